"""``ReproCLI``: the LightningCLI of the suite's GPT and data, used by ``repro fit|validate|test``
and by the run engine (``repro.runs``), so a config trains the same way under both.

The model's ``vocab_size`` is linked from the datamodule's trained tokenizer and its
``block_size`` from the data's block size, so a config names each only once. When
``trainer.precision`` is not set, it is ``bf16-mixed`` on a GPU and ``32-true`` on a CPU. The
model config is validated before any class is built, and a ``ckpt_path`` must be a readable
checkpoint of the configured model; both fail with :class:`ConfigError` (one line, naming the
field or the file).
"""

from __future__ import annotations

import logging
import os
import re

import torch
from lightning.pytorch.cli import LightningCLI

from repro.data import TextDataModule
from repro.models import GPTConfig

from .checkpoints import check_checkpoint_matches, read_checkpoint
from .gpt_module import GPTLightningModule
from .precision import default_precision

SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")


def one_line(exc: Exception) -> str:
    """An error of jsonargparse or of a class it built, as one line: the (nested) key, the value
    given and the first reason (a union's ``Expected a NoneType`` alternative is not a reason)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    keys = re.findall(r'Parser key "([^"]+)"', " ".join(lines))
    key = ".".join(k for i, k in enumerate(keys) if i == 0 or not k.startswith(keys[0])) if keys else None
    inner = max((i for i, line in enumerate(lines) if line.startswith("Parser key")), default=0)
    given = next(
        (line.split(":", 1)[1].strip() for line in lines[inner:] if line.startswith("Given value:")), None
    )
    skip = (
        "Parser key",
        "Given value",
        "Subtypes",
        "Errors:",
        "Does not validate",
        "- Expected a <class 'NoneType'>",
        "- Problem with given class_path",
        "Problem with given class_path",
    )
    reasons = [line.lstrip("- ") for line in lines[inner:] if not line.startswith(skip)]
    reasons = reasons or [line.lstrip("- ") for line in lines if not line.startswith(skip)]
    specific = [r for r in reasons if not r.startswith("Expected a <class")]  # the alternatives of a union
    reason = (specific or reasons or lines)[0]
    reason = re.sub(r"Expected a <class '(\w+)'>", r"expected \1", reason)
    if key and not reason.startswith(key):
        return f"{key}={given}: {reason}" if given and len(keys) > 1 else f"{key}: {reason}"
    return reason


class ConfigError(ValueError):
    """A config or checkpoint that cannot be used (the message names the field or file)."""


def _gpt_fields(gpt) -> dict:
    return dict(gpt.as_dict() if hasattr(gpt, "as_dict") else gpt)


class ReproCLI(LightningCLI):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("model_class", GPTLightningModule)
        kwargs.setdefault("datamodule_class", TextDataModule)
        if not os.environ.get("REPRO_VERBOSE"):  # the seed is in the saved config.yaml; -v shows the line
            logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.block_size", "model.gpt.block_size")
        parser.link_arguments("data.vocab_size", "model.gpt.vocab_size", apply_on="instantiate")

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
        self._check_pipeline_stages(config)

    @staticmethod
    def _check_pipeline_stages(config) -> None:
        """A pipeline needs at least one layer per stage (checked here, before K processes start)."""
        trainer, gpt = config.get("trainer") or {}, config.get("model", {}).get("gpt")
        strategy = trainer.get("strategy")
        name = strategy if isinstance(strategy, str) else (strategy or {}).get("class_path", "")
        devices, nodes = trainer.get("devices"), trainer.get("num_nodes") or 1
        devices = int(devices) if isinstance(devices, str) and devices.isdigit() else devices
        if "clapping" not in str(name).lower() or gpt is None or not isinstance(devices, int):
            return
        n_layer = _gpt_fields(gpt).get("n_layer")
        if isinstance(n_layer, int) and devices * nodes > n_layer:
            raise ConfigError(
                f"trainer.devices={devices}: the pipeline has one stage per process, but model.gpt.n_layer={n_layer}; "
                f"use at most {n_layer} devices (or a deeper model)"
            )

    def instantiate_classes(self) -> None:
        """Build the data, model and trainer; a value that a class refuses is a one-line error."""
        try:
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
