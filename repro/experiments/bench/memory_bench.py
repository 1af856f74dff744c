"""Memory benchmark: the buffer bytes a middle pipeline rank keeps for AQ-SGD (grows with the
dataset size N) and for Clapping (does not), measured by allocating them with the methods' own
code; and the peak resident memory of the pipeline processes (from the pipeline section)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from repro.pipeline.memory import buffer_memory_points

from .measure import row
from .settings import BenchSettings


def bench_memory(
    s: BenchSettings, progress: Callable[[str], None], store: dict[str, Any]
) -> list[dict[str, Any]]:
    progress("memory: AQ-SGD and Clapping buffers for N in " + ", ".join(map(str, s.memory_sizes)))
    points = buffer_memory_points(
        s.memory_sizes, s.block_size, s.n_embd, s.micro_batches, s.batch_size // s.micro_batches, "quant(4)"
    )
    rows = []
    for p in points:
        rows.append(
            row(
                "memory",
                f"{p.method} buffers of a middle rank, N={p.N}",
                "buffer memory",
                "bytes",
                [p.measured_bytes],
                extra={"N": p.N, "analytical_bytes": p.analytical_bytes, "method": p.method},
            )
        )
    pipe = store.get("pipeline")
    if pipe:
        for framework, runs in (
            ("clapping none+identity", pipe["ours"]),
            ("torch.distributed.pipelining", pipe["torch"]),
        ):
            for k, res in runs.items():
                rows.append(
                    row(
                        "memory",
                        f"{framework} K={k}: peak RSS of the largest rank",
                        "peak process memory",
                        "bytes",
                        [max(x["peak_rss"]) for x in res],
                        extra={"stages": k},
                    )
                )
    return rows
