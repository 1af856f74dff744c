"""The command-line options every experiment shares for running at scale: ``--shard``,
``--plan``, ``--step-time`` and ``--runs-per-gpu`` (one wording for table1, clapping and the
coverage profile)."""

from __future__ import annotations

import argparse


def add_scale_args(parser: argparse.ArgumentParser, step_time_of: str, what: str = "the result") -> None:
    parser.add_argument(
        "--runs-per-gpu",
        type=int,
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
        "--step-time",
        type=float,
        default=None,
        help=f"with --plan: one GPU's seconds per optimizer step of {step_time_of}; default: measured by a few "
        "steps here when the accelerator is present",
    )
