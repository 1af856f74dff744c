"""What a pretrained model's phase-off profile predicts, tested zero-shot: with a budget of ``k``
layers left without rotation (NoPE), the layers the profile marks least dependent against the other
ways of spending the same budget, by the loss on text the profile was not measured on (the test
split; the validation split when the config has none, said so in the result).

Allocations of the budget (each removes the rotary phase of ``k`` layers' worth of rotary pairs):
  - ``profile``: the k layers with the smallest phase-off increase lose their rotation;
  - ``inverse``: the k with the largest (the profile's worst choice);
  - ``first-k``, ``last-k``, ``spaced-k``: by depth alone;
  - ``random-k``: ``draws`` seeded draws;
  - ``uniform``: every layer keeps the highest ``1 - k/L`` of its rotary pairs (the same number of
    pairs without phase, spread over all layers; rounded to whole pairs per layer).
Each row's loss is compared with ``profile``'s on the same chunks (paired): the mean difference and
its 95% CI over the chunks.

``finetuned_nope`` asks the same after a short fine-tune: every allocation (and full RoPE) is
fine-tuned from the pretrained weights with its layers' rotation as allocated (``model.rotary``), on
the same batches (same seeds), through the run engine (resumable), and then evaluated as above
(``pretrained_rotations``, the evaluator of every real-model RoPE test). Over several seeds, a
chunk's loss is its mean over the seeds; the CI is still over the chunks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from repro.runs import RunSpec
from repro.runs.provenance import provenance_header
from repro.stats import mean_interval

from .allocation import bottom_k_layers, random_layers, spaced_layers, top_k_layers
from .pretrained_profile import pretrained_model_and_data, token_mean
from .pretrained_rotations import Finetune, finetuned_losses, zero_shot_losses
from .pretrained_rotations import finetune_specs as rotation_specs
from .profile import LayerProfile

METHODS = ("profile", "inverse", "first-k", "last-k", "spaced-k", "random-k", "uniform")


def nope_allocations(
    profile: LayerProfile, k: int, draws: int = 3, seed: int = 0
) -> dict[str, dict[int, float]]:
    """Each method's per-layer rotary fraction (layers not named keep all their pairs)."""
    n = profile.n_layer
    if not 0 < k < n:
        raise ValueError(
            f"--layers={k}: the NoPE budget must be between 1 and {n - 1} (the model's layers - 1)"
        )
    off = lambda layers: dict.fromkeys(layers, 0.0)
    out = {
        "profile": off(bottom_k_layers(profile.values, k)),
        "inverse": off(top_k_layers(profile.values, k)),
        "first-k": off(range(k)),
        "last-k": off(range(n - k, n)),
        "spaced-k": off(spaced_layers(n, k)),
    }
    for r in range(draws):
        out[f"random-k #{r + 1}"] = off(random_layers(n, k, seed + r))
    out["uniform"] = dict.fromkeys(range(n), 1.0 - k / n)
    return out


def zero_shot_nope(
    config_path: str | os.PathLike,
    profile: LayerProfile,
    budgets: list[int],
    draws: int = 3,
    seed: int = 0,
    cache_dir: str | None = None,
    progress=None,
) -> dict[str, Any]:
    """Every allocation's loss at each budget, paired against ``profile``'s over the chunks."""
    plans = {k: nope_allocations(profile, k, draws, seed) for k in budgets}  # bad budgets before any loading
    model, datamodule = pretrained_model_and_data(config_path, cache_dir)
    profile.check_matches(model.n_layer, f"model.pretrained of {config_path}")
    split = "test" if datamodule.test_set is not datamodule.val_set else "validation (no test split)"
    named = {"full RoPE": {}} | {f"k{k} {name}": f for k, plan in plans.items() for name, f in plan.items()}
    losses = zero_shot_losses(model, list(datamodule.test_dataloader()), named, progress=progress)
    measured = {k: {name: losses[f"k{k} {name}"] for name in plan} for k, plan in plans.items()}
    return _result(plans, measured, losses["full RoPE"], split, profile)


@dataclass(frozen=True)
class FinetuneGrid:
    """What the fine-tuned NoPE test trains: every budget's allocations (``draws`` random ones per
    budget, drawn from ``seed``), each fine-tuned ``steps`` steps per seed of ``seeds``, its runs
    under ``folder``, with ``overrides`` of the model config (learning rate, batch size)."""

    budgets: list[int]
    steps: int
    folder: str | os.PathLike
    seeds: tuple[int, ...] = (0,)
    draws: int = 3
    seed: int = 0
    overrides: dict[str, Any] | None = None


def _finetune(config_path, grid: FinetuneGrid) -> Finetune:
    return Finetune(str(config_path), grid.steps, grid.folder, tuple(grid.seeds), grid.overrides)


def finetune_specs(
    config_path: str | os.PathLike, profile: LayerProfile, grid: FinetuneGrid
) -> tuple[
    dict[int, dict[str, dict[int, float]]], dict[str, dict[int, float]], dict[tuple[str, int], RunSpec]
]:
    """The budgets' allocations, every fine-tune's rotation by name (full RoPE first), and its run per
    (name, seed) (what ``finetuned_nope`` trains and ``--plan`` counts)."""
    plans = {k: nope_allocations(profile, k, grid.draws, grid.seed) for k in grid.budgets}
    named = {"full RoPE": {}} | {f"k{k} {name}": f for k, plan in plans.items() for name, f in plan.items()}
    specs = rotation_specs(_finetune(config_path, grid), named, profile.n_layer)
    return plans, named, specs


def finetuned_nope(
    config_path: str | os.PathLike,
    profile: LayerProfile,
    grid: FinetuneGrid,
    cache_dir: str | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Every allocation fine-tuned ``steps`` steps (per seed, runs under ``folder``), then its loss on
    the test chunks with its rotation as trained, paired against ``profile``'s fine-tune."""
    plans, named, _ = finetune_specs(config_path, profile, grid)
    measured, _ = finetuned_losses(
        config_path, _finetune(config_path, grid), named, profile.n_layer, "test", None, cache_dir, quiet,
        "nope fine-tune",
    )  # fmt: skip
    _, datamodule = pretrained_model_and_data(config_path, cache_dir)
    split = "test" if datamodule.test_set is not datamodule.val_set else "validation (no test split)"
    by_budget = {k: {name: measured[f"k{k} {name}"] for name in plan} for k, plan in plans.items()}
    tuned = {"steps": grid.steps, "seeds": list(grid.seeds), "overrides": dict(grid.overrides or {})}
    return _result(plans, by_budget, measured["full RoPE"], split, profile, finetune=tuned)


def _result(
    plans: dict[int, dict[str, dict[int, float]]],
    measured: dict[int, dict[str, list[tuple[float, int]]]],
    reference: list[tuple[float, int]],
    split: str,
    profile: LayerProfile,
    **extra: Any,
) -> dict[str, Any]:
    """The rows of every budget: each allocation's test loss, paired against ``profile``'s."""
    rows = []
    for k, plan in plans.items():
        base = measured[k]["profile"]
        for name, fractions in plan.items():
            chunks = measured[k][name]
            mean, low, high = mean_interval([a - b for (a, _), (b, _) in zip(chunks, base)])
            rows.append(
                {
                    "budget": k,
                    "method": name,
                    "nope_layers": sorted(layer for layer, f in fractions.items() if f == 0.0),
                    "loss": token_mean(chunks),
                    "increase_over_full_rope": token_mean(chunks) - token_mean(reference),
                    "delta_vs_profile": None if name == "profile" else mean,
                    "ci95": None if name == "profile" else [low, high],
                    "verdict": None if name == "profile" else _verdict(low, high),
                }
            )
    return {
        **provenance_header(),  # commit, time, machine
        "split": split,
        "chunks": len(reference),
        "eval_tokens": sum(n for _, n in reference),
        "loss_full_rope": token_mean(reference),
        **extra,
        "profile_meta": {
            key: profile.meta.get(key) for key in ("source", "weights", "chunks", "weights_note")
        },
        "rows": rows,
    }


def _verdict(low: float, high: float) -> str:
    """Read against the profile's choice: a positive difference is a worse (higher) loss."""
    if low > 0:
        return "profile better"
    if high < 0:
        return "profile worse"
    return "unresolved"


def nope_markdown(result: dict[str, Any]) -> str:
    tuned = result.get("finetune")
    how = (
        f"After a {tuned['steps']}-step fine-tune of each allocation (seeds {tuned['seeds']}), NoPE budgets"
        if tuned
        else "Zero-shot NoPE budgets"
    )
    lines = [
        f"{how} on {result['chunks']} {result['split']} chunks ({result['eval_tokens']} tokens); "
        f"full-RoPE loss {result['loss_full_rope']:.4f}. Δ = loss − the profile's choice's, 95% CI over the chunks.",
        "",
        "| NoPE layers k | allocation | layers without rotation | loss | Δ vs profile | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        layers = "all (partial)" if r["method"] == "uniform" else ", ".join(map(str, r["nope_layers"]))
        delta = "" if r["delta_vs_profile"] is None else f"{r['delta_vs_profile']:+.4f}"
        ci = "" if r["ci95"] is None else f"{r['ci95'][0]:+.4f} .. {r['ci95'][1]:+.4f}"
        lines.append(
            f"| {r['budget']} | {r['method']} | {layers} | {r['loss']:.4f} | {delta} | {ci} | {r['verdict'] or ''} |"
        )
    return "\n".join(lines) + "\n"
