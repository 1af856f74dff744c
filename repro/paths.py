"""Where the repository's files are."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS_DIR = REPO_ROOT / "paper_configs" / "experiments"  # settings per experiment and scale
MODELS_DIR = REPO_ROOT / "paper_configs" / "models"  # model configs per scale


def missing_file_message(path: str | os.PathLike, what: str) -> str:
    """``<what> '<path>': no such file``."""
    return f"{what} {str(path)!r}: no such file"
