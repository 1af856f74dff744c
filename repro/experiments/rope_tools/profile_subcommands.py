"""Per-layer profiles of the RoPE allocation (``repro profile phase-off|nope|allocations|pair-order|
coverage|fidelity|interactions``): each subcommand a typed function whose parameters are its options
(``repro.arguments.call``; a dataclass parameter is a group of options, each field its own, shared
by the subcommands that take it); ``profile_command.py`` runs them."""

from __future__ import annotations

import dataclasses
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from repro.alloc.coverage_profile import EARLY_FRACTION, CoverageProfileSettings
from repro.arguments import (
    ClosedUnitInterval,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    documented_by,
)
from repro.experiments.kit.scale_args import ScaleOptions
from repro.runs.build import quiet_lightning
from repro.stop import interrupted_line

from .profile_command import profile_command, runs_dir_of

_C = CoverageProfileSettings  # the coverage profile's defaults are its fields'


@dataclass(frozen=True)
class Levels:
    """The budget levels (defaults of PROTOCOL.md §R2: MHA 1.0/0.25/0.5 coverage; MLA d_nope, d_nope/4,
    d_nope/2)."""

    high: float | None = None
    """high level: coverage in [0,1] (MHA) or rotary width d_R (MLA)"""
    low: float | None = None
    """low level, same unit as --high"""
    budget: float | None = None
    """budget B: mean coverage (MHA) or mean rotary width (MLA)"""


@dataclass(frozen=True)
class Runs:
    """Where and how the training runs of a profile run."""

    runs_dir: Path | None = None
    """where each training run writes its result JSON and TensorBoard log (default: <out>.runs/;
    interactions: the profile's own runs folder, so that its base runs are reused); finished runs
    found there are reused, so a second call resumes"""
    accelerator: str = "cpu"
    """Lightning accelerator for the training runs (cpu, gpu)"""
    workers: PositiveInt = 1
    """train independent runs in this many processes (CPU only; each gets cores/workers threads). On
    a 2-core machine, 2 single-thread workers train small models faster than 1"""


@dataclass(frozen=True)
class Finetunes:
    """A pretrained model's short fine-tune of every rotation before it is evaluated (model.pretrained
    configs)."""

    finetune_steps: NonNegativeInt = 0
    """fine-tune every rotation this many steps before it is evaluated, through the run engine (runs in
    <out without .json>/, resumable); 0, the default: zero-shot"""
    finetune_lr: PositiveFloat | None = None
    """peak learning rate (default: the config's)"""
    finetune_batch_size: PositiveInt | None = None
    """blocks per fine-tune batch (default: the config's)"""
    finetune_eval_every: PositiveInt | None = None
    """validate every this many fine-tune steps (the loss against steps; default: at the end only)"""
    finetune_config: Path | None = None
    """the repro fit YAML the fine-tunes train on (same model.pretrained; e.g. a shorter context than the
    evaluation's; default: --config)"""


def phase_off(
    config: Path,
    out: Path,
    ckpt_path: Path | None = None,
    ref_steps: PositiveInt | None = None,
    seed: NonNegativeInt = 0,
    eval_every: PositiveInt | None = None,
    per_head: bool = False,
    rotary_fraction: ClosedUnitInterval = 0.0,
    levels: Levels = Levels(),
    runs: Runs = Runs(),
) -> int:
    """Loss increase per layer with the rotation angle forced to 0 there: the validation loss of a
    trained model with that layer's rotation angle forced to 0, minus the reference loss.

    Args:
        config: the repro fit YAML of the model and data
        out: output profile JSON
        ckpt_path: a trained checkpoint of this config's model (e.g. final.ckpt); with a model.pretrained
            config, a fine-tune of that model (default: its pretrained weights)
        ref_steps: train the all-high reference for this many steps first (resumable; not with --ckpt_path)
        seed: seed of the reference run (with --ref_steps)
        eval_every: validation interval of the reference run (default: steps/5)
        per_head: also measure every head of every layer (a pretrained model: every key/value head)
        rotary_fraction: a pretrained model (model.pretrained): each layer keeps only this
            highest-frequency fraction of its rotary pairs (0, the default: no rotary phase)
    """
    if ckpt_path is not None and ref_steps is not None:
        raise ValueError("give --ckpt_path or --ref_steps, not both")
    return _run("phase-off", locals())


def nope(
    config: Path,
    profile: Path,
    layers: tuple[PositiveInt, ...],
    out: Path,
    draws: NonNegativeInt = 3,
    seed: NonNegativeInt = 0,
    finetune_steps: NonNegativeInt = 0,
    seeds: tuple[NonNegativeInt, ...] = (0,),
    plan: bool = False,
    step_time: PositiveFloat | None = None,
    accelerator: str = "cpu",
    finetune_lr: PositiveFloat | None = None,
    finetune_batch_size: PositiveInt | None = None,
) -> int:
    """A pretrained model: test what its phase-off profile predicts, zero-shot or after a fine-tune. At
    each budget of k layers without rotation (NoPE), the layers the profile marks least dependent
    against inverse, first-k, last-k, spaced-k, random-k and uniform partial coverage, by the loss on
    the test split (paired over its chunks, 95% CIs).

    Args:
        config: the repro fit YAML naming model.pretrained
        profile: its phase-off profile JSON (repro profile phase-off)
        layers: NoPE budgets k (layers' worth of pairs)
        out: output JSON (and a .md table beside it)
        draws: random-k: seeded draws
        seed: random-k: seed of the first draw
        finetune_steps: fine-tune every allocation (and full RoPE) this many steps before the test,
            through the run engine (runs in <out without .json>/, resumable); 0, the default: zero-shot
        seeds: fine-tune seeds (data order)
        plan: with --finetune_steps: print the fine-tunes' cost and exit (no training)
        step_time: --plan: one GPU's seconds per step of the config
        accelerator: --plan: the device the plan measures a step on (cpu, gpu)
        finetune_lr: peak learning rate (default: the config's)
        finetune_batch_size: blocks per fine-tune batch (default: the config's)
    """
    return _run("nope", locals())


def allocations(
    config: Path,
    allocation: tuple[Path, ...],
    out: Path,
    reference: str = "uniform",
    seeds: tuple[NonNegativeInt, ...] = (0,),
    plan: bool = False,
    step_time: PositiveFloat | None = None,
    accelerator: str = "cpu",
    contexts: tuple[PositiveInt, ...] | None = None,
    finetunes: Finetunes = Finetunes(),
    pair_order: Path | None = None,
) -> int:
    """A pretrained model: test budgeted coverage allocations (repro allocate) zero-shot or fine-tuned.
    Every allocation of each --allocation file (one per budget; repro allocate on the model's config)
    becomes a rotation (each layer keeps its allocated share of its rotary pairs); its test loss,
    zero-shot or after a short fine-tune of each, paired over the test chunks against the reference
    allocation of the same budget (95% CIs), beside full RoPE.

    Args:
        config: the repro fit YAML naming model.pretrained
        allocation: allocation JSON files of repro allocate
        out: output JSON (and a .md table beside it)
        reference: the allocation every row is paired against
        seeds: fine-tune seeds (data order)
        plan: with --finetune_steps: print the cost and exit
        step_time: --plan: one GPU's seconds per step of the config
        accelerator: --plan: the device the plan measures a step on (cpu, gpu)
        contexts: zero-shot at each of these contexts on the same text (chunks of the longest; each must
            divide it), instead of the config's context: loss against context length
        pair_order: a pretrained model: which rotary pairs a layer keeps, per key/value head (a file of
            repro profile pair-order: MHA2MLA's q.k 2-norm order); default: the highest frequencies
            (p-RoPE order)
    """
    return _run("allocations", locals())


def pair_order(config: Path, out: Path, blocks: PositiveInt = 32) -> int:
    """A pretrained model: its rotary pairs ranked per key/value head by q.k contribution (MHA2MLA's
    2-norm selection): per layer and key/value head, the rotary pairs by decreasing mean ||q_i|| (over
    the query heads reading it) x mean ||k_i|| on blocks of the config's training text. --pair_order
    (profile coverage|allocations, convert-mla) reads the file.

    Args:
        config: the repro fit YAML naming model.pretrained
        out: output JSON
        blocks: calibration blocks
    """
    return _run("pair-order", locals())


@documented_by(CoverageProfileSettings)
def coverage(
    config: Path,
    out: Path,
    steps: PositiveInt | None = None,
    early_fraction: Probability = EARLY_FRACTION,
    full_steps: PositiveInt | None = None,
    lr_schedule: Literal["full-run", "early-run"] = "full-run",
    eval_every: PositiveInt | None = None,
    seeds: tuple[NonNegativeInt, ...] = _C.seeds,
    last_n: PositiveInt = _C.last_n,
    group_size: PositiveInt = _C.group_size,
    group_spread: Literal["divide", "copy"] = _C.group_spread,
    probe: bool = False,
    finetunes: Finetunes = Finetunes(),
    pair_order: Path | None = None,
    levels: Levels = Levels(),
    runs: Runs = Runs(),
    scale: ScaleOptions = ScaleOptions(),
) -> int:
    """Coverage-benefit profile: a base run (all low) and one upgrade run per layer; benefit[l] =
    loss(all low) - loss(layer l high), each run trained for T_early steps from the same init seed,
    averaged over seeds.

    Args:
        config: the repro fit YAML of the model and data
        out: output profile JSON
        steps: T_early: steps per run (default: early-fraction x full-steps)
        early_fraction: T_early as a fraction of the full run
        full_steps: steps of the full run (default: the config's trainer.max_steps)
        lr_schedule: full-run: the runs follow the full run's lr schedule, stopped early; early-run: the
            schedule is compressed into T_early steps
        eval_every: validation interval in steps (default: T_early // EVALUATIONS of
            repro.alloc.coverage_profile, a few evaluations a run)
        probe: a pretrained model: only the noise probe (the base and 3 upgrades on every validation
            chunk): the chunks that resolve 0.01 nats, written to --out
        pair_order: a pretrained model: which rotary pairs a layer keeps, per key/value head (a file of
            repro profile pair-order); default: the highest frequencies (p-RoPE order)
    """
    return _run("coverage", locals())


def fidelity(
    config: Path,
    full_steps: PositiveInt,
    eval_every: PositiveInt,
    out: Path,
    seeds: tuple[NonNegativeInt, ...] = (0, 1, 2, 3),
    last_n: PositiveInt = 2,
    levels: Levels = Levels(),
    runs: Runs = Runs(),
) -> int:
    """Does the early profile predict the late one? The coverage-benefit profile runs and the
    all-high reference trained to the full length, evaluating every --eval_every steps: at every
    evaluation the Spearman of the profile there against the final one, its seed stability, and the
    phase-off profile of the reference there.

    Args:
        config: the model config to profile
        full_steps: steps of the full run (and of every run here)
        eval_every: evaluation (and checkpoint) interval in steps
        out: output JSON
        seeds: profile seeds
        last_n: a profile loss = mean of the last n evaluations
    """
    return _run("fidelity", locals())


def interactions(config: Path, profile: Path, out: Path, top: PositiveInt = 3, runs: Runs = Runs()) -> int:
    """Pairwise interaction terms among the top layers of a profile: for pairs of the top-m layers of a
    coverage-benefit profile, a run with both high; benefit[i,j] - (benefit[i] + benefit[j]).

    Args:
        config: the config the profile was measured with
        profile: coverage-benefit profile JSON
        out: output JSON of interaction terms
        top: use all pairs among the top-m layers
    """
    return _run("interactions", locals())


def _run(kind: str, options: dict[str, Any]) -> int:
    """Run subcommand ``kind`` of ``repro profile`` on its options (an option group's fields flat,
    as the profiles read them); Ctrl-C: the line that says how to resume, exit status 130."""
    flat: dict[str, Any] = {"profile_kind": kind, "command": "profile"}
    for name, value in options.items():
        is_group = dataclasses.is_dataclass(value) and not isinstance(value, type)
        flat.update(dataclasses.asdict(value) if is_group else {name: value})
    args = Namespace(**{k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()})
    quiet_lightning()  # one progress line per run instead of Lightning's banners
    try:
        profile_command(args)
    except KeyboardInterrupt:
        trains = hasattr(args, "runs_dir") and getattr(args, "out", None) is not None
        print(interrupted_line("profile", runs_dir_of(args) if trains else Path(".")), file=sys.stderr)
        return 130
    return 0
