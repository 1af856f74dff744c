"""Measured wall-clock time on real shaped links, against the physical limit. The pipeline's K
ranks run each in a network namespace of its own (``links.py``: a node's uplink is tc-shaped, so
every message between stages crosses a shaped link), started as srun or torchrun would start them
(no launcher, ``--trainer.num_nodes`` = K), for each run of ``link_runs`` at each rate and K.

Per row, next to the step time:
- the limit: the busiest resource's time per step, the larger of the busiest uplink (the bytes a
  rank sends per step: its boundary messages and its tied-gradient sums, x 8 / rate) and the
  compute (``none`` on unshaped links, the same K and schedule), and the fraction of it reached;
- the limit with the schedule's fill: plus one micro-batch's message on a link and one
  micro-batch's compute (nothing overlaps the first forward's message or the last backward's);
- the serial (Amdahl) bound of the speed-up over ``none``: compute + link time in series, only
  the link time shrinking by the run's compression ratio (the bound the suite reported before).

    python -m repro.experiments.bench.link_section '<json: one run>'   # what each rank runs
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from repro.experiments.kit.links import Links

from .measure import pairwise, row
from .pipelines import _mean_step_s, _read_ranks
from .settings import BenchSettings, NetworkRun


def rank_main(spec: dict[str, Any]) -> None:
    """One rank of a run (its namespace and environment set by the caller)."""
    import torch

    from repro.lit import GPTLightningModule
    from repro.runs.build import make_trainer

    from .pipelines import _RankReport, run_strategy
    from .settings import load_settings
    from .workload import OPTIM, gpt_config, loader

    s = load_settings(spec["settings"])
    run = NetworkRun(**spec["run"])
    steps = s.pipe_warmup_steps + s.link_timed_steps
    torch.manual_seed(0)
    module = GPTLightningModule(gpt_config(s, tie_embeddings=not run.untied), OPTIM)
    # popen: the processes exist, it launches nothing; AQ-SGD timed compressed (after its exact warm-up epoch)
    strategy = run_strategy(
        s, run, "popen", timeout_s=600, warmup_epochs=0, tied_compressor=run.tied_compressor,
        schedule=run.schedule or s.link_schedule, micro_batches=run.micro_batches or s.link_micro_batches,
    )  # fmt: skip
    trainer = make_trainer(
        steps=steps,
        devices=1,
        num_nodes=spec["stages"],
        strategy=strategy,
        callbacks=[_RankReport(Path(spec["folder"]), 1)],
    )
    trainer.fit(module, train_dataloaders=loader(s, steps))


def uplink_bytes(metrics: dict[str, float], k: int) -> list[float]:
    """Bytes each rank sent over the whole run (its uplink): forward messages of its boundary,
    backward messages of the boundary before it, its tied-gradient sums."""
    total = metrics.get
    return [
        total(f"pipe/bytes_total/b{r}_fwd", 0.0) + total(f"pipe/bytes_total/b{r - 1}_bwd", 0.0)
        + total(f"pipe/bytes_total/tied{r}", 0.0)
        for r in range(k)
    ]  # fmt: skip


def linked_run(s: BenchSettings, run: NetworkRun, links: Links, port: int) -> dict[str, Any]:
    """Step time and bytes of one run with rank i in node i of ``links``."""
    k = links.nodes
    with tempfile.TemporaryDirectory(prefix="repro-bench-link-") as tmp:
        spec = {"settings": s.path or s.preset, "run": run.__dict__, "stages": k, "folder": tmp}
        procs = []
        for rank in range(k):
            env = [
                f"MASTER_ADDR={links.address(0)}", f"MASTER_PORT={port}", f"NODE_RANK={rank}", "LOCAL_RANK=0",
                f"WORLD_SIZE={k}", "OMP_NUM_THREADS=1",
            ]  # fmt: skip
            cmd = [*links.exec_args(rank), *env, sys.executable, "-m", __name__, json.dumps(spec)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        errors = [p.communicate(timeout=1800)[1] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(f"link run {run.label} failed: {errors[0][-1500:]}")
        ranks = _read_ranks(Path(tmp), k)
    metrics = ranks[0]["metrics"]
    steps = s.pipe_warmup_steps + s.link_timed_steps
    return {
        "step_s": _mean_step_s(ranks[0]["times"], s.pipe_warmup_steps),
        "bytes_per_step": metrics["pipe/bytes_total"] / steps,
        "uplink_bytes_per_step": [b / steps for b in uplink_bytes(metrics, k)],
        "compression_ratio": metrics["pipe/compression_ratio"],
    }


def _reference(s: BenchSettings, run: NetworkRun) -> NetworkRun:
    """``none`` with the run's schedule, micro-batches and head (tied or its own): its compute on
    unshaped links is the run's."""
    return NetworkRun("none", untied=run.untied, schedule=run.schedule, micro_batches=run.micro_batches)


def bench_link(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    port = 29700
    measured: dict[tuple[int, float | None, str], list[dict[str, Any]]] = {}
    references = list(dict.fromkeys(_reference(s, run) for run in s.link_runs))
    for k in s.link_stages:
        for rate in (None, *s.link_rates_mbit):
            runs = references if rate is None else list(s.link_runs)
            with Links(k, rate) as links:
                for r in range(s.network_repeats):
                    for run in runs:
                        where = "unshaped links" if rate is None else f"{rate:g} Mbit/s links"
                        progress(
                            f"link: {run.label} on {where}, K={k} namespaces, repeat {r + 1} of {s.network_repeats}"
                        )
                        port += 1
                        measured.setdefault((k, rate, run.label), []).append(linked_run(s, run, links, port))
    rows = []
    for k in s.link_stages:
        for rate in s.link_rates_mbit:
            rows += _rows(s, k, rate, measured)
    return rows


def _rows(s: BenchSettings, k: int, rate: float, measured: dict) -> list[dict[str, Any]]:
    base = s.link_runs[0]
    ref = [x["step_s"] for x in measured[(k, rate, base.label)]]
    out = []
    for run in s.link_runs:
        res = measured[(k, rate, run.label)]
        step = [x["step_s"] for x in res]
        compute = statistics.median(x["step_s"] for x in measured[(k, None, _reference(s, run).label)])
        uplink = max(res[0]["uplink_bytes_per_step"])
        link_s = uplink * 8 / (rate * 1e6)
        limit = max(link_s, compute)
        m = run.micro_batches or s.link_micro_batches
        message_s = (
            max(res[0]["uplink_bytes_per_step"]) * 8 / (rate * 1e6) / (2 * m)
        )  # one of a rank's messages
        fill = message_s + compute / m
        compute_none = statistics.median(x["step_s"] for x in measured[(k, None, _reference(s, base).label)])
        link_none = [t - compute_none for t in ref]
        ratio = res[0]["compression_ratio"]
        bound = [t / (compute_none + ratio * max(ls, 0.0)) for t, ls in zip(ref, link_none)]
        is_ref = run == base
        name = f"{run.label} @ {rate:g} Mbit/s (shaped veth, K={k} namespaces)"
        ref_name = f"{base.label} @ {rate:g} Mbit/s (shaped veth, K={k} namespaces)"
        out.append(
            row(
                "link", name, "step time", "s/step", step,
                reference=None if is_ref else ref_name,
                ratios=None if is_ref else pairwise(ref, step),
                ratio_meaning=None if is_ref else "measured speed-up over none on the same shaped links "
                "(step time of none / this)",
                extra={
                    "rate_mbit": rate,
                    "stages": k,
                    "micro_batches": m,
                    "schedule": run.schedule or s.link_schedule,
                    "compression_ratio": ratio,
                    "bytes_per_step": res[0]["bytes_per_step"],
                    "uplink_bytes_per_step": res[0]["uplink_bytes_per_step"],
                    "achieved_mbit": uplink * 8 / statistics.median(step) / 1e6,
                    "link_s_per_step": link_s,
                    "compute_s_per_step": compute,
                    "limit_s": limit,
                    "fraction_of_limit": limit / statistics.median(step),
                    "fill_s": fill,
                    "fraction_of_limit_with_fill": (limit + fill) / statistics.median(step),
                    "link_s_per_step_of_none": statistics.median(link_none),
                    "speedup_bound_amdahl": statistics.median(bound),
                },
            )
        )  # fmt: skip
    return out


if __name__ == "__main__":
    rank_main(json.loads(sys.argv[1]))
