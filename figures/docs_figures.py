"""`make docs-figures`: the figures the docs show, copied from figures/out/ into docs/figures/.

These small PNGs are the one kind of generated file the repository keeps, so that a reader sees the
results without running anything. Each page that embeds one captions it with the command that
produced the results it draws and that command's commit. Run `make figures` first (this target does);
a figure whose results are missing here is left as it is in docs/figures/.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHOWN = (
    "real_coverage",
    "real_context",
    "mla_plane",
    "clapping_p",
    "clapping_memory",
)  # the figures docs/*.md embed
MAX_BYTES = 200_000  # a docs figure stays small: the repository keeps every version of it


def main(source: Path = ROOT / "figures" / "out", target: Path = ROOT / "docs" / "figures") -> int:
    target.mkdir(parents=True, exist_ok=True)
    copied, missing = [], []
    for name in SHOWN:
        png = source / f"{name}.png"
        if not png.is_file():
            missing.append(name)
            continue
        if png.stat().st_size > MAX_BYTES:
            print(f"[docs-figures] {png}: {png.stat().st_size:,} bytes, over {MAX_BYTES:,}", file=sys.stderr)
            return 1
        shutil.copyfile(png, target / png.name)
        copied.append(name)
    kept = ", ".join(missing) or "none"
    print(f"[docs-figures] copied {', '.join(copied) or 'none'} to {target}; kept as they were: {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
