"""Command line: ``repro fit|validate|test|predict --config paper_configs/<x>.yaml`` (LightningCLI),
and ``repro profile|allocate|transfer|account|analyze`` (RoPE allocation, ``repro.alloc.cli``), and
``repro table1`` (``make reproduce-table1``, ``repro.experiments.table1``), ``repro clapping``
(``make reproduce-clapping``, ``repro.experiments.clapping``) and ``repro bench`` (``make bench``,
``repro.bench.run``).

The model's ``vocab_size`` is linked from the datamodule's trained tokenizer and its
``block_size`` from the data's block size, so a config names each only once. When
``trainer.precision`` is not set, it is ``bf16-mixed`` on a GPU and ``32-true`` on a CPU.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from repro.data import TextDataModule
from repro.lit import GPTLightningModule
from repro.lit.precision import default_precision
from repro.models import GPTConfig


class ReproCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.block_size", "model.gpt.block_size")
        parser.link_arguments("data.vocab_size", "model.gpt.vocab_size", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        self._check_model_config(config)
        trainer = config.get("trainer")
        if trainer is not None and trainer.get("precision") is None:
            trainer["precision"] = default_precision(trainer.get("accelerator", "auto"))


    def _check_model_config(self, config) -> None:
        """Validate the architecture before any class is built (vocab_size is linked later)."""
        gpt = config.get("model", {}).get("gpt")
        if gpt is None:
            return
        fields = gpt.as_dict() if hasattr(gpt, "as_dict") else dict(gpt)
        fields["vocab_size"] = fields.get("vocab_size") or 1
        try:
            GPTConfig(**fields)
        except (TypeError, ValueError) as exc:
            parser = self._parser(self.subcommand) if self.subcommand else self.parser
            parser.error(f"invalid model.gpt: {exc}")


    def _parse_ckpt_path(self) -> None:
        """Lightning reads the checkpoint's hyperparameters here; check the file and its model first."""
        if self.config.get("subcommand"):
            self._check_checkpoint(self.config[self.config.subcommand], self.config.subcommand)
        super()._parse_ckpt_path()

    def _check_checkpoint(self, config, subcommand: str) -> None:
        """A ``ckpt_path`` must be a readable checkpoint of the configured model (checked before
        anything is built or written; tensors are memory-mapped, not read)."""
        ckpt = config.get("ckpt_path")
        if not ckpt or str(ckpt) in ("last", "best", "hpc", "registry"):
            return
        import torch

        from repro.alloc.phase_off_profile import check_checkpoint_matches

        parser = self._parser(subcommand)
        if not Path(ckpt).is_file():
            parser.error(f"ckpt_path={str(ckpt)!r}: no such file")
        try:
            data = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
        except Exception as exc:  # torch raises several types for a damaged file
            parser.error(f"ckpt_path={str(ckpt)!r}: not a readable checkpoint; the file is empty, truncated or "
                         f"corrupt ({type(exc).__name__})")
        saved = data.get("hyper_parameters", {}).get("gpt") if isinstance(data, dict) else None
        gpt = config.get("model", {}).get("gpt")
        if saved is None or gpt is None:
            return
        fields = gpt.as_dict() if hasattr(gpt, "as_dict") else dict(gpt)
        fields["vocab_size"] = saved.get("vocab_size", 1)  # linked from the data later
        try:
            check_checkpoint_matches(saved, GPTConfig(**fields), str(ckpt), ignore=("vocab_size",))
        except (TypeError, ValueError) as exc:
            parser.error(f"ckpt_path: {exc}; use the config the checkpoint was trained with")


def _config_file_problem(args: list[str]) -> str | None:
    """Why a ``--config`` file of the command line cannot be used (None when every one can):
    named here, because the YAML parser's own message does not name the file."""
    import yaml

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
            return f"--config {path!r}: no such file"
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            return f"--config {path!r}: not UTF-8 text"
        except yaml.YAMLError as exc:
            return f"--config {path!r}: not valid YAML ({str(exc).splitlines()[0]})"
        if data is not None and not isinstance(data, dict):
            return f"--config {path!r}: must be a mapping of sections (trainer, model, data), got a {type(data).__name__}"
    return None


def lightning_cli(args: list[str] | None = None, run: bool = True) -> ReproCLI:
    return ReproCLI(
        GPTLightningModule,
        TextDataModule,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"description": "Train and evaluate the suite's GPT models with Lightning."},
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``repro`` console script (argv defaults to the command line).

    ``fit|validate|test|predict`` go to LightningCLI; ``profile|allocate|transfer|account|analyze``
    to the RoPE allocation commands; ``table1`` to the Table 1 reproduction.
    """
    import sys

    from repro.alloc.cli import COMMANDS as ALLOC_COMMANDS, main as alloc_main

    experiments = ("table1", "clapping", "bench")
    COMMANDS = ALLOC_COMMANDS + experiments
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ALLOC_COMMANDS:
        raise SystemExit(alloc_main(args))
    if args and args[0] == "table1":
        from repro.experiments.table1 import main as table1_main

        raise SystemExit(table1_main(args[1:]))
    if args and args[0] == "bench":
        from repro.bench.run import main as bench_main

        raise SystemExit(bench_main(args[1:]))
    if args and args[0] == "clapping":
        from repro.experiments.clapping import main as clapping_main

        raise SystemExit(clapping_main(args[1:]))
    lightning_commands = ("fit", "validate", "test", "predict")
    if args and args[0] in lightning_commands:
        problem = _config_file_problem(args)
        if problem:
            print(f"repro {args[0]}: error: {problem}", file=sys.stderr)
            raise SystemExit(2)
    if args and not args[0].startswith("-") and args[0] not in lightning_commands:
        print(f"repro: error: unknown command {args[0]!r}; commands are "
              f"{', '.join(lightning_commands + COMMANDS)}", file=sys.stderr)
        raise SystemExit(2)
    if args and args[0] in ("-h", "--help"):
        print(f"repro: fit|validate|test|predict (LightningCLI) or {'|'.join(COMMANDS)}; "
              "`repro <command> --help` explains each.")
    lightning_cli(argv)


if __name__ == "__main__":
    main()
