"""Table 1 as a forest plot: each row's paired difference to ``uniform`` (mean over seeds) with its
95% confidence interval, per architecture; filled markers are resolved (Holm-corrected p < 0.05),
open ones are not. Reference points (not budget-matched) are set apart below the line."""

from __future__ import annotations

import sys
from pathlib import Path

from repro.experiments.table1.table_files import ARCH_TITLE

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    REFERENCE_POINTS,
    TABLE1_COLORS,
    TEXT_WIDTH_IN,
    load_table1,
    method_of,
    plt,
    save,
    seeds_phrase,
    style,
)


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_table1(results, "table1_deltas")
    if doc is None:
        return []
    style()
    archs = list(doc["architectures"])
    rows = [r for r in doc["rows"] if method_of(r["method"]) != "uniform"]
    matched = [r for r in rows if method_of(r["method"]) not in REFERENCE_POINTS]
    ordered = matched + [r for r in rows if r not in matched]
    fig, axes = plt.subplots(
        1, len(archs), figsize=(TEXT_WIDTH_IN, 0.9 + 0.2 * len(ordered)), squeeze=False, sharey=True
    )
    for ax, arch in zip(axes[0], archs):
        for y, r in enumerate(ordered):
            delta = r.get(f"{arch}_delta_vs_uniform")
            if delta is None:
                continue
            low, high = r[f"{arch}_delta_ci_low"], r[f"{arch}_delta_ci_high"]
            color = TABLE1_COLORS.get(method_of(r["method"]), "gray")
            resolved = bool(r.get(f"{arch}_resolved"))
            if low is not None and high is not None:
                ax.plot([low, high], [y, y], color=color, linewidth=1.2)
            ax.plot(delta, y, "o", color=color, markerfacecolor=color if resolved else "white", markersize=4)
        ax.axvline(0.0, color="black", linewidth=0.7)
        ax.axhline(len(matched) - 0.5, color="gray", linewidth=0.5, linestyle=":")
        stats = doc["architectures"][arch].get("statistics", {})
        detect = stats.get("detectable_difference")
        title = f"{ARCH_TITLE[arch]}, {seeds_phrase(doc['seeds'])}"
        if detect:
            title += f"; detectable Δ {detect:.3f}"
        ax.set_title(title)
        ax.set_xlabel("Δ validation loss vs uniform (nats/token)")
    labels = [r["method"] + (" †" if method_of(r["method"]) in REFERENCE_POINTS else "") for r in ordered]
    axes[0][0].set_yticks(range(len(ordered)), labels)
    axes[0][0].invert_yaxis()
    fig.suptitle(
        f"Table 1 ({doc['scale']}): paired Δ to uniform, 95% CI; filled = resolved (Holm p < 0.05); "
        "† not budget-matched"
    )
    return save(fig, out, "table1_deltas")


if __name__ == "__main__":
    main()
