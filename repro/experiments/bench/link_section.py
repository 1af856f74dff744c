"""Measured wall-clock time on real shaped links, against the physical limit. The pipeline's K
ranks run each in a network namespace of its own (``links.py``: a node's uplink is tc-shaped, so
every message between stages crosses a shaped link), started as srun or torchrun would start them
(no launcher, ``--trainer.num_nodes`` = K), for each run of ``link_runs`` at each rate and K; a run
with ``engine: torch`` is ``torch.distributed.pipelining`` (PipelineStage and its GPipe or 1F1B
schedule, the tied weights' gradient by ``all_reduce``; or its ZBV or DualPipeV schedule, two
chunks a rank, the embedding and the tied head both on rank 0) on the same links and batches.

Everything a row's limit is made of is measured in the run itself, on every rank, over the timed steps:
- the wire: the bytes each rank's interface sent (the kernel's counter of ``eth0``: messages, tied
  sums, collectives, TCP/IP headers and acknowledgements), over the rate, is that uplink's busy
  time; next to it the bytes the strategy counts (``pipe/bytes_total``: messages and tied sums);
- the compute: each rank's CPU time per step (all its threads); with more ranks than cores, the
  cores' share (the ranks' total over the cores) when that is larger;
- the limit is the larger of the busiest uplink and the compute, and the fraction is limit / step
  (1 = the busiest resource never waits); "with the fill" adds one message on a link and one
  micro-batch of compute (nothing overlaps the first forward's message or the last backward's);
- the serial (Amdahl) bound of the speed-up over ``none``: ``none``'s compute + link time in
  series, only the link time shrinking by the run's compression ratio (the bound the suite reported
  before).

    python -m repro.experiments.bench.link_section '<json: one run>'   # what each rank runs
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from repro.experiments.kit.links import Links
from repro.experiments.kit.step_time import per_step, read_ranks

from .measure import pairwise, row
from .settings import TORCH_V_SCHEDULES, BenchSettings, NetworkRun


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
    if run.engine == "torch":
        return torch_rank_main(s, run, spec)
    steps = s.pipe_warmup_steps + s.link_timed_steps
    torch.manual_seed(0)
    module = GPTLightningModule(gpt_config(s, tie_embeddings=not run.untied), OPTIM)
    # popen: the processes exist, it launches nothing; AQ-SGD timed compressed (after its exact warm-up epoch)
    strategy = run_strategy(
        s, run, "popen", timeout_s=600, warmup_epochs=0, tied_compressor=run.tied_compressor,
        schedule=run.schedule or s.link_schedule, micro_batches=run.micro_batches or s.link_micro_batches,
        extra_warmup=run.extra_warmup,
    )  # fmt: skip
    trainer = make_trainer(
        steps=steps,
        devices=1,
        num_nodes=spec["stages"],
        strategy=strategy,
        callbacks=[_RankReport(Path(spec["folder"]), 1)],
    )
    trainer.fit(module, train_dataloaders=loader(s, steps))


def torch_rank_main(s: BenchSettings, run: NetworkRun, spec: dict[str, Any]) -> None:
    """One rank of ``torch.distributed.pipelining`` on the links: the bench GPT cut by the same stage
    adapter as ours, its schedule over M micro-batches, the tied weights' gradient summed by
    ``all_reduce`` between the first and the last stage, AdamW; the same clock as ours."""
    import os

    import torch
    import torch.distributed as dist

    from repro.experiments.kit.step_time import StepClock
    from repro.lit import GPTLightningModule

    from .versus_torch import TorchPipelineRank
    from .workload import OPTIM, gpt_config, loader

    k, rank = spec["stages"], int(os.environ["NODE_RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=k)  # env://: MASTER_ADDR, MASTER_PORT
    try:
        torch.manual_seed(0)
        module = GPTLightningModule(gpt_config(s, tie_embeddings=not run.untied), OPTIM)
        m = run.micro_batches or s.link_micro_batches
        pipe = TorchPipelineRank(module, rank, k, m, run.schedule or s.link_schedule)
        clock = StepClock()
        for batch in loader(s, s.pipe_warmup_steps + s.link_timed_steps):
            pipe.step(batch)
            clock.tick()
        clock.write(spec["folder"], rank, metrics={})
    finally:
        dist.destroy_process_group()


def uplink_bytes(metrics: dict[str, float], k: int) -> list[float]:
    """Bytes each rank sent over the whole run (its uplink): forward messages of its boundary,
    backward messages of the boundary before it (stage 0's: of boundary K - 1, placement 'v'), its
    tied-gradient sums."""
    total = metrics.get
    return [
        total(f"pipe/bytes_total/b{r}_fwd", 0.0) + total(f"pipe/bytes_total/b{(r - 1) % k}_bwd", 0.0)
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
        ranks = read_ranks(Path(tmp), k)
    metrics = ranks[0]["metrics"]
    steps = s.pipe_warmup_steps + s.link_timed_steps
    counted = metrics.get("pipe/bytes_total")  # torch's pipeline counts nothing
    torch_placement = "v" if run.schedule in TORCH_V_SCHEDULES else "linear"
    return {
        "placement": ranks[0].get("placement") or torch_placement,  # ours: as run (auto's choice)
        "step_s": per_step(ranks[0]["times"], s.pipe_warmup_steps),
        "bytes_per_step": None if counted is None else counted / steps,
        "uplink_bytes_per_step": None if counted is None else [b / steps for b in uplink_bytes(metrics, k)],
        "compression_ratio": metrics.get("pipe/compression_ratio", 1.0),
        # the counters' mean increase per timed step, as for the clock
        "wire_bytes_per_step": [per_step(r["tx"], s.pipe_warmup_steps) for r in ranks],
        "cpu_s_per_step": [per_step(r["cpu"], s.pipe_warmup_steps) for r in ranks],
    }


def compute_s(cpu_s_per_step: list[float], cores: int) -> float:
    """The compute a step needs: the busiest rank's CPU time, or the ranks' total spread over the
    cores when there are more ranks than cores (K = 4 on 2 cores)."""
    return max(max(cpu_s_per_step), sum(cpu_s_per_step) / cores)


def bench_link(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    port = 29700
    measured: dict[tuple[int, float, str], list[dict[str, Any]]] = {}
    for k in s.link_stages:
        for rate in s.link_rates_mbit:
            with Links(k, rate) as links:
                for r in range(s.network_repeats):
                    for run in s.link_runs:
                        progress(
                            f"link: {run.label} on {rate:g} Mbit/s links, K={k} namespaces, "
                            f"repeat {r + 1} of {s.network_repeats}"
                        )
                        port += 1
                        measured.setdefault((k, rate, run.label), []).append(linked_run(s, run, links, port))
    rows = []
    for k in s.link_stages:
        for rate in s.link_rates_mbit:
            rows += _rows(s, k, rate, measured)
    return rows


def _median(res: list[dict[str, Any]], key: str) -> Any:
    """The median over repeats of a per-run figure (of each rank's, for a list)."""
    values = [x[key] for x in res]
    if values[0] is None:
        return None
    if isinstance(values[0], list):
        return [statistics.median(v) for v in zip(*values)]
    return statistics.median(values)


def _rows(
    s: BenchSettings, k: int, rate: float, measured: dict, cores: int | None = None
) -> list[dict[str, Any]]:
    cores = cores or os.cpu_count() or 1
    base = s.link_runs[0]
    ref = [x["step_s"] for x in measured[(k, rate, base.label)]]
    ref_res = measured[(k, rate, base.label)]
    compute_none = compute_s(_median(ref_res, "cpu_s_per_step"), cores)
    link_none = [t - compute_none for t in ref]
    out = []
    for run in s.link_runs:
        res = measured[(k, rate, run.label)]
        step = [x["step_s"] for x in res]
        wire = _median(res, "wire_bytes_per_step")
        cpu = _median(res, "cpu_s_per_step")
        compute = compute_s(cpu, cores)
        link_s = max(wire) * 8 / (rate * 1e6)
        limit = max(link_s, compute)
        m = run.micro_batches or s.link_micro_batches
        fill = (
            link_s / (2 * m) + max(cpu) / m
        )  # one of the busiest rank's messages, one micro-batch of compute
        ratio = res[0]["compression_ratio"]
        bound = [t / (compute_none + ratio * max(ls, 0.0)) for t, ls in zip(ref, link_none)]
        is_ref = run == base
        name = f"{run.label} @ {rate:g} Mbit/s (shaped veth, K={k} namespaces)"
        ref_name = f"{base.label} @ {rate:g} Mbit/s (shaped veth, K={k} namespaces)"
        counted = _median(res, "uplink_bytes_per_step")
        median_step = statistics.median(step)
        out.append(
            row(
                "link", name, "step time", "s/step", step,
                reference=None if is_ref else ref_name,
                ratios=None if is_ref else pairwise(ref, step),
                ratio_meaning=None if is_ref else "measured speed-up over none on the same shaped links "
                "(step time of none / this)",
                extra={
                    "engine": run.engine,
                    "placement": res[0].get("placement"),
                    "rate_mbit": rate,
                    "stages": k,
                    "micro_batches": m,
                    "schedule": run.schedule or s.link_schedule,
                    "compression_ratio": ratio,
                    "bytes_per_step": _median(res, "bytes_per_step"),
                    "uplink_bytes_per_step": counted,
                    "wire_bytes_per_step": wire,
                    "wire_over_counted": None if counted is None else max(wire) / max(counted),
                    "achieved_mbit": max(wire) * 8 / median_step / 1e6,
                    "link_s_per_step": link_s,
                    "cpu_s_per_step": cpu,
                    "cores": cores,
                    "compute_s_per_step": compute,
                    "limit_s": limit,
                    "fraction_of_limit": limit / median_step,
                    "fill_s": fill,
                    "fraction_of_limit_with_fill": (limit + fill) / median_step,
                    "link_s_per_step_of_none": statistics.median(link_none),
                    "speedup_bound_amdahl": statistics.median(bound),
                },
            )
        )  # fmt: skip
    return out


if __name__ == "__main__":
    rank_main(json.loads(sys.argv[1]))
