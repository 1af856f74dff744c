"""Bit-packing of small unsigned integers (``bits`` in 1..8) into a uint8 byte stream.

Value ``i`` occupies bits ``[i*bits, (i+1)*bits)`` of the stream, least significant bit first;
the stream is padded with zero bits to a whole byte, so ``n`` values take ``ceil(n*bits/8)`` bytes.
"""

from __future__ import annotations

import math

import torch


def packed_nbytes(n: int, bits: int) -> int:
    """Bytes that ``n`` values of ``bits`` bits occupy once packed."""
    return math.ceil(n * bits / 8)


def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """1-D uint8 ``values`` (each < 2**bits) -> packed uint8 stream of ``packed_nbytes`` bytes."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits={bits!r}: allowed 1..8")
    values = values.reshape(-1).to(torch.uint8)
    if bits == 8:
        return values.clone()
    n = values.numel()
    device = values.device
    if 8 % bits == 0:  # 1, 2, 4 bits: whole values per byte
        per_byte = 8 // bits
        pad = (-n) % per_byte
        if pad:
            values = torch.cat([values, values.new_zeros(pad)])
        shifts = torch.arange(per_byte, device=device, dtype=torch.uint8) * bits
        return (values.view(-1, per_byte) << shifts).sum(dim=1, dtype=torch.uint8)
    # 3, 5, 6, 7 bits: expand to a bit stream, then regroup by 8
    shifts = torch.arange(bits, device=device, dtype=torch.uint8)
    stream = ((values.unsqueeze(1) >> shifts) & 1).reshape(-1)
    pad = (-stream.numel()) % 8
    if pad:
        stream = torch.cat([stream, stream.new_zeros(pad)])
    byte_shifts = torch.arange(8, device=device, dtype=torch.uint8)
    return (stream.view(-1, 8) << byte_shifts).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``n`` values, as uint8."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits={bits!r}: allowed 1..8")
    packed = packed.reshape(-1).to(torch.uint8)
    if packed.numel() != packed_nbytes(n, bits):
        raise ValueError(f"{packed.numel()} packed bytes cannot hold {n} values of {bits} bits")
    if bits == 8:
        return packed.clone()
    device = packed.device
    mask = (1 << bits) - 1
    if 8 % bits == 0:
        per_byte = 8 // bits
        shifts = torch.arange(per_byte, device=device, dtype=torch.uint8) * bits
        return ((packed.unsqueeze(1) >> shifts) & mask).reshape(-1)[:n]
    byte_shifts = torch.arange(8, device=device, dtype=torch.uint8)
    stream = ((packed.unsqueeze(1) >> byte_shifts) & 1).reshape(-1)[: n * bits]
    shifts = torch.arange(bits, device=device, dtype=torch.uint8)
    return (stream.view(n, bits) << shifts).sum(dim=1, dtype=torch.uint8)
