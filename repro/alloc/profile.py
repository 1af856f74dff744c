"""A per-layer profile (phase-off, coverage-benefit or transferred) and its JSON file.

The file holds the per-layer mean, the std across seeds, the per-seed values, the model config
it was measured on, and how it was measured (steps, seeds, checkpoint, evaluation tokens), so
later steps read it without re-running anything.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from repro.files import read_json, write_json_atomic

PROFILE_KINDS = ("phase_off", "coverage_benefit", "transferred", "rank_benefit")


@dataclass
class LayerProfile:
    kind: Literal["phase_off", "coverage_benefit", "transferred", "rank_benefit"]  # what was measured
    values: list[float]  # per-layer value (mean over seeds); larger = the layer needs position more
    std: list[float] | None = None  # per-layer std across seeds (None when there is one seed)
    per_seed: dict[str, list[float]] = field(default_factory=dict)  # seed -> per-layer values
    per_head: list[list[float]] | None = None  # phase-off only: [layer][head] loss increase
    model: dict[str, Any] = field(default_factory=dict)  # GPTConfig fields of the measured model
    meta: dict[str, Any] = field(default_factory=dict)  # how it was measured

    def __post_init__(self) -> None:
        self.validate()

    @property
    def n_layer(self) -> int:
        return len(self.values)

    def validate(self, source: str = "profile") -> None:
        if self.kind not in PROFILE_KINDS:
            raise ValueError(f"{source}: kind={self.kind!r}; allowed kinds are {PROFILE_KINDS}")
        if not self.values:
            raise ValueError(f"{source}: the profile has no layers (empty 'values')")
        bad = [
            i for i, v in enumerate(self.values) if not isinstance(v, (int, float)) or not math.isfinite(v)
        ]
        if bad:
            raise ValueError(
                f"{source}: values of layers {bad} are not finite numbers ({[self.values[i] for i in bad]})"
            )
        if self.std is not None and len(self.std) != len(self.values):
            raise ValueError(
                f"{source}: 'std' has {len(self.std)} entries but 'values' has {len(self.values)}"
            )
        n_model = self.model.get("n_layer")
        if n_model is not None and n_model != len(self.values):
            raise ValueError(f"{source}: {len(self.values)} values but its model has n_layer={n_model}")

    def check_matches(self, n_layer: int, what: str = "the model") -> None:
        if self.n_layer != n_layer:
            raise ValueError(
                f"the {self.kind} profile has {self.n_layer} layers but {what} has {n_layer}; "
                "measure a profile on this model or transfer one with `repro transfer`"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> LayerProfile:
        path = Path(path)
        data = read_json(path, "profile file")
        if not isinstance(data, dict) or "values" not in data or "kind" not in data:
            raise ValueError(f"profile file {str(path)!r} has no 'kind' and 'values'; is it a profile?")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"profile file {str(path)!r}: unexpected fields ({exc})") from exc
        except ValueError as exc:
            raise ValueError(f"profile file {str(path)!r}: {exc}") from exc
