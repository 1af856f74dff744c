"""Validation-loss curves of the Table 1 rows (mean over seeds, shaded +- std), from the runs' TensorBoard logs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ARCH_TITLE, TEXT_WIDTH_IN, load_table1, plt, save, style  # noqa: E402

REFERENCE = {"all-high", "all-low", "nope"}


def val_curve(tb_dir: str) -> list[tuple[int, float]]:
    from repro.lit.tensorboard_scalars import read_scalars

    return read_scalars(tb_dir).get("val/loss", [])


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_table1(results, "table1_curves")
    if doc is None:
        return []
    style()
    archs = list(doc["architectures"])
    fig, axes = plt.subplots(1, len(archs), figsize=(TEXT_WIDTH_IN, 2.8), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, arch in zip(axes[0], archs):
        arch_doc = doc["architectures"][arch]
        lows = []
        for i, row in enumerate(doc["rows"]):
            names = arch_doc["row_runs"][row["method"]]
            curves = [c for c in (val_curve(arch_doc["runs"][n]["tensorboard"]) for n in names) if c]
            if not curves:
                continue
            steps = sorted(set.intersection(*(set(s for s, _ in c) for c in curves)))
            values = np.array([[dict(c)[s] for s in steps] for c in curves])
            mean = values.mean(axis=0)
            std = values.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros_like(mean)
            method = row["method"].split(" (")[0]
            ls = "--" if method in REFERENCE else "-"
            ax.plot(steps, mean, ls, color=cmap(i), label=row["method"] + (" †" if method in REFERENCE else ""))
            ax.fill_between(steps, mean - std, mean + std, color=cmap(i), alpha=0.2, linewidth=0)
            lows.append((mean, steps))
        # zoom on the second half of training, where the rows separate
        finals = [m[len(m) // 3:] for m, _ in lows]
        lo = min(float(f.min()) for f in finals)
        hi = max(float(f.max()) for f in finals)
        pad = 0.05 * (hi - lo or 1.0)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlim(lows[0][1][len(lows[0][1]) // 3], lows[0][1][-1])
        ax.set_title(f"{ARCH_TITLE[arch]}, {doc['architectures'][arch]['target_layers']} layers, "
                     f"{len(doc['seeds'])} seed(s)")
        ax.set_xlabel("training step")
        ax.set_ylabel("validation loss (nats/token)")
    axes[0][-1].legend(loc="upper right", ncol=2, frameon=False)
    fig.suptitle(f"Table 1 rows: validation loss (mean ± std over seeds; † not budget-matched), scale {doc['scale']}")
    return save(fig, out, "table1_curves")


if __name__ == "__main__":
    main()
