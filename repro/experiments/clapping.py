"""``make reproduce-clapping``: the Clapping experiments (spec section 7).

Every row of the grid (method x compressor x p) is trained for every seed through the
``clapping`` strategy at K stages on K processes (fork launcher, gloo). A run writes its result
JSON (atomically) when it ends; a second call reuses every finished run whose fingerprint
matches and trains only what is missing. The memory figure's points are measured by allocating
the buffers each method keeps, for every dataset size N of the settings. The table is written
last, md, csv and then json.

    repro clapping --scale cpu [--seeds 0 1] [--out results/clapping]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from repro.files import read_json, write_json_atomic
from repro.run_config import RunConfig, load_run_config

from .clapping_settings import ClappingSettings, load_clapping_settings, settings_path


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
            rows += [ClappingRow(method, c, float(p)) for c in settings.compressors for p in settings.clapping_p]
    return rows


def fingerprint(row: ClappingRow, seed: int, settings: ClappingSettings, config: RunConfig) -> str:
    payload = {
        "row": [row.method, row.compressor, row.p], "seed": seed, "steps": settings.steps,
        "eval_every": settings.eval_every, "val_batches": settings.val_batches, "stages": settings.stages,
        "micro_batches": settings.micro_batches, "schedule": settings.schedule, "warmup": settings.warmup_epochs,
        "model": config.raw,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_commit() -> str:
    from .table1 import git_commit as commit

    return commit()


# ------------------------------------------------------------------------------------------- one run
def _result_writer(path: Path, meta: dict[str, Any]):
    import lightning as L

    class ResultWriter(L.Callback):
        """Rank 0 writes the run's result when training ends."""

        def on_train_end(self, trainer, pl_module) -> None:
            strategy = trainer.strategy
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
            k = strategy.num_stages
            totals = strategy.totals
            sent = [totals.get(f"bytes/b{r}_fwd", 0.0) + totals.get(f"bytes/b{r - 1}_bwd", 0.0) for r in range(k)]
            if trainer.global_rank != 0:
                return
            write_json_atomic(path, {
                **meta,
                "final_val_loss": metrics.get("val/loss"),
                "final_train_loss": metrics.get("train/loss"),
                "bytes_total": totals.get("bytes", 0.0),
                "raw_bytes_total": totals.get("raw_bytes", 0.0),
                "bytes_sent_per_rank": sent,
                "buffer_bytes_per_rank": [metrics.get(f"pipe/buffer_bytes/rank{r}", 0.0) for r in range(k)],
                "fresh_batches": metrics.get("pipe/fresh_batches"),
                "train_wall_s": metrics.get("pipe/wall_s"),
                "steps": trainer.global_step,
            })

    return ResultWriter()


def train_row(row: ClappingRow, seed: int, settings: ClappingSettings, config: RunConfig, datamodule,
              runs_dir: Path) -> dict[str, Any]:
    """Train one (row, seed) run, or reuse its finished result."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    from repro.lit import GPTLightningModule
    from repro.pipeline import ClappingStrategy

    name = f"{row.key}-s{seed}"
    result_path = runs_dir / name / "result.json"
    fp = fingerprint(row, seed, settings, config)
    if result_path.exists():
        try:
            done = read_json(result_path)
            if done.get("fingerprint") == fp:
                return {**done, "reused": True}
        except (OSError, ValueError):
            pass  # a broken result is retrained
    meta = {"name": name, "method": row.method, "compressor": row.compressor, "p": row.p, "seed": seed,
            "fingerprint": fp, "tensorboard_dir": str(runs_dir / name / "tb")}
    L.seed_everything(seed, verbose=False)
    module = GPTLightningModule(config.gpt_config(datamodule.vocab_size), config.optim)
    compressor = row.compressor
    strategy = ClappingStrategy(
        micro_batches=settings.micro_batches, schedule=settings.schedule, method=row.strategy_method,
        fwd_compressor=compressor, bwd_compressor=compressor, p=row.p, sampler_seed=seed,
        warmup_epochs=settings.warmup_epochs, start_method="fork", timeout_s=600,
    )
    trainer = L.Trainer(
        accelerator=settings.accelerator, devices=settings.stages, strategy=strategy, max_steps=settings.steps,
        val_check_interval=settings.eval_every, check_val_every_n_epoch=None, limit_val_batches=settings.val_batches,
        num_sanity_val_steps=0, log_every_n_steps=min(10, settings.eval_every),
        logger=TensorBoardLogger(str(runs_dir / name), name="tb", version=0, default_hp_metric=False),
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        gradient_clip_val=config.trainer.get("gradient_clip_val"),
        callbacks=[_result_writer(result_path, meta)],
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule)
    result = read_json(result_path)
    result["wall_s"] = time.perf_counter() - start
    write_json_atomic(result_path, result)
    return {**result, "reused": False}


# ------------------------------------------------------------------------------------------- memory
def measure_memory(settings: ClappingSettings, config: RunConfig, dataset_size: int) -> list[dict[str, Any]]:
    """The memory figure's points for these settings: every N of ``memory_sizes`` and the run's N."""
    m = settings.micro_batches
    points = buffer_memory_points(sorted({*settings.memory_sizes, dataset_size}), config.block_size,
                                  int(config.gpt["n_embd"]), m, int(config.data.get("batch_size", 16)) // m,
                                  settings.compressors[0])
    for point in points:
        point["is_dataset"] = point["N"] == dataset_size
    return points


def buffer_memory_points(sizes, t: int, d: int, m: int, mb: int, compressor: str) -> list[dict[str, Any]]:
    """Buffer bytes of a middle rank (both ends of its two boundaries, both directions): measured
    by allocating them, and analytical. AQ-SGD keeps N x T x d per forward end (its backward is
    direct, stateless); Clapping keeps M slots of (micro-batch x T x d) per end, whatever N is."""
    from repro.pipeline.compressors import build_compressor
    from repro.pipeline.methods import ChannelCodec, MessageContext
    from repro.pipeline.sample_buffers import SampleBuffers

    comp = build_compressor(compressor)
    points = []
    for n in sorted(set(sizes)):
        for method in ("aqsgd", "clapping_fc"):
            measured = 0
            for direction in ("fwd", "fwd", "bwd", "bwd"):  # a middle rank's four channel ends
                rows = SampleBuffers(n) if method == "aqsgd" and direction == "fwd" else None
                codec = ChannelCodec(method, comp, 0, direction, 0, rows)
                for slot in range(m):
                    ids = torch.arange(slot * mb, (slot + 1) * mb) % n
                    codec.encode(torch.randn(mb, t, d), slot, MessageContext(0, True, True, ids))
                measured += codec.buffer_nbytes
                if rows is not None:
                    rows.rows = None  # release before the next size
            analytic = 2 * n * t * d * 4 if method == "aqsgd" else 4 * m * mb * t * d * 4
            points.append({"method": method, "N": n, "measured_bytes": measured, "analytical_bytes": analytic})
    return points


# ------------------------------------------------------------------------------------------- orchestration
def _progress(i: int, n: int, name: str, result: dict, start: float, trained_s: list[float], quiet: bool) -> None:
    if quiet:
        return
    elapsed = time.perf_counter() - start
    tag = "reused" if result.get("reused") else f"{result.get('wall_s', 0.0):.0f} s"
    left = ""
    if trained_s:
        left = f", about {(n - i) * (sum(trained_s) / len(trained_s)) / 60:.1f} min left"
    print(f"[clapping] run {i} of {n}: {name} ({tag}; loss {result.get('final_val_loss', float('nan')):.4f}); "
          f"elapsed {elapsed / 60:.1f} min{left}", file=sys.stderr, flush=True)


def model_config_path(settings: ClappingSettings) -> Path:
    """The settings' model config, relative to the working folder or else to the repository."""
    path = Path(settings.model)
    if path.exists() or path.is_absolute():
        return path
    beside = Path(__file__).resolve().parents[2] / settings.model
    return beside if beside.exists() else path


def run_clapping(settings: ClappingSettings, out: Path, seeds: tuple[int, ...] | None = None,
                 quiet: bool = False, cache_dir: str | None = None) -> dict[str, Any]:
    from .clapping_report import build_report, write_report
    from .interrupts import remember_interrupts, stop_if_interrupted
    from .table1 import check_accelerator

    check_accelerator(settings.accelerator)
    seeds = tuple(seeds) if seeds else settings.seeds
    config = load_run_config(model_config_path(settings))
    data_args = dict(config.data)
    data_args.setdefault("cache_dir", ".cache/repro")
    if cache_dir is not None:
        data_args["cache_dir"] = cache_dir
    from repro.data import TextDataModule

    datamodule = TextDataModule(**data_args)
    datamodule.setup()
    dataset_size = len(datamodule.train_set)
    batch = datamodule.batch_size
    if batch % settings.micro_batches:
        raise ValueError(f"clapping settings: micro_batches={settings.micro_batches} does not divide the model "
                         f"config's data.batch_size={batch}")
    runs_dir = out / "runs"
    rows = plan_rows(settings)
    jobs = [(row, seed) for row in rows for seed in seeds]
    start = time.perf_counter()
    trained_s: list[float] = []
    results = []
    if not quiet:
        print(f"[clapping] {settings.scale}: {len(rows)} rows x {len(seeds)} seeds = {len(jobs)} runs of "
              f"{settings.steps} steps at K={settings.stages} (N={dataset_size} training samples)", file=sys.stderr)
    with remember_interrupts():
        for i, (row, seed) in enumerate(jobs, 1):
            stop_if_interrupted()  # a Ctrl-C lost during a fork still ends the reproduction here
            result = train_row(row, seed, settings, config, datamodule, runs_dir)
            if not result.get("reused"):
                trained_s.append(float(result.get("wall_s", 0.0)))
            results.append(result)
            _progress(i, len(jobs), result["name"], result, start, trained_s, quiet)
        stop_if_interrupted()
    memory = measure_memory(settings, config, dataset_size)
    report = build_report(settings, results, memory, seeds=seeds, dataset_size=dataset_size,
                          wall_s=time.perf_counter() - start, trained_runs=len(trained_s),
                          commit=git_commit(), config=config)
    write_report(report, out)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="repro clapping", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default=None, help="smoke | cpu | paper (the shipped settings)")
    parser.add_argument("--settings", default=None, help="a settings YAML instead of --scale")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="override the settings' seeds")
    parser.add_argument("--out", default="results/clapping", help="results directory")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if bool(args.scale) == bool(args.settings):
        parser.error("give exactly one of --scale or --settings")
    try:
        settings = load_clapping_settings(settings_path(args.scale or args.settings))
        if args.seeds is not None and (len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0):
            raise ValueError(f"--seeds {args.seeds}: give distinct non-negative integers")
        report = run_clapping(settings, Path(args.out), tuple(args.seeds) if args.seeds else None, args.quiet)
    except (ValueError, FileNotFoundError) as exc:
        print(f"repro clapping: error: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / "clapping_table.md").read_text())
    print(f"[clapping] {report['trained_runs']} runs trained, {report['total_runs'] - report['trained_runs']} reused; "
          f"{report['wall_s'] / 60:.1f} min", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
