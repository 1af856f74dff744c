"""``repro fit|validate|test --config FILE [--key=value ...]``: LightningCLI on a model config.

Problems with the config file itself (missing, moved, not YAML, not a mapping) and with the
model or checkpoint it names are reported in one line, before anything is built or written.
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from pathlib import Path

import torch
import yaml
from jsonargparse import ArgumentError
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from repro.argument_errors import one_line
from repro.arguments import show_field_docs
from repro.cores import busy_machine_line
from repro.lit.cli import ConfigError, ReproCLI
from repro.lit.gpt_module import GPTLightningModule
from repro.lit.hf_module import HFCausalLMModule
from repro.paths import missing_file_message
from repro.pipeline.lightning import named_strategy_options, register_strategies
from repro.pipeline.lightning.rendezvous import RendezvousError
from repro.stop import STOP, Stopped

# every parser of the command (main and subcommands) raises instead of printing usage and exiting
_STRICT = {"exit_on_error": False, "allow_abbrev": False}
PARSER_KWARGS = {
    "description": "Train and evaluate the suite's GPT models with Lightning.",
    **_STRICT,
    **{command: dict(_STRICT) for command in ("fit", "validate", "test", "predict")},
}


def config_file_problem(args: list[str]) -> str | None:
    """Why a ``--config`` file of the command line cannot be used (None when every one can)."""
    paths = []
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            paths.append(args[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    for path in paths:
        if path.lstrip().startswith(("{", "[")) or "\n" in path:  # an inline config string
            continue
        file = Path(path)
        if not file.is_file():
            return missing_file_message(path, "--config")
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            return f"--config {path!r}: not UTF-8 text"
        except yaml.YAMLError as exc:
            return f"--config {path!r}: not valid YAML ({str(exc).splitlines()[0]})"
        if data is None:
            return f"--config {path!r}: the file is empty; a config needs model.gpt (see paper_configs/models/smoke/)"
        if not isinstance(data, dict):
            kind = type(data).__name__
            return f"--config {path!r}: must be a mapping of sections (trainer, model, data), got a {kind}"
    return None


SMOKE_CONFIG = "paper_configs/models/smoke/gpt_mha.yaml"


def trains_pretrained(args: list[str]) -> bool:
    """Whether the command line's config (or an option) names ``model.pretrained``: a Hugging Face
    model instead of the suite's GPT."""
    if any(a.startswith("--model.pretrained") for a in args):
        return True
    for i, arg in enumerate(args):
        path = args[i + 1] if arg in ("--config", "-c") and i + 1 < len(args) else None
        path = arg.split("=", 1)[1] if arg.startswith("--config=") else path
        if path and Path(path).is_file():
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            if isinstance(doc, dict) and isinstance(doc.get("model"), dict) and "pretrained" in doc["model"]:
                return True
    return False


def has_config(args: list[str]) -> bool:
    return any(a in ("--config", "-c") or a.startswith("--config=") for a in args)


def asks_help(args: list[str]) -> bool:
    """``-h``, ``--help`` or a class's help (``--trainer.strategy.help ClappingStrategy``)."""
    return any(
        a in ("-h", "--help") or a.startswith("--help=") or a.split("=", 1)[0].endswith(".help") for a in args
    )


def config_strategy(path: str) -> object:
    """A config file's ``trainer.strategy`` (None when it sets none or is not a readable mapping)."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    trainer = doc.get("trainer") if isinstance(doc, dict) else None
    return trainer.get("strategy") if isinstance(trainer, dict) else None


def main(argv: list[str]) -> int:
    """``argv[0]`` is the subcommand (fit, validate or test)."""
    command = argv[0]
    if not has_config(argv) and not asks_help(argv):
        print(
            f"repro {command}: error: no --config: give a model config, e.g. --config {SMOKE_CONFIG} "
            f"(the smoke model, seconds on a CPU); `repro {command} --help` lists every option",
            file=sys.stderr,
        )
        return 2
    problem = config_file_problem(argv)
    if problem:
        print(f"repro {command}: error: {problem}", file=sys.stderr)
        return 2
    register_strategies()
    if asks_help(argv):
        show_field_docs()
    busy = busy_machine_line(torch.get_num_threads())  # the pipeline's stages share the cores themselves
    first_local = os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("SLURM_LOCALID", "0") == "0"
    if busy and first_local and sys.stderr.isatty() and not asks_help(argv):  # said to a person at a terminal
        print(f"repro {command}: {busy}", file=sys.stderr)
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    STOP.stopped = None
    model_class = HFCausalLMModule if trains_pretrained(argv) else GPTLightningModule
    try:
        ReproCLI(
            args=named_strategy_options(argv, config_strategy),
            model_class=model_class,
            save_config_kwargs={"overwrite": True},
            parser_kwargs=PARSER_KWARGS,
        )
    except ConfigError as exc:
        print(f"repro {command}: error: {exc}", file=sys.stderr)
        return 2
    except RendezvousError as exc:  # the stage processes of several machines did not find each other
        print(f"repro {command}: error: {exc}", file=sys.stderr)
        return 1
    except ArgumentError as exc:  # jsonargparse: an unknown key, a value of the wrong type
        print(
            f"repro {command}: error: {one_line(exc)} (`repro {command} --help` lists every option)",
            file=sys.stderr,
        )
        return 2
    except SystemExit as exc:  # Lightning ends a run stopped at once (a second Ctrl-C) with exit(1)
        if STOP.stopped is None:
            raise
        code = exc.code
    except KeyboardInterrupt:  # before training started (or after it ended): nothing to resume
        print(f"repro {command}: interrupted before training started; nothing to resume", file=sys.stderr)
        return 130
    else:
        code = 0
    if STOP.stopped is not None:
        if rank_zero_only.rank == 0:  # every rank of a pipeline started by `repro fit` gets here
            print(stopped_line(command, argv, STOP.stopped), file=sys.stderr)
        return STOP.stopped.exit_code
    return code if isinstance(code, int) else 1


def stopped_line(command: str, argv: list[str], stopped: Stopped) -> str:
    """One line: the signal, the step, and the command that resumes the run."""
    if stopped.path is None:
        return f"repro {command}: stopped by {stopped.name} after step {stopped.step} (no checkpoint was written)"
    keep = [
        a
        for i, a in enumerate(argv[1:], 1)
        if not a.startswith("--ckpt_path") and argv[i - 1] != "--ckpt_path"
    ]
    resume = " ".join(["repro", command, *map(shlex.quote, keep), f"--ckpt_path={shlex.quote(stopped.path)}"])
    return f"repro {command}: stopped by {stopped.name} after step {stopped.step}; resume with: {resume}"
