"""Read and write the LightningCLI YAML files of ``paper_configs/`` outside the CLI.

The profilers and experiment orchestrators train many variants of one config (other RoPE
widths, other seeds). They read the same YAML that ``repro fit --config`` reads, apply the same
links (``model.gpt.block_size`` from ``data.block_size``, ``vocab_size`` from the tokenizer) and
write variants back as YAML that ``repro fit`` trains directly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from repro.files import read_yaml, write_text_atomic
from repro.models.config import GPTConfig

LINKED_GPT_FIELDS = ("vocab_size", "block_size")


@dataclass
class RunConfig:
    path: str  # the YAML file it came from
    gpt: dict[str, Any]  # model.gpt fields as written (vocab_size/block_size are linked, not written)
    optim: dict[str, Any] = field(default_factory=dict)  # model.optim fields
    data: dict[str, Any] = field(default_factory=dict)  # data init args
    trainer: dict[str, Any] = field(default_factory=dict)  # trainer section as written
    seed: int = 0  # seed_everything
    raw: dict[str, Any] = field(default_factory=dict)  # the whole YAML document

    @property
    def block_size(self) -> int:
        return int(self.data.get("block_size", 128))

    def gpt_config(self, vocab_size: int, **overrides: Any) -> GPTConfig:
        fields = {k: v for k, v in self.gpt.items() if k not in LINKED_GPT_FIELDS}
        fields.update(overrides)
        return GPTConfig(vocab_size=vocab_size, block_size=self.block_size, **fields)

    def shape_config(self) -> GPTConfig:
        """The architecture with a placeholder vocabulary (for budgets, accounting, allocation)."""
        return self.gpt_config(vocab_size=1)

    def datamodule(self, **overrides: Any):
        from repro.data import TextDataModule

        return TextDataModule(**{**self.data, **overrides})

    def with_widths(self, widths: list[int], logger_name: str | None = None) -> dict[str, Any]:
        """The YAML document with the per-layer RoPE list replaced (and the run's logger name)."""
        list_field = "rope_dims" if self.shape_config().attention == "mha" else "qk_rope_head_dim"
        widths = [int(w) for w in widths]
        self.gpt_config(vocab_size=1, **{list_field: widths})  # validates the widths against the model
        doc = copy.deepcopy(self.raw)
        doc["model"]["gpt"][list_field] = widths
        logger = doc.get("trainer", {}).get("logger")
        if logger_name and isinstance(logger, dict) and isinstance(logger.get("init_args"), dict):
            logger["init_args"]["name"] = logger_name
        return doc


def load_run_config(path: str | Path) -> RunConfig:
    path = Path(path)
    doc = read_yaml(path, "config file")
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict) or not isinstance(doc["model"].get("gpt"), dict):
        raise ValueError(f"config file {str(path)!r} has no model.gpt section; is it a repro fit config?")
    cfg = RunConfig(
        path=str(path),
        gpt=dict(doc["model"]["gpt"]),
        optim=dict(doc["model"].get("optim") or {}),
        data=dict(doc.get("data") or {}),
        trainer=dict(doc.get("trainer") or {}),
        seed=int(doc.get("seed_everything") or 0),
        raw=doc,
    )
    try:
        cfg.shape_config()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config file {str(path)!r}: invalid model.gpt: {exc}") from exc
    return cfg


def write_run_config(doc: dict[str, Any], path: str | Path, header: str = "") -> None:
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
    if header:
        text = "".join(f"# {line}\n" for line in header.splitlines()) + text
    write_text_atomic(path, text)
