"""Runs one stage's part of a training or evaluation step: the schedule's forwards and backwards,
with the messages of each boundary encoded, sent, received and decoded.

Message tags: payload of micro-batch ``m`` -> ``2m``, its shape header -> ``2m + 1``. A header is
sent only the first time a micro-batch signature (the shapes and dtypes of its tensors, known to
every rank since every rank sees the same batch) is seen; the receiver caches the shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .codecs import ChannelCodec, MessageContext
from .compressors import Identity
from .schedule import Action, forward_schedule
from .stage_parts import StageSplit
from .train_step import TrainStep
from .transport import StageLinks

EXACT = Identity()  # the exact message (method none, and every evaluation): its bytes and its layout


class NonFiniteError(FloatingPointError):
    """A message or the loss of a training step held NaN or inf (the message names where)."""


@dataclass
class DirectionStats:
    """What one direction of one boundary sent during a step (sender side)."""

    payload_bytes: int = 0  # bytes sent
    raw_bytes: int = 0  # bytes the exact message would take (method none)
    rel_error_sum: float | torch.Tensor = 0.0  # sum of ||x_hat - x|| / ||x|| (a device tensor once set)
    messages: int = 0
    nonfinite: float | torch.Tensor = 0.0  # messages whose decoded x_hat held NaN or inf (a device tensor)


@dataclass
class StepStats:
    fwd: DirectionStats = field(default_factory=DirectionStats)  # boundary stage -> stage+1 (this rank sends)
    bwd: DirectionStats = field(default_factory=DirectionStats)  # boundary stage-1 <- stage (this rank sends)


def batch_signature(batch: Any) -> tuple:
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape), str(batch.dtype))
    if isinstance(batch, dict):
        return tuple((k, batch_signature(v)) for k, v in sorted(batch.items()))
    if isinstance(batch, (list, tuple)):
        return tuple(batch_signature(v) for v in batch)
    return (type(batch).__name__,)


def split_batch(batch: Any, chunks: int, equal: bool) -> list[Any]:
    """Split every tensor of a batch along dim 0 into ``chunks`` micro-batches."""
    size = _batch_size(batch)
    if equal and size % chunks:
        raise ValueError(
            f"micro_batches={chunks}: the batch of {size} samples does not split into {chunks} equal micro-batches; "
            f"use a batch size divisible by micro_batches"
        )
    chunks = min(chunks, size)

    def cut(x):
        if isinstance(x, torch.Tensor):
            return list(torch.tensor_split(x, chunks, dim=0))
        if isinstance(x, dict):
            parts = {k: cut(v) for k, v in x.items()}
            return [{k: parts[k][i] for k in x} for i in range(chunks)]
        if isinstance(x, (list, tuple)):
            parts = [cut(v) for v in x]
            return [type(x)(p[i] for p in parts) for i in range(chunks)]
        return [x] * chunks

    return cut(batch)


def _batch_size(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    values = batch.values() if isinstance(batch, dict) else batch
    for v in values:
        if isinstance(v, (torch.Tensor, dict, list, tuple)):
            return _batch_size(v)
    raise ValueError("the batch holds no tensor to split into micro-batches")


class StageRunner:
    """Executes one rank's stage.

    Args:
        split: What this stage holds and how to run it.
        links: The point-to-point transport.
        codecs: {('fwd', 'send'), ('fwd', 'recv'), ('bwd', 'send'), ('bwd', 'recv')} -> ChannelCodec
            (only those that exist for this stage).
        input_fn: the stage adapter's ``input`` (what the first part reads from a micro-batch).
        loss_fn: the stage adapter's ``loss`` (the mean loss of a micro-batch from the last part).
    """

    def __init__(
        self,
        split: StageSplit,
        links: StageLinks,
        codecs: dict[tuple[str, str], ChannelCodec],
        input_fn: Callable[[Any], torch.Tensor],
        loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
    ) -> None:
        self.split = split
        self.links = links
        self.codecs = codecs
        self.input_fn = input_fn
        self.loss_fn = loss_fn
        self.stage = split.stage
        self.shapes: dict[
            tuple, tuple[tuple[int, ...], torch.dtype]
        ] = {}  # signature -> input message (shape, dtype)
        self.sent_signatures: set[tuple] = set()

    # ------------------------------------------------------------------ receiving
    def _input_shape(self, signature: tuple, m: int) -> tuple[tuple[int, ...], torch.dtype]:
        if signature not in self.shapes:
            self.shapes[signature] = self.links.recv_header(
                self.split.previous, "fwd", 2 * m + 1, f"shape header {m}"
            )
        return self.shapes[signature]

    def _send_forward(
        self, y: torch.Tensor, m: int, signature: tuple, codec: ChannelCodec | None, ctx, stats
    ):
        """Send a forward message to the next stage (stage 0 when the last stage's first part
        sends it: ``placement='v'``); every rank sends forward on one boundary at most."""
        dst = self.split.next
        if signature not in self.sent_signatures:
            self.links.send_header(tuple(y.shape), y.dtype, dst, "fwd", 2 * m + 1)
            self.sent_signatures.add(signature)
        self._send(y, m, "fwd", dst, codec, ctx, stats.fwd if stats else None)

    def _receive_exact_input(self, m: int, signature: tuple) -> torch.Tensor:
        """Micro-batch ``m``'s exact input message from the previous stage (evaluation)."""
        shape, dtype = self._input_shape(signature, m)
        nbytes = EXACT.payload_nbytes(shape, dtype)
        data = self.links.recv(nbytes, self.split.previous, "fwd", 2 * m, f"activation {m}").wait()
        return EXACT.decompress(data, shape, dtype)

    def _send(self, x: torch.Tensor, m: int, direction: str, dst: int, codec, ctx, stats) -> None:
        x = x.detach()
        if codec is None:  # evaluation: exact messages
            self.links.send(EXACT.compress(x).data, dst, direction, 2 * m)
            return
        with self.links.timeline.span(f"encode {direction} {m}", "codec"):
            payload, x_hat = codec.encode(x, m, ctx)
        self.links.send(payload.data, dst, direction, 2 * m)
        if stats is not None:
            stats.payload_bytes += payload.nbytes
            stats.raw_bytes += EXACT.payload_nbytes(tuple(x.shape), x.dtype)
            if codec.mode(m, ctx) != "full":  # a full message is exact: its error is 0
                # kept on the device: one host sync per step (in the strategy's reduction), not per message
                rel = torch.linalg.vector_norm(x_hat.float() - x.float()) / torch.linalg.vector_norm(
                    x.float()
                ).clamp_min(1e-30)
                stats.rel_error_sum = stats.rel_error_sum + rel
            stats.messages += 1
            # x_hat is what the receiver uses (a compressor can overflow: fp16 casts, fp16 scales)
            stats.nonfinite = stats.nonfinite + (~torch.isfinite(x_hat)).any().to(torch.float32)

    # ------------------------------------------------------------------ steps
    def train_step(
        self,
        micro_batches: list[Any],
        contexts: list[MessageContext],
        schedule: list[Action],
        loss_scale: float,
        feed_ahead: int | None = None,
    ) -> tuple[torch.Tensor | None, StepStats]:
        """Run the schedule (``train_step.py``; ``feed_ahead``: how far the last stage's first part
        runs ahead, placement 'v'); gradients accumulate into the parameters' ``.grad``. Returns the
        sum of the micro-batch losses (last stage; ``None`` elsewhere) and what this rank sent."""
        stats = StepStats()
        signatures = [batch_signature(mb) for mb in micro_batches]
        step = TrainStep(self, micro_batches, contexts, loss_scale, stats, signatures)
        step.run(schedule, feed_ahead)
        self.links.finish_sends()
        return step.loss_sum, stats

    @torch.no_grad()
    def eval_step(self, micro_batches: list[Any]) -> tuple[torch.Tensor | None, int]:
        """Forward only, exact messages. Returns (sum over micro-batches of loss * size, samples)."""
        split, links = self.split, self.links
        total: torch.Tensor | None = None
        count = 0
        signatures = [batch_signature(mb) for mb in micro_batches]
        if split.wraps and split.is_last:  # the first part runs here and feeds stage 0
            for m, mb in enumerate(micro_batches):
                self._send_forward(split.forward_first(self.input_fn(mb)), m, signatures[m], None, None, None)
        for action in forward_schedule(len(micro_batches)):
            m = action.micro_batch
            mb = micro_batches[m]
            x = self._receive_exact_input(m, signatures[m]) if split.receives_input else self.input_fn(mb)
            y = split.forward(x)
            if split.is_last:
                n = _batch_size(mb)
                value = self.loss_fn(y, mb).float() * n
                total = value if total is None else total + value
                count += n
            else:
                self._send_forward(y, m, signatures[m], None, None, None)
        links.finish_sends()
        return total, count
