"""Clapping: validation loss against step and against bytes sent, one column per compressor
(mean over seeds). The none rows (exact messages) are drawn in every column; Clapping rows use
the middle p of the grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from repro.lit.tensorboard_scalars import read_scalars

from _common import METHOD_COLORS, TEXT_WIDTH_IN, load_clapping, plt, save, style


def _curve(run: dict, results: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    beside = Path(results) / "clapping" / "runs" / "tb" / run["name"]  # the results folder may have moved
    scalars = read_scalars(beside if beside.is_dir() else Path(run["tensorboard_dir"]))
    if "val/loss" not in scalars or "pipe/bytes_total" not in scalars:
        return None
    steps = np.array([s for s, _ in scalars["val/loss"]], dtype=float)
    loss = np.array([v for _, v in scalars["val/loss"]])
    b_steps = np.array([s for s, _ in scalars["pipe/bytes_total"]], dtype=float)
    b_vals = np.array([v for _, v in scalars["pipe/bytes_total"]])
    # bytes at each validation step (cumulative bytes grow linearly between logged steps)
    per_step = b_vals[-1] / (b_steps[-1] + 1)
    bytes_at = np.interp(
        steps, b_steps, b_vals, left=0.0, right=b_vals[-1] + per_step * max(0, steps[-1] - b_steps[-1])
    )
    return steps, loss, bytes_at


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_clapping(results, "clapping_curves")
    if doc is None:
        return []
    style()
    ps = sorted(doc["settings"]["clapping_p"])
    mid_p = ps[len(ps) // 2]
    compressors = list(doc["settings"]["compressors"])
    fig, axes = plt.subplots(2, len(compressors), figsize=(TEXT_WIDTH_IN, 4.2), squeeze=False, sharey="row")
    for col, comp in enumerate(compressors):
        for method in ("none", "none_lazy", "direct", "ef21", "aqsgd", "clapping_fc", "clapping_fu"):
            runs = [
                r
                for r in doc["runs"]
                if r["method"] == method
                and (r["compressor"] == comp or method.startswith("none"))
                and (not method.startswith("clapping") or r["p"] == mid_p)
            ]
            curves = [c for c in (_curve(r, results) for r in runs) if c is not None]
            if not curves:
                continue
            n = min(len(c[0]) for c in curves)
            steps = curves[0][0][:n]
            loss = np.mean([c[1][:n] for c in curves], axis=0)
            sent = np.mean([c[2][:n] for c in curves], axis=0)
            label = method + (f" p={mid_p:g}" if method.startswith("clapping") else "")
            style_kw = {
                "color": METHOD_COLORS[method],
                "marker": "o",
                "markersize": 2.5,
                "linestyle": "--" if method.startswith("none") else "-",
            }
            axes[0][col].plot(steps, loss, label=label, **style_kw)
            axes[1][col].plot(sent / 1e6, loss, label=label, **style_kw)
        axes[0][col].set_title(comp)
        axes[0][col].set_xlabel("step")
        axes[1][col].set_xlabel("bytes sent (MB, all boundaries)")
    axes[0][0].set_ylabel("validation loss")
    axes[1][0].set_ylabel("validation loss")
    axes[0][-1].legend(frameon=False, loc="upper right")
    fig.suptitle(
        f"Clapping ({doc['scale']}): K={doc['settings']['stages']}, N={doc['dataset_size']}, "
        f"seeds {doc['seeds']}",
        fontsize=8,
    )
    return save(fig, out, "clapping_curves")


if __name__ == "__main__":
    main()
