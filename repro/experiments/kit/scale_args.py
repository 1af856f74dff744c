"""The command-line options every experiment shares: which settings (``--scale`` or
``--settings``, one rule for table1 and clapping) and running at scale (``--shard``, ``--plan``,
``--step_time`` and ``--runs_per_gpu``, one wording for table1, clapping and the coverage profile)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
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


def add_settings_args(
    parser: argparse.ArgumentParser, experiment: str, scales: Sequence[str], default: str = DEFAULT_SCALE
) -> None:
    parser.add_argument(
        "--scale",
        default=None,
        choices=scales,
        help=f"which shipped settings: paper_configs/experiments/{experiment}/<scale>.yaml (default {default})",
    )
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        help="a settings YAML instead of a shipped scale (not with --scale)",
    )


def parse_experiment_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    shipped: Callable[[str], Path],
    default: str = DEFAULT_SCALE,
) -> tuple[argparse.Namespace, Path]:
    """An experiment command's arguments and its settings file (``--settings``, or the shipped file
    of ``--scale``, default ``default``; both at once is a usage error: a settings file names its own
    scale), with its output set up: Lightning's own lines shown with ``--verbose``, kept quiet
    otherwise."""
    from repro.runs.build import VERBOSE_ENV, quiet_lightning

    args = parser.parse_args(argv)
    if args.scale and args.settings:
        parser.error("give --scale or --settings, not both (a settings file names its own scale)")
    path = args.settings or shipped(args.scale or default)
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"
    quiet_lightning()
    return args, path


def add_scale_args(parser: argparse.ArgumentParser, step_time_of: str, what: str = "the result") -> None:
    parser.add_argument(
        "--runs_per_gpu",
        type=PositiveInt,
        default=None,
        help="GPU: runs sharing each GPU (small models leave a GPU idle); every visible GPU is used",
    )
    parser.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="train shard I of N (0-based) into the shared output folder; default from SLURM_ARRAY_TASK_ID and "
        f"SLURM_ARRAY_TASK_COUNT when set. The last shard to finish writes {what}",
    )
    parser.add_argument(
        "--plan", action="store_true", help="print the runs, steps, tokens and GPU-hours without training"
    )
    parser.add_argument(
        "--step_time",
        type=PositiveFloat,
        default=None,
        help=f"with --plan: one GPU's seconds per optimizer step of {step_time_of}; default: measured by a few "
        "steps here when the accelerator is present",
    )
