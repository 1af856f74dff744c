"""``repro export --ckpt CKPT --out DIR`` (and/or ``--gguf FILE``): a checkpoint of a pretrained
model's fine-tuning (one process or a pipeline: both hold the full model) back as a Hugging Face
folder that ``from_pretrained`` and any evaluation tool read (config, sharded safetensors, every
tokenizer file of the source), and as a GGUF file that llama.cpp and Ollama run (a Llama-family
model: ``--gguf_type f32|f16|q8_0``; ``repro.models.gguf_export``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

from repro.models.gguf_export import TYPES

from .checkpoints import pretrained_weights


def export_checkpoint(ckpt: str | Path, out: str | Path, pretrained: str | None = None) -> Path:
    from repro.models.hf_causal_lm import HFCausalLM

    hp, state = pretrained_weights(ckpt, mmap=False)
    source = pretrained or hp["pretrained"]
    model = HFCausalLM(source, hp.get("attention", "sdpa"), hp.get("tie_embeddings", "auto"))
    return model.save_pretrained(out, state)


def export(
    ckpt: str,
    out: str | None = None,
    gguf: str | None = None,
    gguf_type: Literal[TYPES] = "f32",
    gguf_pre: str | None = None,
    pretrained: str | None = None,
) -> None:
    """A fine-tune's checkpoint written as a Hugging Face folder (``--out``), a GGUF file (``--gguf``), or both.

    Args:
        ckpt: a checkpoint of repro fit on a model.pretrained config
        out: the Hugging Face folder to write
        gguf: also (or only) the GGUF file to write (a Llama-family model)
        gguf_type: the GGUF's matrices: f32, f16 or q8_0
        gguf_pre: llama.cpp's name of the tokenizer's pre-tokenizer (default: the source GGUF's, or gpt-2 for
            GPT-2's own)
        pretrained: the model folder it started from (default: recorded)
    """
    if out is None and gguf is None:
        raise ValueError("give --out DIR, --gguf FILE, or both")
    if gguf is not None:
        from repro.models.gguf_export import check_exportable, origin_gguf, write_gguf
        from repro.models.hf_folder import model_folder, read_config

        hp, _ = pretrained_weights(ckpt)
        source = model_folder(pretrained or hp["pretrained"])
        check_exportable(read_config(source), gguf_type)  # before the work
    with tempfile.TemporaryDirectory(prefix="repro-export-") as scratch:
        folder = export_checkpoint(ckpt, out or Path(scratch) / "hf", pretrained)
        if out is not None:
            print(f"wrote {folder} (from_pretrained reads it)")
        if gguf is not None:
            written = write_gguf(folder, gguf, gguf_type, gguf_pre, origin_gguf(source))
            print(f"wrote {written} ({gguf_type}; llama.cpp runs it, repro gguf reads it back)")
