"""The pipeline across machines, on this one: "nodes" are network namespaces joined by shaped veth
links (169.254.0.0/16 addresses that exist only inside the namespaces the tests make, removed after).
A shaped link carries its set rate; two nodes of two ranks under torchrun, and the same four ranks
started as srun would (SLURM variables, no launcher process), train exactly as one machine does;
a node that dies ends the other within 60 s, naming what it lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from repro.experiments.kit.links import LinkError, Links, measured_rate_mbit

from conftest import MODELS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"),
]
CONFIG = MODELS / "smoke" / "pipeline.yaml"
STEPS = 6


def _fit_args(work: Path, cache: Path, *extra: str) -> list[str]:
    log = work / "losses.jsonl"
    return [
        "fit", "--config", str(CONFIG), f"--trainer.max_steps={STEPS}", "--trainer.limit_val_batches=1",
        f"--data.cache_dir={cache}", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f'--trainer.callbacks+={{"class_path": "stop_helpers.LossLog", "init_args": {{"path": "{log}"}}}}',
        *extra,
    ]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    tests = str(Path(__file__).resolve().parent)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": tests, **extra}


def _outcome(work: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
    losses = [json.loads(line)["loss"] for line in (work / "losses.jsonl").read_text().splitlines()]
    (ckpt,) = work.glob("logs/*/version_0/checkpoints/final.ckpt")
    return losses, torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


@pytest.fixture(scope="module")
def one_machine(tmp_path_factory, data_cache):
    """The reference: the same four ranks on one machine (the fork launcher)."""
    work = tmp_path_factory.mktemp("one-machine")
    args = [
        sys.executable,
        "-m",
        "repro.cli",
        *_fit_args(work, data_cache, "--trainer.strategy.init_args.start_method=fork"),
    ]
    subprocess.run(args, cwd=work, env=_env(), check=True, capture_output=True, timeout=600)
    return _outcome(work)


def _same(a, b) -> None:
    assert a[0] == b[0] and len(a[0]) == STEPS  # every loss, bitwise
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_a_shaped_link_carries_its_set_rate_and_nothing_is_left_behind():
    with Links(2, rate_mbit=50) as links:
        names = list(links.names)
        rate = measured_rate_mbit(links, 0, 1, megabytes=4)
    assert abs(rate - 50) <= 5, rate  # within 10 % of the set rate
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in left for name in names)


def test_links_without_root_say_so_in_one_line(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LinkError, match=r"network namespaces need root \(CAP_NET_ADMIN\)"), Links(2):
        pass


def _torchrun(links: Links, work: Path, cache: Path, port: int, *extra: str) -> list[subprocess.Popen]:
    """docs/cluster.md's recipe on each node, as it is: no interface named by hand."""
    procs = []
    for node in range(2):
        cmd = [
            *links.exec_args(node, gloo_interface=False), sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node), "--master-addr", links.address(0),
            "--master-port", str(port), "-m", "repro.cli",
            *_fit_args(work, cache, "--trainer.devices=2", "--trainer.num_nodes=2", *extra),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(cmd, cwd=work, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    return procs


def test_two_nodes_under_torchrun_train_as_one_machine_bitwise(one_machine, tmp_path, data_cache):
    """This machine's host name resolves to 127.0.0.1: gloo would offer it to the other node; the
    strategy finds the interface that routes to MASTER_ADDR itself and says so."""
    with Links(2, rate_mbit=1000) as links:
        procs = _torchrun(links, tmp_path, data_cache, 29611)
        outs = [p.communicate(timeout=600)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    assert all("gloo on eth0" in out and "routes to MASTER_ADDR" in out for out in outs)
    _same(_outcome(tmp_path), one_machine)


def _slurm_rank(links: Links, rank: int, work: Path, cache: Path, port: int) -> subprocess.Popen:
    """What srun starts for task ``rank`` of 4 on 2 nodes: the variables, and no launcher (nor an
    interface named by hand)."""
    slurm = dict(
        SLURM_NTASKS="4", SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="2", SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank % 2), SLURM_NODEID=str(rank // 2), SLURM_JOB_ID="777", SLURM_JOB_NAME="pipeline",
        SLURM_NODELIST=links.address(0), MASTER_ADDR=links.address(0), MASTER_PORT=str(port),
    )  # fmt: skip
    cmd = [
        *links.exec_args(rank // 2, gloo_interface=False), sys.executable, "-m", "repro.cli",
        *_fit_args(work, cache, "--trainer.devices=2", "--trainer.num_nodes=2"),
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=work, env=_env(**slurm), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


LAUNCHED = (
    "repro.cli",
    "multiprocessing",
)  # a forked rank (the parent's command line), a spawned or a popen one


def _rank_children(pids: list[int]) -> dict[int, str]:
    """Processes whose parent is one of ``pids`` (from /proc) and that a launcher would start, with
    their command lines: a fork keeps the parent's ``-m repro.cli``, spawn runs ``multiprocessing``'s
    entry, popen ``-m repro.cli`` again. Short-lived tools are not ranks (the ``git rev-parse`` of
    the run's provenance, the ``python -c`` jsonargparse's type-stub finder runs for sys.path)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) in pids:
                cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if any(mark in cmdline for mark in LAUNCHED):
                    out[int(stat.parent.name)] = cmdline
        except OSError:
            continue
    return out


def test_four_ranks_started_as_srun_would_train_as_one_machine_with_no_extra_process(
    one_machine, tmp_path, data_cache
):
    with Links(2, rate_mbit=1000) as links:
        procs = [_slurm_rank(links, r, tmp_path, data_cache, 29631) for r in range(4)]
        extra = {}
        while any(p.poll() is None for p in procs):
            extra |= _rank_children([p.pid for p in procs])  # `ip netns exec` execs: none expected
            time.sleep(0.5)
        outs = [p.communicate()[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:]
    assert not extra, f"the ranks started processes of their own: {extra}"
    _same(_outcome(tmp_path), one_machine)


def test_a_node_that_dies_ends_the_other_within_60_s_naming_it(tmp_path, data_cache):
    with Links(2, rate_mbit=1000) as links:
        procs = _torchrun(
            links,
            tmp_path,
            data_cache,
            29651,
            "--trainer.max_steps=1000",
            "--trainer.strategy.init_args.timeout_s=20",
        )
        log = tmp_path / "losses.jsonl"
        deadline = time.time() + 300
        while (not log.exists() or len(log.read_text().splitlines()) < 2) and time.time() < deadline:
            time.sleep(0.2)
        assert log.exists(), "training never started"
        killed = time.time()
        pids = subprocess.run(
            ["ip", "netns", "pids", links.names[1]], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:  # node 1 dies: its agent and both its ranks
            os.kill(int(pid), signal.SIGKILL)
        out = procs[0].communicate(timeout=120)[0].decode()
        ended = time.time() - killed
    assert procs[0].returncode != 0 and ended < 60, (ended, out[-2000:])
    assert "stage" in out and ("timed out" in out or "died" in out or "closed" in out), out[-3000:]
