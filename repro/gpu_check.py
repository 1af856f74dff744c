"""``make gpu-check`` / ``repro gpu-check``: the one prepared GPU acceptance run (at most about 8
minutes on one H200), written as one markdown table to paste into the README:

1. ``make bench-gpu``: the Lightning path against the plain loop, eager and compiled, for
   ``paper_mha`` and ``paper_mla`` (tokens/s, MFU, peak memory);
2. a pipeline run of the Clapping strategy on the GPU (K ranks on K GPUs over NCCL; on one GPU the
   K ranks share it, their messages through host memory over gloo);
3. a shortened ``gpu`` Table 1 (``experiments/table1/gpu_check.yaml``: the MHA half, one seed,
   ``--steps``) with its wall time;
4. the ``--plan`` of the full ``gpu`` scale at a step time measured here.

A part that fails is recorded (a FAILED row, its traceback in the json and on stderr) and the next
part still runs; the report is rewritten after each part, so a run cut short keeps what it finished.

Without a CUDA GPU it says so in one line and measures nothing.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from repro.arguments import PositiveInt
from repro.files import table_head, write_report
from repro.paths import EXPERIMENTS_DIR, MODELS_DIR


def gpu_check(out: Path, steps: int, quiet: bool = False) -> dict[str, Any]:
    import torch

    from repro.experiments.bench.run import run_bench
    from repro.experiments.bench.settings import load_settings as bench_settings
    from repro.experiments.table1.cost import print_table1_plan
    from repro.experiments.table1.run import run_table1
    from repro.experiments.table1.settings import load_table1_settings
    from repro.runs import RunSpec, train_all
    from repro.runs.provenance import provenance_header

    start = time.perf_counter()
    say = (
        (lambda m: None)
        if quiet
        else (lambda m: print(f"[gpu-check {time.perf_counter() - start:5.0f}s] {m}", file=sys.stderr))
    )
    gpus = torch.cuda.device_count()
    report: dict[str, Any] = {**provenance_header(), "gpu": torch.cuda.get_device_name(0), "gpus": gpus}
    report.update(bench=[], table1_short=None, plan=[], pipeline=None, failed={})

    def part(name: str, fn: Any) -> None:
        """Run one part; a failure is recorded (its last line in the table, the whole traceback in
        the json) and the next part still runs, so one GPU call reports every part it can."""
        try:
            fn()
        except Exception as exc:  # reported, never swallowed
            report["failed"][name] = traceback.format_exc()
            say(f"{name} failed: {type(exc).__name__}: {exc}")
        report["wall_s"] = time.perf_counter() - start
        write_report(out, "gpu_check", report, markdown(report))  # after each part: a partial report survives

    def bench() -> None:
        say(f"1/4 make bench-gpu on {report['gpu']} ({gpus} GPU(s))")
        report["bench"] = run_bench(bench_settings("gpu"), out / "bench-gpu", quiet=quiet)["rows"]

    def table1() -> None:
        say(f"3/4 a shortened gpu Table 1 ({steps} steps)")
        t0 = time.perf_counter()
        short = load_table1_settings(EXPERIMENTS_DIR / "table1" / "gpu_check.yaml", steps=steps)
        table = run_table1(short, out / "table1", quiet=quiet)
        report["table1_short"] = {"steps": steps, "wall_s": time.perf_counter() - t0,
                                  "runs": table["runs_total"] if table else None}  # fmt: skip

    def plan() -> None:
        say("4/4 the plan of the full gpu scale (a step time measured here: one compilation first)")
        lines = io.StringIO()
        with contextlib.redirect_stdout(lines):
            print_table1_plan(
                load_table1_settings(EXPERIMENTS_DIR / "table1" / "gpu.yaml"), out / "plan", None
            )
        report["plan"] = lines.getvalue().splitlines()

    def pipeline() -> None:
        k = max(2, min(4, gpus))
        say(
            f"2/4 a pipeline run: K={k} ranks {'over NCCL' if gpus >= k else f'sharing {gpus} GPU(s) over gloo'}"
        )
        spec = RunSpec.make(
            "pipeline", out / "pipeline", MODELS_DIR / "smoke" / "table1_target_mha.yaml", 0, 40, 40,
            {"trainer.limit_val_batches": 2},
            {"micro_batches": 2, "method": "clapping_fc", "fwd_compressor": "quant(4)", "bwd_compressor": "quant(8)",
             "p": 0.5}, stages=k,
        )  # fmt: skip
        t0 = time.perf_counter()
        run = train_all([spec], "gpu")[spec.key]
        report["pipeline"] = {"stages": k, "wall_s": time.perf_counter() - t0, "val_loss": run.final_val_loss,
                              "summary": run.pipeline}  # fmt: skip

    # the short pipeline run before the long Table 1
    for name, fn in (("bench-gpu", bench), ("pipeline", pipeline), ("table1", table1), ("plan", plan)):
        part(name, fn)
    return report


def markdown(r: dict[str, Any]) -> str:
    title = f"`make gpu-check` at commit {r['git_commit'][:7]}, {r['created']}, {r['gpu']} x {r['gpus']}, "
    lines = table_head(title + f"{r['wall_s'] / 60:.1f} min.", ["part", "what", "measured"])
    for row in r["bench"]:
        if row["section"] != "compile":
            continue
        extra = f", MFU {100 * row['mfu']:.0f}%" if row.get("mfu") is not None else ""
        extra += f", peak {row['peak_memory_bytes'] / 2**30:.1f} GiB" if row.get("peak_memory_bytes") else ""
        ratio = f" (x{row['ratio']:.3f} vs {row['reference']})" if row.get("ratio") is not None else ""
        lines.append(f"| bench-gpu | {row['name']} | {row['median']:,.0f} {row['unit']}{extra}{ratio} |")
    t = r["table1_short"]
    if t is not None:
        lines.append(
            f"| Table 1 (gpu, shortened) | {t['runs']} runs of {t['steps']} steps | {t['wall_s'] / 60:.1f} min |"
        )
    for line in r["plan"]:
        if "GPU-hours" in line or "wall time on" in line:
            lines.append(f"| --plan (gpu scale, step time measured here) | {line.strip().split(':')[0]} | "
                         f"{line.strip().split(':', 1)[1].strip()} |")  # fmt: skip
    p = r["pipeline"]
    if p is not None:
        lines.append(
            f"| pipeline | clapping_fc quant(4)/quant(8), K={p['stages']}, 40 steps | {p['wall_s']:.0f} s, val loss "
            f"{p['val_loss']:.4f} |"
        )
    for name, trace in r.get("failed", {}).items():
        last = trace.strip().splitlines()[-1].replace("|", "/")
        lines.append(f"| {name} | FAILED | {last[:300]} |")
    return "\n".join(lines) + "\n"


def gpu_check_command(
    out: Path = Path("results/gpu-check"), steps: PositiveInt = 300, quiet: bool = False
) -> int:
    """The GPU acceptance run's table on stdout; 1 where no CUDA GPU is visible or a part failed.

    Args:
        out: results folder
        steps: steps of the shortened Table 1's runs
        quiet: no progress lines
    """
    import torch

    if not torch.cuda.is_available():
        print("repro gpu-check: no CUDA GPU is visible here; nothing was measured", file=sys.stderr)
        return 1
    report = gpu_check(out, steps, quiet)
    print(markdown(report), end="")
    for name, trace in report["failed"].items():
        print(f"--- {name} failed:\n{trace}", file=sys.stderr)
    return 1 if report["failed"] else 0
