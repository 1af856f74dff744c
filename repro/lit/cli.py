"""``ReproCLI``: the LightningCLI of the suite's GPT and data, used by ``repro fit|validate|test``
and by the run engine (``repro.runs``), so a config trains the same way under both.

The model's ``vocab_size`` is linked from the datamodule's trained tokenizer and its
``block_size`` from the data's block size, so a config names each only once. When
``trainer.precision`` is not set, it is :func:`repro.lit.precision.default_precision`'s. The
model config is validated before any class is built, and a ``ckpt_path`` must be a readable
checkpoint of the configured model; both fail with :class:`ConfigError` (one line, naming the
field or the file).
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from pathlib import Path

import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import StrategyRegistry

from repro.argument_errors import one_line
from repro.arguments import VERBOSE_ENV
from repro.data import TextDataModule
from repro.data.datamodule import ExistingPath
from repro.deferred_init import deferred_init
from repro.lightning_compat import summary_without_unmeasured_flops
from repro.models import GPTConfig
from repro.models.hf_folder import HFModelError, model_folder

from .callbacks import FinalCheckpoint, counting_steps
from .checkpoints import check_checkpoint_matches, read_checkpoint
from .gpt_module import GPTLightningModule
from .hf_module import HFCausalLMModule
from .precision import default_precision

SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")


class ConfigError(ValueError):
    """A config or checkpoint that cannot be used (the message names the field or file)."""


def _model_folder(location):
    """A model's folder, as the data's tokenizer file (the model's own tokenizer.json is in it)."""
    try:
        return ExistingPath(str(model_folder(location)))
    except HFModelError as exc:
        raise ConfigError(str(exc)) from None


def _gpt_fields(gpt) -> dict:
    return dict(gpt.as_dict() if hasattr(gpt, "as_dict") else gpt)


# Lightning's lines that say nothing about a run (hidden unless -v / REPRO_VERBOSE)
NOISE = ("💡 Tip:", "`weights_only` was not set")


def _quiet_noise(record: logging.LogRecord) -> bool:
    return not any(mark in str(record.msg) for mark in NOISE)


def resumed_version(ckpt_path, save_dir, name: str) -> int | None:
    """``n`` when ``ckpt_path`` is a checkpoint in ``<save_dir>/<name>/version_<n>/checkpoints/``:
    a resumed fit logs on into the run it resumes (one TensorBoard curve, not two halves)."""
    if not ckpt_path or str(ckpt_path) in SPECIAL_CKPT_PATHS or save_dir is None:
        return None
    ckpt = Path(str(ckpt_path)).resolve()
    run = ckpt.parent.parent
    number = run.name.removeprefix("version_")
    inside = ckpt.parent.name == "checkpoints" and run.name.startswith("version_") and number.isdigit()
    return int(number) if inside and run.parent == (Path(str(save_dir)) / str(name or "")).resolve() else None


class RunConfigFile(SaveConfigCallback):
    """LightningCLI's ``config.yaml``, written into the run's log directory only: a run without a
    logger has none, and Lightning's would be the working folder (overwriting a file there)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not trainer.loggers:
            return
        super().setup(trainer, pl_module, stage)


class ReproCLI(LightningCLI):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("save_config_callback", RunConfigFile)
        kwargs.setdefault("model_class", GPTLightningModule)
        kwargs.setdefault("datamodule_class", TextDataModule)
        kwargs.setdefault(
            "seed_everything_default", 0
        )  # a config that names no seed: seed 0, said in config.yaml
        if not os.environ.get(VERBOSE_ENV):  # the seed is in the saved config.yaml; -v shows the line
            logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
            for name in (
                "lightning.pytorch.utilities.rank_zero",
                "lightning.pytorch.trainer.connectors.checkpoint_connector",
            ):
                logging.getLogger(name).addFilter(_quiet_noise)
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.set_defaults({"trainer.log_every_n_steps": 10})  # Lightning's 50 logs nothing in a short run
        if self.pretrained:  # the model's own tokenizer tokenizes the data
            parser.link_arguments("model.pretrained", "data.tokenizer_file", compute_fn=_model_folder)
            return
        parser.link_arguments("data.block_size", "model.gpt.block_size")
        parser.link_arguments("data.model_vocab_size", "model.gpt.vocab_size", apply_on="instantiate")

    @property
    def pretrained(self) -> bool:
        """Whether this CLI trains a Hugging Face model (``model: {pretrained: ...}``)."""
        return issubclass(self.model_class, HFCausalLMModule)

    def parse_arguments(self, parser, args) -> None:
        """Parse, then check the model config and the checkpoint (before Lightning reads the checkpoint's
        hyperparameters into the config)."""
        super().parse_arguments(parser, args)
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        self._check_model_config(config)
        self._check_checkpoint(config)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.get("trainer")
        if trainer is None:
            return
        accelerator = str(trainer.get("accelerator", "auto"))
        if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            raise ConfigError(
                f"trainer.accelerator={accelerator!r} but no CUDA GPU is visible here; "
                "pass --trainer.accelerator=cpu (and a smaller model) to run on the CPU"
            )
        if trainer.get("precision") is None:
            trainer["precision"] = default_precision(accelerator)
        self._check_strategy_config(config)
        logger = trainer.get("logger")
        if (
            self.subcommand == "fit"
            and isinstance(logger, Namespace)
            and "TensorBoardLogger" in logger.class_path
        ):
            args = logger.init_args
            if args.get("version") is None:  # a resumed fit logs on into the run it resumes
                args["version"] = resumed_version(
                    config.get("ckpt_path"), args.get("save_dir"), args.get("name")
                )

    def _default_trainer_kwargs(self) -> dict:
        """What a config that leaves them unset gets: TensorBoard under ``logs/<config name>/version_<n>``
        (the resumed run's version when ``ckpt_path`` is one of its checkpoints) instead of
        ``lightning_logs/``, and only ``FinalCheckpoint``'s checkpoint (no ``epoch=..-step=..ckpt``
        beside it) unless the config lists a ``ModelCheckpoint``."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.get("trainer") or {}
        out = {}
        if trainer.get("logger") is None and self.subcommand == "fit":
            files = config.get("config") or []
            name = Path(str(files[-1])).stem if files else "run"
            save_dir = os.path.join(trainer.get("default_root_dir") or ".", "logs")
            version = resumed_version(config.get("ckpt_path"), save_dir, name)
            out["logger"] = TensorBoardLogger(save_dir, name=name, version=version, default_hp_metric=False)
        callbacks = trainer.get("callbacks") or []
        if trainer.get("enable_checkpointing") in (None, True) and not any(
            "ModelCheckpoint" in str(getattr(c, "class_path", "")) for c in callbacks
        ):
            out["enable_checkpointing"] = False
        return out

    def _check_strategy_config(self, config) -> None:
        """A strategy class may check the run's config before any of its processes starts: its
        ``check_config(config, options, model_layers)`` (the pipeline's: a layer per stage,
        micro-batches, the launcher's processes), the layers as the module class says
        (``config_layers``). The class is found from the config (a registered name or a
        class_path), never by matching its name."""
        trainer = config.get("trainer") or {}
        strategy = trainer.get("strategy")
        if isinstance(strategy, str):
            entry = dict.get(StrategyRegistry, strategy)  # (the registry's own get() builds the strategy)
            cls, options = (entry["strategy"], dict(entry["init_params"])) if entry else (None, {})
        elif strategy is not None and strategy.get("class_path"):
            module, _, name = str(strategy["class_path"]).rpartition(".")
            try:
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError):
                return  # jsonargparse names a class it cannot import
            options = dict(strategy.get("init_args") or {})
        else:
            return
        check = getattr(cls, "check_config", None)
        if callable(check):
            try:
                check(config, options, self.model_class.config_layers(config.get("model") or {}))
            except ValueError as exc:
                raise ConfigError(one_line(exc)) from None

    def instantiate_trainer(self, **kwargs):
        """The trainer; ``repro fit`` always has a ``FinalCheckpoint`` (the checkpoint a stop signal
        writes, and the final one), whether or not the config lists it. A pretrained model's
        embedding must hold the data's vocabulary (checked here, before the trainer is built)."""
        if self.pretrained and self.datamodule.model_vocab_size > self.model.model.vocab_size:
            raise ConfigError(
                f"data: the tokenizer has {self.datamodule.model_vocab_size:,} ids but the model's embedding holds "
                f"{self.model.model.vocab_size:,}; tokenize with the model's own tokenizer"
            )
        trainer = super().instantiate_trainer(**{**self._default_trainer_kwargs(), **kwargs})
        if self.subcommand == "fit" and not any(isinstance(c, FinalCheckpoint) for c in trainer.callbacks):
            trainer.callbacks.append(FinalCheckpoint())
        summary_without_unmeasured_flops(trainer)  # Lightning's said 'Total Flops: 0' for every run
        bar = (
            trainer.progress_bar_callback
        )  # Lightning's default bar, counting steps where steps bound the run
        if bar is not None:
            trainer.callbacks[trainer.callbacks.index(bar)] = counting_steps(bar)
        return trainer

    def instantiate_classes(self) -> None:
        """Build the data, model and trainer; a value that a class refuses is a one-line error. The
        suite's GPT is built on meta (its weights drawn later, bit for bit those of a build here, and
        the random state after it the same): the module's ``configure_model`` draws it whole, or,
        under a strategy whose ``model_sharded_context`` defers (the pipeline's), each rank its own stage."""
        try:
            with deferred_init():
                super().instantiate_classes()
        except (ValueError, TypeError, FileNotFoundError) as exc:
            raise ConfigError(one_line(exc)) from None

    @staticmethod
    def _check_model_config(config) -> None:
        """Validate the architecture before any class is built (vocab_size is linked later)."""
        gpt = config.get("model", {}).get("gpt")
        if gpt is None:
            return
        fields = _gpt_fields(gpt)
        fields["vocab_size"] = fields.get("vocab_size") or 1
        try:
            GPTConfig(**fields)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid model.gpt: {exc}") from None

    @staticmethod
    def _check_checkpoint(config) -> None:
        """A ``ckpt_path`` must be a readable checkpoint of the configured model (tensors are
        memory-mapped, not read)."""
        ckpt = config.get("ckpt_path")
        if not ckpt or str(ckpt) in SPECIAL_CKPT_PATHS:
            return
        try:
            data = read_checkpoint(ckpt, mmap=True)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(f"ckpt_path={str(ckpt)!r}: {str(exc).split(': ', 1)[-1]}") from None
        saved = data.get("hyper_parameters", {}).get("gpt")
        gpt = config.get("model", {}).get("gpt")
        if saved is None or gpt is None:
            return
        fields = _gpt_fields(gpt)
        fields["vocab_size"] = saved.get("vocab_size", 1)  # linked from the data later
        try:
            check_checkpoint_matches(saved, GPTConfig(**fields), str(ckpt), ignore=("vocab_size",))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"ckpt_path: {exc}; use the config the checkpoint was trained with") from None
