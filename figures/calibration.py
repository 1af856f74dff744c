"""Does the profile predict the gain? Predicted (sum of the chosen layers' coverage benefit) against
realized gain (loss of all-low minus loss of the allocation, full runs), and the pairwise
interaction terms of the top layers. Values in millinats (1 mnat = 0.001 nats), so no axis needs
an offset; legends sit under their panels, off the data."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TEXT_WIDTH_IN, load_table1, plt, save, style

MN = 1000.0  # nats -> millinats


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_table1(results, "calibration")
    if doc is None:
        return []
    style()
    archs = list(doc["architectures"])
    fig, axes = plt.subplots(len(archs), 2, figsize=(TEXT_WIDTH_IN, 2.8 * len(archs)), squeeze=False)
    for row, arch in zip(axes, archs):
        an = doc["architectures"][arch]["analysis"]
        ax = row[0]
        pts = an["calibration_points"]
        px = [MN * p["predicted_gain"] for p in pts]
        py = [MN * p["realized_gain"] for p in pts]
        ax.scatter(px, py, s=16, color="tab:blue", edgecolors="black", linewidths=0.3)
        offsets = ((3, 2, "left"), (3, -7, "left"), (-3, 2, "right"), (-3, -7, "right"))
        for i, p in enumerate(sorted(pts, key=lambda q: (q["predicted_gain"], q["realized_gain"]))):
            dx, dy, ha = offsets[i % len(offsets)]  # neighbours' labels go to different corners
            ax.annotate(
                ",".join(p["methods"][:2]),
                (MN * p["predicted_gain"], MN * p["realized_gain"]),
                textcoords="offset points",
                xytext=(dx, dy),
                ha=ha,
                fontsize=4.5,
            )
        cal = an.get("calibration")
        if cal and np.isfinite(cal["slope"]):
            xs = np.linspace(min(px), max(px), 2)
            ax.plot(
                xs,
                cal["slope"] * xs + MN * cal["intercept"],
                "--",
                color="tab:red",
                label=f"fit: slope {cal['slope']:.2f}, Spearman {cal['spearman']:.2f}",
            )
            ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.28))
        ax.set_xlabel("predicted gain: sum of benefit of high layers (mnats)")
        ax.set_ylabel("realized gain vs all-low (mnats)")
        ax.set_title(f"{arch.upper()}: calibration ({len(pts)} allocations)")
        ax = row[1]
        terms = an["interactions"]
        if terms:
            labels = [f"{t['layers'][0]}+{t['layers'][1]}" for t in terms]
            x = np.arange(len(terms))
            w = 0.27
            ax.bar(
                x - w,
                [MN * t["pair_benefit"] for t in terms],
                w,
                label="pair benefit (measured)",
                color="tab:blue",
            )
            ax.bar(
                x, [MN * t["additive"] for t in terms], w, label="sum of single benefits", color="tab:gray"
            )
            ax.bar(x + w, [MN * t["interaction"] for t in terms], w, label="interaction", color="tab:orange")
            ax.axhline(0, color="black", lw=0.6)
            ax.set_xticks(x, labels)
            ax.set_xlabel("layer pair")
            ax.set_ylabel("benefit (mnats)")
            ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3)
        else:
            ax.text(
                0.5,
                0.5,
                "no interaction runs (interaction_top = 0)",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
        ax.set_title(f"{arch.upper()}: interactions of top layers")
    fig.suptitle(f"Profile calibration and interactions (scale {doc['scale']})")
    return save(fig, out, "calibration")


if __name__ == "__main__":
    main()
