"""``repro allocate|transfer|account|analyze``: the RoPE allocation pipeline from the command line.

Every command reads and writes JSON/YAML files; outputs are written atomically. Each is a typed
function (its parameters are its options, ``repro.arguments.call``); ``repro profile``'s
subcommands are in ``profile_subcommands.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

from repro.alloc import analysis  # analysis.calibration: the name "calibration" is an option here
from repro.alloc.accounting import account_model
from repro.alloc.allocation import METHODS, random_allocations
from repro.alloc.allocation import allocate as allocation_of
from repro.alloc.analysis import predicted_gain, seed_stability, spearman, transfer_fidelity
from repro.alloc.budget import default_levels, levels_for, num_high_layers
from repro.alloc.fidelity import coverage_fidelity, format_fidelity
from repro.alloc.pretrained_accounting import account_pretrained
from repro.alloc.profile import LayerProfile
from repro.alloc.transfer import transfer_profile
from repro.arguments import NonNegativeInt, PositiveInt
from repro.files import read_json, write_json_atomic
from repro.models.config import GPTConfig
from repro.runs.model_config import load_model_config, write_model_config

from .profile_command import print_profile


# ---------------------------------------------------------------------------------------------- handlers
def allocate(
    config: Path,
    out: Path,
    method: tuple[str, ...] = ("all",),
    benefit: Path | None = None,
    transferred: Path | None = None,
    phase_off: Path | None = None,
    draws: NonNegativeInt = 3,
    seed: NonNegativeInt = 0,
    write_configs: Path | None = None,
    high: float | None = None,
    low: float | None = None,
    budget: float | None = None,
) -> None:
    """High/low RoPE coverage per layer under a fixed budget, by one or more methods.

    Budget-matched: profiled, transferred, uniform, first-k, last-k, spaced-k, random-k, inverse,
    phase-off-k. Reference points: all-high, all-low, nope.

    Args:
        config: the repro fit YAML of the model to allocate
        out: output JSON with every allocation
        method: methods, or 'all' (those whose inputs are given)
        benefit: coverage-benefit profile JSON (profiled, inverse)
        transferred: transferred profile JSON (transferred)
        phase_off: phase-off profile JSON (phase-off-k)
        draws: random-k: number of seeded draws R
        seed: random-k: seed of the first draw (draw r uses seed + r)
        write_configs: also write one repro fit YAML per allocation into this folder (train with repro fit
            --config)
        high: high level: coverage in [0,1] (MHA) or rotary width d_R (MLA) (default of PROTOCOL.md §R2: MHA
            1.0, MLA d_nope)
        low: low level, same unit as --high (default: MHA 0.25, MLA d_nope/4)
        budget: budget B: mean coverage (MHA) or mean rotary width (MLA) (default: MHA 0.5, MLA d_nope/2)
    """
    model_config = load_model_config(config)
    shape = model_config.attention_shape()
    levels = levels_for(shape, high, low, budget)
    benefit = LayerProfile.load(benefit) if benefit else None
    transferred = LayerProfile.load(transferred) if transferred else None
    phase_off = LayerProfile.load(phase_off) if phase_off else None
    methods = list(method)
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
    for name in methods:
        if name == "random-k":
            allocations.extend(random_allocations(shape, levels, draws, seed))
        else:
            allocations.append(
                allocation_of(
                    name, shape, levels, benefit=benefit, phase_off=phase_off, transferred=transferred
                )
            )
    records = [a.to_dict() for a in allocations]
    write_json_atomic(
        out,
        {
            "config": str(config),
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
    if write_configs:
        for a in allocations:
            name = a.method + (f"-r{a.record['draw']}" if "draw" in a.record else "")
            stem = Path(config).stem
            doc = model_config.with_widths(a.widths, logger_name=f"{stem}-{name}")
            write_model_config(
                doc,
                write_configs / f"{stem}-{name}.yaml",
                header=f"{stem} with the '{name}' allocation (repro allocate; {a.config_field} rewritten)",
            )
        print(f"wrote {len(allocations)} configs to {write_configs}/")


def transfer(
    profile: Path,
    out: Path,
    config: Path | None = None,
    target_layers: PositiveInt | None = None,
    method: Literal["linear", "nearest"] = "linear",
    direct: Path | None = None,
) -> None:
    """A profile mapped to a model of another depth by normalized depth.

    Layer j of an L-layer model sits at u=j/(L-1); the target profile is the source profile
    interpolated at the target's depths.

    Args:
        profile: source profile JSON (measured on the smaller model)
        out: output transferred profile JSON
        config: the target model's repro fit YAML (or --target_layers)
        target_layers: number of layers of the target model (or --config)
        method: interpolation
        direct: a profile measured directly on the target: report transfer fidelity against it
    """
    if (config is None) == (target_layers is None):
        raise ValueError("give the target as --config or as --target_layers (one of them)")
    source = LayerProfile.load(profile)
    target_model = None
    if config:
        shape = load_model_config(config).shape_config()
        n_target, target_model = shape.n_layer, shape.to_dict()
    else:
        n_target = target_layers
    transferred = transfer_profile(source, n_target, method, target_model, source_path=str(profile))
    if direct:
        measured = LayerProfile.load(direct)
        k = num_high_layers(n_target, default_levels(shape)) if config else max(1, n_target // 3)
        transferred.meta["fidelity"] = transfer_fidelity(transferred.values, measured.values, k)
    transferred.save(out)
    print_profile(transferred)
    if "fidelity" in transferred.meta:
        f = transferred.meta["fidelity"]
        print(
            f"fidelity vs {direct}: Spearman {f['spearman']:.3f}, top-{f['top_k']} Jaccard {f['jaccard']:.3f}"
        )


def account(
    config: Path | None = None,
    pretrained: str | None = None,
    allocation: Path | None = None,
    context: PositiveInt | None = None,
    bytes_per_elem: PositiveInt = 2,
    out: Path | None = None,
) -> None:
    """KV cache, RoPE and attention cost per token and per layer (PROTOCOL.md §R6).

    Of a model config (its own widths, or each allocation of a repro allocate file) or of a pretrained
    or converted model.

    Args:
        config: the repro fit YAML of the model (a GPT or model.pretrained); or --pretrained
        pretrained: a pretrained or converted model (a folder, .gguf, package or hub id): what a token caches
        allocation: allocation JSON from repro allocate: account each allocation (default: the config's own
            widths)
        context: context length T for attention FLOPs (default: the config's block size; --pretrained alone:
            the model's max_position_embeddings)
        bytes_per_elem: bytes per cached element (2: bf16)
        out: output JSON (default: print only)
    """
    if (config is None) == (pretrained is None):
        raise ValueError("give the model as --config or as --pretrained (one of them)")
    model_config = load_model_config(config) if config else None
    if pretrained or model_config.is_pretrained:
        _account_pretrained(model_config, pretrained, allocation, context, bytes_per_elem, out)
        return
    shape = model_config.shape_config()
    if allocation:
        data = read_json(allocation, "allocation file")
        if "allocations" not in data:
            raise ValueError(
                f"--allocation {str(allocation)!r} has no 'allocations'; is it from repro allocate?"
            )
        rows = []
        for a in data["allocations"]:
            if a.get("attention") != shape.attention:
                raise ValueError(
                    f"allocation '{a['method']}' was made for attention={a.get('attention')!r} but "
                    f"{str(config)!r} has attention={shape.attention!r}"
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
                    **account_model(cfg, context, bytes_per_elem),
                }
            )
    else:
        rows = [{"method": "config", **account_model(shape, context, bytes_per_elem)}]
    _print_accounts(rows)
    if out:
        write_json_atomic(out, {"config": str(config), "rows": rows})


def _account_pretrained(config, pretrained, allocation, context, bytes_per_elem, out) -> None:
    """A pretrained or converted model's costs (from its folder), or each allocation's coverage of a
    pretrained fixed-width model (``--allocation``: its rotated dims per layer)."""
    location = pretrained or config.pretrained
    context = context or (config.block_size if config is not None and "block_size" in config.data else None)
    rows = []
    if allocation:
        shape = config.attention_shape() if config is not None else None
        if shape is None:
            raise ValueError("--allocation: give --config (the pretrained model's repro fit YAML)")
        for a in read_json(allocation, "allocation file").get("allocations", []):
            fractions = [w / shape.head_dim for w in a["widths"]]
            rows.append(
                {
                    "method": a["method"],
                    "draw": a.get("record", {}).get("draw"),
                    **account_pretrained(location, context, bytes_per_elem, fractions),
                }
            )
    else:
        rows = [{"method": "model", **account_pretrained(location, context, bytes_per_elem)}]
    _print_accounts(rows)
    if out:
        write_json_atomic(out, {"pretrained": str(location), "rows": rows})


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


def analyze(
    out: Path,
    benefit: Path | None = None,
    phase_off: Path | None = None,
    transferred: Path | None = None,
    top_k: PositiveInt | None = None,
    calibration: Path | None = None,
    fidelity: bool = False,
) -> None:
    """Stability, calibration and transfer fidelity of saved profiles (PROTOCOL.md §R5).

    What is given is analyzed: the profile's seed stability, its Spearman against a phase-off profile,
    the fidelity of a transferred profile, the calibration of realized gains.

    Args:
        out: output JSON
        benefit: coverage-benefit profile JSON (stability across seeds)
        phase_off: phase-off profile JSON (Spearman against --benefit)
        transferred: transferred profile JSON (fidelity against --benefit)
        top_k: k for the top-k Jaccard of transfer fidelity
        calibration: JSON list of {high_layers, realized_gain}: realized loss change of trained allocations
        fidelity: with --benefit: the profile read at every evaluation of its runs against its final value
    """
    result: dict[str, Any] = {}
    benefit = LayerProfile.load(benefit) if benefit else None
    if benefit is not None and len(benefit.per_seed) > 1:
        result["stability"] = seed_stability(benefit.per_seed)
    if phase_off:
        phase = LayerProfile.load(phase_off)
        if benefit is None:
            raise ValueError("--phase_off needs --benefit to compare with")
        phase.check_matches(benefit.n_layer, "the coverage-benefit profile")
        result["phase_off_vs_benefit_spearman"] = spearman(phase.values, benefit.values)
    if transferred:
        if benefit is None:
            raise ValueError("--transferred needs --benefit (the profile measured directly on the target)")
        moved = LayerProfile.load(transferred)
        moved.check_matches(benefit.n_layer, "the coverage-benefit profile")
        k = top_k or num_high_layers(benefit.n_layer, default_levels(_shape_of(benefit)))
        result["transfer_fidelity"] = transfer_fidelity(moved.values, benefit.values, k)
    if fidelity:
        if benefit is None:
            raise ValueError(
                "--fidelity needs --benefit (a coverage profile whose runs recorded their curves)"
            )
        k = top_k or num_high_layers(benefit.n_layer, default_levels(_shape_of(benefit)))
        result["fidelity"] = coverage_fidelity(benefit, k)
        print(format_fidelity(result["fidelity"]), file=sys.stderr)
    if calibration:
        if benefit is None:
            raise ValueError("--calibration needs --benefit (the profile whose sums predict the gains)")
        records = read_json(calibration, "calibration file")
        predicted = [predicted_gain(benefit.values, r["high_layers"]) for r in records]
        result["calibration"] = analysis.calibration(predicted, [float(r["realized_gain"]) for r in records])
    if not result:
        raise ValueError(
            "nothing to analyze: give --benefit (with 2+ seeds), --phase_off, --transferred or --calibration"
        )
    write_json_atomic(out, result)
    print(json.dumps(result, indent=2))


def _shape_of(profile):
    return GPTConfig(**{"vocab_size": 1, **profile.model})
