"""``repro profile phase-off|coverage|fidelity|interactions``: the profiles of the RoPE allocation
from the command line (outputs written atomically)."""

from __future__ import annotations

import sys
import time
from itertools import combinations
from pathlib import Path

from repro.alloc.allocation import top_k_layers
from repro.alloc.analysis import (
    interaction_terms,
)
from repro.alloc.budget import levels_for, num_high_layers
from repro.alloc.calibration import pair_order_file
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
from repro.alloc.pretrained_allocations import (
    FULL,
    allocation_rotations,
    allocations_markdown,
    contexts_markdown,
    evaluate_allocations,
    evaluate_contexts,
)
from repro.alloc.pretrained_coverage import coverage_probe, coverage_rotations, pretrained_coverage_profile
from repro.alloc.pretrained_nope import (
    FinetuneGrid,
    finetune_specs,
    finetuned_nope,
    nope_markdown,
    zero_shot_nope,
)
from repro.alloc.pretrained_profile import measure_pretrained_profile, pretrained_config
from repro.alloc.pretrained_rotations import Finetune, finetune_overrides
from repro.alloc.pretrained_rotations import finetune_specs as rotation_specs
from repro.alloc.profile import LayerProfile
from repro.experiments.kit.compute_plan import planned_runs, print_plan
from repro.files import read_json, write_json_atomic, write_text_atomic
from repro.runs.model_config import load_model_config
from repro.runs.pool import count_progress
from repro.runs.shards import Shard


def levels_of(args, shape, need_budget: bool = True):
    """The levels the options give; a profile, which needs no budget, takes the default budget moved
    inside [low, high] when --budget is not given (so --low/--high alone never fail on it)."""
    if need_budget or args.budget is not None:
        return levels_for(shape, args.high, args.low, args.budget)
    base = levels_for(shape)
    low = base.low if args.low is None else args.low
    high = base.high if args.high is None else args.high
    return levels_for(shape, high, low, min(max(base.budget, low), high))


def runs_dir_of(args) -> Path:
    return args.runs_dir or args.out.with_name(args.out.name + ".runs")


def profile_command(args) -> None:
    if args.profile_kind == "nope":
        _zero_shot_nope(args)
        return
    if args.profile_kind == "allocations":
        _allocations(args)
        return
    if args.profile_kind == "pair-order":
        doc = pair_order_file(args.config, args.blocks, args.out)
        print(f"wrote {args.out}: the rotary pairs of {doc['model']['n_layer']} layers x "
              f"{doc['model']['kv_heads']} key/value heads ranked on {doc['blocks']} blocks")  # fmt: skip
        return
    if args.profile_kind == "phase-off" and pretrained_config(args.config) is not None:
        if args.ref_steps is not None:
            raise ValueError(
                "--ref_steps trains the suite's GPT; a model.pretrained config is profiled as it is, or from "
                "--ckpt_path (a fine-tune of it)"
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
        print_profile(profile)
        return
    if args.profile_kind == "phase-off" and args.ckpt_path is None and args.ref_steps is None:
        raise ValueError("give --ckpt_path or --ref_steps (or a config with model.pretrained)")
    if args.profile_kind == "coverage" and pretrained_config(args.config) is not None:
        _pretrained_coverage(args)
        return
    config = load_model_config(args.config)
    shape = config.shape_config()
    if args.profile_kind == "fidelity":
        _fidelity(args, config, shape)
    elif args.profile_kind == "phase-off":
        checkpoint = args.ckpt_path
        if args.ref_steps is not None:
            eval_every = args.eval_every or max(1, args.ref_steps // 5)
            levels = levels_of(args, shape)
            print(f"[phase-off] training the all-high reference for {args.ref_steps} steps", file=sys.stderr)
            spec = reference_spec(config, levels, args.ref_steps, args.seed, eval_every, runs_dir_of(args))
            ref = train_reference(spec, args.accelerator)
            checkpoint = Path(ref.checkpoint)
        profile = measure_phase_off_profile(config, checkpoint, per_head=args.per_head)
        profile.save(args.out)
        print_profile(profile)
    elif args.profile_kind == "coverage":
        full = args.full_steps or int(config.trainer.get("max_steps") or 0)
        steps = args.steps
        if steps is None:
            if full <= 0:
                raise ValueError("give --steps, or --full_steps, or a config with trainer.max_steps")
            steps = early_steps(full, args.early_fraction, "--early_fraction")
        settings = CoverageProfileSettings(
            steps=steps,
            seeds=tuple(args.seeds),
            eval_every=args.eval_every or early_eval_every(steps),
            last_n=args.last_n,
            group_size=args.group_size,
            group_spread=args.group_spread,
            schedule_steps=max(full, steps) if args.lr_schedule == "full-run" and full > 0 else None,
        )
        levels = levels_of(args, shape, need_budget=False)
        if args.budget is not None:
            num_high_layers(shape.n_layer, levels)  # fail early on a budget no allocation can meet
        if args.plan:
            runs = planned_runs(profile_specs(config, levels, settings, runs_dir_of(args)), 1)
            print_plan(
                f"coverage profile of {config.path}", runs, config.path, args.accelerator, args.step_time
            )
            return
        started = time.perf_counter()
        profile = coverage_benefit_profile(
            config,
            levels,
            settings,
            runs_dir_of(args),
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
        print_profile(profile)
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


def finetune_of(args, runs: Path, seeds) -> Finetune | None:
    """The fine-tune the pretrained-model commands ask for (None: zero-shot)."""
    if not args.finetune_steps:
        return None
    return Finetune(
        config=str(args.finetune_config or args.config),
        steps=args.finetune_steps,
        folder=runs,
        seeds=tuple(seeds),
        overrides=finetune_overrides(args.finetune_steps, args.finetune_lr, args.finetune_batch_size),
        eval_every=args.finetune_eval_every,
    )


def _pretrained_coverage(args) -> None:
    """The coverage-benefit profile of a pretrained model, zero-shot or after a short fine-tune."""
    config = load_model_config(args.config)
    levels = levels_of(args, config.attention_shape(), need_budget=False)
    if args.probe:
        probe = coverage_probe(args.config, levels, progress=count_progress("probe", "evaluations"))
        write_json_atomic(args.out, probe)
        for name, sd in probe["paired_std"].items():
            print(
                f"{name}: benefit {probe['benefit'][name]:+.4f}, paired std {sd:.4f} over {probe['chunks']} chunks"
            )
        print(
            f"{probe['chunks_needed']} chunks of {probe['chunk_tokens']} tokens (blocks of {probe['context']}) give a "
            f"95% CI of +-{probe['target']} nats "
            f"(the config's data.max_val_blocks / eval_batch_size sets the chunks)"
        )
        return
    finetune = finetune_of(args, args.out.with_suffix(""), args.seeds)
    if args.plan:
        if finetune is None:
            raise ValueError("--plan: only with --finetune_steps (the zero-shot profile trains nothing)")
        n = config.attention_shape().n_layer
        specs = rotation_specs(finetune, coverage_rotations(n, levels.low, levels.high), n, args.pair_order)
        runs = planned_runs(list(specs.values()), 1)
        print_plan("coverage fine-tunes", runs, str(args.config), args.accelerator, args.step_time)
        return
    how = "zero-shot" if finetune is None else f"after {finetune.steps} fine-tune steps of each rotation"
    print(
        f"[coverage] {config.pretrained}: every layer at coverage {levels.low:g}, one at {levels.high:g}, {how}",
        file=sys.stderr,
    )
    started = time.perf_counter()
    profile = pretrained_coverage_profile(
        args.config,
        levels,
        finetune,
        args.pair_order,
        progress=count_progress("coverage", "evaluations of the validation batches"),
    )
    profile.meta["command_wall_s"] = time.perf_counter() - started
    profile.save(args.out)
    print_profile(profile)


def _allocations(args) -> None:
    """Budgeted coverage allocations of a pretrained model, zero-shot or after a fine-tune of each."""
    if pretrained_config(args.config) is None:
        raise ValueError(f"--config {str(args.config)!r} names no model.pretrained")
    docs = [read_json(path, "allocation file") for path in args.allocation]
    for path, doc in zip(args.allocation, docs):
        if not isinstance(doc, dict) or "allocations" not in doc or "levels" not in doc:
            raise ValueError(f"--allocation {str(path)!r}: not a file of repro allocate")
    if args.contexts:
        if args.finetune_steps:
            raise ValueError("--contexts: zero-shot only (give it without --finetune_steps)")
        result = evaluate_contexts(
            args.config, docs, list(args.contexts), args.reference,
            None if args.pair_order is None else str(args.pair_order), count_progress("contexts", "contexts"),
        )  # fmt: skip
        result["allocation_files"] = [str(p) for p in args.allocation]
        write_json_atomic(args.out, result)
        table = contexts_markdown(result)
        write_text_atomic(args.out.with_suffix(".md"), table)
        print(table)
        return
    finetune = finetune_of(args, args.out.with_suffix(""), args.seeds)
    if args.plan:
        if finetune is None:
            raise ValueError("--plan: only with --finetune_steps (the zero-shot test trains nothing)")
        n_layer = len(docs[0]["allocations"][0]["widths"])
        head_dim = load_model_config(args.config).attention_shape().head_dim
        rotations, _ = allocation_rotations(docs, head_dim)
        specs = rotation_specs(finetune, {FULL: {}} | rotations, n_layer, args.pair_order)
        runs = planned_runs(list(specs.values()), 1)
        print_plan("allocation fine-tunes", runs, str(args.config), args.accelerator, args.step_time)
        return
    started = time.perf_counter()
    result = evaluate_allocations(
        args.config,
        docs,
        args.reference,
        finetune,
        None if args.pair_order is None else str(args.pair_order),
        progress=count_progress("allocations", "evaluations of the test batches"),
    )
    result["command_wall_s"] = time.perf_counter() - started
    result["allocation_files"] = [str(p) for p in args.allocation]
    write_json_atomic(args.out, result)
    table = allocations_markdown(result)
    write_text_atomic(args.out.with_suffix(".md"), table)
    print(table)


def _fidelity(args, config, shape) -> None:
    """Coverage profile runs and the all-high reference trained to the full length; the profiles
    read at every evaluation (phase-off: from the reference's checkpoints)."""
    steps, every = args.full_steps, args.eval_every
    if steps % every:
        raise ValueError(f"--full_steps={steps}, --eval_every={every}: the steps must be a multiple of it")
    levels = levels_of(args, shape)
    k = num_high_layers(shape.n_layer, levels)
    settings = CoverageProfileSettings(
        steps=steps, seeds=tuple(args.seeds), eval_every=every, last_n=args.last_n, schedule_steps=steps
    )
    runs_dir = runs_dir_of(args)
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


def print_profile(profile) -> None:
    print(f"{profile.kind} profile ({profile.n_layer} layers)")
    for layer, value in enumerate(profile.values):
        spread = f" +- {profile.std[layer]:.4f}" if profile.std else ""
        if profile.meta.get("ci95") and profile.meta.get("chunks", 0) > 1:
            low, high = profile.meta["ci95"][layer]
            spread += f"  (95% CI over {profile.meta['chunks']} chunks {low:+.5f} .. {high:+.5f})"
        print(f"  layer {layer:3d}: {value:+.5f}{spread}")


def _zero_shot_nope(args) -> None:
    if pretrained_config(args.config) is None:
        raise ValueError(f"--config {str(args.config)!r} names no model.pretrained")
    profile = LayerProfile.load(args.profile)
    if profile.kind != "phase_off":
        raise ValueError(
            f"--profile {str(args.profile)!r}: a {profile.kind} profile; give a phase-off profile"
        )
    if args.finetune_steps:
        overrides = {"model.optim.warmup_steps": max(1, args.finetune_steps // 8)}  # an eighth of the steps
        if args.finetune_lr is not None:
            overrides["model.optim.lr"] = args.finetune_lr
        if args.finetune_batch_size is not None:
            overrides["data.batch_size"] = args.finetune_batch_size
        if len(set(args.seeds)) != len(args.seeds):
            raise ValueError(f"--seeds {args.seeds}: must be distinct")
        grid = FinetuneGrid(
            args.layers, args.finetune_steps, args.out.with_suffix(""), tuple(args.seeds), args.draws, args.seed,
            overrides,
        )  # fmt: skip
        if args.plan:
            _, _, specs = finetune_specs(args.config, profile, grid)
            runs = planned_runs(list(specs.values()), 1)
            print_plan("nope fine-tunes", runs, str(args.config), args.accelerator, args.step_time)
            return
        result = finetuned_nope(args.config, profile, grid)
    elif args.plan:
        raise ValueError("--plan: only with --finetune_steps (the zero-shot test trains nothing)")
    else:
        result = zero_shot_nope(
            args.config,
            profile,
            args.layers,
            args.draws,
            args.seed,
            progress=count_progress("nope", "evaluations of the test batches"),
        )
    write_json_atomic(args.out, result)
    table = nope_markdown(result)
    write_text_atomic(args.out.with_suffix(".md"), table)
    print(table)
