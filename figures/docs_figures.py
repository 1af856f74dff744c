"""`make docs-figures`: the figures the docs show, copied from figures/out/ into docs/figures/.

These small PNGs are the one kind of generated file the repository keeps, so that a reader sees the
results without running anything. Each page that embeds one captions it with the command that
produced the results it draws and that command's commit. Run `make figures` first (this target does);
a figure whose results are missing here is left as it is in docs/figures/.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
SHOWN = (
    "table1_deltas",
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
        data = compact(png)
        if len(data) > MAX_BYTES:
            print(f"[docs-figures] {png}: {len(data):,} bytes, over {MAX_BYTES:,}", file=sys.stderr)
            return 1
        (target / png.name).write_bytes(data)
        copied.append(name)
    kept = ", ".join(missing) or "none"
    print(f"[docs-figures] copied {', '.join(copied) or 'none'} to {target}; kept as they were: {kept}")
    return 0


def compact(png: Path) -> bytes:
    """The PNG re-encoded losslessly, smaller: without its alpha channel where every pixel is opaque
    (matplotlib writes one), and with the encoder's optimization."""
    image = Image.open(png)
    if image.mode == "RGBA" and image.getextrema()[3] == (255, 255):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


if __name__ == "__main__":
    sys.exit(main())
