"""A real model's coverage-benefit profile beside its phase-off profile (docs/real_model.md): per
layer, what keeping high coverage there buys (base: every layer low) and what removing its rotary
phase costs, each with its 95% CI over the text chunks; one coverage profile per pair of levels and
context found in results/real/ (coverage_<context>_b<budget>.json)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TEXT_WIDTH_IN, _load_result, load_json, plt, save, style

COMMAND = (
    "repro profile coverage --config paper_configs/models/real/smollm2.yaml --high 0.5 --low 0.125 --seeds 0 "
    "--out results/real/coverage_256_b25.json"
)


def _bars(ax, values, ci, offset, width, color, label):
    values, ci = np.asarray(values), np.asarray(ci)
    x = np.arange(len(values)) + offset
    ax.bar(x, values, width, color=color, alpha=0.85, label=label)
    ax.errorbar(
        x, values, yerr=[values - ci[:, 0], ci[:, 1] - values], fmt="none", ecolor="black", capsize=1, lw=0.5
    )


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    files = sorted(Path(results, "real").glob("coverage_*_b*.json"))
    if not files:
        _load_result(results, "real/coverage_256_b25.json", "real_coverage", COMMAND)
        return []
    phase_off = _load_result(
        results, "real/phase_off.json", "real_coverage (phase-off panel)", "repro profile phase-off ..."
    )
    style()
    fig, axes = plt.subplots(
        2 if phase_off else 1, 1, figsize=(TEXT_WIDTH_IN, 4.6 if phase_off else 2.4), squeeze=False
    )
    ax = axes[0][0]
    profiles = [load_json(f) for f in files]
    width = 0.8 / len(profiles)
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, len(profiles)))
    for i, (p, c) in enumerate(zip(profiles, colors)):
        lv, meta = p["meta"]["levels"], p["meta"]
        tuned = f", fine-tuned {meta['finetune']['steps']} steps" if meta.get("finetune") else ", zero-shot"
        label = f"coverage {lv['low']:g} -> {lv['high']:g}, {meta['context']} tokens{tuned}"
        _bars(ax, p["values"], meta["ci95"], i * width - 0.4 + width / 2, width, c, label)
    ax.axhline(0, color="gray", lw=0.6)
    ax.set_ylabel("benefit (nats)")
    ax.set_title("coverage-benefit profile: loss(all low) - loss(this layer high), 95% CI over chunks")
    ax.legend(ncol=2, loc="upper right")
    if phase_off:
        ax = axes[1][0]
        _bars(ax, phase_off["values"], phase_off["meta"]["ci95"], 0, 0.8, "tab:green",
              f"phase-off, {phase_off['meta']['chunks']} chunks")  # fmt: skip
        ax.axhline(0, color="gray", lw=0.6)
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylabel("loss increase (nats)")
        ax.set_title("phase-off profile: loss with this layer's rotary phase removed - loss as trained")
    axes[-1][0].set_xlabel("layer")
    return save(fig, out, "real_coverage")


if __name__ == "__main__":
    main()
