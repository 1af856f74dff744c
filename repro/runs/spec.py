"""A training run, as the experiments describe it: a model config file, the values the experiment
sets on it (overrides), a seed and a number of steps; pipeline runs add the strategy's options.
Its fingerprint is the one definition of "the same run": a finished result with the same
fingerprint is reused instead of trained again."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.files import read_yaml

# Keys of a model config that do not change a run's numbers (where logs go, what is printed).
NOT_RESULTS = (
    "trainer.logger",
    "trainer.callbacks",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.enable_checkpointing",
    "trainer.log_every_n_steps",
    "trainer.default_root_dir",
    "data.cache_dir",
    "data.num_workers",
    "data.verify",
)


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class RunSpec:
    name: str  # file stem of the result, unique within its folder
    folder: str  # where the result JSON, TensorBoard log (tb/<name>) and checkpoint go
    config: str  # the model config YAML (absolute path)
    seed: int  # seed_everything and data.shuffle_seed: one init and one data order
    steps: int  # optimizer steps (trainer.max_steps)
    eval_every: int  # validation interval in steps; the last evaluation falls on the final step
    overrides: tuple[
        tuple[str, Any], ...
    ] = ()  # dotted config keys the experiment sets, e.g. model.gpt.rope_dims
    pipeline: tuple[tuple[str, Any], ...] = ()  # ClappingStrategy options; empty = one process
    stages: int = 1  # processes of a pipeline run (one per stage); 1 = a single-process run
    save_checkpoint: bool = False  # also write <folder>/<name>.ckpt at the end
    checkpoint_every: int = 0  # also write <folder>/<name>-step<k>.ckpt every k steps (0 = never)
    label: str = field(default="", compare=False)  # how progress lines name the run (default: the name)
    weights_only: bool = (
        False  # the end checkpoint without optimizer state (for evaluation: a third the size)
    )

    @staticmethod
    def make(
        name: str,
        folder: str | Path,
        config: str | Path,
        seed: int,
        steps: int,
        eval_every: int,
        overrides: Mapping[str, Any] | None = None,
        pipeline: Mapping[str, Any] | None = None,
        stages: int = 1,
        save_checkpoint: bool = False,
        checkpoint_every: int = 0,
        label: str = "",
        weights_only: bool = False,
    ) -> RunSpec:
        """A spec from plain values (lists and dicts are frozen so the spec is hashable)."""
        for what, value in (("seed", seed), ("steps", steps), ("eval_every", eval_every), ("stages", stages)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if what == "seed" else 1):
                raise ValueError(
                    f"run {name!r}: {what}={value!r} must be a {'non-negative' if what == 'seed' else 'positive'} "
                    "integer"
                )
        return RunSpec(
            name,
            str(folder),
            str(Path(config).resolve()),
            seed,
            steps,
            eval_every,
            tuple((k, _frozen(v)) for k, v in (overrides or {}).items()),
            tuple(sorted((k, _frozen(v)) for k, v in (pipeline or {}).items())),
            stages,
            save_checkpoint,
            checkpoint_every,
            label,
            weights_only,
        )

    @property
    def key(self) -> str:
        """Unique among all runs of an experiment."""
        return str(Path(self.folder) / self.name)

    @property
    def display(self) -> str:
        return self.label or self.name

    def override_dict(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in self.overrides}

    def pipeline_dict(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in self.pipeline}

    def resolved_config(self) -> dict[str, Any]:
        """The model config document with the overrides applied and the keys that do not change the
        numbers removed (what the fingerprint hashes)."""
        doc = copy.deepcopy(read_yaml(self.config, "config file"))
        for key, value in self.override_dict().items():
            _set(doc, key, value)
        for key in NOT_RESULTS:
            _drop(doc, key)
        return doc

    def fingerprint(self) -> str:
        model = self.resolved_config()
        payload = {
            "model": model,
            "data": prepared_identity(model, self.config),
            "seed": self.seed,
            "steps": self.steps,
            "eval_every": self.eval_every,
            "pipeline": self.pipeline_dict(),
            "stages": self.stages,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prepared_identity(doc: dict, config: str) -> str | None:
    """A prepared corpus's identity (its manifest's tokenizer and shard checksums), so a run on a
    corpus prepared again differently is not taken for a finished one; None for other corpora."""
    data = doc.get("data") or {}
    if data.get("corpus") != "prepared" or not data.get("prepared_dir"):
        return None
    folder = Path(config).parent / str(data["prepared_dir"])
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return f"not prepared: {folder}"
    record = json.loads(manifest.read_text())
    return hashlib.sha256(
        json.dumps([record.get("tokenizer"), record.get("splits")], sort_keys=True).encode()
    ).hexdigest()[:16]


def _set(doc: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _drop(doc: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    node = doc
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(last, None)
