"""The grid of the Clapping experiments: one row per (method, compressor, p), each trained for
every seed as a K-stage pipeline run of the engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.runs import RunSpec

from .settings import ClappingSettings

TIMEOUT_S = 600  # how long a stage may wait for a message before the run fails


@dataclass(frozen=True)
class ClappingRow:
    method: str  # experiment method: none, none_lazy, direct, ef21, aqsgd, clapping_fc, clapping_fu
    compressor: str  # compressor of both directions ('identity' for the none rows)
    p: float  # lazy-sampling probability

    @property
    def strategy_method(self) -> str:
        return "none" if self.method == "none_lazy" else self.method

    @property
    def key(self) -> str:
        comp = self.compressor.replace("(", "").replace(")", "").replace(",", "-").replace("=", "")
        return f"{self.method}-{comp}-p{self.p:g}"


def plan_rows(settings: ClappingSettings) -> list[ClappingRow]:
    rows: list[ClappingRow] = []
    for method in settings.methods:
        if method == "none":
            rows.append(ClappingRow("none", "identity", 1.0))
        elif method == "none_lazy":
            rows.append(ClappingRow("none_lazy", "identity", float(settings.lazy_p)))
        elif method in ("direct", "ef21", "aqsgd"):
            rows += [ClappingRow(method, c, 1.0) for c in settings.compressors]
        else:
            rows += [
                ClappingRow(method, c, float(p)) for c in settings.compressors for p in settings.clapping_p
            ]
    return rows


def run_spec(row: ClappingRow, seed: int, settings: ClappingSettings, runs_dir: Path) -> RunSpec:
    """One (row, seed) run: the model config at K stages with the row's method and compressors."""
    pipeline = dict(
        micro_batches=settings.micro_batches,
        schedule=settings.schedule,
        method=row.strategy_method,
        fwd_compressor=row.compressor,
        bwd_compressor=row.compressor,
        p=row.p,
        warmup_epochs=settings.warmup_epochs,
        timeout_s=TIMEOUT_S,
    )
    name = f"{row.key}-s{seed}"
    return RunSpec.make(
        name,
        runs_dir,
        settings.model,
        seed,
        settings.steps,
        settings.eval_every,
        {"trainer.limit_val_batches": settings.val_batches},
        pipeline,
        stages=settings.stages,
        label=name,
    )


def grid(
    settings: ClappingSettings, seeds: tuple[int, ...], runs_dir: Path
) -> list[tuple[ClappingRow, RunSpec]]:
    return [(row, run_spec(row, seed, settings, runs_dir)) for row in plan_rows(settings) for seed in seeds]
