"""Table 1's rows as types: one :class:`Table1Row` per method, one :class:`ArchCells` per architecture
half. The JSON and CSV files hold them as flat records (``<arch>_<field>`` keys, in field order);
``record`` writes one and ``from_record`` reads it back."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ArchCells:
    """One architecture's columns of a row (random-k: over every draw; the comparison fields are None
    for the uniform row itself)."""

    high_layers: str  # the high-coverage layers, ';' between random-k draws ('-': none)
    widths: str  # the per-layer rotary widths, ';' between draws
    mean_level: float  # mean coverage level over layers
    loss_mean: float  # final validation loss, mean over seeds (and draws)
    loss_std: float | None  # its std (None: one value)
    delta_vs_uniform: float  # paired Δ to uniform, mean over seeds (0.0 for uniform)
    delta_std: float | None
    delta_ci_low: float | None
    delta_ci_high: float | None
    p: float | None  # paired t-test
    p_holm: float | None  # Holm-corrected over the rows of the half
    p_wilcoxon: float | None
    p_sign: float | None
    resolved: bool | None  # p_holm < alpha
    runs: int
    kv_elements_per_token: int
    rope_flops_per_token: int
    attention_flops_per_token: int
    mark_holds_under_float_spread: bool | None = None  # None: no float spread measured

    def record(self, arch: str) -> dict[str, Any]:
        return {f"{arch}_{f.name}": getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_record(cls, record: dict[str, Any], arch: str) -> ArchCells:
        return cls(**{f.name: record.get(f"{arch}_{f.name}") for f in fields(cls)})


@dataclass(frozen=True)
class Table1Row:
    method: str  # the row's name: its method, with the number of draws for random-k
    budget_matched: bool  # False: a reference point (a different total rotary width)
    cells: dict[str, ArchCells]  # by architecture ('mha', 'mla'), in table order

    @property
    def is_reference(self) -> bool:
        """The uniform row, which every other row is compared with."""
        return self.method == "uniform"

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "budget_matched": self.budget_matched}
        for arch, cells in self.cells.items():
            out.update(cells.record(arch))
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any], archs: list[str]) -> Table1Row:
        return cls(
            record["method"], record["budget_matched"], {a: ArchCells.from_record(record, a) for a in archs}
        )
