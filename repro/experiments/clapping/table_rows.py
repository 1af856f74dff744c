"""The Clapping table's rows as a type: one :class:`TableRow` per (regime, method, compressor, p).
The JSON holds each as a flat record (``record``, read back by ``from_record``); the CSV flattens the
measured link figures into ``link_*`` columns (``csv_record``)."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

LINK_FIGURES = ("step_s", "speedup", "speedup_bound")  # measured on shaped links (link_times)
LISTS = ("seeds", "seed_losses")  # list fields: space-joined in the CSV, after the link columns


@dataclass(frozen=True)
class TableRow:
    regime: str  # finetune | from_scratch
    method: str  # none, none_lazy, direct, ef21, aqsgd, clapping_fc, clapping_fu
    compressor: str  # 'identity', 'C' for both directions, or 'F/B'
    p: float  # lazy-sampling probability
    val_loss: float  # final validation loss, mean over seeds
    val_loss_std: float | None
    delta_vs_none: float  # paired Δ to none of the regime (0.0 for none)
    delta_ci_low: float | None
    delta_ci_high: float | None
    p_value: float | None  # paired t-test
    p_holm: float | None  # Holm-corrected over the regime's rows
    resolved: bool | None
    bytes_total: float  # mean over seeds
    compression_ratio: float | None  # bytes against none of the same seed
    bytes_to_target: float | None  # None: some seed never reached the target loss
    reached_target: str  # 'reached/seeds'
    buffer_bytes_max_rank: int
    train_wall_s: float
    emulated_net_s: float  # the busiest rank's bytes x 8 / bandwidth: a bound, not a measurement
    seeds: list[int]
    seed_losses: list[float]  # in seed order
    link: dict[str, Any] | None = None  # measured step time on shaped links (None: not measured)
    tied_compressor: str = "identity"  # the tied embedding/head gradient sum's compressor (identity: exact)

    @property
    def is_reference(self) -> bool:
        """The none row (with the exact tied sum), which every row of its regime is compared with."""
        return self.method == "none" and self.tied_compressor == "identity"

    @property
    def label(self) -> str:
        """The compressor column: the messages', and the tied sum's where it is compressed."""
        return self.compressor + (
            "" if self.tied_compressor == "identity" else f", tied sum {self.tied_compressor}"
        )

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TableRow:
        return cls(
            **{f.name: record.get(f.name, None if f.default is MISSING else f.default) for f in fields(cls)}
        )

    def csv_record(self) -> dict[str, Any]:
        """The CSV's columns (``CSV_COLUMNS``): lists joined by spaces, the link figures flattened."""
        out = {k: v for k, v in self.record().items() if k not in ("link", *LISTS)}
        out.update({f"link_{k}": (self.link or {}).get(k) for k in LINK_FIGURES})
        out.update({k: " ".join(str(v) for v in getattr(self, k)) for k in LISTS})
        return out


CSV_COLUMNS = tuple(
    [f.name for f in fields(TableRow) if f.name not in ("link", *LISTS)]
    + [f"link_{k}" for k in LINK_FIGURES]
    + list(LISTS)
)
