"""Orchestrators killed mid-way (SIGKILL or SIGINT to the whole process group, ranks included)
and started again finish with the same table as an uninterrupted run, and never leave a results
file that passes for a finished one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import MODELS

pytestmark = pytest.mark.slow

TINY_CLAPPING = f"""scale: smoke
model: {MODELS}/smoke/clapping.yaml
regimes: [from_scratch]
finetune: {{steps: 8, eval_every: 4}}
from_scratch:
  {{steps: 8, eval_every: 4, methods: [none, ef21, clapping_fc], compressors: ["quant(4)"], clapping_p: [0.5]}}
val_batches: 2
seeds: [0]
stages: 2
micro_batches: 2
warmup_epochs: 1
memory_sizes: [64]
accelerator: cpu
"""


def _cli(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "repro.cli", *args]


def run_to_end(args: list[str], cwd: Path) -> None:
    out = subprocess.run(_cli(args), cwd=cwd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]


def interrupt(args: list[str], cwd: Path, ready, sig: int, timeout: float = 600) -> int:
    """Start the command in its own process group, wait until ``ready()``, send ``sig`` to the
    whole group and return the exit code."""
    log = open(cwd / f"interrupted-{sig}.log", "w")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(_cli(args), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout
    try:
        while not ready():
            if proc.poll() is not None:
                pytest.fail(
                    f"the command ended (code {proc.returncode}) before it could be interrupted: "
                    + (cwd / f"interrupted-{sig}.log").read_text()[-2000:]
                )
            if time.time() > deadline:
                pytest.fail("the command never reached the point of interruption")
            time.sleep(0.2)
        os.killpg(proc.pid, sig)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    # nothing of the group outlives it (zombies waiting for init to reap them have exited)
    deadline = time.time() + 30
    while living_members(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not living_members(proc.pid), f"left behind: {living_members(proc.pid)}"
    return code


def living_members(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (from /proc)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _results(folder: Path) -> list[Path]:
    return sorted(folder.glob("runs/*.json"))


def _clapping_numbers(table: dict) -> list[tuple]:
    return [
        (
            r["method"],
            r["compressor"],
            r["p"],
            r["val_loss"],
            r["bytes_total"],
            r["compression_ratio"],
            r["buffer_bytes_max_rank"],
        )
        for r in table["rows"]
    ]


@pytest.fixture(scope="module")
def clapping_work(tmp_path_factory):
    work = tmp_path_factory.mktemp("clapping-kill")
    (work / "tiny.yaml").write_text(TINY_CLAPPING)
    run_to_end(["clapping", "--settings", "tiny.yaml", "--out", "whole", "--quiet"], work)
    return work, json.loads((work / "whole" / "clapping_table.json").read_text())


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_an_interrupted_clapping_reproduction_finishes_with_the_same_table(sig, clapping_work):
    work, whole = clapping_work
    out = work / f"cut-{sig}"
    args = ["clapping", "--settings", "tiny.yaml", "--out", out.name, "--quiet"]
    code = interrupt(args, work, lambda: len(_results(out)) >= 1, sig)
    assert code != 0
    assert not (out / "clapping_table.json").exists()  # no table passes for a finished one
    if sig == signal.SIGINT:  # Ctrl-C: one line, no traceback (from the ranks or the main process)
        log = (work / f"interrupted-{sig}.log").read_text()
        assert "Traceback" not in log, log[-3000:]
        last = [line for line in log.splitlines() if line.strip()][-1]
        assert last.startswith("repro clapping: interrupted: ") and "rerun the same command to resume" in last
    done = _results(out)
    assert 1 <= len(done) < 3
    for path in done:  # every result that exists is complete
        assert json.loads(path.read_text())["fingerprint"]
    run_to_end(args, work)
    resumed = json.loads((out / "clapping_table.json").read_text())
    assert resumed["trained_runs"] == 3 - len(done)
    assert _clapping_numbers(resumed) == _clapping_numbers(whole)


def test_an_interrupted_coverage_profile_resumes_to_the_same_profile(tmp_path, data_cache):
    """`repro profile coverage` SIGKILLed after its first run: the rerun trains only the rest and
    writes the same profile as an uninterrupted one."""
    config = tmp_path / "smoke.yaml"
    text = (MODELS / "smoke" / "gpt_mha.yaml").read_text()
    config.write_text(text.replace("  shuffle_seed: 0\n", f"  shuffle_seed: 0\n  cache_dir: {data_cache}\n"))
    common = [
        "profile",
        "coverage",
        "--config",
        str(config),
        "--steps",
        "6",
        "--eval_every",
        "3",
        "--last_n",
        "2",
        "--seeds",
        "0",
        "--group_size",
        "2",  # 3 runs (all low, then layers 0-1 high, then layer 2) prove the resume as well as 4 per layer
    ]
    run_to_end([*common, "--out", "whole.json"], tmp_path)
    runs = tmp_path / "cut.json.runs"
    code = interrupt(
        [*common, "--out", "cut.json"], tmp_path, lambda: len(list(runs.glob("*.json"))) >= 1, signal.SIGKILL
    )
    assert code != 0 and not (tmp_path / "cut.json").exists()
    run_to_end([*common, "--out", "cut.json"], tmp_path)
    whole = json.loads((tmp_path / "whole.json").read_text())
    cut = json.loads((tmp_path / "cut.json").read_text())
    assert cut["values"] == whole["values"]


def test_a_ctrl_c_swallowed_mid_run_still_stops_the_orchestrator():
    """Python drops a KeyboardInterrupt raised inside an at-fork callback ("Exception ignored");
    the orchestrators remember the signal and stop before the next run."""
    from repro.stop import remember_interrupts, stop_if_interrupted

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs as a background job
    with remember_interrupts():
        stop_if_interrupted()  # nothing received yet
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass  # swallowed, as an at-fork callback would
        with pytest.raises(KeyboardInterrupt, match="finished runs are kept"):
            stop_if_interrupted()
    assert signal.getsignal(signal.SIGINT) is before
