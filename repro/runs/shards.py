"""Many machines through the cluster's own scheduler: shard ``i`` of ``N`` trains its part of an
experiment's runs into the shared results folder, and every shard reads the others' results from
there (no server, no messages: a finished run is its result file).

The partition is a pure function of the runs: sorted by length (longest first) then name, run j
goes to shard ``j mod N``, so every shard computes the same partition and the shards get about
the same number of steps. Under ``sbatch --array`` the shard comes from ``SLURM_ARRAY_TASK_ID``
(minus ``SLURM_ARRAY_TASK_MIN``) and ``SLURM_ARRAY_TASK_COUNT``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .spec import RunSpec
from .store import RunResult, load_finished


@dataclass(frozen=True)
class Shard:
    index: int  # this shard, 0 .. count - 1
    count: int  # shards in all

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and self.count >= 1 and 0 <= self.index < self.count):
            raise ValueError(f"--shard {self.index}/{self.count}: give i/N with 0 <= i < N")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @staticmethod
    def parse(text: str | None, env: Mapping[str, str] | None = None) -> Shard | None:
        """``"i/N"``; without it, the SLURM array task when one is set; else None (no sharding)."""
        env = os.environ if env is None else env
        if text is None:
            if "SLURM_ARRAY_TASK_ID" not in env or "SLURM_ARRAY_TASK_COUNT" not in env:
                return None
            try:
                task, count = int(env["SLURM_ARRAY_TASK_ID"]), int(env["SLURM_ARRAY_TASK_COUNT"])
                low = int(env.get("SLURM_ARRAY_TASK_MIN", 0))
            except ValueError:
                raise ValueError(
                    "SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT are not integers; give --shard i/N"
                ) from None
            if count == 1:
                return None
            return Shard(task - low, count)
        index, sep, count = text.partition("/")
        try:
            shard = Shard(int(index), int(count)) if sep else None
        except ValueError:
            shard = None
        if shard is None:
            raise ValueError(f"--shard {text!r}: give i/N with 0 <= i < N (e.g. 0/4)")
        return shard

    def select(self, specs: Sequence[RunSpec]) -> list[RunSpec]:
        """This shard's runs, in their given order."""
        mine = {s.key for s in assign(specs, self.count)[self.index]}
        return [s for s in specs if s.key in mine]


def assign(specs: Sequence[RunSpec], count: int) -> list[list[RunSpec]]:
    """The partition of ``specs`` into ``count`` shards (the same in every process)."""
    ordered = sorted(specs, key=lambda s: (-s.steps, s.key))
    return [ordered[i::count] for i in range(count)]


def finished_results(specs: Sequence[RunSpec]) -> tuple[dict[str, RunResult], list[RunSpec]]:
    """The finished results of ``specs`` found in their folders, and the runs not finished yet."""
    found, missing = {}, []
    for spec in specs:
        result = load_finished(spec, spec.fingerprint())
        if result is None:
            missing.append(spec)
        else:
            found[spec.key] = result
    return found, missing


def wait_for(
    specs: Sequence[RunSpec],
    note: Callable[[str], None],
    poll_s: float = 30.0,
    timeout_s: float | None = None,
) -> dict[str, RunResult]:
    """Wait until every run of ``specs`` has its result (written by other shards); a line names the
    missing runs when waiting starts and every 10 minutes. The results are looked for after 1 s,
    then at twice the last interval, up to ``poll_s`` (a short wait ends soon, a long one reads the
    shared filesystem rarely)."""
    start = time.monotonic()
    last = None
    interval = min(1.0, poll_s)
    while True:
        found, missing = finished_results(specs)
        if not missing:
            return found
        now = time.monotonic()
        if last is None or now - last >= 600:
            names = ", ".join(s.display for s in missing[:5]) + (" ..." if len(missing) > 5 else "")
            note(f"waiting for {len(missing)} run(s) of other shards: {names}")
            last = now
        if timeout_s is not None and now - start > timeout_s:
            raise TimeoutError(
                f"{len(missing)} run(s) did not finish within {timeout_s:.0f} s (their shards failed or "
                f"were not started): {', '.join(s.display for s in missing[:5])}"
            )
        time.sleep(interval)
        interval = min(2 * interval, poll_s)


def gather(
    specs: Sequence[RunSpec],
    trained: dict[str, RunResult],
    shard: Shard | None,
    note: Callable[[str], None],
    *,
    wait: bool = False,
    writes: str = "the table",
) -> dict[str, RunResult] | None:
    """Every result of ``specs`` once this process has trained its part (``trained``): without
    ``shard``, what it trained (all of them); with one, ``wait`` for the other shards (their runs
    come next), or, when some are not finished, a line saying the last shard to finish writes
    ``writes`` and None (this shard is done)."""
    if shard is None:
        return trained
    if wait:
        return wait_for(specs, note)
    found, missing = finished_results(specs)
    if missing:
        note(
            f"shard {shard} done; {len(missing)} runs of other shards are not finished: the last shard "
            f"to finish writes {writes}"
        )
        return None
    return found
