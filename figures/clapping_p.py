"""Clapping: final validation loss against the lazy-sampling probability p (mean +- std over
seeds), Clapping-FC and Clapping-FU per compressor; the none row as a reference line."""

from __future__ import annotations

from pathlib import Path

from _common import COLUMN_WIDTH_IN, METHOD_COLORS, load_clapping, plt, save, style


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_clapping(results, "clapping_p")
    if doc is None:
        return []
    style()
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN, 2.4))
    markers = ["o", "s", "^", "D"]
    for i, comp in enumerate(doc["settings"]["compressors"]):
        for method, ls in (("clapping_fc", "-"), ("clapping_fu", "--")):
            rows = sorted(
                (r for r in doc["rows"] if r["method"] == method and r["compressor"] == comp),
                key=lambda r: r["p"],
            )
            if rows:
                ax.errorbar(
                    [r["p"] for r in rows],
                    [r["val_loss"] for r in rows],
                    yerr=[r["val_loss_std"] for r in rows],
                    color=METHOD_COLORS[method],
                    linestyle=ls,
                    marker=markers[i % 4],
                    markersize=3,
                    capsize=2,
                    label=f"{method} {comp}",
                )
    for r in doc["rows"]:
        if r["method"] == "none":
            ax.axhline(r["val_loss"], color="black", linewidth=0.8, linestyle=":", label="none (exact)")
    ax.set_xlabel("p (probability of a fresh batch)")
    ax.set_ylabel("final validation loss")
    ax.legend(frameon=False, fontsize=5.5)
    return save(fig, out, "clapping_p")


if __name__ == "__main__":
    main()
