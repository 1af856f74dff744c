"""Measured wall-clock time on real shaped links: the pipeline's K ranks, each in a network
namespace of its own (``links.py``: every boundary message crosses a tc-shaped link), started as
srun or torchrun would start them (no launcher, ``--trainer.num_nodes`` = K), for ``none`` and the
compressed methods at each rate. Next to each measured speed-up over ``none``: its Amdahl bound
from the measured split of ``none``'s step into compute (the same run on unshaped links) and link
time (the rest), with only the link time shrinking by the method's measured compression ratio.

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
    module = GPTLightningModule(gpt_config(s), OPTIM)
    # popen: the processes exist, it launches nothing; AQ-SGD timed compressed (after its exact warm-up epoch)
    strategy = run_strategy(s, run, "popen", timeout_s=600, warmup_epochs=0)
    trainer = make_trainer(
        steps=steps,
        devices=1,
        num_nodes=spec["stages"],
        strategy=strategy,
        callbacks=[_RankReport(Path(spec["folder"]), 1)],
    )
    trainer.fit(module, train_dataloaders=loader(s, steps))


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
        "compression_ratio": metrics["pipe/compression_ratio"],
    }


def bench_link(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    k, base = s.network_stages, s.network_runs[0]
    port = 29700
    measured: dict[tuple[float | None, str], list[dict[str, Any]]] = {}
    for rate in (None, *s.link_rates_mbit):
        runs = [base] if rate is None else list(s.network_runs)
        with Links(k, rate) as links:
            for r in range(s.network_repeats):
                for run in runs:
                    where = "unshaped links" if rate is None else f"{rate:g} Mbit/s links"
                    progress(
                        f"link: {run.label} on {where}, K={k} namespaces, repeat {r + 1} of {s.network_repeats}"
                    )
                    port += 1
                    measured.setdefault((rate, run.label), []).append(linked_run(s, run, links, port))
    compute = [x["step_s"] for x in measured[(None, base.label)]]
    rows = []
    for rate in s.link_rates_mbit:
        ref = [x["step_s"] for x in measured[(rate, base.label)]]
        link_s = [a - c for a, c in zip(ref, compute)]
        for run in s.network_runs:
            res = measured[(rate, run.label)]
            step = [x["step_s"] for x in res]
            ratio = res[0]["compression_ratio"]
            bound = [t / (c + ratio * max(ls, 0.0)) for t, c, ls in zip(ref, compute, link_s)]
            is_ref = run == base
            bytes_per_step = res[0]["bytes_per_step"]
            rows.append(
                row(
                    "link",
                    f"{run.label} @ {rate:g} Mbit/s (shaped veth, K={k} namespaces)",
                    "step time",
                    "s/step",
                    step,
                    reference=None
                    if is_ref
                    else f"{base.label} @ {rate:g} Mbit/s (shaped veth, K={k} namespaces)",
                    ratios=None if is_ref else pairwise(ref, step),
                    ratio_meaning=None
                    if is_ref
                    else "measured speed-up over none on the same shaped links (step time of none / this)",
                    extra={
                        "rate_mbit": rate,
                        "compression_ratio": ratio,
                        "bytes_per_step": bytes_per_step,
                        "achieved_mbit": bytes_per_step * 8 / statistics.median(step) / 1e6,
                        "compute_s_per_step": statistics.median(compute),
                        "link_s_per_step_of_none": statistics.median(link_s),
                        "speedup_bound_amdahl": statistics.median(bound),
                        "stages": k,
                    },
                )
            )
    return rows


if __name__ == "__main__":
    rank_main(json.loads(sys.argv[1]))
