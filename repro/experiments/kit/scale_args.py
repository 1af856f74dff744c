"""The command-line options every experiment shares: which settings (``--scale`` or ``--settings``,
one rule for table1, clapping and mla-plane: :func:`settings_file`) and running at scale (``--shard``,
``--plan``, ``--step_time`` and ``--runs_per_gpu``, one wording for table1, clapping and the coverage
profile: :class:`ScaleOptions`, a command parameter whose fields are its options)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from repro.arguments import PositiveFloat, PositiveInt

DEFAULT_SCALE = "cpu"  # the scale an experiment runs without --scale or --settings


@dataclass(frozen=True)
class ScaleOptions:
    """Running at scale: a command's parameter of this type has these options (``--shard``, ...)."""

    runs_per_gpu: PositiveInt | None = None
    """GPU: runs sharing each GPU (small models leave a GPU idle); every visible GPU is used"""
    shard: str | None = None
    """I/N: train shard I of N (0-based) into the shared output folder; default from SLURM_ARRAY_TASK_ID
    and SLURM_ARRAY_TASK_COUNT when set. The last shard to finish writes the result"""
    plan: bool = False
    """print the runs, steps, tokens and GPU-hours without training"""
    step_time: PositiveFloat | None = None
    """with --plan: one GPU's seconds per optimizer step of the model; default: measured by a few steps
    here when the accelerator is present"""


def settings_file(
    scale: str | None, settings: Path | None, shipped: Callable[[str], Path], default: str = DEFAULT_SCALE
) -> Path:
    """An experiment's settings file: ``--settings``, or the shipped file of ``--scale`` (default
    ``default``); both at once is a usage error (a settings file names its own scale). Lightning's
    own lines are kept quiet from here on, unless ``-v``."""
    from repro.runs.build import quiet_lightning

    if scale and settings:
        raise ValueError("give --scale or --settings, not both (a settings file names its own scale)")
    quiet_lightning()
    return settings or shipped(scale or default)
