"""Clapping: buffer memory of a middle rank against the dataset size N, AQ-SGD (per-sample rows,
O(N)) and Clapping (per micro-batch slot, O(1)); measured allocations over the analytical lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from _common import COLUMN_WIDTH_IN, METHOD_COLORS, load_clapping, plt, save, style


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_clapping(results, "clapping_memory")
    if doc is None:
        return []
    style()
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN, 2.4))
    for method, label in (("aqsgd", "AQ-SGD"), ("clapping_fc", "Clapping (FC/FU)")):
        pts = sorted((p for p in doc["memory"] if p["method"] == method), key=lambda p: p["N"])
        n = np.array([p["N"] for p in pts], dtype=float)
        ax.plot(
            n,
            [p["analytical_bytes"] / 2**20 for p in pts],
            "-",
            color=METHOD_COLORS[method],
            label=f"{label}, analytical",
        )
        ax.scatter(
            n,
            [p["measured_bytes"] / 2**20 for p in pts],
            color=METHOD_COLORS[method],
            s=14,
            edgecolors="black",
            linewidths=0.3,
            zorder=3,
            label=f"{label}, measured",
        )
        here = [p for p in pts if p["is_dataset"] and method == "aqsgd"]
        for p in here:
            ax.annotate(
                "this run's N",
                (p["N"], p["measured_bytes"] / 2**20),
                textcoords="offset points",
                xytext=(4, -8),
                fontsize=5.5,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("dataset size N (samples)")
    ax.set_ylabel("buffer memory of a middle rank (MiB)")
    ax.legend(frameon=False, loc="upper left")
    return save(fig, out, "clapping_memory")


if __name__ == "__main__":
    main()
