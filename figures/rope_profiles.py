"""Per-layer profiles of the Table 1 models: coverage benefit (target measured, source transferred by
normalized depth) and phase-off, with the chosen high layers marked."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TEXT_WIDTH_IN, load_json, load_table1, plt, save, style


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_table1(results, "rope_profiles")
    if doc is None:
        return []
    style()
    archs = list(doc["architectures"])
    fig, axes = plt.subplots(len(archs), 2, figsize=(TEXT_WIDTH_IN, 2.3 * len(archs) + 0.5), squeeze=False)
    for row, arch in zip(axes, archs):
        a = doc["architectures"][arch]
        paths = a["profiles"]
        target, source = load_json(paths["coverage_target"]), load_json(paths["coverage_source"])
        transferred, phase_off = load_json(paths["transferred"]), load_json(paths["phase_off_target"])
        n = len(target["values"])
        x = np.arange(n)
        ax = row[0]
        ax.bar(
            x,
            target["values"],
            yerr=target.get("std"),
            color="tab:blue",
            alpha=0.75,
            capsize=2,
            label=f"target, measured ({n} layers)",
        )
        ax.plot(x, transferred["values"], "o-", color="tab:orange", ms=3, label="transferred from source")
        ns = len(source["values"])
        src_x = [u * (n - 1) for u in (np.linspace(0, 1, ns) if ns > 1 else [0.5])]
        ax.plot(src_x, source["values"], "s", color="tab:red", ms=4, label=f"source, measured ({ns} layers)")
        top = max(max(target["values"]), max(transferred["values"]), max(source["values"]))
        span = top - min(0.0, min(target["values"]), min(source["values"]))
        for layer in a["profiled_high_layers"]:
            ax.plot(layer, top + 0.08 * span, "*", color="black", ms=7)
        ax.plot([], [], "*", color="black", label="profiled: high layers")
        ax.axhline(0, color="gray", lw=0.6)
        ax.set_xticks(x)
        ax.set_xlabel("layer (target model)")
        ax.set_ylabel("coverage benefit (nats)")
        seeds = target["meta"].get("seeds") or []
        spread = "± std over seeds" if len(seeds) > 1 else "one seed: no spread"
        ax.set_title(f"{arch.upper()}: coverage benefit ({target['meta']['steps']}-step runs, {spread})")
        ax = row[1]
        ax.bar(
            x, phase_off["values"], color="tab:green", alpha=0.75, label="loss(phase off) - loss(reference)"
        )
        k = a["k"]
        order = sorted(range(n), key=lambda i: (-phase_off["values"][i], i))[:k]
        ptop = max(phase_off["values"])
        pspan = ptop - min(0.0, min(phase_off["values"]))
        for layer in order:
            ax.plot(layer, ptop + 0.08 * (pspan or 1.0), "v", color="black", ms=5)
        ax.plot([], [], "v", color="black", label=f"phase-off-k: top {k}")
        ax.axhline(0, color="gray", lw=0.6)
        ax.set_xticks(x)
        ax.set_xlabel("layer (target model)")
        ax.set_ylabel("loss increase (nats)")
        ax.set_title(f"{arch.upper()}: phase-off profile of the all-high reference")
    handles, labels = [], []
    for ax in axes[-1]:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, loc="outside lower center", ncol=3, frameon=False)
    fig.suptitle(f"Which layers need position (scale {doc['scale']})")
    return save(fig, out, "rope_profiles")


if __name__ == "__main__":
    main()
