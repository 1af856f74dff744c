"""The rows of ``repro mla-plane``: at each budget, which allocation of the cache each row is
(its per-layer rotary pairs and latent ranks, its factorization and pair order) and the key that
names its converted folder (a hash of everything the conversion reads)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from repro.alloc.mla_allocation import Split, mla_allocation

from .settings import MLAPlaneSettings

SOURCE = "source (unconverted)"  # the row of the model as it came


@dataclass(frozen=True)
class Row:
    budget: float  # fraction of the source's KV elements per token
    kind: str  # one of settings.ROW_KINDS
    split: Split  # the mean split (pairs per key/value head, latent rank)
    svd: str  # weights | activations
    order: str  # frequency | 2-norm
    pairs: tuple[int, ...]  # per layer
    ranks: tuple[int, ...]  # per layer
    draw: int | None = None  # random-k

    @property
    def name(self) -> str:
        draw = "" if self.draw is None else f" #{self.draw + 1}"
        return f"B{self.budget:g} {self.kind}{draw} N{self.split.pairs} R{self.split.rank}"

    @property
    def method(self) -> str:
        return self.kind + ("" if self.draw is None else f" #{self.draw + 1}")

    def key(self, source: str, calibration: str) -> str:
        """Names the converted folder: the same key, the same conversion."""
        payload = [source, list(self.pairs), list(self.ranks), self.svd, self.order]
        if self.svd == "activations" or self.order == "2-norm":
            payload.append(calibration)
        digest = hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:12]
        return f"{self.kind.split(' ')[0]}-N{self.split.pairs}-R{self.split.rank}-{digest}"

    def cache_elements(self, n_kv: int) -> int:
        return sum(r + n_kv * 2 * p for p, r in zip(self.pairs, self.ranks))


def budget_rows(
    settings: MLAPlaneSettings,
    budget: float,
    splits: list[Split],
    n_layer: int,
    coverage: list[float] | None,
    rank_benefit: list[float] | None,
) -> list[Row]:
    """Every row of one budget (``splits[0]``: the main split)."""
    main, rows = splits[0], []

    def add(kind: str, split: Split, method: str, svd: str, order: str = "frequency", draw=None) -> None:
        pairs, ranks = mla_allocation(method, n_layer, split, coverage, rank_benefit, seed=draw or 0)
        rows.append(Row(budget, kind, split, svd, order, tuple(pairs), tuple(ranks), draw))

    for kind in settings.rows:
        if kind == "uniform (weights)":
            add(kind, main, "uniform", "weights")
        elif kind == "uniform":
            add(kind, main, "uniform", settings.svd)
        elif kind == "uniform (2-norm)":
            add(kind, main, "uniform", settings.svd, "2-norm")
        elif kind == "uniform (split)":
            for split in splits[1:]:
                add(kind, split, "uniform", settings.svd)
        elif kind == "random-k":
            for d in range(settings.random_draws):
                add(kind, main, "random-k", settings.svd, draw=d)
        else:
            add(kind, main, kind, settings.svd)
    return rows
