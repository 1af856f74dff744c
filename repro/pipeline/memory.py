"""The memory model of the methods' buffers (PROTOCOL.md §C3): what a middle pipeline rank keeps,
measured by allocating the buffers with the methods' own code, next to the analytical formulas.

AQ-SGD keeps one row of ``T x d`` per training sample at each forward end (``N x T x d``; its
backward is direct, stateless). Clapping (and EF21) keep one buffer per micro-batch slot at each
end, in both directions: ``4 M (B/M) T d`` values on a middle rank, whatever ``N`` is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .codecs import ChannelCodec, MessageContext
from .compressors import build_compressor
from .sample_buffers import SampleBuffers

FLOAT32_BYTES = 4


@dataclass(frozen=True)
class BufferMemoryPoint:
    method: str  # 'aqsgd' or 'clapping_fc'
    N: int  # training samples
    measured_bytes: int  # bytes of the buffers the methods' code allocated
    analytical_bytes: int  # the formula's bytes


def analytical_buffer_bytes(method: str, n: int, t: int, d: int, micro_batches: int, micro_batch: int) -> int:
    """Buffer bytes of a middle rank (two boundaries, fp32 messages) by the formulas above."""
    if method == "aqsgd":
        return 2 * n * t * d * FLOAT32_BYTES
    return 4 * micro_batches * micro_batch * t * d * FLOAT32_BYTES


def buffer_memory_points(
    sizes: Iterable[int], t: int, d: int, micro_batches: int, micro_batch: int, compressor: str
) -> list[BufferMemoryPoint]:
    """For every N: the buffers of a middle rank's four channel ends after one message per slot."""
    comp = build_compressor(compressor)
    points = []
    for n in sorted(set(sizes)):
        for method in ("aqsgd", "clapping_fc"):
            measured = 0
            for direction in ("fwd", "fwd", "bwd", "bwd"):  # a middle rank's four channel ends
                rows = SampleBuffers(n) if method == "aqsgd" and direction == "fwd" else None
                codec = ChannelCodec(method, comp, 0, direction, 0, rows)
                for slot in range(micro_batches):
                    ids = torch.arange(slot * micro_batch, (slot + 1) * micro_batch) % n
                    codec.encode(torch.randn(micro_batch, t, d), slot, MessageContext(0, True, True, ids))
                measured += codec.buffer_nbytes
                if rows is not None:
                    rows.rows = None  # release before the next size
            points.append(
                BufferMemoryPoint(
                    method, n, measured, analytical_buffer_bytes(method, n, t, d, micro_batches, micro_batch)
                )
            )
    return points
