"""Where the repository's files are, and where the config files of earlier versions moved to (so
an old path in a script or README fails with a message naming the new one)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS_DIR = REPO_ROOT / "paper_configs" / "experiments"  # settings per experiment and scale
MODELS_DIR = REPO_ROOT / "paper_configs" / "models"  # model configs per scale

# Paths of earlier versions of the suite -> where the file is now.
MOVED = {
    "paper_configs/smoke.yaml": "paper_configs/models/smoke/gpt_mha.yaml",
    "paper_configs/smoke_mla.yaml": "paper_configs/models/smoke/gpt_mla.yaml",
    "paper_configs/smoke_target.yaml": "paper_configs/models/smoke/gpt_mha_6_layers.yaml",
    "paper_configs/smoke_pipeline.yaml": "paper_configs/models/smoke/pipeline.yaml",
    "paper_configs/cpu_target_mha.yaml": "paper_configs/models/cpu/gpt_mha.yaml",
    "paper_configs/cpu_target_mla.yaml": "paper_configs/models/cpu/gpt_mla.yaml",
    "paper_configs/cpu_source_mha.yaml": "paper_configs/models/cpu/gpt_mha.yaml (the 6-layer source was removed)",
    "paper_configs/cpu_source_mla.yaml": "paper_configs/models/cpu/gpt_mla.yaml (the 6-layer source was removed)",
    "paper_configs/paper_mha.yaml": "paper_configs/models/paper/gpt_mha.yaml",
    "paper_configs/paper_mla.yaml": "paper_configs/models/paper/gpt_mla.yaml",
    **{
        f"paper_configs/table1/{s}.yaml": f"paper_configs/experiments/table1/{s}.yaml"
        for s in ("smoke", "cpu", "paper", "paper_gpu_check")
    },
    **{
        f"paper_configs/table1/{s}_{m}_{a}.yaml": f"paper_configs/models/{s}/table1_{m}_{a}.yaml"
        for s in ("smoke", "cpu", "paper")
        for m in ("target", "source")
        for a in ("mha", "mla")
    },
    **{
        f"paper_configs/clapping/{s}.yaml": f"paper_configs/experiments/clapping/{s}.yaml"
        for s in ("smoke", "cpu", "paper")
    },
    **{
        f"paper_configs/clapping/{s}_model.yaml": f"paper_configs/models/{s}/clapping.yaml"
        for s in ("smoke", "cpu", "paper")
    },
    **{
        f"paper_configs/bench/{s}.yaml": f"paper_configs/experiments/bench/{s}.yaml"
        for s in ("full", "quick")
    },
}


def moved_to(path: str | os.PathLike) -> str | None:
    """Where a config of an earlier layout lives now (None when ``path`` is not one of them)."""
    text = Path(path).as_posix()
    for old, new in MOVED.items():
        if text == old or text.endswith("/" + old):
            return new
    return None


def missing_file_message(path: str | os.PathLike, what: str) -> str:
    """``<what> '<path>': no such file`` (and where it moved, for a path of an earlier layout)."""
    new = moved_to(path)
    return f"{what} {str(path)!r}: no such file" + (f"; it moved to {new}" if new else "")
