"""Validation-loss curves of the Table 1 rows (mean over seeds, shaded +- std), from the runs' logs.

Each run's result log holds its validation curve against the optimizer step (the same values as
its TensorBoard ``val/loss``, which Lightning files under the step before); the TensorBoard log
is read when the result log is missing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from repro.lit.tensorboard_scalars import read_scalars

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ARCH_TITLE, TEXT_WIDTH_IN, load_table1, plt, save, style

REFERENCE = {"all-high", "all-low", "nope"}


def val_curve(run: dict) -> list[tuple[int, float]]:
    result = Path(run.get("result", ""))
    if result.is_file():
        return [(int(s), float(v)) for s, v in json.loads(result.read_text())["val_curve"]]
    return [(s + 1, v) for s, v in read_scalars(run["tensorboard"]).get("val/loss", [])]


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_table1(results, "table1_curves")
    if doc is None:
        return []
    style()
    archs = list(doc["architectures"])
    fig, axes = plt.subplots(1, len(archs), figsize=(TEXT_WIDTH_IN, 3.3), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, arch in zip(axes[0], archs):
        arch_doc = doc["architectures"][arch]
        lows = []
        for i, row in enumerate(doc["rows"]):
            names = arch_doc["row_runs"][row["method"]]
            curves = [c for c in (val_curve(arch_doc["runs"][n]) for n in names) if c]
            if not curves:
                continue
            steps = sorted(set.intersection(*({s for s, _ in c} for c in curves)))
            values = np.array([[dict(c)[s] for s in steps] for c in curves])
            mean = values.mean(axis=0)
            std = values.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros_like(mean)
            method = row["method"].split(" (")[0]
            ls = "--" if method in REFERENCE else "-"
            ax.plot(
                steps, mean, ls, color=cmap(i), label=row["method"] + (" †" if method in REFERENCE else "")
            )
            ax.fill_between(steps, mean - std, mean + std, color=cmap(i), alpha=0.2, linewidth=0)
            lows.append((mean, steps))
        # zoom on the second half of training, where the rows separate
        finals = [m[len(m) // 3 :] for m, _ in lows]
        lo = min(float(f.min()) for f in finals)
        hi = max(float(f.max()) for f in finals)
        pad = 0.05 * (hi - lo or 1.0)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlim(lows[0][1][len(lows[0][1]) // 3], lows[0][1][-1])
        ax.set_title(
            f"{ARCH_TITLE[arch]}, {doc['architectures'][arch]['target_layers']} layers, "
            f"{len(doc['seeds'])} seed(s)"
        )
        ax.set_xlabel("training step")
        ax.set_ylabel("validation loss (nats/token)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=6, frameon=False)
    fig.suptitle(
        f"Table 1 rows: validation loss (mean ± std over seeds; † not budget-matched), scale {doc['scale']}"
    )
    return save(fig, out, "table1_curves")


if __name__ == "__main__":
    main()
