"""``repro profile|allocate|transfer|account|analyze``: the RoPE allocation pipeline from the command line.

Every command reads and writes JSON/YAML files; outputs are written atomically.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from repro.alloc.accounting import account_model
from repro.alloc.allocation import METHODS, allocate, random_allocations
from repro.alloc.analysis import (
    calibration,
    predicted_gain,
    seed_stability,
    spearman,
    transfer_fidelity,
)
from repro.alloc.budget import default_levels, num_high_layers
from repro.alloc.fidelity import coverage_fidelity, format_fidelity
from repro.alloc.pretrained_accounting import account_pretrained
from repro.alloc.profile import LayerProfile
from repro.alloc.transfer import transfer_profile
from repro.arguments import flat
from repro.files import read_json, write_json_atomic
from repro.models.config import GPTConfig
from repro.runs.build import VERBOSE_ENV, quiet_lightning
from repro.runs.model_config import load_model_config, write_model_config
from repro.stop import interrupted_line

from .command_arguments import build_parser
from .profile_command import levels_of, print_profile, profile_command, runs_dir_of

COMMANDS = ("profile", "allocate", "transfer", "account", "analyze")


def main(argv: list[str]) -> int:
    args = flat(build_parser().parse_args(argv), "command", "profile_kind")
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"
    quiet_lightning()  # one progress line per run instead of Lightning's banners
    try:
        handler = {
            "profile": profile_command,
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
        print(interrupted_line(args.command, runs_dir_of(args) if trains else Path(".")), file=sys.stderr)
        return 130
    return 0


# ---------------------------------------------------------------------------------------------- handlers
def _allocate(args) -> None:
    config = load_model_config(args.config)
    shape = config.attention_shape()
    levels = levels_of(args, shape)
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
    print_profile(transferred)
    if "fidelity" in transferred.meta:
        f = transferred.meta["fidelity"]
        print(
            f"fidelity vs {args.direct}: Spearman {f['spearman']:.3f}, top-{f['top_k']} Jaccard {f['jaccard']:.3f}"
        )


def _account(args) -> None:
    config = load_model_config(args.config) if args.config else None
    if args.pretrained or (config is not None and config.is_pretrained):
        _account_pretrained(args, config)
        return
    shape = config.shape_config()
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
    _print_accounts(rows)
    if args.out:
        write_json_atomic(args.out, {"config": str(args.config), "rows": rows})


def _account_pretrained(args, config) -> None:
    """A pretrained or converted model's costs (from its folder), or each allocation's coverage of a
    pretrained fixed-width model (``--allocation``: its rotated dims per layer)."""
    location = args.pretrained or config.pretrained
    context = args.context or (
        config.block_size if config is not None and "block_size" in config.data else None
    )
    rows = []
    if args.allocation:
        shape = config.attention_shape() if config is not None else None
        if shape is None:
            raise ValueError("--allocation: give --config (the pretrained model's repro fit YAML)")
        for a in read_json(args.allocation, "allocation file").get("allocations", []):
            fractions = [w / shape.head_dim for w in a["widths"]]
            rows.append(
                {
                    "method": a["method"],
                    "draw": a.get("record", {}).get("draw"),
                    **account_pretrained(location, context, args.bytes_per_elem, fractions),
                }
            )
    else:
        rows = [{"method": "model", **account_pretrained(location, context, args.bytes_per_elem)}]
    _print_accounts(rows)
    if args.out:
        write_json_atomic(args.out, {"pretrained": str(location), "rows": rows})


def _print_accounts(rows: list[dict[str, Any]]) -> None:
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


def _analyze(args) -> None:
    out: dict[str, Any] = {}
    benefit = LayerProfile.load(args.benefit) if args.benefit else None
    if benefit is not None and len(benefit.per_seed) > 1:
        out["stability"] = seed_stability(benefit.per_seed)
    if args.phase_off:
        phase_off = LayerProfile.load(args.phase_off)
        if benefit is None:
            raise ValueError("--phase_off needs --benefit to compare with")
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
            "nothing to analyze: give --benefit (with 2+ seeds), --phase_off, --transferred or --calibration"
        )
    write_json_atomic(args.out, out)
    print(json.dumps(out, indent=2))


def _shape_of(profile):
    return GPTConfig(**{"vocab_size": 1, **profile.model})
