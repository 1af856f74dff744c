"""Quality-storage-compute plot of the MLA allocations: KV bytes per token against validation loss,
coloured by attention FLOPs per token, Pareto front marked (every method and budget trained)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COLUMN_WIDTH_IN, load_table1, plt, save, style  # noqa: E402


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
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN + 0.6, 2.9))
    xs = [p["kv_bytes_per_token"] for p in points]
    ys = [p["loss_mean"] for p in points]
    flops = [p["attention_flops_per_token"] / 1e6 for p in points]
    ax.errorbar(xs, ys, yerr=[p["loss_std"] or 0.0 for p in points], fmt="none", ecolor="gray", elinewidth=0.6,
                capsize=1.5, zorder=1)
    sc = ax.scatter(xs, ys, c=flops, cmap="viridis", s=18, zorder=2, edgecolors="black", linewidths=0.3)
    fx = [xs[i] for i in front]
    fy = [ys[i] for i in front]
    ax.step(fx, fy, where="post", color="tab:red", lw=1.0, zorder=3, label="Pareto front")
    order = sorted(range(len(points)), key=lambda i: (xs[i], ys[i]))
    for rank, i in enumerate(order):  # alternate sides so that labels of neighbouring points do not collide
        p = points[i]
        label = ", ".join(p["methods"][:3]) + ("…" if len(p["methods"]) > 3 else "")
        left = rank % 2 == 1
        ax.annotate(label, (xs[i], ys[i]), textcoords="offset points", xytext=(-3 if left else 3, 2),
                    ha="right" if left else "left", fontsize=5)
    cb = fig.colorbar(sc, ax=ax)
    cb.set_label(f"attention FLOPs per token (millions, context {a.get('context', '?')})")
    ax.set_xlabel(f"KV cache per token (bytes, {bpe} B/element, all layers)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"MLA allocations, {a['target_layers']} layers (scale {doc['scale']})")
    ax.legend(frameon=False, loc="best")
    return save(fig, out, "quality_storage_compute")


if __name__ == "__main__":
    main()
