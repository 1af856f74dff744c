"""A model config file (the YAML ``repro fit --config`` reads), read outside LightningCLI.

The experiments need a few facts from it before training (the architecture for budgets and
accounting, the data section for the datamodule) and write allocated variants of it back as
YAML that ``repro fit`` trains. Training itself always goes through ``ReproCLI`` (``repro.runs``),
so a file means the same thing under ``repro fit`` and under an experiment.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from repro.data import TextDataModule
from repro.data.datamodule import PATH_FIELDS
from repro.files import read_yaml, write_text_atomic
from repro.models import GPTConfig
from repro.models.config import width_field_of

LINKED_GPT_FIELDS = ("vocab_size", "block_size")
# What an experiment decides for every run (its settings own these numbers): a model file that an
# experiment trains must not set them.
SCHEDULE_KEYS = (
    "seed_everything",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.val_check_interval",
    "trainer.check_val_every_n_epoch",
    "data.shuffle_seed",
)


width_field = (
    width_field_of  # the config list of an attention kind's per-layer RoPE widths (GPTConfig owns it)
)


@dataclass
class ModelConfig:
    path: str  # the YAML file it came from (absolute)
    gpt: dict[str, Any]  # model.gpt fields as written (vocab_size/block_size are linked, not written)
    optim: dict[str, Any] = field(default_factory=dict)  # model.optim fields
    data: dict[str, Any] = field(default_factory=dict)  # data init args
    trainer: dict[str, Any] = field(default_factory=dict)  # trainer section as written
    raw: dict[str, Any] = field(default_factory=dict)  # the whole YAML document
    pretrained: str | None = None  # a Hugging Face model (model.pretrained, relative to the file), not a GPT

    @property
    def is_pretrained(self) -> bool:
        return self.pretrained is not None

    @property
    def hidden_size(self) -> int:
        """The width of the messages between pipeline stages."""
        if not self.is_pretrained:
            return int(self.gpt["n_embd"])
        from repro.models.hf_folder import model_folder, read_config

        config = read_config(model_folder(self.pretrained))
        return int(getattr(config, "hidden_size", None) or config.n_embd)

    @property
    def block_size(self) -> int:
        return int(self.data.get("block_size", 128))

    @property
    def batch_size(self) -> int:
        return int(self.data.get("batch_size", 16))

    def gpt_config(self, vocab_size: int, **overrides: Any) -> GPTConfig:
        fields = {k: v for k, v in self.gpt.items() if k not in LINKED_GPT_FIELDS}
        fields.update(overrides)
        return GPTConfig(vocab_size=vocab_size, block_size=self.block_size, **fields)

    def shape_config(self) -> GPTConfig:
        """The architecture with a placeholder vocabulary (for budgets, accounting, allocation)."""
        if self.is_pretrained:
            raise ValueError(
                f"config file {self.path!r} names a pretrained model, not a repro GPT (model.gpt)"
            )
        return self.gpt_config(vocab_size=1)

    def attention_shape(self) -> GPTConfig:
        """The attention shape budgets, allocations and accounting read: the GPT's own
        (``shape_config``), or a pretrained model's fixed-width heads (layers, query and key/value
        heads, head width) as a GPTConfig, its coverage written into ``model.rotary``."""
        if not self.is_pretrained:
            return self.shape_config()
        from repro.models.hf_folder import model_folder, read_config

        hf = read_config(model_folder(self.pretrained))
        n_head = int(hf.num_attention_heads)
        head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // n_head)
        return GPTConfig(
            vocab_size=1,
            block_size=self.block_size,
            n_layer=int(hf.num_hidden_layers),
            n_embd=n_head * head_dim,
            n_head=n_head,
            n_kv_head=int(getattr(hf, "num_key_value_heads", None) or n_head),
            attention="mha",
        )

    @property
    def width_field(self) -> str:
        return width_field(self.shape_config().attention)

    def data_args(self, **overrides: Any) -> dict[str, Any]:
        """The data section with ``overrides``; paths in the file are relative to it (as
        ``repro fit`` reads them), paths in ``overrides`` are taken as given."""
        args = dict(self.data)
        for name in PATH_FIELDS:
            if args.get(name) is not None:
                args[name] = os.path.normpath(Path(self.path).parent / os.path.expanduser(str(args[name])))
        if self.is_pretrained:  # its own tokenizer, as repro fit links it
            from repro.models.hf_folder import model_folder

            args["tokenizer_file"] = str(model_folder(self.pretrained))
        return {**args, **overrides}

    def datamodule(self, **overrides: Any) -> TextDataModule:
        return TextDataModule(**self.data_args(**overrides))

    def value(self, dotted: str) -> Any:
        """The value a dotted key (``trainer.max_steps``) has in the file, or None."""
        node: Any = self.raw
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def check_trainable_by_experiment(self, what: str) -> None:
        """An experiment owns the schedule of its runs: the file must not set it too."""
        found = [f"{k}={self.value(k)!r}" for k in SCHEDULE_KEYS if self.value(k) is not None]
        if found:
            raise ValueError(
                f"{what} {self.path!r} sets {', '.join(found)}, which the experiment's settings own "
                f"(steps, evaluation interval, seeds); remove them from the model file"
            )

    def with_widths(self, widths: list[int], logger_name: str | None = None) -> dict[str, Any]:
        """The YAML document with the per-layer RoPE list replaced (and the run's logger name); a
        pretrained model's as ``model.rotary`` (each layer's rotated dims / head width)."""
        widths = [int(w) for w in widths]
        doc = copy.deepcopy(self.raw)
        if self.is_pretrained:
            shape = self.attention_shape()
            shape.__class__(**{**shape.to_dict(), "rope_dims": widths})  # validates the widths
            doc["model"]["rotary"] = [w / shape.head_dim for w in widths]
        else:
            self.gpt_config(
                vocab_size=1, **{self.width_field: widths}
            )  # validates the widths against the model
            doc["model"]["gpt"][self.width_field] = widths
        logger = doc.get("trainer", {}).get("logger")
        if logger_name and isinstance(logger, dict) and isinstance(logger.get("init_args"), dict):
            logger["init_args"]["name"] = logger_name
        return doc


def load_model_config(path: str | Path) -> ModelConfig:
    path = Path(path).resolve()
    doc = read_yaml(path, "config file")
    model = doc.get("model") if isinstance(doc, dict) else None
    if isinstance(model, dict) and model.get("pretrained"):
        location = str(model["pretrained"])
        local = path.parent / os.path.expanduser(location)
        return ModelConfig(
            path=str(path),
            gpt={},
            optim=dict(model.get("optim") or {}),
            data=dict(doc.get("data") or {}),
            trainer=dict(doc.get("trainer") or {}),
            raw=doc,
            pretrained=str(local) if local.exists() else location,
        )
    if not isinstance(model, dict) or not isinstance(model.get("gpt"), dict):
        raise ValueError(
            f"config file {str(path)!r} has no model.gpt (nor model.pretrained) section; is it a repro fit config?"
        )
    cfg = ModelConfig(
        path=str(path),
        gpt=dict(doc["model"]["gpt"]),
        optim=dict(doc["model"].get("optim") or {}),
        data=dict(doc.get("data") or {}),
        trainer=dict(doc.get("trainer") or {}),
        raw=doc,
    )
    try:
        cfg.shape_config()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config file {str(path)!r}: invalid model.gpt: {exc}") from None
    return cfg


def write_model_config(doc: dict[str, Any], path: str | Path, header: str = "") -> None:
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
    if header:
        text = "".join(f"# {line}\n" for line in header.splitlines()) + text
    write_text_atomic(path, text)
