"""Clapping: training wall time split into compute (measured, this machine's loopback links)
and emulated network time at the table's bandwidth (busiest rank's bytes x 8 / bandwidth)."""

from __future__ import annotations

from pathlib import Path

from _common import TEXT_WIDTH_IN, load_clapping, plt, save, style


def main(results: Path = Path("results"), out: Path = Path("figures/out")) -> list[Path]:
    doc = load_clapping(results, "clapping_time")
    if doc is None:
        return []
    style()
    rows = doc["rows"]
    labels = [
        f"{r.get('regime', '')} {r['method']} {r['compressor']} p={r['p']:g}".strip()
        + ("" if r.get("tied_compressor", "identity") == "identity" else f", tied sum {r['tied_compressor']}")
        for r in rows
    ]
    fig, ax = plt.subplots(figsize=(TEXT_WIDTH_IN, 0.8 + 0.16 * len(rows)))
    y = range(len(rows))
    compute = [r["train_wall_s"] for r in rows]
    net = [r["emulated_net_s"] for r in rows]
    ax.barh(y, compute, color="tab:blue", label="compute (measured wall time)")
    ax.barh(
        y, net, left=compute, color="tab:orange", label=f"network, emulated at {doc['bandwidth_mbps']:g} Mbps"
    )
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=5.5)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per run (mean over seeds)")
    ax.set_title(f"Clapping ({doc['scale']}): training time per run, compute and emulated network", pad=18)
    ax.legend(frameon=False, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2)
    return save(fig, out, "clapping_time")


if __name__ == "__main__":
    main()
