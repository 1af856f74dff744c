"""The rotary-phase profile of a real pretrained model (README "A real model"): per layer, the loss
increase when that layer alone loses its rotary phase, with its 95% CI over the text chunks; beside
it, what the profile predicts zero-shot (each NoPE allocation's loss against the profile's choice)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TEXT_WIDTH_IN, _load_result, plt, save, style

COMMAND = "repro profile phase-off --config paper_configs/models/real/smollm2.yaml --out results/real/phase_off.json"


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    profile = _load_result(results, "real/phase_off.json", "real_profile", COMMAND)
    if profile is None:
        return []
    nope = _load_result(results, "real/nope.json", "real_profile (right panel)", "repro profile nope ...")
    style()
    fig, axes = plt.subplots(1, 2 if nope else 1, figsize=(TEXT_WIDTH_IN, 2.6), squeeze=False)
    values = np.array(profile["values"])
    ci = np.array(profile["meta"]["ci95"])
    x = np.arange(len(values))
    ax = axes[0][0]
    ax.bar(x, values, color="tab:green", alpha=0.8)
    ax.errorbar(
        x,
        values,
        yerr=[values - ci[:, 0], ci[:, 1] - values],
        fmt="none",
        ecolor="black",
        capsize=1.5,
        lw=0.7,
    )
    ax.axhline(0, color="gray", lw=0.6)
    ax.set_xlabel("layer")
    ax.set_ylabel("loss increase (nats)")
    ax.set_yscale("symlog", linthresh=0.01)
    meta = profile["meta"]
    ax.set_title(
        f"{profile['model'].get('model_type', 'model')} ({len(values)} layers): phase-off per layer, "
        f"95% CI over {meta['chunks']} chunks",
        fontsize=8,
    )
    if nope:
        ax = axes[0][1]
        budgets = sorted({r["budget"] for r in nope["rows"]})
        methods = [r["method"] for r in nope["rows"] if r["budget"] == budgets[0]]
        width = 0.8 / len(budgets)
        for i, k in enumerate(budgets):
            rows = {r["method"]: r for r in nope["rows"] if r["budget"] == k}
            loss = [rows[m]["increase_over_full_rope"] for m in methods]
            ax.bar(
                np.arange(len(methods)) + i * width, loss, width, label=f"k = {k} layers' worth without phase"
            )
        ax.set_xticks(np.arange(len(methods)) + width * (len(budgets) - 1) / 2)
        ax.set_xticklabels(methods, rotation=60, ha="right", fontsize=6)
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylabel("loss increase over full RoPE")
        ax.set_title(f"zero-shot NoPE budgets ({nope['split']} split, {nope['chunks']} chunks)", fontsize=8)
        ax.legend(fontsize=6)
    return save(fig, out, "real_profile")


if __name__ == "__main__":
    main()
