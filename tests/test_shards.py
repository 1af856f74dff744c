"""Sharding and planning, pure: the partition of a plan over N shards, the SLURM array variables,
and the wall time of a plan on N GPUs."""

from __future__ import annotations

import pytest

from repro.experiments.kit.compute_plan import PlannedRun, wall_seconds
from repro.runs.shards import Shard, assign
from repro.runs.spec import RunSpec

from conftest import MODELS


def _specs(n: int) -> list[RunSpec]:
    config = MODELS / "smoke" / "table1_target_mha.yaml"
    return [
        RunSpec.make(f"r{i}", "/tmp/x", config, seed=i % 3, steps=10 * (1 + i % 4), eval_every=10)
        for i in range(n)
    ]


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_partition_the_runs_the_same_way_everywhere_with_balanced_steps(count):
    specs = _specs(23)
    parts = assign(specs, count)
    assert sorted(s.key for p in parts for s in p) == sorted(s.key for s in specs)  # each run once
    assert parts == assign(list(reversed(specs)), count)  # independent of the order given
    steps = [sum(s.steps for s in p) for p in parts]
    assert max(steps) - min(steps) <= 40  # at most one longest run apart
    for i in range(count):
        assert Shard(i, count).select(specs) == [s for s in specs if s in parts[i]]


def test_shard_from_the_flag_or_the_slurm_array():
    assert Shard.parse("1/4", env={}) == Shard(1, 4)
    assert Shard.parse(None, env={}) is None
    slurm = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "3"}
    assert Shard.parse(None, env=slurm) == Shard(2, 4)  # --array=3-6: task 5 is the third
    assert Shard.parse("0/2", env=slurm) == Shard(0, 2)  # the flag wins
    assert Shard.parse(None, env={"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1"}) is None
    for bad in ("4/4", "1", "a/b", "-1/3", "0/0"):
        with pytest.raises(ValueError, match="give i/N"):
            Shard.parse(bad, env={})


def test_wall_time_packs_each_stage_longest_first_and_pipelines_hold_k_gpus():
    runs = [PlannedRun(f"a{i}", 1, 1, 1, flops) for i, flops in enumerate([4.0, 3.0, 3.0, 2.0])]
    runs.append(PlannedRun("b", 2, 1, 1, 5.0))
    assert wall_seconds(runs, 1.0, 1) == 12.0 + 5.0
    assert wall_seconds(runs, 1.0, 2) == 6.0 + 5.0  # {4, 2} and {3, 3}, then stage 2
    assert wall_seconds(runs, 1.0, 8) == 4.0 + 5.0
    pipes = [PlannedRun(f"p{i}", 1, 1, 1, 1.0, gpus=4) for i in range(4)]
    assert wall_seconds(pipes, 1.0, 8) == 2.0  # two 4-GPU runs at a time
    assert wall_seconds(pipes, 1.0, 2) == 8.0  # one at a time, its 4 stages sharing 2 GPUs


def test_a_waiting_shard_looks_after_1_s_then_backs_off_to_its_poll_interval(monkeypatch):
    """Another shard's results are looked for after 1, 2, 4, ... s, at most poll_s apart."""
    from repro.runs import shards

    sleeps, calls = [], []

    def finished(specs):
        calls.append(1)
        return ({}, list(specs)) if len(calls) < 8 else ({"a": "done"}, [])

    monkeypatch.setattr(shards, "finished_results", finished)
    monkeypatch.setattr(shards.time, "sleep", sleeps.append)
    spec = type("Spec", (), {"display": "run a"})()
    assert shards.wait_for([spec], note=lambda line: None, poll_s=30.0) == {"a": "done"}
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
