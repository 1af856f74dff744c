"""``placement: auto``: where the model's first part runs, chosen by the bytes a step sends.

With a weight tied between the first part (a token embedding) and the last (the output head),
``linear`` sums that weight's gradient between stage 0 and the last stage after every backward,
both ends sending it whole (or as the tied compressor's payload). ``v`` runs the first part on the
last stage beside the head, one copy and no sum, and sends the first part's output to stage 0 and
its gradient back instead, per micro-batch, through the boundary compressors. ``auto`` picks ``v``
when the tied sum's bytes per step reach what ``v`` sends (at equal bytes ``v`` still wins: its
messages stream through the step, where the sum crosses after the last backward, in series), and
``linear`` otherwise (and always when nothing is tied: ``v`` would only add the wrap-around messages).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .compressors import Compressor
from .stage_parts import StageParts


@dataclass(frozen=True)
class PlacementChoice:
    placement: str  # 'linear' or 'v'
    why: str  # the reason, with the bytes per step of each where they are known

    def line(self) -> str:
        return f"[clapping] placement auto: {self.placement} ({self.why})"


def tied_first_and_last(parts: StageParts) -> list[nn.Parameter]:
    """The parameters the first and the last part share (a tied embedding and head)."""
    last = {id(p) for p in parts.last.parameters()}
    return [p for p in parts.first.parameters() if id(p) in last]


def first_part_width(parts: StageParts) -> int | None:
    """The features of the first part's output: its token embedding's width (None: no embedding)."""
    for module in parts.first.modules():
        if isinstance(module, nn.Embedding):
            return module.embedding_dim
    return None


def megabytes(n: int) -> str:
    return f"{n / 1e6:.3g} MB"


def choose_placement(
    parts: StageParts,
    num_stages: int,
    micro_batches: int,
    batch_shape: tuple[int, int] | None,
    fwd: Compressor,
    bwd: Compressor,
    tied: Compressor,
) -> PlacementChoice:
    """The placement ``auto`` resolves to, from the model's parts, the batch's (sequences, tokens)
    and the compressors of the boundaries and of the tied sum."""
    if num_stages < 2:
        return PlacementChoice("linear", "one stage")
    shared = tied_first_and_last(parts)
    if not shared:
        return PlacementChoice("linear", "no weight is tied between the first and the last part")
    tied_bytes = 2 * sum(tied.payload_nbytes(tuple(p.shape), p.dtype) for p in shared)
    width = first_part_width(parts)
    if batch_shape is None or width is None:
        unknown = "the batch shape" if batch_shape is None else "the first part's output width"
        return PlacementChoice(
            "linear",
            f"the tied sum sends {megabytes(tied_bytes)} a step; v is not priced: {unknown} is not known "
            f"before the first batch (set placement: v or linear to choose)",
        )
    sequences, tokens = batch_shape
    micro = (max(1, sequences // micro_batches), tokens, width)
    dtype = shared[0].dtype  # the embedding's output has its weight's dtype
    wrap_bytes = micro_batches * (fwd.payload_nbytes(micro, dtype) + bwd.payload_nbytes(micro, dtype))
    placement = "v" if tied_bytes >= wrap_bytes else "linear"  # equal: v overlaps, the sum does not
    return PlacementChoice(
        placement,
        f"a step's tied gradient sum sends {megabytes(tied_bytes)} under linear; v sends the first part's "
        f"output and its gradient instead, {megabytes(wrap_bytes)}",
    )
