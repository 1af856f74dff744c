"""Quality-storage-compute plot of the MLA allocations: KV bytes per token against validation loss,
coloured by attention FLOPs per token, Pareto front marked (every method and budget trained).
Points are numbered; the key under the plot names the allocations of each."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COLUMN_WIDTH_IN, load_table1, plt, save, style


def number_points(ax, fig, points, xs, ys) -> None:
    """A number next to every point and a key under the axes (no leader lines to cross)."""
    order = sorted(range(len(points)), key=lambda i: (xs[i], ys[i]))
    key = []
    for n, i in enumerate(order, start=1):
        ax.annotate(str(n), (xs[i], ys[i]), textcoords="offset points", xytext=(3, 3), fontsize=5.5)
        key.append(f"{n}: {', '.join(points[i]['methods'])}")
    ax.text(
        0.0, -0.2, "\n".join(key), transform=ax.transAxes, va="top", ha="left", fontsize=5.5, linespacing=1.25
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
    number_points(ax, fig, points, xs, ys)
    cb = fig.colorbar(sc, ax=ax)
    cb.set_label(f"attention FLOPs per token (millions, context {a.get('context', '?')})")
    ax.set_xlabel(f"KV cache per token (bytes, {bpe} B/element, all layers)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"MLA allocations, {a['target_layers']} layers (scale {doc['scale']})")
    ax.legend(frameon=False, loc="best")
    return save(fig, out, "quality_storage_compute")


if __name__ == "__main__":
    main()
