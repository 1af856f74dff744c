"""How the processes on one machine share its cores: the one rule the run engine's slots, the
pipeline strategy's stage processes and the benchmarks all use."""

from __future__ import annotations

import os


def threads_per_process(processes: int, cores: int | None = None) -> int:
    """Torch threads for each of ``processes`` processes sharing ``cores`` (default: this
    machine's): ``cores // processes``, at least one."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, processes))


def busy_machine_line(threads: int, cores: int | None = None, load: float | None = None) -> str | None:
    """One line when other work already keeps cores busy and ``threads`` torch threads would share
    them (``load``: the 1-minute load average; default: this machine's). torch's threads wait for
    each other at every operation, so one of them on a busy core slows every step: a session saw the
    smoke model go from 15.5 to 1.8 it/s. The thread count is not changed behind the user's back (it
    changes the float summation order, so the numbers); the line says what to set. None when the
    cores are free, or OMP_NUM_THREADS chose."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = cores or os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            return None
    if load + threads < cores + 1.5:  # (the process itself adds some load while it starts)
        return None
    free = max(1, round(cores - load))
    return (
        f"the machine is busy (load {load:.1f} on {cores} cores) and torch uses {threads} threads: a thread on a "
        f"busy core slows every step, up to several-fold; if steps are slow, set OMP_NUM_THREADS={min(free, threads)}"
    )
