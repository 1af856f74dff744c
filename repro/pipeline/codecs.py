"""Communication methods (PROTOCOL.md §C3): what one end of one boundary and direction sends and
what it makes of what it receives.

A :class:`ChannelCodec` is one end (sender or receiver) of one (boundary, direction) channel. Both
ends hold the same state and update it from the same payload bytes, so their buffers are
bit-identical. Each message is handled in one of four modes:

- ``full``: the exact message (identity payload). ``none`` always; ``clapping_fu`` on fresh
  steps (``h <- x``); ``aqsgd`` forward during warm-up or for samples not yet buffered
  (``h[id] <- x``).
- ``direct``: ``C(x)``, no state (``direct``; ``aqsgd`` backward).
- ``delta``: ``c = C(x - h); h <- h + c``, one ``h`` per micro-batch slot (``ef21``,
  ``clapping_fc``, ``clapping_fu`` on reuse steps).
- ``delta_sample``: the same with ``h`` per training sample id (``aqsgd`` forward after warm-up).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .compressors import Compressor, Identity, Payload
from .sample_buffers import SampleBuffers

METHODS = ("none", "direct", "ef21", "aqsgd", "clapping_fc", "clapping_fu")
DIRECTIONS = ("fwd", "bwd")


@dataclass
class MessageContext:
    """What both ends know about a message before it is sent."""

    step: int  # training step (optimizer step index of the run)
    fresh: bool  # this step drew a fresh batch (lazy sampling)
    warmup: bool  # AQ-SGD warm-up epoch (sent uncompressed)
    sample_ids: torch.Tensor | None = None  # (micro-batch,) sample ids, AQ-SGD only


def message_seed(base_seed: int, boundary: int, direction: str, step: int, slot: int) -> int:
    """The seed both ends use for one message (randk's entries, stochastic rounding)."""
    key = f"{base_seed}|{boundary}|{direction}|{step}|{slot}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF


class ChannelCodec:
    """One end of one (boundary, direction) channel.

    Args:
        method: One of ``METHODS``.
        compressor: The compressor ``C`` of this direction.
        boundary: Boundary index (between stage ``boundary`` and ``boundary + 1``).
        direction: 'fwd' (activations) or 'bwd' (gradients).
        seed: Base seed of the shared message seeds.
        sample_buffers: AQ-SGD's per-sample rows (forward direction of method 'aqsgd').
    """

    def __init__(
        self,
        method: str,
        compressor: Compressor,
        boundary: int,
        direction: str,
        seed: int = 0,
        sample_buffers: SampleBuffers | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method={method!r}: allowed values are {METHODS}")
        if direction not in DIRECTIONS:
            raise ValueError(f"direction={direction!r}: allowed values are {DIRECTIONS}")
        if method == "aqsgd" and direction == "fwd" and sample_buffers is None:
            raise ValueError("aqsgd forward needs per-sample buffers")
        self.method = method
        self.compressor = compressor
        self.identity = Identity()
        self.boundary = boundary
        self.direction = direction
        self.seed = seed
        self.sample_buffers = sample_buffers
        self.slots: dict[int, torch.Tensor] = {}  # micro-batch slot -> h

    # ------------------------------------------------------------------ what a message is
    def mode(self, slot: int, ctx: MessageContext) -> str:
        m = self.method
        if m == "none":
            return "full"
        if m == "direct":
            return "direct"
        if m in ("ef21", "clapping_fc"):
            return "delta"
        if m == "clapping_fu":
            return "full" if ctx.fresh else "delta"
        # aqsgd
        if self.direction == "bwd":
            return "direct"
        if ctx.sample_ids is None:
            raise ValueError("aqsgd needs the batch's sample ids (batch key sample_id_key)")
        if ctx.warmup or not self.sample_buffers.all_filled(ctx.sample_ids):
            return "full"
        return "delta_sample"

    def wire_compressor(self, slot: int, ctx: MessageContext) -> Compressor:
        return self.identity if self.mode(slot, ctx) == "full" else self.compressor

    def payload_nbytes(self, shape, dtype, slot: int, ctx: MessageContext) -> int:
        return self.wire_compressor(slot, ctx).payload_nbytes(tuple(shape), dtype)

    # ------------------------------------------------------------------ the two ends
    def encode(self, x: torch.Tensor, slot: int, ctx: MessageContext) -> tuple[Payload, torch.Tensor]:
        """Sender: the payload to send and the ``x_hat`` the receiver will rebuild from it."""
        x = x.detach()
        mode = self.mode(slot, ctx)
        seed = message_seed(self.seed, self.boundary, self.direction, ctx.step, slot)
        if mode == "full":
            payload = self.identity.compress(x, seed)
        elif mode == "direct":
            payload = self.compressor.compress(x, seed)
        elif mode == "delta":
            payload = self.compressor.compress(x - self._slot_buffer(slot, x.shape, x.dtype, x.device), seed)
        else:
            rows = self.sample_buffers.read(ctx.sample_ids, x.device)
            payload = self.compressor.compress(x - rows, seed)
        return payload, self._apply(mode, payload, tuple(x.shape), x.dtype, slot, ctx, seed)

    def decode(self, payload: Payload, shape, dtype, slot: int, ctx: MessageContext) -> torch.Tensor:
        """Receiver: ``x_hat`` from the payload."""
        mode = self.mode(slot, ctx)
        seed = message_seed(self.seed, self.boundary, self.direction, ctx.step, slot)
        return self._apply(mode, payload, tuple(shape), dtype, slot, ctx, seed)

    def _apply(self, mode, payload, shape, dtype, slot, ctx, seed) -> torch.Tensor:
        if mode == "full":
            x = self.identity.decompress(payload, shape, dtype, seed)
            if self.method == "clapping_fu":
                self.slots[slot] = x.clone()
            elif self.method == "aqsgd":
                self.sample_buffers.write(ctx.sample_ids, x)
            return x
        c = self.compressor.decompress(payload, shape, dtype, seed)
        if mode == "direct":
            return c
        if mode == "delta":
            h = self._slot_buffer(slot, shape, dtype, c.device) + c
            self.slots[slot] = h
            return h.clone()
        h = self.sample_buffers.read(ctx.sample_ids, c.device) + c
        self.sample_buffers.write(ctx.sample_ids, h)
        return h

    def _slot_buffer(self, slot, shape, dtype, device) -> torch.Tensor:
        h = self.slots.get(slot)
        if h is None:
            return torch.zeros(shape, dtype=dtype, device=device)
        if tuple(h.shape) != tuple(shape):
            raise ValueError(
                f"boundary {self.boundary} {self.direction}: micro-batch slot {slot} holds a {tuple(h.shape)} "
                f"buffer but the message is {tuple(shape)}; every training micro-batch must have the same shape"
            )
        return h

    # ------------------------------------------------------------------ state
    def snapshot(self, sample_ids: torch.Tensor | None) -> dict:
        """The state before a step, for ``restore`` (a step skipped for non-finite values). Slot
        buffers are replaced, never written in place, so keeping the dict is enough; AQ-SGD rows
        are written in place, so the step's rows are copied."""
        snap: dict = {"slots": dict(self.slots)}
        if self.sample_buffers is not None and sample_ids is not None:
            snap["rows"] = self.sample_buffers.snapshot(sample_ids)
        return snap

    def restore(self, snap: dict) -> None:
        self.slots = dict(snap["slots"])
        if "rows" in snap:
            self.sample_buffers.restore(snap["rows"])

    @property
    def buffer_nbytes(self) -> int:
        total = sum(h.numel() * h.element_size() for h in self.slots.values())
        if self.sample_buffers is not None:
            total += self.sample_buffers.nbytes
        return total

    def digest(self) -> str:
        """A hash of every buffer (equal on both ends of a channel)."""
        hasher = hashlib.sha256()
        for slot in sorted(self.slots):
            hasher.update(self.slots[slot].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        if self.sample_buffers is not None and self.sample_buffers.rows is not None:
            hasher.update(
                self.sample_buffers.rows.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
            )
            hasher.update(self.sample_buffers.filled.numpy().tobytes())
        return hasher.hexdigest()

    def state_dict(self, with_sample_buffers: bool = True) -> dict:
        """Slot buffers always; AQ-SGD's per-sample rows only when asked (they are N x T x d)."""
        state = {"slots": {k: v.detach().cpu().clone() for k, v in self.slots.items()}}
        if self.sample_buffers is not None and with_sample_buffers:
            state["sample_buffers"] = self.sample_buffers.state_dict()
        return state

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        self.slots = {int(k): v.to(device) for k, v in state["slots"].items()}
        if self.sample_buffers is not None and "sample_buffers" in state:
            self.sample_buffers.load_state_dict(state["sample_buffers"], device)


def channel_ends(rank: int, num_stages: int, wraps: bool = False) -> list[tuple[str, str, int]]:
    """The (direction, role, boundary) channel ends a stage holds: towards the next stage it sends
    activations and receives their gradients; towards the previous one, the reverse. With ``wraps``
    (``placement='v'``) the last stage's first part feeds stage 0 over boundary ``num_stages - 1``."""
    ends = []
    if rank < num_stages - 1:
        ends += [("fwd", "send", rank), ("bwd", "recv", rank)]
    if rank > 0:
        ends += [("fwd", "recv", rank - 1), ("bwd", "send", rank - 1)]
    if wraps and rank == num_stages - 1:
        ends += [("fwd", "send", rank), ("bwd", "recv", rank)]
    if wraps and rank == 0:
        ends += [("fwd", "recv", num_stages - 1), ("bwd", "send", num_stages - 1)]
    return ends


def build_codecs(
    method: str,
    compressors: dict[str, Compressor],
    rank: int,
    num_stages: int,
    seed: int = 0,
    sample_buffers: Callable[[int, str], SampleBuffers] | None = None,
    wraps: bool = False,
) -> dict[tuple[str, str], ChannelCodec]:
    """Every channel end of one stage, ``(direction, role) -> codec``. ``sample_buffers(boundary,
    role)`` makes AQ-SGD's per-sample rows of a forward end (method 'aqsgd' only); ``wraps``: see
    :func:`channel_ends`."""
    codecs = {}
    for direction, role, boundary in channel_ends(rank, num_stages, wraps):
        rows = None
        if method == "aqsgd" and direction == "fwd":
            if sample_buffers is None:
                raise ValueError("method='aqsgd' needs per-sample buffers for its forward channels")
            rows = sample_buffers(boundary, role)
        codecs[(direction, role)] = ChannelCodec(
            method, compressors[direction], boundary, direction, seed, rows
        )
    return codecs
