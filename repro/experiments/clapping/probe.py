"""``repro clapping --probe``: how much seed noise the fine-tune rows carry at a given fine-tune
length and dataset size N, and what the seeds could resolve there: the numbers the fine-tune
regime is sized by (the Clapping counterpart of ``repro table1 --probe``).

For each (steps, N) pair, a few fine-tune rows (``none`` and the ``--probe_methods``, at the grid's
first compressor or ``--probe_compressor``, and for the Clapping methods at the grid's first p)
are trained for every seed from the same base model as the table, one evaluation at the end. Per
pair: ``none``'s mean and seed std, and for every other row the paired difference to ``none``
(mean, std of the differences, p); then, from the pooled std of the paired differences, the
seeds a paired t-test needs to detect each target difference with 80 % power at alpha and at
Holm's strictest level (alpha / m, m the rows the fine-tune table compares with ``none``). N
defaults to the settings' N scaled with the steps, so every pair passes over its data as many
times as the table's rows do. At the table's own (steps, N) the probe's runs are the table's
(written to ``<out>/runs``), so a probe at that length costs the table nothing.

    repro clapping --scale cpu --probe --probe_steps 80 320 --probe_compressor 'quant(4)/quant(8)'
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from repro.experiments.kit.probe_report import probe_table
from repro.files import write_report
from repro.runs import Progress, train_all
from repro.runs.model_config import load_model_config
from repro.runs.provenance import provenance_header
from repro.stats import probe_noise

from .plan import base_spec, clapping_data_use, grid, plan_rows
from .settings import EXPERIMENT_METHODS, ClappingSettings

PROBE_METHODS = ("direct", "clapping_fc")  # compared with none
TARGETS = (0.01, 0.02)  # nats: the differences the sizing asks about (0.02: the settings' minimal loss)


def probe_lengths(
    settings: ClappingSettings, steps: list[int], blocks: list[int] | None
) -> list[tuple[int, int]]:
    """The (steps, N) pairs: ``blocks`` one per step count, or N scaled with the steps."""
    if not steps or any(s <= 0 for s in steps):
        raise ValueError(f"--probe_steps {steps}: positive step counts")
    if blocks is None:
        if settings.finetune_blocks is None:
            raise ValueError(
                "--probe_blocks: give N per step count (the settings' finetune_blocks is null: all)"
            )
        ratio = settings.finetune_blocks / settings.finetune.steps
        return [(n, max(1, round(n * ratio))) for n in steps]
    if len(blocks) != len(steps) or any(b <= 0 for b in blocks):
        raise ValueError(f"--probe_blocks {blocks}: one positive N per --probe_steps value ({steps})")
    return list(zip(steps, blocks))


def probe(
    settings: ClappingSettings,
    out: Path,
    steps: list[int],
    blocks: list[int] | None = None,
    methods: tuple[str, ...] = PROBE_METHODS,
    cache_dir: str | None = None,
    quiet: bool = False,
    compressor: str | None = None,
) -> dict[str, Any]:
    bad = [m for m in methods if m not in EXPERIMENT_METHODS or m == "none"]
    if bad or not methods:
        raise ValueError(
            f"--probe_methods {list(methods)}: methods compared with none, from {EXPERIMENT_METHODS[1:]}"
        )
    if "finetune" not in settings.regimes:
        raise ValueError(
            f"clapping settings {settings.path!r}: regimes={list(settings.regimes)}: the probe "
            "measures the finetune regime"
        )
    lengths = probe_lengths(settings, steps, blocks)
    config = load_model_config(settings.model)
    base = None if config.is_pretrained else base_spec(settings, out)
    grid_of = settings.finetune
    compressor, p = compressor or grid_of.compressors[0], grid_of.clapping_p[0]
    holm_rows = len(plan_rows(replace(settings, regimes=("finetune",)))) - 1
    jobs: dict[tuple[int, int], list] = {}
    for n, size in lengths:
        tuned = replace(
            settings,
            regimes=("finetune",),
            finetune=replace(
                grid_of,
                steps=n,
                eval_every=n,
                methods=("none", *methods),
                compressors=(compressor,),
                clapping_p=(p,),
                tied_compressors=("identity",),
            ),
            finetune_blocks=size,
        )
        # at the table's own length the probe's runs are the table's (the same specs): trained once
        same = (n, size) == (grid_of.steps, settings.finetune_blocks)
        jobs[(n, size)] = grid(tuned, out / "runs" if same else out / "probe" / f"steps{n}-N{size}", base)
    for n, size in lengths:
        clapping_data_use(settings, None, jobs[(n, size)], cache_dir)
    specs = [spec for rows in jobs.values() for _, spec in rows]
    progress = Progress(
        "clapping probe", len(specs) + (1 if base else 0), sum(s.steps for s in specs), 1, quiet
    )
    results = train_all([base], settings.accelerator, 1, cache_dir, progress) if base else {}
    results.update(train_all(specs, settings.accelerator, 1, cache_dir, progress))
    probes = []
    for (n, size), rows in jobs.items():
        loss: dict[str, list[float]] = {}
        wall = []
        for row, spec in rows:
            result = results[spec.key]
            loss.setdefault(row.method, []).append(result.final_val_loss)
            wall.append(result.wall_s)
        none = loss["none"]
        probes.append(
            {
                "steps": n,
                "N": size,
                "epochs": n * config.batch_size / size,
                "seeds": list(settings.seeds),
                "none_mean": statistics.fmean(none),
                "none_std": statistics.stdev(none) if len(none) > 1 else None,
                "losses": loss,
                **probe_noise(loss, "none", TARGETS, holm_rows),
                "run_wall_s": statistics.fmean(wall),
            }
        )
    doc = {
        "scale": settings.scale,
        **provenance_header(),
        "compressor": compressor,
        "p": p,
        "holm_rows": holm_rows,
        "probes": probes,
    }
    write_report(out, "probe", doc, probe_markdown(doc))
    return doc


def probe_markdown(doc: dict[str, Any]) -> str:
    prefix = (
        f"Fine-tune noise probe, scale {doc['scale']}, commit {doc['git_commit'][:7]}, compressor "
        f"{doc['compressor']} (Clapping p {doc['p']:g})"
    )
    return probe_table(
        prefix,
        "none",
        doc,
        ["steps", "N", "epochs", "none val loss"],
        lambda p: [
            str(p["steps"]),
            str(p["N"]),
            f"{p['epochs']:.1f}",
            f"{p['none_mean']:.4f} +- {p['none_std'] or 0:.4f}",
        ],
        TARGETS,
    )
