"""Results of training runs on disk: ``<folder>/<name>.json`` (written atomically when the run
ends), its TensorBoard log ``<folder>/tb/<name>/`` and, when asked, ``<folder>/<name>.ckpt``. A
result whose fingerprint matches its spec is reused; anything else (missing, half-written by a
killed run, or from another setting) is trained again."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from repro.files import write_json_atomic

from .spec import RunSpec


@dataclass(frozen=True)
class RunResult:
    name: str  # the run's name (file stem)
    fingerprint: str  # of the spec it was trained for
    seed: int  # init seed and data order
    steps: int  # optimizer steps asked for
    global_step: int  # optimizer steps trained
    val_curve: tuple[tuple[int, float], ...]  # (step, validation loss) after every evaluation
    metrics: dict[str, float]  # the final callback metrics (train/loss, val/loss, pipe/*, ...)
    overrides: dict[str, Any]  # what the experiment set on the model config
    config: str  # the model config file
    wall_s: float  # seconds from the start of the run to its result
    tokens_trained: int  # optimizer steps x batch x block
    threads: int  # torch threads of the run's process(es)
    device: str  # where it ran (cpu, cuda:0, ...)
    provenance: dict[str, Any]  # commit, machine, time
    pipeline: dict[str, Any] | None = None  # the pipeline strategy's summary (bytes, buffers)
    checkpoint: str | None = None  # <folder>/<name>.ckpt when the spec asked for one
    val_bytes: tuple[float, ...] | None = None  # pipeline runs: bytes sent by each evaluation of val_curve
    reused: bool = field(default=False, compare=False)  # found finished on disk (not stored)

    @property
    def final_val_loss(self) -> float:
        """The validation loss at the final step (the last evaluation must fall on it)."""
        if not self.val_curve or int(self.val_curve[-1][0]) != int(self.steps):
            raise ValueError(f"run {self.name!r} has no evaluation at its final step {self.steps}")
        return float(self.val_curve[-1][1])

    def mean_last(self, n: int) -> float:
        """Mean of the last n evaluations of the validation curve."""
        if len(self.val_curve) < n:
            raise ValueError(
                f"{self.name}: {len(self.val_curve)} evaluations, fewer than the {n} to average; "
                "train longer or lower n"
            )
        return sum(loss for _, loss in self.val_curve[-n:]) / n

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("reused")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], reused: bool = False) -> RunResult:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["val_curve"] = tuple((int(s), float(v)) for s, v in values.get("val_curve", ()))
        if values.get("val_bytes") is not None:
            values["val_bytes"] = tuple(values["val_bytes"])
        return cls(**{**values, "reused": reused})


def result_path(spec: RunSpec) -> Path:
    return Path(spec.folder) / f"{spec.name}.json"


def checkpoint_path(spec: RunSpec) -> Path:
    return Path(spec.folder) / f"{spec.name}.ckpt"


def step_checkpoint_paths(spec: RunSpec) -> list[Path]:
    """The checkpoints a run writes every ``checkpoint_every`` steps (before its last step)."""
    every = spec.checkpoint_every
    return (
        [Path(spec.folder) / f"{spec.name}-step{k}.ckpt" for k in range(every, spec.steps, every)]
        if every
        else []
    )


def tensorboard_dir(spec: RunSpec) -> Path:
    return Path(spec.folder) / "tb" / spec.name


def load_finished(spec: RunSpec, fingerprint: str | None = None) -> RunResult | None:
    """The finished result of ``spec`` (marked reused), or None when it must be trained."""
    path = result_path(spec)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        result = RunResult.from_dict(data, reused=True)
    except (OSError, ValueError, TypeError):
        return None  # a damaged result is trained again
    if result.fingerprint != (fingerprint or spec.fingerprint()):
        return None
    if spec.save_checkpoint and not checkpoint_path(spec).is_file():
        return None
    if any(not p.is_file() for p in step_checkpoint_paths(spec)):
        return None
    return result


def save_result(spec: RunSpec, result: RunResult) -> None:
    write_json_atomic(result_path(spec), result.to_dict())
