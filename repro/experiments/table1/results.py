"""The typed outcome of one architecture's half of Table 1 (what the report is made from)."""

from __future__ import annotations

from dataclasses import dataclass

from repro.alloc.allocation import Allocation
from repro.alloc.profile import LayerProfile
from repro.runs import RunResult

from .plan import ArchPlan, widths_name


@dataclass(frozen=True)
class ArchAllocations:
    """One architecture's half after stage 1: its profiles and the allocations stage 2 trains."""

    plan: ArchPlan
    benefit: LayerProfile  # coverage-benefit profile of the target
    source: LayerProfile  # coverage-benefit profile of the source
    transferred: LayerProfile  # the source profile at the target's depths
    phase_off: LayerProfile  # phase-off profile of the all-high reference
    allocations: tuple[Allocation, ...]  # every row's allocation (random-k: every draw)
    sweep: tuple[Allocation, ...]  # the extra budgets (MLA)
    pairs: tuple[tuple[int, int], ...]  # the layer pairs whose interaction is measured


@dataclass(frozen=True)
class ArchOutcome(ArchAllocations):
    """One architecture's half of the table, once every run is done: its allocations and their runs."""

    runs: dict[str, RunResult]  # row run name -> result
    interactions: tuple[dict, ...]  # interaction terms of the top layers

    def run(self, widths, seed: int) -> RunResult:
        return self.runs[widths_name(widths, seed)]
