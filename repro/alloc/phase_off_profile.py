"""Phase-off profile (spec section 3): how much a trained model's loss depends on each layer's
rotary phase. For each layer l, the validation loss with the rotation angle forced to 0 in layer l
only (its rotary dims stay, with no phase); ``phase_off[l] = loss_off(l) - loss_ref``.
Optionally per query head.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from repro.models import GPT
from repro.models.config import GPTConfig
from repro.run_config import RunConfig

from .budget import level_to_width
from .profile import LayerProfile
from .training_runs import RunSpec, run_name, train_run


@torch.no_grad()
def mean_loss(model: GPT, batches: list[dict[str, torch.Tensor]]) -> tuple[float, int]:
    """Token-weighted mean next-token loss over the batches, and the number of tokens."""
    model.eval()
    total, tokens = 0.0, 0
    device = next(model.parameters()).device
    for batch in batches:
        _, loss = model(batch["input_ids"].to(device), batch["targets"].to(device))
        n = batch["targets"].numel()
        total += float(loss) * n
        tokens += n
    if tokens == 0:
        raise ValueError("no evaluation tokens: the validation loader is empty")
    return total / tokens, tokens


def phase_off_values(model: GPT, batches: list[dict[str, torch.Tensor]], per_head: bool = False) -> dict[str, Any]:
    """Loss increase per layer (and per head) with the rotation angle forced to 0 there."""
    ref, tokens = mean_loss(model, batches)
    values, heads = [], []
    for layer in range(model.config.n_layer):
        with model.phase_off([layer]):
            values.append(mean_loss(model, batches)[0] - ref)
        if per_head:
            row = []
            for head in range(model.config.n_head):
                with model.phase_off({layer: [head]}):
                    row.append(mean_loss(model, batches)[0] - ref)
            heads.append(row)
    return {"values": values, "per_head": heads if per_head else None, "loss_ref": ref, "tokens": tokens}


WIDTH_FIELDS = ("rope_dims", "qk_rope_head_dim")


def check_checkpoint_matches(
    saved: dict[str, Any], expected: GPTConfig, checkpoint: str, ignore: tuple[str, ...] = ()
) -> None:
    """A checkpoint must hold the model the config describes; list every field that differs."""
    want = expected.to_dict()
    have = GPTConfig(**saved).to_dict()
    diff = {k: (have.get(k), want[k]) for k in want if k not in ignore and have.get(k) != want[k]}
    if diff:
        lines = ", ".join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in diff.items())
        raise ValueError(f"checkpoint {checkpoint!r} does not match the config's model ({lines})")


def load_checked_model(
    checkpoint: str | Path, expected: GPTConfig | None, ignore: tuple[str, ...] = ()
) -> tuple[GPT, dict[str, Any]]:
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises several types for a damaged file
        raise ValueError(f"checkpoint {str(path)!r} cannot be read ({type(exc).__name__}: {exc})") from exc
    hparams = ckpt.get("hyper_parameters", {}) if isinstance(ckpt, dict) else {}
    if "gpt" not in hparams or "state_dict" not in ckpt:
        raise ValueError(f"checkpoint {str(path)!r} is not a repro GPT checkpoint (no 'gpt' hyperparameters)")
    if expected is not None:
        check_checkpoint_matches(hparams["gpt"], expected, str(path), ignore)
    model = GPT(GPTConfig(**hparams["gpt"]))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state)
    return model, hparams


def measure_phase_off_profile(
    run_config: RunConfig, checkpoint: str | Path, per_head: bool = False, datamodule=None, device: str = "cpu"
) -> LayerProfile:
    """Phase-off profile of a trained checkpoint on the config's validation data (evaluated on ``device``)."""
    datamodule = datamodule or run_config.datamodule()
    datamodule.setup("validate")
    # the reference keeps its own widths (all high by the spec); every other field must match the config
    model, _ = load_checked_model(checkpoint, run_config.gpt_config(datamodule.vocab_size), ignore=WIDTH_FIELDS)
    batches = [{k: v.to(device) for k, v in b.items()} for b in datamodule.val_dataloader()]  # moved once
    measured = phase_off_values(model.to(device), batches, per_head)
    return LayerProfile(
        kind="phase_off",
        values=measured["values"],
        per_head=measured["per_head"],
        model=model.config.to_dict(),
        meta={
            "source": run_config.path,
            "checkpoint": str(checkpoint),
            "loss_ref": measured["loss_ref"],
            "eval_tokens": measured["tokens"],
            "per_head": per_head,
        },
    )


def train_reference(
    run_config: RunConfig, steps: int, seed: int, eval_every: int, runs_dir: Path, levels, accelerator: str = "cpu",
    datamodule=None,
) -> dict[str, Any]:
    """Train (or reuse) the all-high reference model of the phase-off profile; returns the run record."""
    shape = run_config.shape_config()
    high_w = level_to_width(levels.high, shape, levels.unit)
    widths = tuple([high_w] * shape.n_layer)
    datamodule = datamodule or run_config.datamodule()
    datamodule.setup("fit")
    spec = RunSpec(run_name(list(range(shape.n_layer)), seed, prefix="reference"), widths, seed, steps, eval_every,
                   save_checkpoint=True)
    return train_run(run_config, spec, runs_dir, datamodule, accelerator)
