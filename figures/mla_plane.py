"""The quality-storage-compute plane of a real model's MLA conversions (docs/real_model.md): KV bytes
per token against test loss, coloured by attention FLOPs per token, the Pareto front marked; zero-shot
(every row) and after the fine-tune (the fine-tuned rows and the fine-tuned source)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TEXT_WIDTH_IN, _load_result, plt, save, style

COMMAND = "repro mla-plane --scale real"
MARKERS = {"source": "*", "uniform (weights)": "s", "uniform": "o", "uniform (2-norm)": "D", "uniform (split)": "v",
           "profiled": "P", "profiled-rotary": "<", "profiled-rank": ">", "inverse": "X", "random-k": "^"}  # fmt: skip


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = _load_result(results, "mla_plane/mla_plane.json", "mla_plane", COMMAND)
    if doc is None:
        return []
    style()
    primary = doc["contexts"][0]
    rows = doc["rows"]
    flops = [r[f"attention_flops_per_token@{primary}"] for r in rows]
    norm = plt.Normalize(min(flops), max(flops))
    panels = [("zero_shot_loss@" + primary, "zero-shot", "pareto_zero_shot")]
    if any("finetuned_loss" in r for r in rows):
        panels.append(
            ("finetuned_loss", f"after {doc['finetune']['steps']} fine-tune steps", "pareto_finetuned")
        )
    curves = [r for r in rows if r.get("finetune_curves")]
    fig, axes = plt.subplots(1, len(panels) + bool(curves), figsize=(TEXT_WIDTH_IN, 3.0), squeeze=False)
    context = rows[0][f"context@{primary}"]
    for ax, (key, title, front_key) in zip(axes[0], panels):
        shown = [r for r in rows if key in r]
        for r in shown:
            kind = r["method"].split(" #")[0]
            ax.scatter(r["kv_bytes_per_token"], r[key], c=[r[f"attention_flops_per_token@{primary}"]], cmap="viridis",
                       norm=norm, marker=MARKERS.get(kind, "o"), s=28, edgecolors="black", linewidths=0.3)  # fmt: skip
        front = sorted((r["kv_bytes_per_token"], r[key]) for r in shown if r.get(front_key))
        if front:
            ax.step(*zip(*front), where="post", color="tab:red", lw=0.8, label="Pareto front")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("KV cache bytes per token (bf16)")
        ax.set_ylabel(f"test loss at {context} tokens (nats)")
        ax.set_title(title)
    handles = [plt.Line2D([], [], marker=m, ls="", color="gray", label=k) for k, m in MARKERS.items()]
    fig.legend(handles=handles, fontsize=6, loc="outside lower center", ncol=5)
    bar = fig.colorbar(
        plt.cm.ScalarMappable(norm=norm, cmap="viridis"), ax=axes[0][: len(panels)].tolist(), shrink=0.85
    )
    if curves:  # how far each fine-tune recovered: its validation loss against steps (first seed)
        ax = axes[0][-1]
        budgets = sorted({r["budget"] for r in curves if r["method"] != "source"}, reverse=True)
        shades = dict(
            zip(
                budgets,
                plt.cm.plasma([0.1 + 0.7 * i / max(1, len(budgets) - 1) for i in range(len(budgets))]),
            )
        )
        for r in curves:
            steps, losses = zip(*r["finetune_curves"][0])
            kind = r["method"].split(" #")[0]
            color = "black" if r["method"] == "source" else shades[r["budget"]]
            ax.plot(steps, losses, marker=MARKERS.get(kind, "o"), ms=3, lw=0.8, color=color,
                    label="source" if r["method"] == "source" else None)  # fmt: skip
        for b, c in shades.items():
            ax.plot([], [], color=c, label=f"budget {b:g}")
        ax.set_xlabel("fine-tune step")
        ax.set_ylabel("validation loss (nats)")
        ax.set_title("recovery during the fine-tune")
        ax.legend(fontsize=5.5)
    bar.set_label(f"attention FLOPs per token at {context} tokens")
    return save(fig, out, "mla_plane")


if __name__ == "__main__":
    main()
