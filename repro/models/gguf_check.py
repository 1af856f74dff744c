"""llama.cpp's logits of a GGUF file against transformers' of the Hugging Face folder it was written
from (``repro gguf FILE --compare DIR``): the check that a file ``repro export --gguf`` wrote runs in
llama.cpp itself as the model it came from. Needs ``llama-cpp-python`` (not a dependency of the
suite: it builds llama.cpp from source, about 13 minutes on 2 cores)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from .hf_folder import HFModelError

KV_TYPES = {"f32": 0, "f16": 1}  # ggml's type ids of the KV cache


def compare_with_llama_cpp(
    gguf: str | os.PathLike, folder: str | os.PathLike, text: str, kv_cache: str = "f32", threads: int = 2
) -> dict[str, Any]:
    """Both models' logits on ``text`` (tokenized by the folder's tokenizer, no special tokens): the
    largest absolute difference, the largest logit, and how often their top tokens agree."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise HFModelError(
            "--compare runs llama.cpp: pip install llama-cpp-python (it builds llama.cpp, ~13 min on 2 cores)"
        )
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(folder)).encode(text, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].double()
    del model
    llm = Llama(
        model_path=str(Path(gguf)), logits_all=True, n_ctx=len(ids) + 8, n_threads=threads, verbose=False,
        type_k=KV_TYPES[kv_cache], type_v=KV_TYPES[kv_cache],
    )  # fmt: skip
    llm.eval(ids)
    got = torch.tensor(llm.scores[: len(ids)], dtype=torch.float64)
    return {
        "tokens": len(ids),
        "kv_cache": kv_cache,
        "max_abs_diff": float((got - want).abs().max()),
        "max_abs_logit": float(want.abs().max()),
        "top1_agreement": float((got.argmax(-1) == want.argmax(-1)).double().mean()),
    }
