"""The one style module of the figures: paper-column sizes and fonts, the colours and line styles
of methods (one distinct colour per Table 1 method, one per Clapping method), loading results,
and saving PNG + PDF trimmed to their content (no label is clipped).

Every figure script has ``main(results=Path('results'), out=Path('figures/out')) -> list[Path]``:
it returns the files it wrote, or an empty list after printing why it skipped (missing results).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLUMN_WIDTH_IN = 3.4  # one column of a two-column paper
TEXT_WIDTH_IN = 7.0  # both columns


def seeds_phrase(seeds) -> str:
    """'1 seed' or 'n seeds' (a list of seeds or a count)."""
    n = seeds if isinstance(seeds, int) else len(seeds)
    return f"{n} seed" if n == 1 else f"{n} seeds"


def style() -> None:
    plt.rcParams.update(
        {
            "font.size": 8,
            "axes.titlesize": 8,
            "axes.labelsize": 8,
            "legend.fontsize": 6.5,
            "xtick.labelsize": 7,
            "ytick.labelsize": 7,
            "lines.linewidth": 1.2,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "savefig.dpi": 200,
            "figure.constrained_layout.use": True,
        }
    )


def _load_result(results: Path, relative: str, figure: str, command: str) -> dict[str, Any] | None:
    path = Path(results) / relative
    if not path.is_file():
        print(f"[figures] skip {figure}: {path} not found (run `{command}` first)")
        return None
    return json.loads(path.read_text())


def load_table1(results: Path, figure: str) -> dict[str, Any] | None:
    """The Table 1 document, or None (with a message) when there is none yet."""
    return _load_result(results, "table1/table1.json", figure, "make reproduce-table1")


def load_clapping(results: Path, figure: str) -> dict[str, Any] | None:
    """The Clapping table document, or None (with a message) when there is none yet."""
    return _load_result(results, "clapping/clapping_table.json", figure, "make reproduce-clapping")


# Table 1 methods: twelve colours that stay apart in print (Okabe-Ito plus darker tones), and a
# line style per group: budget-matched solid, reference points dashed
TABLE1_COLORS = {
    "profiled": "#0072B2",
    "transferred": "#56B4E9",
    "uniform": "#000000",
    "first-k": "#E69F00",
    "last-k": "#D55E00",
    "spaced-k": "#009E73",
    "random-k": "#999999",
    "inverse": "#CC79A7",
    "phase-off-k": "#7B3294",
    "all-high": "#1B7837",
    "all-low": "#8C510A",
    "nope": "#B2182B",
}
REFERENCE_POINTS = ("all-high", "all-low", "nope")


def method_of(row_method: str) -> str:
    """'random-k (R=2)' -> 'random-k'."""
    return row_method.split(" (")[0]


METHOD_COLORS = {
    "none": "black",
    "none_lazy": "tab:gray",
    "direct": "tab:red",
    "ef21": "tab:orange",
    "aqsgd": "tab:purple",
    "clapping_fc": "tab:blue",
    "clapping_fu": "tab:green",
}


def load_json(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def save(fig, out: Path, name: str) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for p in paths:
        tmp = p.with_name(f".{p.stem}.tmp{p.suffix}")  # written whole, then renamed
        fig.savefig(tmp, bbox_inches="tight", pad_inches=0.03)  # trimmed to the content: nothing clipped
        tmp.replace(p)
    plt.close(fig)
    print(f"[figures] wrote {paths[0]} and .pdf")
    return paths
