"""``repro profile|allocate|transfer|account|analyze``: the RoPE allocation pipeline from the command line.

Every command reads and writes JSON/YAML files; outputs are written atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Any

from repro.files import read_json, write_json_atomic
from repro.models.config import GPTConfig
from repro.runs.build import quiet_lightning
from repro.runs.model_config import load_model_config, write_model_config

from .accounting import account_model
from .allocation import METHODS, allocate, random_allocations, top_k_layers
from .analysis import (
    calibration,
    interaction_terms,
    predicted_gain,
    seed_stability,
    spearman,
    transfer_fidelity,
)
from .budget import default_levels, levels_for, num_high_layers
from .coverage_profile import CoverageProfileSettings, coverage_benefit_profile, pair_benefits
from .phase_off_profile import measure_phase_off_profile, train_reference
from .profile import LayerProfile
from .transfer import transfer_profile

COMMANDS = ("profile", "allocate", "transfer", "account", "analyze")


def _levels_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "budget levels (defaults from the spec: MHA 1.0/0.25/0.5 coverage; MLA d_nope, d_nope/4, d_nope/2)"
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
        "--runs-dir",
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
        type=int,
        default=1,
        help="train independent runs in this many processes (CPU only; each gets cores/workers threads). "
        "On a 2-core machine, 2 single-thread workers train small models faster than 1",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="repro", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    prof = sub.add_parser(
        "profile", help="measure a per-layer profile (phase-off, coverage-benefit, interactions)"
    )
    psub = prof.add_subparsers(dest="profile_kind", required=True)

    po = psub.add_parser(
        "phase-off",
        help="loss increase per layer with the rotation angle forced to 0 there",
        description="Phase-off profile of a trained model: for each layer, the validation loss "
        "with that layer's rotation angle forced to 0, minus the reference loss.",
    )
    po.add_argument("--config", required=True, type=Path, help="the repro fit YAML of the model and data")
    src = po.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--ckpt-path", type=Path, help="a trained checkpoint of this config's model (e.g. final.ckpt)"
    )
    src.add_argument(
        "--ref-steps", type=int, help="train the all-high reference for this many steps first (resumable)"
    )
    po.add_argument("--seed", type=int, default=0, help="seed of the reference run (with --ref-steps)")
    po.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="validation interval of the reference run (default: steps/5)",
    )
    po.add_argument("--per-head", action="store_true", help="also measure every query head of every layer")
    po.add_argument("--out", required=True, type=Path, help="output profile JSON")
    _levels_args(po)
    _runs_args(po)

    cov = psub.add_parser(
        "coverage",
        help="coverage-benefit profile: base run (all low) and one upgrade run per layer",
        description="Coverage-benefit profile: benefit[l] = loss(all low) - loss(layer l high), "
        "each run trained for T_early steps from the same init seed, averaged over seeds.",
    )
    cov.add_argument("--config", required=True, type=Path, help="the repro fit YAML of the model and data")
    cov.add_argument(
        "--steps",
        type=int,
        default=None,
        help="T_early: steps per run (default: early-fraction x full-steps)",
    )
    cov.add_argument(
        "--early-fraction",
        type=float,
        default=0.15,
        help="T_early as a fraction of the full run (default 0.15)",
    )
    cov.add_argument(
        "--full-steps",
        type=int,
        default=None,
        help="steps of the full run (default: the config's trainer.max_steps)",
    )
    cov.add_argument(
        "--lr-schedule",
        choices=("full-run", "early-run"),
        default="full-run",
        help="full-run: the runs follow the full run's lr schedule, stopped early; "
        "early-run: the schedule is compressed into T_early steps",
    )
    cov.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="S_profile seeds (default: 0 1)")
    cov.add_argument(
        "--eval-every", type=int, default=None, help="validation interval in steps (default: T_early/6)"
    )
    cov.add_argument(
        "--last-n", type=int, default=3, help="a run's loss is the mean of its last n evaluations (default 3)"
    )
    cov.add_argument(
        "--group-size",
        type=int,
        default=1,
        help="upgrade contiguous groups of g layers (ceil(L/g)+1 runs per seed)",
    )
    cov.add_argument(
        "--group-spread",
        choices=("divide", "copy"),
        default="divide",
        help="spread a group's benefit over its layers: divide equally (default) or copy to each",
    )
    cov.add_argument("--out", required=True, type=Path, help="output profile JSON")
    _levels_args(cov)
    _runs_args(cov)

    inter = psub.add_parser(
        "interactions",
        help="pairwise interaction terms among the top layers of a profile",
        description="For pairs of the top-m layers of a coverage-benefit profile, train a run with "
        "both high and report benefit[i,j] - (benefit[i] + benefit[j]).",
    )
    inter.add_argument("--config", required=True, type=Path, help="the config the profile was measured with")
    inter.add_argument("--profile", required=True, type=Path, help="coverage-benefit profile JSON")
    inter.add_argument("--top", type=int, default=3, help="use all pairs among the top-m layers (default 3)")
    inter.add_argument("--out", required=True, type=Path, help="output JSON of interaction terms")
    _runs_args(inter, default="the profile's own runs folder, so that its base runs are reused")

    al = sub.add_parser(
        "allocate",
        help="choose high/low layers under the budget with one or more methods",
        description="Allocations under a fixed budget. Budget-matched: profiled, transferred, uniform, "
        "first-k, last-k, spaced-k, random-k, inverse, phase-off-k. Reference points: "
        "all-high, all-low, nope.",
    )
    al.add_argument("--config", required=True, type=Path, help="the repro fit YAML of the model to allocate")
    al.add_argument(
        "--method", nargs="+", default=["all"], help="methods, or 'all' (those whose inputs are given)"
    )
    al.add_argument("--benefit", type=Path, help="coverage-benefit profile JSON (profiled, inverse)")
    al.add_argument("--transferred", type=Path, help="transferred profile JSON (transferred)")
    al.add_argument("--phase-off", type=Path, help="phase-off profile JSON (phase-off-k)")
    al.add_argument("--draws", type=int, default=3, help="random-k: number of seeded draws R (default 3)")
    al.add_argument(
        "--seed", type=int, default=0, help="random-k: seed of the first draw (draw r uses seed + r)"
    )
    al.add_argument("--out", required=True, type=Path, help="output JSON with every allocation")
    al.add_argument(
        "--write-configs",
        type=Path,
        default=None,
        help="also write one repro fit YAML per allocation into this folder (train with repro fit --config)",
    )
    _levels_args(al)

    tr = sub.add_parser(
        "transfer",
        help="map a profile to a model of another depth by normalized depth",
        description="Normalized-depth transfer: layer j of an L-layer model sits at u=j/(L-1); the "
        "target profile is the source profile interpolated at the target's depths.",
    )
    tr.add_argument(
        "--profile", required=True, type=Path, help="source profile JSON (measured on the smaller model)"
    )
    target = tr.add_mutually_exclusive_group(required=True)
    target.add_argument("--config", type=Path, help="the target model's repro fit YAML")
    target.add_argument("--target-layers", type=int, help="number of layers of the target model")
    tr.add_argument(
        "--method", choices=("linear", "nearest"), default="linear", help="interpolation (default linear)"
    )
    tr.add_argument("--out", required=True, type=Path, help="output transferred profile JSON")
    tr.add_argument(
        "--direct",
        type=Path,
        default=None,
        help="a profile measured directly on the target: report transfer fidelity against it",
    )

    ac = sub.add_parser(
        "account",
        help="KV-cache, RoPE and attention cost per token of a model or allocation",
        description="Analytical resource accounting per token and per layer (spec section 6).",
    )
    ac.add_argument("--config", required=True, type=Path, help="the repro fit YAML of the model")
    ac.add_argument(
        "--allocation",
        type=Path,
        default=None,
        help="allocation JSON from repro allocate: account each allocation (default: the config's own widths)",
    )
    ac.add_argument(
        "--context", type=int, default=None, help="context length T for attention FLOPs (default: block size)"
    )
    ac.add_argument(
        "--bytes-per-elem", type=int, default=2, help="bytes per cached element (default 2, bf16)"
    )
    ac.add_argument("--out", type=Path, default=None, help="output JSON (default: print only)")

    an = sub.add_parser(
        "analyze",
        help="stability, phase-off vs benefit, transfer fidelity, calibration",
        description="The brief analysis of spec section 5 from saved profiles and results.",
    )
    an.add_argument("--benefit", type=Path, help="coverage-benefit profile JSON (stability across seeds)")
    an.add_argument("--phase-off", type=Path, help="phase-off profile JSON (Spearman against --benefit)")
    an.add_argument("--transferred", type=Path, help="transferred profile JSON (fidelity against --benefit)")
    an.add_argument("--top-k", type=int, default=None, help="k for the top-k Jaccard of transfer fidelity")
    an.add_argument(
        "--calibration",
        type=Path,
        help="JSON list of {high_layers, realized_gain}: realized loss change of trained allocations",
    )
    an.add_argument("--out", required=True, type=Path, help="output JSON")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    quiet_lightning()  # one progress line per run instead of Lightning's banners
    try:
        handler = {
            "profile": _profile,
            "allocate": _allocate,
            "transfer": _transfer,
            "account": _account,
            "analyze": _analyze,
        }[args.command]
        handler(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"repro {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


# ---------------------------------------------------------------------------------------------- handlers
def _levels(args, shape):
    return levels_for(shape, args.high, args.low, args.budget)


def _runs_dir(args) -> Path:
    return args.runs_dir or args.out.with_name(args.out.name + ".runs")


def _profile(args) -> None:
    config = load_model_config(args.config)
    shape = config.shape_config()
    if args.profile_kind == "phase-off":
        checkpoint = args.ckpt_path
        if args.ref_steps is not None:
            if args.ref_steps <= 0:
                raise ValueError(f"--ref-steps={args.ref_steps}: must be a positive integer")
            eval_every = args.eval_every or max(1, args.ref_steps // 5)
            levels = _levels(args, shape)
            print(f"[phase-off] training the all-high reference for {args.ref_steps} steps", file=sys.stderr)
            ref = train_reference(
                config, levels, args.ref_steps, args.seed, eval_every, _runs_dir(args), args.accelerator
            )
            checkpoint = Path(ref.checkpoint)
        profile = measure_phase_off_profile(config, checkpoint, per_head=args.per_head)
        profile.save(args.out)
        _print_profile(profile)
    elif args.profile_kind == "coverage":
        full = args.full_steps or int(config.trainer.get("max_steps") or 0)
        steps = args.steps
        if steps is None:
            if full <= 0:
                raise ValueError("give --steps, or --full-steps, or a config with trainer.max_steps")
            if not 0.0 < args.early_fraction <= 1.0:
                raise ValueError(f"--early-fraction={args.early_fraction}: must be in (0, 1]")
            steps = max(1, round(args.early_fraction * full))
        settings = CoverageProfileSettings(
            steps=steps,
            seeds=tuple(args.seeds),
            eval_every=args.eval_every or max(1, steps // 6),
            last_n=args.last_n,
            group_size=args.group_size,
            group_spread=args.group_spread,
            schedule_steps=max(full, steps) if args.lr_schedule == "full-run" and full > 0 else None,
        )
        levels = _levels(args, shape)
        num_high_layers(shape.n_layer, levels)  # fail early on an infeasible budget
        started = time.perf_counter()
        profile = coverage_benefit_profile(
            config, levels, settings, _runs_dir(args), args.accelerator, workers=args.workers
        )
        profile.meta["command_wall_s"] = time.perf_counter() - started
        profile.save(args.out)
        _print_profile(profile)
        print(
            f"wall time {profile.meta['command_wall_s']:.1f}s for {profile.meta['runs']} runs "
            f"({profile.meta['training_wall_s']:.1f}s of training summed over runs, {args.workers} worker(s))"
        )
    else:  # interactions
        profile = LayerProfile.load(args.profile)
        if profile.kind != "coverage_benefit":
            raise ValueError(
                f"--profile {str(args.profile)!r} is a {profile.kind} profile; interactions need coverage_benefit"
            )
        profile.check_matches(shape.n_layer, f"the model of {str(args.config)!r}")
        if not 2 <= args.top <= profile.n_layer:
            raise ValueError(f"--top={args.top}: must be in 2..{profile.n_layer}")
        pairs = list(combinations(top_k_layers(profile.values, args.top), 2))
        # the pair runs share the profile's base runs: train them in the profile's runs folder
        runs_dir = args.runs_dir or Path(
            profile.meta.get("runs_dir") or args.profile.with_name(args.profile.name + ".runs")
        )
        measured = pair_benefits(config, profile, pairs, runs_dir, args.accelerator, workers=args.workers)
        terms = interaction_terms(profile.values, measured)
        write_json_atomic(args.out, {"profile": str(args.profile), "top": args.top, "terms": terms})
        for t in terms:
            print(
                f"layers {t['layers']}: pair {t['pair_benefit']:+.4f}  additive {t['additive']:+.4f}  "
                f"interaction {t['interaction']:+.4f}"
            )


def _print_profile(profile) -> None:
    print(f"{profile.kind} profile ({profile.n_layer} layers)")
    for layer, value in enumerate(profile.values):
        spread = f" +- {profile.std[layer]:.4f}" if profile.std else ""
        print(f"  layer {layer:3d}: {value:+.5f}{spread}")


def _allocate(args) -> None:
    config = load_model_config(args.config)
    shape = config.shape_config()
    levels = _levels(args, shape)
    benefit = LayerProfile.load(args.benefit) if args.benefit else None
    transferred = LayerProfile.load(args.transferred) if args.transferred else None
    phase_off = LayerProfile.load(args.phase_off) if args.phase_off else None
    methods = list(args.method)
    if methods == ["all"]:
        methods = [
            m
            for m in METHODS
            if not (
                (m in ("profiled", "inverse") and benefit is None)
                or (m == "transferred" and transferred is None)
                or (m == "phase-off-k" and phase_off is None)
            )
        ]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"--method {unknown}: allowed methods are {METHODS} or 'all'")
    allocations = []
    for method in methods:
        if method == "random-k":
            allocations.extend(random_allocations(shape, levels, args.draws, args.seed))
        else:
            allocations.append(
                allocate(method, shape, levels, benefit=benefit, phase_off=phase_off, transferred=transferred)
            )
    records = [a.to_dict() for a in allocations]
    write_json_atomic(
        args.out,
        {
            "config": str(args.config),
            "n_layer": shape.n_layer,
            "levels": levels.to_dict(),
            "allocations": records,
        },
    )
    for a in allocations:
        tag = "" if a.budget_matched else "  (reference point, not budget-matched)"
        draw = f" draw {a.record['draw']}" if "draw" in a.record else ""
        print(
            f"{a.method}{draw}: {a.config_field}={a.widths} high={a.high_layers} mean={a.mean_level:g}{tag}"
        )
    if args.write_configs:
        for a in allocations:
            name = a.method + (f"-r{a.record['draw']}" if "draw" in a.record else "")
            stem = Path(args.config).stem
            doc = config.with_widths(a.widths, logger_name=f"{stem}-{name}")
            write_model_config(
                doc,
                args.write_configs / f"{stem}-{name}.yaml",
                header=f"{stem} with the '{name}' allocation (repro allocate; {a.config_field} rewritten)",
            )
        print(f"wrote {len(allocations)} configs to {args.write_configs}/")


def _transfer(args) -> None:
    source = LayerProfile.load(args.profile)
    target_model = None
    if args.config:
        shape = load_model_config(args.config).shape_config()
        n_target, target_model = shape.n_layer, shape.to_dict()
    else:
        n_target = args.target_layers
    transferred = transfer_profile(source, n_target, args.method, target_model, source_path=str(args.profile))
    if args.direct:
        direct = LayerProfile.load(args.direct)
        k = num_high_layers(n_target, default_levels(shape)) if args.config else max(1, n_target // 3)
        transferred.meta["fidelity"] = transfer_fidelity(transferred.values, direct.values, k)
    transferred.save(args.out)
    _print_profile(transferred)
    if "fidelity" in transferred.meta:
        f = transferred.meta["fidelity"]
        print(
            f"fidelity vs {args.direct}: Spearman {f['spearman']:.3f}, top-{f['top_k']} Jaccard {f['jaccard']:.3f}"
        )


def _account(args) -> None:
    shape = load_model_config(args.config).shape_config()
    if args.allocation:
        data = read_json(args.allocation, "allocation file")
        if "allocations" not in data:
            raise ValueError(
                f"--allocation {str(args.allocation)!r} has no 'allocations'; is it from repro allocate?"
            )
        rows = []
        for a in data["allocations"]:
            if a.get("attention") != shape.attention:
                raise ValueError(
                    f"allocation '{a['method']}' was made for attention={a.get('attention')!r} but "
                    f"{str(args.config)!r} has attention={shape.attention!r}"
                )
            if len(a["widths"]) != shape.n_layer:
                raise ValueError(
                    f"allocation '{a['method']}' has {len(a['widths'])} layers but the model has {shape.n_layer}"
                )
            field = "rope_dims" if shape.attention == "mha" else "qk_rope_head_dim"
            cfg = shape.__class__(**{**shape.to_dict(), field: a["widths"]})
            rows.append(
                {
                    "method": a["method"],
                    "draw": a.get("record", {}).get("draw"),
                    **account_model(cfg, args.context, args.bytes_per_elem),
                }
            )
    else:
        rows = [{"method": "config", **account_model(shape, args.context, args.bytes_per_elem)}]
    print(
        f"{'method':<14}{'KV elems/token':>16}{'KV bytes/token':>16}{'RoPE FLOPs':>12}"
        f"{'attn FLOPs':>14}{'rotary params':>15}"
    )
    for r in rows:
        t = r["total"]
        print(
            f"{r['method']:<14}{t['kv_cache_elements']:>16,}{t['kv_cache_bytes']:>16,}{t['rope_flops']:>12,}"
            f"{t['attention_flops']:>14,}{t['rotary_parameters']:>15,}"
        )
    if args.out:
        write_json_atomic(args.out, {"config": str(args.config), "rows": rows})


def _analyze(args) -> None:
    out: dict[str, Any] = {}
    benefit = LayerProfile.load(args.benefit) if args.benefit else None
    if benefit is not None and len(benefit.per_seed) > 1:
        out["stability"] = seed_stability(benefit.per_seed)
    if args.phase_off:
        phase_off = LayerProfile.load(args.phase_off)
        if benefit is None:
            raise ValueError("--phase-off needs --benefit to compare with")
        phase_off.check_matches(benefit.n_layer, "the coverage-benefit profile")
        out["phase_off_vs_benefit_spearman"] = spearman(phase_off.values, benefit.values)
    if args.transferred:
        if benefit is None:
            raise ValueError("--transferred needs --benefit (the profile measured directly on the target)")
        transferred = LayerProfile.load(args.transferred)
        transferred.check_matches(benefit.n_layer, "the coverage-benefit profile")
        k = args.top_k or num_high_layers(benefit.n_layer, default_levels(_shape_of(benefit)))
        out["transfer_fidelity"] = transfer_fidelity(transferred.values, benefit.values, k)
    if args.calibration:
        if benefit is None:
            raise ValueError("--calibration needs --benefit (the profile whose sums predict the gains)")
        records = read_json(args.calibration, "calibration file")
        predicted = [predicted_gain(benefit.values, r["high_layers"]) for r in records]
        out["calibration"] = calibration(predicted, [float(r["realized_gain"]) for r in records])
    if not out:
        raise ValueError(
            "nothing to analyze: give --benefit (with 2+ seeds), --phase-off, --transferred or --calibration"
        )
    write_json_atomic(args.out, out)
    print(json.dumps(out, indent=2))


def _shape_of(profile):
    return GPTConfig(**{"vocab_size": 1, **profile.model})
