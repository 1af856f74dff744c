"""Compressor benchmark: compress+decompress throughput on activation-shaped tensors, and the
achieved payload against the analytical size (values, indices, scales) written out here from
the compressors' definitions, not taken from their own ``payload_nbytes``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from repro.pipeline.compressors import Compressor, Quantize, RandK, TopK, build_compressor

from .measure import row
from .settings import BenchSettings


def analytical_bytes(comp: Compressor, shape: tuple[int, ...]) -> int:
    """Bytes a message of fp32 ``shape`` should take: fp16/bf16 2 per value; topk k values (4)
    plus k indices of the smallest integer type holding n; randk k values (the indices come from
    the shared seed); quant one fp16 scale per channel plus ceil(n * bits / 8) packed codes."""
    n = math.prod(shape)
    if comp.is_identity:
        return 4 * n
    if isinstance(comp, TopK):
        k = max(1, min(n, math.ceil(comp.ratio * n)))
        index = 1 if n <= 256 else 2 if n <= 2**15 else 4 if n <= 2**31 else 8
        return k * (4 + index)
    if isinstance(comp, RandK):
        return max(1, min(n, math.ceil(comp.ratio * n))) * 4
    if isinstance(comp, Quantize):
        return shape[-1] * torch.tensor([], dtype=comp.scale_dtype).element_size() + math.ceil(
            n * comp.bits / 8
        )
    return 2 * n  # fp16 / bf16 casts


def bench_compressors(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for shape in s.compressor_shapes:
        x = torch.randn(*shape, generator=gen)
        raw = x.numel() * 4
        for spec in s.compressors:
            comp = build_compressor(spec)
            progress(f"compressors: {spec} on {list(shape)}")
            comp.decompress(comp.compress(x, seed=1), x.shape, x.dtype, seed=1)  # warm-up
            seconds = []
            for i in range(s.compressor_repeats):
                start = time.perf_counter()
                payload = comp.compress(x, seed=i)
                comp.decompress(payload, x.shape, x.dtype, seed=i)
                seconds.append(time.perf_counter() - start)
            achieved = payload.nbytes
            analytic = analytical_bytes(comp, tuple(shape))
            # seconds a bandwidth_mbps link saves on this message (both are paid once per message)
            saved_s = (raw - achieved) * 8 / (s.bandwidth_mbps * 1e6)
            gbps = [raw / t / 1e9 for t in seconds]
            median_s = sorted(seconds)[len(seconds) // 2]
            rows.append(
                row(
                    "compressors",
                    f"{spec} {list(shape)}",
                    "compress+decompress throughput",
                    "GB/s of input",
                    gbps,
                    extra={
                        "shape": list(shape),
                        "achieved_bytes": achieved,
                        "analytical_bytes": analytic,
                        "bytes_rel_diff": abs(achieved - analytic) / analytic,
                        "bytes_goal_met": abs(achieved - analytic) <= 0.01 * analytic,
                        "compression_ratio": achieved / raw,
                        "codec_s": median_s,
                        "link_saved_s": saved_s,
                        "time_goal_met": median_s < saved_s,
                    },
                )
            )
    return rows
