"""How the processes on one machine share its cores: the one rule the run engine's slots, the
pipeline strategy's stage processes and the benchmarks all use."""

from __future__ import annotations

import os


def threads_per_process(processes: int, cores: int | None = None) -> int:
    """Torch threads for each of ``processes`` processes sharing ``cores`` (default: this
    machine's): ``cores // processes``, at least one."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, processes))
