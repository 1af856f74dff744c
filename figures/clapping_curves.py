"""Clapping: validation loss against step and against bytes sent, per regime (mean over seeds with
a 95 % confidence band). One line per method for each compressor; Clapping rows at the middle p."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import NullFormatter

from repro.stats import mean_interval

from _common import METHOD_COLORS, TEXT_WIDTH_IN, load_clapping, plt, save, style

SHOWN = ("none", "direct", "ef21", "aqsgd", "clapping_fc", "clapping_fu")
DASHES = ["-", "--", ":", "-."]


def _band(runs: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = min(len(r["val_curve"]) for r in runs)
    steps = np.array([s for s, _ in runs[0]["val_curve"][:n]], dtype=float)
    stats = [mean_interval([r["val_curve"][i][1] for r in runs]) for i in range(n)]
    sent = np.array(
        [np.mean([r["val_bytes"][i] for r in runs]) if runs[0]["val_bytes"] else np.nan for i in range(n)]
    )
    mean, low, high = (np.array(col) for col in zip(*stats))
    return steps, sent / 1e6, mean, low, high


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_clapping(results, "clapping_curves")
    if doc is None:
        return []
    style()
    regimes = doc["settings"]["regimes"]
    fig, axes = plt.subplots(
        len(regimes), 2, figsize=(TEXT_WIDTH_IN, 2.4 * len(regimes) + 0.6), squeeze=False
    )
    for row_axes, regime in zip(axes, regimes):
        grid = doc["settings"][regime]
        ps = sorted(grid["clapping_p"])
        mid = ps[len(ps) // 2]
        for c_index, comp in enumerate(grid["compressors"]):
            for method in SHOWN:
                runs = [
                    r
                    for r in doc["runs"]
                    if r.get("tied_compressor", "identity") == "identity"  # the exact tied sum's rows
                    if r["regime"] == regime
                    and r["method"] == method
                    and (r["compressor"] == comp or method == "none")
                    and (not method.startswith("clapping") or r["p"] == mid)
                ]
                if not runs or (method == "none" and c_index > 0):
                    continue
                steps, sent, mean, low, high = _band(runs)
                label = (
                    "none (exact)"
                    if method == "none"
                    else f"{method} {comp}" + (f" p={mid:g}" if method.startswith("clapping") else "")
                )
                style_kw = {
                    "color": METHOD_COLORS[method],
                    "linestyle": "-" if method == "none" else DASHES[c_index % 4],
                }
                for ax, x in ((row_axes[0], steps), (row_axes[1], sent)):
                    ax.plot(x, mean, label=label, marker="o", markersize=2, **style_kw)
                    ax.fill_between(x, low, high, color=METHOD_COLORS[method], alpha=0.15, linewidth=0)
        row_axes[0].set_title(f"{regime}: loss against step", fontsize=8)
        row_axes[1].set_title(f"{regime}: loss against bytes sent", fontsize=8)
        row_axes[0].set_xlabel("optimizer step")
        row_axes[1].set_xlabel("bytes sent, all boundaries (MB)")
        row_axes[1].set_xscale("log")
        row_axes[1].xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short ranges
        for ax in row_axes:
            ax.set_ylabel("validation loss (nats/token)")
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(
        list(handles.values()),
        list(handles),
        loc="outside lower center",
        ncol=3,
        frameon=False,
        fontsize=5.5,
        handlelength=4,
    )
    fig.suptitle(
        f"Clapping ({doc['scale']}): K={doc['settings']['stages']}, seeds {doc['seeds']}; "
        "bands: 95% confidence interval of the mean",
        fontsize=8,
    )
    return save(fig, out, "clapping_curves")


if __name__ == "__main__":
    main()
