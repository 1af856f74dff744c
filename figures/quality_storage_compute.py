"""Quality-storage-compute plot of the MLA allocations: KV bytes per token against validation loss,
coloured by attention FLOPs per token, Pareto front marked (every method and budget trained).
Points are numbered; the key under the plot names the allocations of each."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COLUMN_WIDTH_IN, load_table1, plt, save, style


def number_points(ax, points, xs, ys) -> None:
    """A number for every point and a key under the axes. Points that share a storage size (every
    budget-matched allocation) get their numbers in a column beside them, in the order of their
    losses, joined by short lines that cannot cross."""
    order = sorted(range(len(points)), key=lambda i: (xs[i], ys[i]))
    number = {i: n for n, i in enumerate(order, start=1)}
    y_span = (max(ys) - min(ys)) or 1.0
    x_span = (max(xs) - min(xs)) or 1.0
    gap = 0.045 * y_span
    for x in sorted(set(xs)):
        group = sorted((i for i in range(len(points)) if xs[i] == x), key=lambda i: ys[i])
        if len(group) == 1:
            i = group[0]
            ax.annotate(
                str(number[i]), (xs[i], ys[i]), textcoords="offset points", xytext=(3, 3), fontsize=5.5
            )
            continue
        placed: list[float] = []
        for i in group:
            placed.append(ys[i] if not placed else max(ys[i], placed[-1] + gap))
        shift = (placed[-1] - ys[group[-1]]) / 2  # centre the column on the group
        for i, y in zip(group, placed):
            ax.annotate(
                str(number[i]),
                (xs[i], ys[i]),
                xytext=(xs[i] + 0.06 * x_span, y - shift),
                textcoords="data",
                va="center",
                fontsize=5.5,
                arrowprops={"arrowstyle": "-", "lw": 0.3, "color": "gray", "shrinkA": 0, "shrinkB": 1},
            )
    key = [f"{number[i]}: {', '.join(points[i]['methods'])}" for i in order]
    half = (len(key) + 1) // 2
    for column, lines in enumerate((key[:half], key[half:])):
        ax.text(
            0.5 * column,
            -0.23,
            "\n".join(lines),
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=5.5,
            linespacing=1.3,
        )


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_table1(results, "quality_storage_compute")
    if doc is None:
        return []
    if "mla" not in doc["architectures"]:
        print("[figures] skip quality_storage_compute: the table has no MLA half")
        return []
    style()
    a = doc["architectures"]["mla"]
    points, front = a["storage_points"], a["pareto_front"]
    bpe = a.get("bytes_per_elem", 2)
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN + 0.6, 3.4))
    xs = [p["kv_bytes_per_token"] for p in points]
    ys = [p["loss_mean"] for p in points]
    flops = [p["attention_flops_per_token"] / 1e6 for p in points]
    ax.errorbar(
        xs,
        ys,
        yerr=[p["loss_std"] or 0.0 for p in points],
        fmt="none",
        ecolor="gray",
        elinewidth=0.6,
        capsize=1.5,
        zorder=1,
    )
    sc = ax.scatter(xs, ys, c=flops, cmap="viridis", s=18, zorder=2, edgecolors="black", linewidths=0.3)
    fx = [xs[i] for i in front]
    fy = [ys[i] for i in front]
    ax.step(fx, fy, where="post", color="tab:red", lw=1.0, zorder=3, label="Pareto front")
    number_points(ax, points, xs, ys)
    cb = fig.colorbar(sc, ax=ax)
    cb.set_label(f"attention FLOPs per token (millions, context {a.get('context', '?')})")
    ax.set_xlabel(f"KV cache per token (bytes, {bpe} B/element, all layers)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"MLA allocations, {a['target_layers']} layers (scale {doc['scale']})")
    ax.legend(frameon=False, loc="best")
    return save(fig, out, "quality_storage_compute")


if __name__ == "__main__":
    main()
