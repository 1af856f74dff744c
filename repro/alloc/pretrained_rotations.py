"""Named per-layer rotations of a pretrained model, evaluated zero-shot or after a short fine-tune
of each: the one evaluator behind the real-model RoPE tests (whole-layer NoPE, the coverage-benefit
profile, budgeted coverage allocations).

A rotation is ``{layer: fraction}``: layer ``l`` keeps its rotary phase on only that fraction of its
rotary pairs (its highest frequencies, p-RoPE order, or the order of a pair-ranking file: see
``HFCausalLM.set_rotary``); a layer it does not name keeps all of them; ``{}`` is the model as
trained. Losses are per chunk (one evaluation batch: the unit of every interval), so rows can be
compared paired over the same chunks.

Fine-tuned, every rotation is trained ``steps`` steps from the pretrained weights with its rotation
in place (``model.rotary``: the same forward as the zero-shot test, now trained through), on the same
batches (same seeds), through the run engine (resumable: finished runs are reused), then evaluated
with its rotation as trained. Over several seeds a chunk's loss is its mean over the seeds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from repro.runs import Progress, RunSpec, train_all

from .pretrained_profile import chunk_losses, pretrained_model_and_data, token_mean

Rotation = dict[int, float]
Chunks = list[tuple[float, int]]  # (mean loss, tokens) per chunk


def rotation_list(rotation: Rotation, n_layer: int) -> list[float]:
    """The per-layer list ``model.rotary`` takes (1.0 where the rotation names no fraction)."""
    return [float(rotation.get(i, 1.0)) for i in range(n_layer)]


def zero_shot_losses(
    model, batches: list, rotations: dict[str, Rotation], order: str | None = None, progress=None
) -> dict[str, Chunks]:
    """Each rotation's per-chunk losses on ``batches`` (the model is left as trained)."""
    out: dict[str, Chunks] = {}
    model.eval()
    for i, (name, rotation) in enumerate(rotations.items()):
        model.set_rotary(rotation or None, order)
        out[name] = chunk_losses(model, batches)
        model.set_rotary(None)
        if progress is not None:
            progress(i + 1, len(rotations))
    return out


@dataclass(frozen=True)
class Finetune:
    """How each rotation is fine-tuned: ``steps`` steps per seed of ``seeds`` on ``config`` (a
    ``repro fit`` YAML naming the same ``model.pretrained``; its data are the training text), with
    ``overrides`` of that config (learning rate, batch size); runs and checkpoints under ``folder``,
    validated every ``eval_every`` steps (the loss against fine-tuning steps)."""

    config: str | os.PathLike
    steps: int
    folder: str | os.PathLike
    seeds: tuple[int, ...] = (0,)
    overrides: dict[str, Any] | None = None
    eval_every: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps <= 0:
            raise ValueError(f"--finetune_steps={self.steps!r}: a positive number of steps")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ValueError(f"--seeds {list(self.seeds)}: give one or more distinct seeds")
        every = self.eval_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every <= 0):
            raise ValueError(f"--finetune_eval_every={every!r}: a positive number of steps")

    def record(self) -> dict[str, Any]:
        """What a result says of its fine-tunes."""
        return {
            "config": str(self.config),
            "steps": self.steps,
            "seeds": list(self.seeds),
            "overrides": dict(self.overrides or {}),
            "runs_dir": str(self.folder),
        }


def finetune_overrides(steps: int, lr: float | None, batch_size: int | None) -> dict[str, Any]:
    """The overrides of a fine-tune's config the commands set: warm-up over an eighth of the steps,
    and the learning rate and batch size when given."""
    overrides: dict[str, Any] = {"model.optim.warmup_steps": max(1, steps // 8)}
    if lr is not None:
        overrides["model.optim.lr"] = lr
    if batch_size is not None:
        overrides["data.batch_size"] = batch_size
    return overrides


def run_slug(name: str) -> str:
    return name.replace(" ", "-").replace("#", "").replace("/", "-")


def finetune_specs(
    finetune: Finetune, rotations: dict[str, Rotation], n_layer: int, order: str | None = None
) -> dict[tuple[str, int], RunSpec]:
    """The run of every (rotation name, seed): what ``finetuned_losses`` trains and ``--plan`` counts."""

    def spec(name: str, rotation: Rotation, seed: int) -> RunSpec:
        overrides = dict(finetune.overrides or {})
        if rotation:
            overrides["model.rotary"] = rotation_list(rotation, n_layer)
            if order is not None:
                overrides["model.rotary_order"] = str(order)
        every = finetune.eval_every or finetune.steps
        return RunSpec.make(
            f"{run_slug(name)}-s{seed}", finetune.folder, finetune.config, seed, finetune.steps,
            every if finetune.steps % every == 0 else finetune.steps, overrides,
            save_checkpoint=True, label=f"{name}, seed {seed}", weights_only=True,
        )  # fmt: skip

    return {(name, s): spec(name, r, s) for name, r in rotations.items() for s in finetune.seeds}


def finetuned_losses(
    eval_config: str | os.PathLike,
    finetune: Finetune,
    rotations: dict[str, Rotation],
    n_layer: int,
    split: str = "test",
    order: str | None = None,
    cache_dir: str | None = None,
    quiet: bool = False,
    label: str = "fine-tune",
) -> tuple[dict[str, Chunks], dict[str, list[list[float]]]]:
    """Every rotation fine-tuned (per seed), then its per-chunk losses on ``split`` of
    ``eval_config`` with its rotation as trained (mean over seeds), and its validation curve per seed
    ([step, loss] pairs, on the fine-tune config's validation text)."""
    specs = finetune_specs(finetune, rotations, n_layer, order)
    progress = Progress(label, len(specs), finetune.steps * len(specs), 1, quiet)
    results = train_all(list(specs.values()), "cpu", 1, cache_dir, progress)
    losses: dict[str, Chunks] = {}
    curves: dict[str, list[list[float]]] = {}
    for name, rotation in rotations.items():
        per_seed = []
        for seed in finetune.seeds:
            result = results[specs[(name, seed)].key]
            model, datamodule = pretrained_model_and_data(eval_config, cache_dir, result.checkpoint)
            model.set_rotary(rotation or None, order)
            model.eval()
            loader = datamodule.test_dataloader() if split == "test" else datamodule.val_dataloader()
            per_seed.append(chunk_losses(model, list(loader)))
            curves.setdefault(name, []).append([[int(s), float(v)] for s, v in result.val_curve])
        losses[name] = [
            (sum(c[i][0] for c in per_seed) / len(per_seed), per_seed[0][i][1])
            for i in range(len(per_seed[0]))
        ]
        progress.note(f"{name}: {split} loss {token_mean(losses[name]):.4f} after {finetune.steps} steps")
    return losses, curves
