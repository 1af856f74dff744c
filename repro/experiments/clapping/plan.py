"""The runs of the Clapping experiments: the base model of the fine-tune regime (pretrained once,
one process, exact), and one row per (regime, method, compressor, p), each trained for every seed
as a K-stage pipeline run of the engine."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from repro.experiments.kit.data_use import check_data_use
from repro.runs import RunSpec
from repro.runs.store import checkpoint_path

from .settings import ClappingSettings, split_compressor

TIMEOUT_S = 600  # how long a stage may wait for a message before the run fails


@dataclass(frozen=True)
class ClappingRow:
    regime: str  # finetune | from_scratch
    method: str  # experiment method: none, none_lazy, direct, ef21, aqsgd, clapping_fc, clapping_fu
    compressor: str  # 'identity' (the none rows), 'C' for both directions, or 'F/B'
    p: float  # lazy-sampling probability
    tied: str = "identity"  # the tied embedding/head gradient sum's compressor (identity: exact)

    @property
    def strategy_method(self) -> str:
        return "none" if self.method == "none_lazy" else self.method

    @property
    def key(self) -> str:
        comp = (
            self.compressor.replace("(", "")
            .replace(")", "")
            .replace(",", "-")
            .replace("=", "")
            .replace("/", "+")
        )
        tied = (
            ""
            if self.tied == "identity"
            else "-tied" + self.tied.replace("(", "").replace(")", "").replace(",", "-")
        )
        return f"{self.regime}-{self.method}-{comp}-p{self.p:g}{tied.replace('=', '')}"


def plan_rows(settings: ClappingSettings) -> list[ClappingRow]:
    rows: list[ClappingRow] = []
    for regime in settings.regimes:
        grid = settings.grid(regime)
        for method in grid.methods:
            if method == "none":
                rows.append(ClappingRow(regime, "none", "identity", 1.0))
            elif method == "none_lazy":
                rows.append(ClappingRow(regime, "none_lazy", "identity", float(settings.lazy_p)))
            elif method in ("direct", "ef21", "aqsgd"):
                rows += [ClappingRow(regime, method, c, 1.0) for c in grid.compressors]
            else:
                rows += [
                    ClappingRow(regime, method, c, float(p))
                    for c in grid.compressors
                    for p in grid.clapping_p
                ]
    return [replace(row, tied=tied) for row in rows for tied in settings.grid(row.regime).tied_compressors]


def finetune_data(settings: ClappingSettings, subset: str) -> dict[str, Any]:
    """The data overrides of the base (``pretrain``) and of the fine-tune rows (``finetune``): the
    plays held back from pretraining, or a prepared folder of their own (the base then trains on
    the model config's data as it is)."""
    if settings.finetune_data:
        if subset != "finetune":
            return {}
        return {
            "data.corpus": "prepared",
            "data.prepared_dir": settings.finetune_data,
            "data.max_train_blocks": settings.finetune_blocks,
        }
    data: dict[str, Any] = {
        "data.finetune_documents": list(settings.finetune_documents),
        "data.train_subset": subset,
    }
    if subset == "finetune":
        data["data.max_train_blocks"] = settings.finetune_blocks
    return data


def base_spec(settings: ClappingSettings, out: Path) -> RunSpec:
    """The base model: the model config pretrained once on the plays minus the fine-tune ones. Its
    name carries its fingerprint, so the rows that start from its checkpoint change with it."""
    spec = RunSpec.make(
        "base",
        out / "base",
        settings.model,
        0,
        settings.base_steps,
        settings.base_eval_every,
        {**finetune_data(settings, "pretrain"), "trainer.limit_val_batches": settings.val_batches},
        save_checkpoint=True,
        label="base (pretraining, one process, exact)",
    )
    return replace(spec, name=f"base-{spec.fingerprint()}")


def run_spec(
    row: ClappingRow, seed: int, settings: ClappingSettings, runs_dir: Path, base: RunSpec | None
) -> RunSpec:
    """One (row, seed) run: the model config at K stages with the row's method and compressors."""
    grid = settings.grid(row.regime)
    fwd, bwd = split_compressor(row.compressor)
    pipeline = dict(
        micro_batches=settings.micro_batches,
        schedule=settings.schedule,
        method=row.strategy_method,
        fwd_compressor=fwd,
        bwd_compressor=bwd,
        p=row.p,
        placement=settings.placement,  # one for every row: the grid compares methods, not placements
        **({} if row.tied == "identity" else {"tied_compressor": row.tied}),
        warmup_epochs=settings.warmup_epochs,
        timeout_s=TIMEOUT_S,
    )
    overrides: dict[str, Any] = {"trainer.limit_val_batches": settings.val_batches}
    if row.regime == "finetune":
        overrides.update(finetune_data(settings, "finetune"))
        overrides.update(
            {
                "model.optim.lr": settings.finetune_lr,
                "model.optim.warmup_steps": settings.finetune_warmup_steps,
            }
        )
        if (
            base is not None
        ):  # without a base run, the model config is a pretrained model: the rows start from it
            overrides["model.init_checkpoint"] = str(checkpoint_path(base))
    name = f"{row.key}-s{seed}"
    return RunSpec.make(
        name,
        runs_dir,
        settings.model,
        seed,
        grid.steps,
        grid.eval_every,
        overrides,
        pipeline,
        stages=settings.stages,
        label=name,
    )


def grid(
    settings: ClappingSettings, runs_dir: Path, base: RunSpec | None
) -> list[tuple[ClappingRow, RunSpec]]:
    return [
        (row, run_spec(row, seed, settings, runs_dir, base))
        for row in plan_rows(settings)
        for seed in settings.seeds
    ]


def clapping_data_use(
    settings: ClappingSettings, base, jobs, cache_dir: str | None = None, strict: bool = True
):
    """[(limit, uses)]: the base and from-scratch rows against max_epochs_over_data, the fine-tune rows
    against finetune_max_epochs_over_data."""
    what = f"clapping {settings.scale}"
    tune = [spec for row, spec in jobs if row.regime == "finetune"]
    rest = ([base] if base else []) + [spec for row, spec in jobs if row.regime != "finetune"]
    out = []
    for limit, specs in (
        (settings.max_epochs_over_data, rest),
        (settings.finetune_max_epochs_over_data, tune),
    ):
        if specs:
            out.append((limit, check_data_use(specs, limit, what, cache_dir, strict)))
    return out
