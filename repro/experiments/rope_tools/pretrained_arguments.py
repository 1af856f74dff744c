"""The options of ``repro profile``'s subcommands for a pretrained model (``model.pretrained``
configs): ``nope``, ``allocations``, ``pair-order``, and the fine-tune and pair-order options that
``coverage`` shares with them."""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.arguments import NonNegativeInt, PositiveFloat, PositiveInt


def add_finetune_args(p: argparse.ArgumentParser, what: str) -> None:
    """A pretrained model's short fine-tune of every rotation before it is evaluated."""
    g = p.add_argument_group("a pretrained model's fine-tunes (model.pretrained configs)")
    g.add_argument(
        "--finetune_steps",
        type=NonNegativeInt,
        default=0,
        help=f"fine-tune {what} this many steps before it is evaluated, through the run engine (runs in "
        "<out without .json>/, resumable); 0, the default: zero-shot",
    )
    g.add_argument(
        "--finetune_lr", type=PositiveFloat, default=None, help="peak learning rate (default: the config's)"
    )
    g.add_argument(
        "--finetune_batch_size",
        type=PositiveInt,
        default=None,
        help="blocks per fine-tune batch (default: the config's)",
    )
    g.add_argument(
        "--finetune_eval_every",
        type=PositiveInt,
        default=None,
        help="validate every this many fine-tune steps (the loss against steps; default: at the end only)",
    )
    g.add_argument(
        "--finetune_config",
        type=Path,
        default=None,
        help="the repro fit YAML the fine-tunes train on (same model.pretrained; e.g. a shorter context than "
        "the evaluation's; default: --config)",
    )


def add_pair_order_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pair_order",
        type=Path,
        default=None,
        help="a pretrained model: which rotary pairs a layer keeps, per key/value head (a file of repro profile "
        "pair-order: MHA2MLA's q.k 2-norm order); default: the highest frequencies (p-RoPE order)",
    )


def add_pretrained_subcommands(psub) -> None:
    """``nope``, ``allocations`` and ``pair-order`` under ``repro profile``."""
    nope = psub(
        "nope",
        help="a pretrained model: test what its phase-off profile predicts, zero-shot or after a fine-tune",
        description="At each budget of k layers without rotation (NoPE), the layers the profile marks least "
        "dependent against inverse, first-k, last-k, spaced-k, random-k and uniform partial coverage, by the "
        "loss on the test split (paired over its chunks, 95%% CIs).",
    )
    nope.add_argument("--config", required=True, type=Path, help="the repro fit YAML naming model.pretrained")
    nope.add_argument(
        "--profile", required=True, type=Path, help="its phase-off profile JSON (repro profile phase-off)"
    )
    nope.add_argument(
        "--layers", required=True, type=PositiveInt, nargs="+", help="NoPE budgets k (layers' worth of pairs)"
    )
    nope.add_argument("--draws", type=NonNegativeInt, default=3, help="random-k: seeded draws (default 3)")
    nope.add_argument("--seed", type=NonNegativeInt, default=0, help="random-k: seed of the first draw")
    nope.add_argument("--out", required=True, type=Path, help="output JSON (and a .md table beside it)")
    nope.add_argument(
        "--finetune_steps",
        type=NonNegativeInt,
        default=0,
        help="fine-tune every allocation (and full RoPE) this many steps before the test, through the run "
        "engine (runs in <out without .json>/, resumable); 0, the default: zero-shot",
    )
    nope.add_argument(
        "--seeds", type=NonNegativeInt, nargs="+", default=[0], help="fine-tune seeds (data order; default 0)"
    )
    nope.add_argument(
        "--plan",
        action="store_true",
        help="with --finetune_steps: print the fine-tunes' cost and exit (no training)",
    )
    nope.add_argument(
        "--step_time",
        type=PositiveFloat,
        default=None,
        help="--plan: one GPU's seconds per step of the config",
    )
    nope.add_argument(
        "--accelerator", default="cpu", help="--plan: the device the plan measures a step on (cpu, gpu)"
    )
    nope.add_argument(
        "--finetune_lr", type=PositiveFloat, default=None, help="peak learning rate (default: the config's)"
    )
    nope.add_argument(
        "--finetune_batch_size",
        type=PositiveInt,
        default=None,
        help="blocks per fine-tune batch (default: the config's)",
    )

    alloc = psub(
        "allocations",
        help="a pretrained model: test budgeted coverage allocations (repro allocate) zero-shot or fine-tuned",
        description="Every allocation of each --allocation file (one per budget; repro allocate on the model's "
        "config) becomes a rotation (each layer keeps its allocated share of its rotary pairs); its test loss, "
        "zero-shot or after a short fine-tune of each, paired over the test chunks against the reference "
        "allocation of the same budget (95%% CIs), beside full RoPE.",
    )
    alloc.add_argument(
        "--config", required=True, type=Path, help="the repro fit YAML naming model.pretrained"
    )
    alloc.add_argument(
        "--allocation", required=True, type=Path, nargs="+", help="allocation JSON files of repro allocate"
    )
    alloc.add_argument(
        "--reference", default="uniform", help="the allocation every row is paired against (default uniform)"
    )
    alloc.add_argument(
        "--seeds", type=NonNegativeInt, nargs="+", default=[0], help="fine-tune seeds (data order; default 0)"
    )
    alloc.add_argument("--plan", action="store_true", help="with --finetune_steps: print the cost and exit")
    alloc.add_argument(
        "--step_time",
        type=PositiveFloat,
        default=None,
        help="--plan: one GPU's seconds per step of the config",
    )
    alloc.add_argument(
        "--accelerator", default="cpu", help="--plan: the device the plan measures a step on (cpu, gpu)"
    )
    alloc.add_argument(
        "--contexts",
        type=PositiveInt,
        nargs="+",
        default=None,
        help="zero-shot at each of these contexts on the same text (chunks of the longest; each must divide it), "
        "instead of the config's context: loss against context length",
    )
    alloc.add_argument("--out", required=True, type=Path, help="output JSON (and a .md table beside it)")
    add_finetune_args(alloc, "every allocation (and full RoPE)")
    add_pair_order_arg(alloc)

    order = psub(
        "pair-order",
        help="a pretrained model: its rotary pairs ranked per key/value head by q.k contribution (MHA2MLA)",
        description="MHA2MLA's 2-norm selection: per layer and key/value head, the rotary pairs by decreasing "
        "mean ||q_i|| (over the query heads reading it) x mean ||k_i|| on blocks of the config's training text. "
        "--pair_order (profile coverage|allocations, convert-mla) reads the file.",
    )
    order.add_argument(
        "--config", required=True, type=Path, help="the repro fit YAML naming model.pretrained"
    )
    order.add_argument("--blocks", type=PositiveInt, default=32, help="calibration blocks (default 32)")
    order.add_argument("--out", required=True, type=Path, help="output JSON")
