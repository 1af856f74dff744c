"""Clapping: final validation loss against the lazy-sampling probability p (mean over seeds with a
95 % confidence interval), Clapping-FC and Clapping-FU per compressor, in the fine-tune regime (the
first regime of the results); the none row as a reference band."""

from __future__ import annotations

from pathlib import Path

from repro.stats import mean_interval

from _common import COLUMN_WIDTH_IN, METHOD_COLORS, load_clapping, plt, save, seeds_phrase, style


def _finals(doc: dict, regime: str, method: str, compressor: str, p: float) -> list[float]:
    return [
        r["final_val_loss"]
        for r in doc["runs"]
        if r.get("tied_compressor", "identity") == "identity"  # the exact tied sum's rows
        if (r["regime"], r["method"], r["compressor"], r["p"]) == (regime, method, compressor, p)
    ]


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_clapping(results, "clapping_p")
    if doc is None:
        return []
    style()
    regime = doc["settings"]["regimes"][0]
    grid = doc["settings"][regime]
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN, 2.6))
    markers = ["o", "s", "^", "D"]
    for i, comp in enumerate(grid["compressors"]):
        for method, ls, shift in (("clapping_fc", "-", -0.006), ("clapping_fu", "--", 0.006)):
            ps = sorted(grid["clapping_p"])
            stats = [mean_interval(_finals(doc, regime, method, comp, p)) for p in ps]
            if not all(_finals(doc, regime, method, comp, p) for p in ps):
                continue
            means = [m for m, _, _ in stats]
            err = [[m - lo for m, lo, _ in stats], [hi - m for m, _, hi in stats]]
            ax.errorbar(
                [p + shift for p in ps],
                means,
                yerr=err,
                color=METHOD_COLORS[method],
                linestyle=ls,
                marker=markers[i % 4],
                markersize=3,
                capsize=2,
                label=f"{method} {comp}",
            )
    none = _finals(doc, regime, "none", "identity", 1.0)
    if none:
        mean, low, high = mean_interval(none)
        ax.axhline(mean, color="black", linewidth=0.8, linestyle=":", label="none (exact)")
        ax.axhspan(low, high, color="black", alpha=0.08, linewidth=0)
    ps = sorted(grid["clapping_p"] + [1.0])
    ax.set_xlim(0.0, 1.05)  # p is in (0, 1]: the whole range, whatever ps the grid has
    ax.set_xticks(sorted(set(ps)))
    ax.set_xlabel("p (probability of a fresh batch)")
    ax.set_ylabel("final validation loss (nats/token)")
    spread = "mean and 95% CI over " if len(doc["seeds"]) > 1 else "one run, no interval: "
    ax.set_title(
        f"Clapping: final loss against p, {regime} regime ({spread}{seeds_phrase(doc['seeds'])})", fontsize=7
    )
    fig.legend(loc="outside lower center", ncol=2, frameon=False, fontsize=5.5)
    return save(fig, out, "clapping_p")


if __name__ == "__main__":
    main()
