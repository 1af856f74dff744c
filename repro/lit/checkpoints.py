"""Checkpoints of the suite's models: read one (failing with the file's name on a missing, empty,
truncated or corrupt file), check that it holds the model a config describes (every differing
field named), and load its weights into a plain GPT; the Hugging Face weights of a pretrained
model's fine-tune (``pretrained_weights``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from repro.models import GPTConfig
from repro.models.config import ATTENTION_KINDS, width_field_of
from repro.models.gpt import GPT

HF_PREFIX = "model.hf."  # where HFCausalLMModule keeps the Hugging Face model's state-dict entries
WIDTH_FIELDS = tuple(width_field_of(kind) for kind in ATTENTION_KINDS)  # both kinds' per-layer RoPE lists


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint's dictionary (tensors memory-mapped with ``mmap``, not read)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r}: no such file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except Exception as exc:  # torch raises several types for a damaged file
        raise ValueError(
            f"checkpoint {str(path)!r}: not a readable checkpoint; the file is empty, truncated or "
            f"corrupt ({type(exc).__name__})"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"checkpoint {str(path)!r}: not a Lightning checkpoint (a {type(data).__name__})")
    return data


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
    """A plain GPT with the checkpoint's weights (checked against ``expected``), and its hyperparameters."""
    path = str(checkpoint)
    ckpt = read_checkpoint(path)
    hparams = ckpt.get("hyper_parameters", {})
    if "gpt" not in hparams or "state_dict" not in ckpt:
        raise ValueError(f"checkpoint {path!r} is not a repro GPT checkpoint (no 'gpt' hyperparameters)")
    if expected is not None:
        check_checkpoint_matches(hparams["gpt"], expected, path, ignore)
    model = GPT(GPTConfig(**hparams["gpt"]))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state)
    return model, hparams


def pretrained_weights(path: str | Path, mmap: bool = True) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A fine-tune of a pretrained model: its hyperparameters (``pretrained``, ``attention``,
    ``tie_embeddings``) and its Hugging Face state dict (names as ``from_pretrained`` has them)."""
    data = read_checkpoint(path, mmap=mmap)
    hp = dict(data.get("hyper_parameters") or {})
    if not hp.get("pretrained"):
        raise ValueError(
            f"checkpoint {str(path)!r}: not a fine-tuning of a pretrained model (no 'pretrained')"
        )
    state = {
        k.removeprefix(HF_PREFIX): v
        for k, v in (data.get("state_dict") or {}).items()
        if k.startswith(HF_PREFIX)
    }
    if not state:
        raise ValueError(f"checkpoint {str(path)!r}: holds no {HF_PREFIX}* weights")
    return hp, state
