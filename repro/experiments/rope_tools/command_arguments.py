"""The arguments of ``repro profile``'s subcommands (``commands.py`` runs them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.alloc.coverage_profile import EARLY_FRACTION, EVALUATIONS, CoverageProfileSettings
from repro.arguments import (
    ClosedUnitInterval,
    NonNegativeInt,
    Parser,
    PositiveInt,
    Probability,
)
from repro.experiments.kit.scale_args import add_scale_args

from .pretrained_arguments import add_finetune_args, add_pair_order_arg, add_pretrained_subcommands


def _levels_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "budget levels (defaults of PROTOCOL.md §R2: MHA 1.0/0.25/0.5 coverage; MLA d_nope, d_nope/4, d_nope/2)"
    )
    g.add_argument(
        "--high",
        type=float,
        default=None,
        help="high level: coverage in [0,1] (MHA) or rotary width d_R (MLA)",
    )
    g.add_argument("--low", type=float, default=None, help="low level, same unit as --high")
    g.add_argument(
        "--budget", type=float, default=None, help="budget B: mean coverage (MHA) or mean rotary width (MLA)"
    )


def _runs_args(p: argparse.ArgumentParser, default: str = "<out>.runs/") -> None:
    p.add_argument(
        "--runs_dir",
        type=Path,
        default=None,
        help=f"where each training run writes its result JSON and TensorBoard log (default: {default}); "
        "finished runs found there are reused, so a second call resumes",
    )
    p.add_argument(
        "--accelerator", default="cpu", help="Lightning accelerator for the training runs (cpu, gpu)"
    )
    p.add_argument(
        "--workers",
        type=PositiveInt,
        default=1,
        help="train independent runs in this many processes (CPU only; each gets cores/workers threads). "
        "On a 2-core machine, 2 single-thread workers train small models faster than 1",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="repro",
        description="The RoPE allocation pipeline's profiles.",
    )
    sub = parser.subcommands("command")

    prof = sub("profile", help="measure a per-layer profile (phase-off, coverage-benefit, interactions)")
    psub = prof.subcommands("profile_kind")

    po = psub(
        "phase-off",
        help="loss increase per layer with the rotation angle forced to 0 there",
        description="Phase-off profile of a trained model: for each layer, the validation loss "
        "with that layer's rotation angle forced to 0, minus the reference loss.",
    )
    po.add_argument("--config", required=True, type=Path, help="the repro fit YAML of the model and data")
    src = po.add_mutually_exclusive_group()  # one of them for the suite's GPT; a pretrained model is its own
    src.add_argument(
        "--ckpt_path",
        type=Path,
        help="a trained checkpoint of this config's model (e.g. final.ckpt); with a model.pretrained config, a "
        "fine-tune of that model (default: its pretrained weights)",
    )
    src.add_argument(
        "--ref_steps",
        type=PositiveInt,
        help="train the all-high reference for this many steps first (resumable)",
    )
    po.add_argument(
        "--seed", type=NonNegativeInt, default=0, help="seed of the reference run (with --ref_steps)"
    )
    po.add_argument(
        "--eval_every",
        type=PositiveInt,
        default=None,
        help="validation interval of the reference run (default: steps/5)",
    )
    po.add_argument(
        "--per_head",
        action="store_true",
        help="also measure every head of every layer (a pretrained model: every key/value head)",
    )
    po.add_argument(
        "--rotary_fraction",
        type=ClosedUnitInterval,
        default=0.0,
        help="a pretrained model (model.pretrained): each layer keeps only this highest-frequency fraction of "
        "its rotary pairs (0, the default: no rotary phase)",
    )
    po.add_argument("--out", required=True, type=Path, help="output profile JSON")
    _levels_args(po)
    _runs_args(po)

    add_pretrained_subcommands(psub)

    cov = psub(
        "coverage",
        help="coverage-benefit profile: base run (all low) and one upgrade run per layer",
        description="Coverage-benefit profile: benefit[l] = loss(all low) - loss(layer l high), "
        "each run trained for T_early steps from the same init seed, averaged over seeds.",
    )
    cov.add_argument("--config", required=True, type=Path, help="the repro fit YAML of the model and data")
    cov.add_argument(
        "--steps",
        type=PositiveInt,
        default=None,
        help="T_early: steps per run (default: early-fraction x full-steps)",
    )
    cov.add_argument(
        "--early_fraction",
        type=Probability,
        default=EARLY_FRACTION,
        help=f"T_early as a fraction of the full run (default {EARLY_FRACTION:g})",
    )
    cov.add_argument(
        "--full_steps",
        type=PositiveInt,
        default=None,
        help="steps of the full run (default: the config's trainer.max_steps)",
    )
    cov.add_argument(
        "--lr_schedule",
        choices=("full-run", "early-run"),
        default="full-run",
        help="full-run: the runs follow the full run's lr schedule, stopped early; "
        "early-run: the schedule is compressed into T_early steps",
    )
    cov.add_argument(
        "--eval_every",
        type=PositiveInt,
        default=None,
        help=f"validation interval in steps (default: T_early/{EVALUATIONS})",
    )
    cov.add_fields(CoverageProfileSettings, "seeds", "last_n", "group_size", "group_spread")
    cov.add_argument("--out", required=True, type=Path, help="output profile JSON")
    cov.add_argument(
        "--probe",
        action="store_true",
        help="a pretrained model: only the noise probe (the base and 3 upgrades on every validation chunk): the "
        "chunks that resolve 0.01 nats, written to --out",
    )
    add_finetune_args(cov, "the base and every upgrade (the 'early' profile of a pretrained model)")
    add_pair_order_arg(cov)
    _levels_args(cov)
    _runs_args(cov)
    add_scale_args(cov, "the config's model", "the profile")

    fid = psub(
        "fidelity",
        help="does the early profile predict the late one? (coverage and phase-off along one full run)",
        description="Train the coverage-benefit profile runs and the all-high reference to the full length, "
        "evaluating every --eval_every steps, and report at every evaluation the Spearman of the profile "
        "there against the final one, its seed stability, and the phase-off profile of the reference there.",
    )
    fid.add_argument("--config", required=True, type=Path, help="the model config to profile")
    fid.add_argument(
        "--full_steps", type=PositiveInt, required=True, help="steps of the full run (and of every run here)"
    )
    fid.add_argument(
        "--seeds",
        type=NonNegativeInt,
        nargs="+",
        default=[0, 1, 2, 3],
        help="profile seeds (default 0 1 2 3)",
    )
    fid.add_argument(
        "--eval_every", type=PositiveInt, required=True, help="evaluation (and checkpoint) interval in steps"
    )
    fid.add_argument(
        "--last_n", type=PositiveInt, default=2, help="a profile loss = mean of the last n evaluations"
    )
    fid.add_argument("--out", required=True, type=Path, help="output JSON")
    _levels_args(fid)
    _runs_args(fid)

    inter = psub(
        "interactions",
        help="pairwise interaction terms among the top layers of a profile",
        description="For pairs of the top-m layers of a coverage-benefit profile, train a run with "
        "both high and report benefit[i,j] - (benefit[i] + benefit[j]).",
    )
    inter.add_argument("--config", required=True, type=Path, help="the config the profile was measured with")
    inter.add_argument("--profile", required=True, type=Path, help="coverage-benefit profile JSON")
    inter.add_argument(
        "--top", type=PositiveInt, default=3, help="use all pairs among the top-m layers (default 3)"
    )
    inter.add_argument("--out", required=True, type=Path, help="output JSON of interaction terms")
    _runs_args(inter, default="the profile's own runs folder, so that its base runs are reused")

    _verbose_everywhere(parser)
    return parser


def _verbose_everywhere(parser: Parser) -> None:
    """``-v`` on every command as typed (``repro allocate ... -v``): on each leaf subcommand, where
    the parse reaches it (on the top parser, no command saw it)."""
    for child in parser.subparsers.values():
        if child.subparsers:
            _verbose_everywhere(child)
        else:
            child.add_argument("-v", "--verbose", action="store_true", help="show Lightning's own lines too")
