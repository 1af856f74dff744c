"""``make reproduce-clapping``: the Clapping experiments (PROTOCOL.md §C7).

Every row of the grid (method x compressor x p) is trained for every seed through the
``clapping`` strategy at K stages on K processes (fork launcher, gloo), as runs of the engine: a
run writes its result JSON (atomically) when it ends, and a second call reuses every finished run
whose fingerprint matches and trains only what is missing. The memory figure's points are
measured by allocating the buffers each method keeps, for every dataset size N of the settings.
The table is written last, md, csv and then json.

    repro clapping --scale cpu [--seeds 0 1] [--out results/clapping]
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from repro.arguments import NonNegativeInt, PositiveFloat, PositiveInt, documented_by, fields_help
from repro.data.tokenizer import tokenizer_digest
from repro.experiments.kit.compute_plan import planned_runs, print_plan
from repro.experiments.kit.data_use import data_lines
from repro.experiments.kit.links import LinkError, check_links_possible
from repro.experiments.kit.scale_args import ScaleOptions, settings_file
from repro.pipeline.memory import buffer_memory_points
from repro.runs import Progress, RunResult, check_accelerator, train_all
from repro.runs.model_config import load_model_config
from repro.runs.provenance import display_path
from repro.runs.shards import Shard, gather
from repro.stop import interrupted_line, remember_interrupts, stop_if_interrupted

from .link_times import measure_link_times
from .plan import ClappingRow, base_spec, clapping_data_use, finetune_data, grid, plan_rows
from .probe import PROBE_METHODS, probe_markdown
from .probe import probe as noise_probe
from .quantizer_error import quantizer_error_table
from .report import build_report, write_report
from .settings import SCALES, ClappingSettings, load_clapping_settings, settings_path, split_compressor


def run_record(row: ClappingRow, result: RunResult, runs_dir: Path) -> dict[str, Any]:
    """One run as a flat record of the table's json (what the figures read)."""
    summary = result.pipeline or {}
    return {
        "name": result.name,
        "regime": row.regime,
        "method": row.method,
        "compressor": row.compressor,
        "p": row.p,
        "tied_compressor": row.tied,
        "seed": result.seed,
        "fingerprint": result.fingerprint,
        "final_val_loss": result.final_val_loss,
        "final_train_loss": result.metrics.get("train/loss"),
        "steps": result.global_step,
        "val_curve": [list(point) for point in result.val_curve],
        "val_bytes": list(result.val_bytes or []),
        "bytes_total": summary.get("bytes_total", 0.0),
        "raw_bytes_total": summary.get("raw_bytes_total", 0.0),
        "tied_bytes_total": list(
            summary.get("tied_bytes_total", (0.0, 0.0))
        ),  # sent, exact; within the totals
        "bytes_sent_per_rank": summary.get("bytes_sent_per_rank", []),
        "buffer_bytes_per_rank": summary.get("buffer_bytes_per_rank", []),
        "fresh_batches": summary.get("fresh_batches"),
        "train_wall_s": summary.get("train_wall_s"),
        "wall_s": result.wall_s,
        "reused": result.reused,
        "tensorboard_dir": str(runs_dir / "tb" / result.name),
    }


def measure_memory(
    settings: ClappingSettings, dataset_size: int, block_size: int, d_model: int, batch_size: int
) -> list[dict[str, Any]]:
    """The memory figure's points for these settings: every N of ``memory_sizes`` and the run's N."""
    m = settings.micro_batches
    compressor = split_compressor(settings.grid(settings.regimes[0]).compressors[0])[0]
    points = buffer_memory_points(
        sorted({*settings.memory_sizes, dataset_size}), block_size, d_model, m, batch_size // m, compressor
    )
    return [{**asdict(p), "is_dataset": dataset_size == p.N} for p in points]


def run_clapping(
    settings: ClappingSettings,
    out: Path,
    cache_dir: str | None = None,
    quiet: bool = False,
    shard: Shard | None = None,
    runs_per_gpu: int = 1,
) -> dict[str, Any] | None:
    """Train (or reuse) every run and write the table; returns the report, or None for a shard
    whose peers are not done (the last shard to finish writes the table)."""
    check_accelerator(settings.accelerator)
    config = load_model_config(settings.model)
    config.check_trainable_by_experiment("clapping model")
    cache = {"cache_dir": cache_dir} if cache_dir else {}
    sizes, finetune_batch, tokenizers = {}, None, {}
    for regime in settings.regimes:  # the tokenizer and token caches, once; the sizes N
        data = finetune_data(settings, "finetune") if regime == "finetune" else {}
        dm = config.datamodule(**{k.removeprefix("data."): v for k, v in data.items()}, **cache)
        dm.setup()
        sizes[regime] = len(dm.train_set)
        tokenizers[regime] = tokenizer_digest(dm.text_tokenizer)
        if dm.batch_size % settings.micro_batches:
            raise ValueError(
                f"clapping settings: micro_batches={settings.micro_batches} does not divide the model "
                f"config's data.batch_size={dm.batch_size}"
            )
        if regime == "finetune":
            finetune_batch = next(iter(dm.train_dataloader()))
    if settings.finetune_data and "finetune" in settings.regimes and not config.is_pretrained:
        base_dm = config.datamodule(**cache)
        if tokenizer_digest(base_dm.text_tokenizer) != tokenizers["finetune"]:
            raise ValueError(
                f"clapping settings: finetune_data={settings.finetune_data!r} was prepared with another tokenizer "
                f"than the base's data; prepare it with --tokenizer <the base's prepared folder>/tokenizer.json"
            )
    if settings.link_steps:  # before any training: the measured link column needs root
        try:
            check_links_possible()
        except LinkError as exc:
            raise ValueError(f"link_steps={settings.link_steps}: {exc}") from None
    runs_dir = out / "runs"
    base = base_spec(settings, out) if "finetune" in settings.regimes and not config.is_pretrained else None
    jobs = grid(settings, runs_dir, base)
    clapping_data_use(settings, base, jobs, cache_dir)  # no run may pass over its data more than its limit
    start = time.perf_counter()
    specs = ([base] if base else []) + [s for _, s in jobs]
    mine = shard.select(specs) if shard else specs
    progress = Progress(
        f"clapping {shard}" if shard else "clapping", len(mine), sum(s.steps for s in mine), 1, quiet
    )
    progress.note(
        f"scale {settings.scale}: {len(jobs)} runs at K={settings.stages} ({', '.join(settings.regimes)}; "
        f"N = {', '.join(f'{r} {n}' for r, n in sizes.items())})"
        + (f"; this shard ({shard}) trains {len(mine)}" if shard else "")
        + ("; the base model first" if base else "")
    )
    train = partial(
        train_all,
        accelerator=settings.accelerator,
        cache_dir=cache_dir,
        progress=progress,
        runs_per_gpu=runs_per_gpu,
    )
    with remember_interrupts():
        results = {}
        if base:  # every row starts from the base model: a shard waits for the shard that trains it
            results = gather([base], train([base] if base in mine else []), shard, progress.note, wait=True)
        results.update(train([s for s in mine if s != base]))
        stop_if_interrupted()
    results = gather(specs, results, shard, progress.note)
    if results is None:
        return None
    records = [run_record(row, results[spec.key], runs_dir) for row, spec in jobs]
    base_record = quantizer_errors = None
    if base:
        base_result = results[base.key]
        base_record = {
            "name": base.name,
            "checkpoint": base_result.checkpoint,
            "steps": base.steps,
            "final_val_loss": base_result.final_val_loss,
            "wall_s": base_result.wall_s,
        }
        quantizer_errors = quantizer_error_table(
            base_result.checkpoint,
            finetune_batch,
            settings.stages,
            settings.micro_batches,
            settings.quant_error_bits,
        )
    link = (
        measure_link_times(settings, plan_rows(settings), out, progress.note) if settings.link_steps else None
    )
    first = settings.regimes[0]
    memory = measure_memory(settings, sizes[first], config.block_size, config.hidden_size, config.batch_size)
    report = build_report(
        settings,
        records,
        memory,
        quantizer_errors,
        dataset_sizes=sizes,
        wall_s=time.perf_counter() - start,
        trained_runs=progress.trained,
        model_config=display_path(config.path),
        base=base_record,
        link_times=link,
    )
    write_report(report, out)
    return report


def print_clapping_plan(settings: ClappingSettings, out: Path, step_time: float | None) -> None:
    """The runs (the base, then the grid: K GPUs each), steps, tokens and GPU-hours, without training."""
    pretrained = load_model_config(settings.model).is_pretrained  # the base is the pretrained model itself
    base = base_spec(settings, out) if "finetune" in settings.regimes and not pretrained else None
    jobs = [spec for _, spec in grid(settings, out / "runs", base)]
    runs = (planned_runs([base], 1) if base else []) + [
        replace(r, gpus=settings.stages) for r in planned_runs(jobs, 2)
    ]
    print_plan(f"clapping {settings.scale}", runs, str(settings.model), settings.accelerator, step_time)
    for limit, uses in clapping_data_use(settings, base, grid(settings, out / "runs", base), strict=False):
        for line in data_lines(uses, limit):
            print(line)


@documented_by(ClappingSettings)
def clapping(
    scale: Literal[SCALES] | None = None,
    settings: Path | None = None,
    seeds: tuple[NonNegativeInt, ...] | None = None,
    accelerator: Literal["cpu", "gpu"] | None = None,
    out: Path = Path("results/clapping"),
    cache_dir: str | None = None,
    quiet: bool = False,
    at_scale: ScaleOptions = ScaleOptions(),
    probe: bool = False,
    probe_steps: tuple[PositiveInt, ...] | None = None,
    probe_blocks: tuple[PositiveInt, ...] | None = None,
    probe_methods: tuple[str, ...] = PROBE_METHODS,
    probe_compressor: str | None = None,
    link_steps: NonNegativeInt | None = None,
    link_repeats: PositiveInt | None = None,
    bandwidth_mbps: PositiveFloat | None = None,
) -> int:
    """Clapping's grid: pipeline-parallel training with compressed activations and gradients
    between stages (make reproduce-clapping).

    Args:
        scale: which shipped settings: paper_configs/experiments/clapping/<scale>.yaml (default cpu)
        settings: a settings YAML instead of a shipped scale (not with --scale)
        seeds: the settings' seeds instead
        accelerator: the settings' accelerator instead
        out: results directory
        cache_dir: tokenizer and token cache (default: the config's data.cache_dir)
        quiet: no progress lines
        probe: train only the fine-tune noise probe: none and --probe_methods, every seed, at each
            --probe_steps; prints the seed noise and the seeds a target difference needs (writes
            <out>/probe.{md,json}; the base model is the table's, reused from <out>)
        probe_steps: fine-tune lengths of the probe (default: the settings' fine-tune steps)
        probe_blocks: N (fine-tune training blocks) per --probe_steps value (default: the settings' N
            scaled with the steps, as many epochs as the table's rows)
        probe_methods: rows compared with none
        probe_compressor: the compressor of the probe's rows, C or F/B (default: the fine-tune grid's first)
        link_steps: the settings' link_steps instead
        link_repeats: the settings' link_repeats instead
        bandwidth_mbps: the settings' bandwidth_mbps instead
    """
    path = settings_file(scale, settings, settings_path)
    try:
        chosen = load_clapping_settings(
            path, seeds=tuple(seeds) if seeds else None, accelerator=accelerator, link_steps=link_steps,
            link_repeats=link_repeats, bandwidth_mbps=bandwidth_mbps,
        )  # fmt: skip
        if at_scale.plan:
            print_clapping_plan(chosen, out, at_scale.step_time)
            return 0
        if probe:
            doc = noise_probe(chosen, out, list(probe_steps or [chosen.finetune.steps]), probe_blocks,
                              tuple(probe_methods), cache_dir, quiet, probe_compressor)  # fmt: skip
            print(probe_markdown(doc), end="")
            return 0
        report = run_clapping(
            chosen, out, cache_dir, quiet, Shard.parse(at_scale.shard), at_scale.runs_per_gpu or 1
        )
    except KeyboardInterrupt:
        print(interrupted_line("clapping", out), file=sys.stderr)
        return 130
    if report is not None:
        print((out / "clapping_table.md").read_text())
        trained, total = report["trained_runs"], report["total_runs"]
        print(f"[clapping] {trained} runs trained, {total - trained} reused; {report['wall_s'] / 60:.1f} min",
              file=sys.stderr)  # fmt: skip
    return 0


clapping.epilog = "settings file fields:\n" + fields_help(ClappingSettings)  # type: ignore[attr-defined]
