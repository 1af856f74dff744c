"""Validation-loss curves of the Table 1 rows (mean over seeds with a 95% confidence band), from
the runs' result logs. Top row: the whole run; bottom row: the last two thirds, zoomed (said in
its title), where the rows separate. Rows whose allocations are the same share their runs and are
drawn once, labelled with every name (e.g. ``first-k = transferred``); each architecture has its
own legend, since the rows that coincide differ between them.

Steps are optimizer steps as the result log records them: an evaluation after step 300 of a
300-step run is at 300 (TensorBoard files the same value under step 299; the fallback below
shifts it back)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from repro.experiments.table1.table_files import ARCH_TITLE
from repro.lit.tensorboard_scalars import read_scalars
from repro.stats import mean_interval

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


def val_curve(run: dict) -> list[tuple[int, float]]:
    result = Path(run.get("result", ""))
    if result.is_file():
        return [(int(s), float(v)) for s, v in json.loads(result.read_text())["val_curve"]]
    return [(s + 1, v) for s, v in read_scalars(run["tensorboard"]).get("val/loss", [])]


def grouped_rows(doc: dict, arch: str) -> list[tuple[str, list[str]]]:
    """(label, run names) per distinct set of runs, in table order; equal rows share a label."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for row in doc["rows"]:
        names = tuple(doc["architectures"][arch]["row_runs"][row["method"]])
        groups.setdefault(names, []).append(method_of(row["method"]))
    return [(" = ".join(methods), list(names)) for names, methods in groups.items()]


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_table1(results, "table1_curves")
    if doc is None:
        return []
    style()
    archs = list(doc["architectures"])
    fig, axes = plt.subplots(2, len(archs), figsize=(TEXT_WIDTH_IN, 5.4), squeeze=False)
    for col, arch in enumerate(archs):
        arch_doc = doc["architectures"][arch]
        finals = []
        for label, names in grouped_rows(doc, arch):
            curves = [c for c in (val_curve(arch_doc["runs"][n]) for n in names) if c]
            if not curves:
                continue
            steps = sorted(set.intersection(*({s for s, _ in c} for c in curves)))
            stats = [mean_interval([dict(c)[s] for c in curves]) for s in steps]
            mean, low, high = (np.array(v) for v in zip(*stats))
            first = label.split(" = ")[0]
            reference = first in REFERENCE_POINTS
            kw = {"color": TABLE1_COLORS.get(first, "gray"), "linestyle": "--" if reference else "-"}
            for ax in axes[:, col]:
                ax.plot(
                    steps, mean, label=label + (" †" if reference else ""), marker="o", markersize=1.8, **kw
                )
                ax.fill_between(steps, low, high, color=kw["color"], alpha=0.12, linewidth=0)
            finals.append((np.array(steps), mean))
        steps0 = finals[0][0]
        start = steps0[len(steps0) // 3]
        tail = [m[s >= start] for s, m in finals]
        lo, hi = min(float(t.min()) for t in tail), max(float(t.max()) for t in tail)
        pad = 0.06 * (hi - lo or 1.0)
        zoom = axes[1, col]
        zoom.set_xlim(start, steps0[-1])
        zoom.set_ylim(lo - pad, hi + pad)
        axes[0, col].set_title(
            f"{ARCH_TITLE[arch]}, {arch_doc['target_layers']} layers, {seeds_phrase(doc['seeds'])}: whole run"
        )
        zoom.set_title(f"zoomed: steps {start} to {steps0[-1]}")
        for ax in axes[:, col]:
            ax.set_xlabel("optimizer step")
            ax.set_ylabel("validation loss (nats/token)")
    for col in range(len(archs)):  # one legend per architecture: their equal-row groups differ
        handles, labels = axes[0, col].get_legend_handles_labels()
        axes[1, col].legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.28),
            ncol=2,
            frameon=False,
            fontsize=6,
        )
    fig.suptitle(
        f"Table 1 rows, scale {doc['scale']}: mean over seeds, bands 95% CI of the mean; † not budget-matched"
    )
    return save(fig, out, "table1_curves")


if __name__ == "__main__":
    main()
