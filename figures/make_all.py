"""`make figures`: every figure script in this folder, each on whatever results exist.

A figure whose results are missing is skipped with a message; the others are still drawn.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIGURES = (
    "table1_curves",
    "table1_deltas",
    "rope_profiles",
    "quality_storage_compute",
    "calibration",
    "real_profile",
    "real_coverage",
    "real_context",
    "mla_plane",
    "clapping_curves",
    "clapping_memory",
    "clapping_p",
    "clapping_time",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--results", type=Path, default=Path("results"), help="results folder (default results/)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("figures/out"), help="output folder (default figures/out/)"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    written, skipped = [], []
    for name in FIGURES:
        files = importlib.import_module(name).main(args.results, args.out)
        (written if files else skipped).append(name)
    print(
        f"[figures] drew {len(written)} figure(s): {', '.join(written) or 'none'}; "
        f"skipped {len(skipped)}: {', '.join(skipped) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
