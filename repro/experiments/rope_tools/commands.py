"""``repro profile|allocate|transfer|account|analyze``: the RoPE allocation pipeline from the command line.

Every command reads and writes JSON/YAML files; outputs are written atomically.
"""

from __future__ import annotations

import json
import os
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Any

from repro.alloc.accounting import account_model
from repro.alloc.allocation import METHODS, allocate, random_allocations, top_k_layers
from repro.alloc.analysis import (
    calibration,
    interaction_terms,
    predicted_gain,
    seed_stability,
    spearman,
    transfer_fidelity,
)
from repro.alloc.budget import default_levels, levels_for, num_high_layers
from repro.alloc.coverage_profile import (
    CoverageProfileSettings,
    coverage_benefit_profile,
    early_eval_every,
    early_steps,
    pair_benefits,
    profile_specs,
)
from repro.alloc.fidelity import coverage_fidelity, format_fidelity, phase_off_fidelity
from repro.alloc.phase_off_profile import measure_phase_off_profile, reference_spec, train_reference
from repro.alloc.pretrained_profile import measure_pretrained_profile, pretrained_config
from repro.alloc.profile import LayerProfile
from repro.alloc.transfer import transfer_profile
from repro.experiments.kit.compute_plan import planned_runs, print_plan
from repro.files import read_json, write_json_atomic
from repro.models.config import GPTConfig
from repro.runs.build import VERBOSE_ENV, quiet_lightning
from repro.runs.interrupts import interrupted_line
from repro.runs.model_config import load_model_config, write_model_config
from repro.runs.pool import count_progress
from repro.runs.shards import Shard

from .command_arguments import build_parser

COMMANDS = ("profile", "allocate", "transfer", "account", "analyze")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"
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
    except KeyboardInterrupt:
        trains = hasattr(args, "runs_dir") and getattr(args, "out", None) is not None
        print(interrupted_line(args.command, _runs_dir(args) if trains else Path(".")), file=sys.stderr)
        return 130
    return 0


# ---------------------------------------------------------------------------------------------- handlers
def _levels(args, shape):
    return levels_for(shape, args.high, args.low, args.budget)


def _runs_dir(args) -> Path:
    return args.runs_dir or args.out.with_name(args.out.name + ".runs")


def _profile(args) -> None:
    if args.profile_kind == "phase-off" and pretrained_config(args.config) is not None:
        if args.ref_steps is not None:
            raise ValueError(
                "--ref-steps trains the suite's GPT; a model.pretrained config is profiled as it is, or from "
                "--ckpt-path (a fine-tune of it)"
            )
        weights = f"{args.ckpt_path}" if args.ckpt_path else "the pretrained weights"
        print(f"[phase-off] profiling {weights} of {args.config}", file=sys.stderr)
        profile = measure_pretrained_profile(
            args.config,
            args.rotary_fraction,
            per_head=args.per_head,
            checkpoint=args.ckpt_path,
            progress=count_progress("phase-off", "evaluations of the validation batches"),
        )
        profile.save(args.out)
        _print_profile(profile)
        return
    if args.profile_kind == "phase-off" and args.ckpt_path is None and args.ref_steps is None:
        raise ValueError(
            "repro profile phase-off: give --ckpt-path or --ref-steps (or a config with model.pretrained)"
        )
    config = load_model_config(args.config)
    shape = config.shape_config()
    if args.profile_kind == "fidelity":
        _fidelity(args, config, shape)
    elif args.profile_kind == "phase-off":
        checkpoint = args.ckpt_path
        if args.ref_steps is not None:
            if args.ref_steps <= 0:
                raise ValueError(f"--ref-steps={args.ref_steps}: must be a positive integer")
            eval_every = args.eval_every or max(1, args.ref_steps // 5)
            levels = _levels(args, shape)
            print(f"[phase-off] training the all-high reference for {args.ref_steps} steps", file=sys.stderr)
            spec = reference_spec(config, levels, args.ref_steps, args.seed, eval_every, _runs_dir(args))
            ref = train_reference(spec, args.accelerator)
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
            steps = early_steps(full, args.early_fraction, "--early-fraction")
        settings = CoverageProfileSettings(
            steps=steps,
            seeds=tuple(args.seeds),
            eval_every=args.eval_every or early_eval_every(steps),
            last_n=args.last_n,
            group_size=args.group_size,
            group_spread=args.group_spread,
            schedule_steps=max(full, steps) if args.lr_schedule == "full-run" and full > 0 else None,
        )
        levels = _levels(args, shape)
        num_high_layers(shape.n_layer, levels)  # fail early on an infeasible budget
        if args.plan:
            runs = planned_runs(profile_specs(config, levels, settings, _runs_dir(args)), 1)
            print_plan(
                f"coverage profile of {config.path}", runs, config.path, args.accelerator, args.step_time
            )
            return
        started = time.perf_counter()
        profile = coverage_benefit_profile(
            config,
            levels,
            settings,
            _runs_dir(args),
            args.accelerator,
            workers=args.workers,
            shard=Shard.parse(args.shard),
            runs_per_gpu=args.runs_per_gpu or 1,
            writes=str(args.out),
        )
        if profile is None:  # the line saying so is printed: the last shard to finish writes args.out
            return
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


def _fidelity(args, config, shape) -> None:
    """Coverage profile runs and the all-high reference trained to the full length; the profiles
    read at every evaluation (phase-off: from the reference's checkpoints)."""
    steps, every = args.full_steps, args.eval_every
    if steps <= 0 or every <= 0 or steps % every:
        raise ValueError(
            f"--full-steps={steps}, --eval-every={every}: positive, and the steps a multiple of it"
        )
    levels = _levels(args, shape)
    k = num_high_layers(shape.n_layer, levels)
    settings = CoverageProfileSettings(
        steps=steps, seeds=tuple(args.seeds), eval_every=every, last_n=args.last_n, schedule_steps=steps
    )
    runs_dir = _runs_dir(args)
    profile = coverage_benefit_profile(
        config, levels, settings, runs_dir, args.accelerator, workers=args.workers
    )
    spec = reference_spec(config, levels, steps, args.seeds[0], every, runs_dir, checkpoint_every=every)
    ref = train_reference(spec, args.accelerator)
    checkpoints = [
        (k_step, runs_dir / f"{Path(ref.checkpoint).stem}-step{k_step}.ckpt")
        for k_step in range(every, steps, every)
    ]
    checkpoints.append((steps, Path(ref.checkpoint)))
    phase_off = [(step, measure_phase_off_profile(config, path)) for step, path in checkpoints]
    coverage = coverage_fidelity(profile, k)
    by_phase_off = phase_off_fidelity(phase_off, coverage[-1]["values"])
    write_json_atomic(
        args.out,
        {
            "config": str(args.config),
            "steps": steps,
            "eval_every": every,
            "seeds": list(args.seeds),
            "last_n": args.last_n,
            "k": k,
            "levels": levels.to_dict(),
            "coverage": coverage,
            "phase_off": by_phase_off,
            "profile": profile.to_dict(),
        },
    )
    print(format_fidelity(coverage, by_phase_off))


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
            cfg = shape.__class__(**{**shape.to_dict(), shape.width_field: a["widths"]})
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
    if args.fidelity:
        if benefit is None:
            raise ValueError(
                "--fidelity needs --benefit (a coverage profile whose runs recorded their curves)"
            )
        k = args.top_k or num_high_layers(benefit.n_layer, default_levels(_shape_of(benefit)))
        out["fidelity"] = coverage_fidelity(benefit, k)
        print(format_fidelity(out["fidelity"]), file=sys.stderr)
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
