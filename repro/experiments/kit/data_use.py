"""How much of its training data each run reads: the tokens a run trains on against the tokens its
training split holds (the blocks it samples from), the epochs that makes, and an experiment's
limit on them (``max_epochs_over_data``: at ``paper`` scale each token is seen at most once).

The facts come from the run's datamodule as the run would build it (the model config's data
section with the run's ``data.*`` overrides); a prepared corpus is read from its manifest, a
small corpus from its cached shards. A prepared folder that is not on this machine yet is
reported as such (a plan can be printed before the data is prepared)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from repro.runs.model_config import load_model_config
from repro.runs.spec import RunSpec


@dataclass(frozen=True)
class DataUse:
    run: str  # the run's label
    data: str  # the corpus the run trains on (a prepared folder, or the corpus name)
    tokens_needed: int  # steps x batch x block
    tokens_available: int | None  # blocks of the training split x block (None: not prepared here)
    missing: str = ""  # why the split's size is unknown

    @property
    def epochs(self) -> float | None:
        return None if not self.tokens_available else self.tokens_needed / self.tokens_available


@lru_cache(maxsize=256)
def _split_facts(
    config: str, data_overrides: tuple, cache_dir: str | None
) -> tuple[str, int | None, int, int, str]:
    """(data, training tokens available, batch, block, why unknown) of a config with overrides."""
    model = load_model_config(config)
    overrides = dict(data_overrides, **({"cache_dir": cache_dir} if cache_dir else {}))
    args = model.data_args(**overrides)
    data = args.get("prepared_dir") or args.get("shard_dir") or args.get("corpus", "shakespeare")
    dm = model.datamodule(**overrides)
    try:
        blocks = dm.train_blocks()
    except FileNotFoundError as exc:
        return str(data), None, dm.batch_size, dm.block_size, str(exc)
    return str(data), blocks * dm.block_size, dm.batch_size, dm.block_size, ""


def data_use(spec: RunSpec, cache_dir: str | None = None) -> DataUse:
    overrides = tuple(
        sorted(
            (k.removeprefix("data."), tuple(v) if isinstance(v, list) else v)
            for k, v in spec.override_dict().items()
            if k.startswith("data.")
        )
    )
    data, available, batch, block, missing = _split_facts(spec.config, overrides, cache_dir)
    return DataUse(spec.display, data, spec.steps * batch * block, available, missing)


def over_limit(use: DataUse, limit: float | None) -> bool:
    return limit is not None and use.epochs is not None and use.epochs > limit + 1e-9


def check_data_use(
    specs: Sequence[RunSpec],
    limit: float | None,
    what: str,
    cache_dir: str | None = None,
    strict: bool = True,
) -> list[DataUse]:
    """Each run's use of its data; with ``strict``, a run over ``limit`` epochs stops the
    experiment (one line)."""
    uses = [data_use(s, cache_dir) for s in specs]
    for use in uses:
        if strict and over_limit(use, limit):
            raise ValueError(
                f"{what}: run {use.run!r} trains on {use.tokens_needed / 1e6:,.1f} M tokens but its training split "
                f"({use.data}) holds {use.tokens_available / 1e6:,.1f} M: {use.epochs:.2f} epochs, over "
                f"max_epochs_over_data={limit:g}; prepare a larger corpus, train fewer steps, or raise the limit"
            )
    return uses


def data_lines(uses: Sequence[DataUse], limit: float | None) -> list[str]:
    """What the runs read, grouped by data and length, as printed lines of a plan."""
    groups: dict[tuple, list[DataUse]] = {}
    for use in uses:
        groups.setdefault((use.data, use.tokens_needed, use.tokens_available, use.missing), []).append(use)
    lines = [f"  data (max_epochs_over_data={'none' if limit is None else f'{limit:g}'}):"]
    for (data, needed, available, _), members in groups.items():
        runs = f"{len(members)} run{'s' if len(members) > 1 else ''}"
        if available is None:
            lines.append(
                f"    {runs} x {needed / 1e6:,.1f} M tokens from {data}: not prepared here yet "
                f"(`repro data prepare SOURCE --out {data}`)"
            )
        else:
            over = (
                "  OVER THE LIMIT: the experiment stops before training"
                if over_limit(members[0], limit)
                else ""
            )
            lines.append(
                f"    {runs} x {needed / 1e6:,.1f} M tokens from {data} ({available / 1e6:,.1f} M training tokens): "
                f"{needed / available:.2f} epochs each{over}"
            )
    return lines
