"""Loss against context length for a real model's allocations (docs/real_model.md): each allocation's
zero-shot test loss minus full RoPE's at each context, on the same text, with its 95% CI over the
chunks (repro profile allocations --contexts)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TABLE1_COLORS, TEXT_WIDTH_IN, _load_result, method_of, plt, save, style

COMMAND = (
    "repro profile allocations --config paper_configs/models/real/smollm2.yaml --allocation "
    "results/real/alloc_ctx256.json --contexts 256 2048 8192 --out results/real/contexts.json"
)


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = _load_result(results, "real/contexts.json", "real_context", COMMAND)
    if doc is None:
        return []
    style()
    budgets = sorted({r["budget"] for r in doc["by_context"][0]["rows"]})
    fig, axes = plt.subplots(1, len(budgets) + 1, figsize=(TEXT_WIDTH_IN, 2.6), squeeze=False)
    contexts = [c["context"] for c in doc["by_context"]]
    ax = axes[0][0]
    ax.plot(contexts, [c["loss_full_rope"] for c in doc["by_context"]], "o-", color="black")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("test loss, full RoPE (nats)")
    ax.set_title(f"{doc['by_context'][0]['chunks']} chunks of {doc['chunk_tokens']} tokens")
    for ax, budget in zip(axes[0][1:], budgets):
        names = [r["name"] for r in doc["by_context"][0]["rows"] if r["budget"] == budget]
        for name in names:
            rows = [next(r for r in c["rows"] if r["name"] == name) for c in doc["by_context"]]
            d = np.array([r["vs_full_rope"]["delta"] for r in rows])
            lo = np.array([r["vs_full_rope"]["ci95"][0] for r in rows])
            hi = np.array([r["vs_full_rope"]["ci95"][1] for r in rows])
            method = method_of(rows[0]["method"])
            ax.errorbar(contexts, d, yerr=[d - lo, hi - d], marker="o", ms=2.5, capsize=1.5, lw=0.9,
                        color=TABLE1_COLORS.get(method, "gray"), label=method)  # fmt: skip
        ax.axhline(0, color="gray", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("loss - full RoPE (nats)")
        ax.set_title(f"coverage budget {budget:g} of the pairs")
        ax.legend(fontsize=5.5)
    return save(fig, out, "real_context")


if __name__ == "__main__":
    main()
