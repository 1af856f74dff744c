"""Compressors for the messages between pipeline stages (PROTOCOL.md §C2).

``compress(x, seed) -> Payload`` and ``decompress(payload, shape, dtype, seed) -> x_hat``. A
:class:`Payload` is one flat uint8 tensor: exactly the bytes that cross the wire, so its size is
the byte count that is logged. Both ends rebuild ``x_hat`` from the same bytes with the same code,
so error-feedback buffers stay bit-identical on sender and receiver. ``seed`` is shared by both
ends (it picks ``randk``'s entries and ``quant``'s stochastic rounding); the receiver knows the
message's shape and dtype before it arrives, so :meth:`Compressor.payload_nbytes` tells it how many
bytes to receive.

Spec strings: ``identity``, ``fp16``, ``bf16``, ``topk(0.05)``, ``randk(0.1)``, ``quant(4)`` (the
zero-level fixed-point grid), ``quant(4,stochastic)``, ``quant(2,grid=span)`` (the grid without a
zero level).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from .bitpack import pack_bits, packed_nbytes, unpack_bits

COMPRESSOR_KINDS = ("identity", "fp16", "bf16", "topk", "randk", "quant")


@dataclass
class Payload:
    """The bytes of one message, as sent."""

    data: torch.Tensor  # 1-D uint8

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _from_bytes(data: torch.Tensor, offset: int, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    size = numel * torch.empty((), dtype=dtype).element_size()
    chunk = data[offset : offset + size]
    if dtype != torch.uint8:
        if offset % torch.empty((), dtype=dtype).element_size():
            chunk = chunk.clone()  # a dtype view needs an aligned start
        chunk = chunk.view(dtype)
    return chunk, offset + size


def _numel(shape) -> int:
    return math.prod(shape)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _shared_generator(seed: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen


class Compressor:
    """Base class; ``spec`` is the string that builds it again."""

    kind = "identity"

    @property
    def spec(self) -> str:
        return self.kind

    @property
    def is_identity(self) -> bool:
        return False

    def payload_nbytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        raise NotImplementedError

    def compress(self, x: torch.Tensor, seed: int = 0) -> Payload:
        raise NotImplementedError

    def decompress(
        self, payload: Payload, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0
    ) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.spec


class Identity(Compressor):
    """The message itself (zero-copy on the sender)."""

    kind = "identity"

    @property
    def is_identity(self) -> bool:
        return True

    def payload_nbytes(self, shape, dtype) -> int:
        return _numel(shape) * _element_size(dtype)

    def compress(self, x, seed=0) -> Payload:
        return Payload(_as_bytes(x))

    def decompress(self, payload, shape, dtype, seed=0) -> torch.Tensor:
        return _from_bytes(payload.data, 0, _numel(shape), dtype)[0].view(shape)


class Cast(Compressor):
    """Cast to a 16-bit float (``fp16`` or ``bf16``) and back."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.wire_dtype = torch.float16 if kind == "fp16" else torch.bfloat16

    def payload_nbytes(self, shape, dtype) -> int:
        return _numel(shape) * 2

    def compress(self, x, seed=0) -> Payload:
        return Payload(_as_bytes(x.to(self.wire_dtype)))

    def decompress(self, payload, shape, dtype, seed=0) -> torch.Tensor:
        return _from_bytes(payload.data, 0, _numel(shape), self.wire_dtype)[0].view(shape).to(dtype)


def _index_dtype(n: int) -> torch.dtype:
    """Smallest signed integer dtype that holds the indices 0..n-1 (uint8 up to 256 entries)."""
    if n <= 256:
        return torch.uint8
    if n <= 2**15:
        return torch.int16
    if n <= 2**31:
        return torch.int32
    return torch.int64


class _Sparsifier(Compressor):
    """Keeps ``k = ceil(ratio * n)`` of the ``n`` entries."""

    def __init__(self, ratio: float) -> None:
        _check_ratio(ratio, self.kind)
        self.ratio = float(ratio)

    @property
    def spec(self) -> str:
        return f"{self.kind}({self.ratio:g})"

    def k(self, n: int) -> int:
        return max(1, min(n, math.ceil(self.ratio * n)))


class TopK(_Sparsifier):
    """The ``ceil(ratio * n)`` largest-magnitude entries: values, then their indices."""

    kind = "topk"

    def payload_nbytes(self, shape, dtype) -> int:
        n = _numel(shape)
        return self.k(n) * (_element_size(dtype) + _element_size(_index_dtype(n)))

    def compress(self, x, seed=0) -> Payload:
        flat = x.reshape(-1)
        n = flat.numel()
        idx = torch.topk(flat.abs(), self.k(n), sorted=False).indices
        idx, _ = torch.sort(idx)  # a canonical order: the same payload for the same message
        values = flat[idx]
        return Payload(torch.cat([_as_bytes(values), _as_bytes(idx.to(_index_dtype(n)))]))

    def decompress(self, payload, shape, dtype, seed=0) -> torch.Tensor:
        n = _numel(shape)
        k = self.k(n)
        values, offset = _from_bytes(payload.data, 0, k, dtype)
        idx, _ = _from_bytes(payload.data, offset, k, _index_dtype(n))
        out = torch.zeros(n, dtype=dtype, device=payload.data.device)
        out[idx.long()] = values
        return out.view(shape)


class RandK(_Sparsifier):
    """``ceil(ratio * n)`` entries drawn from the shared seed; only their values are sent.
    Not rescaled by ``n / k`` (a contractive compressor, as error feedback assumes)."""

    kind = "randk"

    def _indices(self, n: int, seed: int, device: torch.device) -> torch.Tensor:
        gen = _shared_generator(seed, device)
        return torch.randperm(n, generator=gen, device=device)[: self.k(n)]

    def payload_nbytes(self, shape, dtype) -> int:
        return self.k(_numel(shape)) * _element_size(dtype)

    def compress(self, x, seed=0) -> Payload:
        flat = x.reshape(-1)
        return Payload(_as_bytes(flat[self._indices(flat.numel(), seed, flat.device)]))

    def decompress(self, payload, shape, dtype, seed=0) -> torch.Tensor:
        n = _numel(shape)
        values, _ = _from_bytes(payload.data, 0, self.k(n), dtype)
        out = torch.zeros(n, dtype=dtype, device=payload.data.device)
        out[self._indices(n, seed, payload.data.device)] = values
        return out.view(shape)


QUANT_GRIDS = ("fixed", "span")  # the default grid first


class Quantize(Compressor):
    """``bits``-bit quantization with one absmax scale ``s`` per hidden channel (the last
    dimension), taken over batch and sequence and stored as ``scale_dtype`` (fp16 by default,
    rounded up so that no value exceeds it). Values are bit-packed. Two grids:

    - ``fixed`` (the default): AC-SGD's fixed point. Step ``s / 2**(bits-1)``, codes clipped to
      ``[-2**(bits-1), 2**(bits-1) - 1]``, so 0 is a level; deterministic rounding errs by at most
      half a step inside the grid and one step at the clipped top.
    - ``span``: ``2**bits`` levels spread evenly over ``[-s, s]`` (no zero level; error at most
      ``s / (2**bits - 1)``). On heavy-tailed data most values sit near 0 and are sent as
      ``+-s / (2**bits - 1)``, so its relative error can exceed 1: not contractive there.
    """

    kind = "quant"

    def __init__(
        self, bits: int, stochastic: bool = False, scale_dtype: str = "fp16", grid: str = "fixed"
    ) -> None:
        if not isinstance(bits, int) or isinstance(bits, bool) or not 2 <= bits <= 8:
            raise ValueError(f"quant bits={bits!r}: allowed integers 2..8")
        if scale_dtype not in _SCALE_DTYPES:
            raise ValueError(f"quant scale_dtype={scale_dtype!r}: allowed {tuple(_SCALE_DTYPES)}")
        if grid not in QUANT_GRIDS:
            raise ValueError(f"quant grid={grid!r}: allowed {QUANT_GRIDS}")
        self.bits = bits
        self.stochastic = bool(stochastic)
        self.scale_dtype_name = scale_dtype
        self.scale_dtype = _SCALE_DTYPES[scale_dtype]
        self.grid = grid
        self.levels = 2**bits - 1  # span: the top code
        self.half = 2 ** (bits - 1)  # fixed: codes -half .. half - 1, step s / half

    @property
    def spec(self) -> str:
        extra = ",stochastic" if self.stochastic else ""
        extra += f",scale={self.scale_dtype_name}" if self.scale_dtype_name != "fp16" else ""
        extra += f",grid={self.grid}" if self.grid != "fixed" else ""
        return f"quant({self.bits}{extra})"

    @staticmethod
    def _channels(shape) -> int:
        return shape[-1] if len(shape) else 1

    def payload_nbytes(self, shape, dtype) -> int:
        channels = self._channels(shape)
        return channels * _element_size(self.scale_dtype) + packed_nbytes(_numel(shape), self.bits)

    def _scale(self, rows: torch.Tensor) -> torch.Tensor:
        # a channel beyond the scale dtype's range (fp16: 65504) is clipped to it, not sent as inf
        absmax = rows.abs().amax(dim=0).float().clamp(max=torch.finfo(self.scale_dtype).max)
        scale = absmax.to(self.scale_dtype)
        too_small = scale.float() < absmax
        if bool(too_small.any()):  # round up, so |x| <= scale after the cast
            bumped = torch.nextafter(scale, torch.full_like(scale, float("inf")))
            scale = torch.where(too_small, bumped, scale)
        return scale

    def _round(self, u: torch.Tensor, seed: int) -> torch.Tensor:
        if self.stochastic:
            noise = torch.rand(u.shape, generator=_shared_generator(seed, u.device), device=u.device)
            return torch.floor(u + noise)
        return torch.round(u)

    def codes(self, rows: torch.Tensor, s: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """The unsigned codes (0 .. 2**bits - 1) of ``rows`` (n, channels) under scales ``s``."""
        safe = torch.where(s > 0, s, torch.ones_like(s))
        if self.grid == "span":
            return self._round((rows / safe + 1.0) * (0.5 * self.levels), seed).clamp_(0, self.levels)
        signed = self._round(rows / safe * self.half, seed).clamp_(-self.half, self.half - 1)
        return signed + self.half

    def values(self, codes: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The values the codes stand for (the inverse of ``codes`` up to rounding)."""
        if self.grid == "span":
            return (codes * (2.0 / self.levels) - 1.0) * s
        return (codes - self.half) * (s / self.half)

    def compress(self, x, seed=0) -> Payload:
        rows = x.reshape(-1, self._channels(x.shape)).float()
        scale = self._scale(rows)
        q = self.codes(rows, scale.float(), seed).to(torch.uint8)
        return Payload(torch.cat([_as_bytes(scale), pack_bits(q.reshape(-1), self.bits)]))

    def decompress(self, payload, shape, dtype, seed=0) -> torch.Tensor:
        channels = self._channels(shape)
        scale, offset = _from_bytes(payload.data, 0, channels, self.scale_dtype)
        q = unpack_bits(payload.data[offset:], self.bits, _numel(shape)).view(-1, channels).float()
        return self.values(q, scale.float()).view(shape).to(dtype)


_SCALE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _check_ratio(ratio, kind: str) -> None:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < float(ratio) <= 1.0:
        raise ValueError(f"{kind} ratio={ratio!r}: must be in (0, 1]")


_SPEC = re.compile(r"^\s*([a-z0-9]+)\s*(?:\((.*)\))?\s*$")


def build_compressor(spec: str | Compressor, field: str = "compressor") -> Compressor:
    """Build a compressor from its spec string (``quant(4)``, ``topk(0.05)``, ...)."""
    if isinstance(spec, Compressor):
        return spec
    allowed = (
        "identity, fp16, bf16, topk(ratio), randk(ratio), "
        "quant(bits[,stochastic][,scale=fp16|bf16|fp32][,grid=fixed|span])"
    )
    match = _SPEC.match(str(spec))
    if not match or match.group(1) not in COMPRESSOR_KINDS:
        raise ValueError(f"{field}={spec!r}: unknown compressor; allowed: {allowed}")
    kind, arg_text = match.group(1), match.group(2)
    args = [a.strip() for a in arg_text.split(",")] if arg_text else []
    try:
        if kind in ("identity", "fp16", "bf16"):
            if args:
                raise ValueError(f"{kind} takes no arguments")
            return Identity() if kind == "identity" else Cast(kind)
        if kind in ("topk", "randk"):
            if len(args) != 1:
                raise ValueError(f"{kind} takes one argument, the ratio in (0, 1]")
            cls = TopK if kind == "topk" else RandK
            return cls(float(args[0]))
        if not args:
            raise ValueError("quant needs the number of bits, e.g. quant(4)")
        bits = int(args[0])
        stochastic, scale, grid = False, "fp16", "fixed"
        for extra in args[1:]:
            if extra == "stochastic":
                stochastic = True
            elif extra == "deterministic":
                stochastic = False
            elif extra.startswith("scale="):
                scale = extra.split("=", 1)[1]
            elif extra.startswith("grid="):
                grid = extra.split("=", 1)[1]
            else:
                raise ValueError(f"unknown quant option {extra!r}")
        return Quantize(bits, stochastic, scale, grid)
    except ValueError as exc:
        raise ValueError(f"{field}={spec!r}: {exc}; allowed: {allowed}") from None
