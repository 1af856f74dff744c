"""``repro export --ckpt CKPT --out DIR`` (and/or ``--gguf FILE``): a checkpoint of a pretrained
model's fine-tuning (one process or a pipeline: both hold the full model) back as a Hugging Face
folder that ``from_pretrained`` and any evaluation tool read (config, sharded safetensors, every
tokenizer file of the source), and as a GGUF file that llama.cpp and Ollama run (a Llama-family
model: ``--gguf_type f32|f16|q8_0``; ``repro.models.gguf_export``)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from repro.arguments import Parser
from repro.models.gguf_export import TYPES
from repro.models.hf_folder import HFModelError

from .checkpoints import pretrained_weights


def export_checkpoint(ckpt: str | Path, out: str | Path, pretrained: str | None = None) -> Path:
    from repro.models.hf_causal_lm import HFCausalLM

    hp, state = pretrained_weights(ckpt, mmap=False)
    source = pretrained or hp["pretrained"]
    model = HFCausalLM(source, hp.get("attention", "sdpa"), hp.get("tie_embeddings", "auto"))
    return model.save_pretrained(out, state)


def main(argv: list[str]) -> int:
    parser = Parser(prog="repro export", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ckpt", required=True, help="a checkpoint of repro fit on a model.pretrained config"
    )
    parser.add_argument("--out", default=None, help="the Hugging Face folder to write")
    parser.add_argument(
        "--gguf", default=None, help="also (or only) the GGUF file to write (a Llama-family model)"
    )
    parser.add_argument(
        "--gguf_type", choices=TYPES, default="f32", help="the GGUF's matrices: f32, f16 or q8_0"
    )
    parser.add_argument(
        "--gguf_pre",
        default=None,
        help="llama.cpp's name of the tokenizer's pre-tokenizer (default: the source GGUF's, or gpt-2 for GPT-2's own)",
    )
    parser.add_argument(
        "--pretrained", default=None, help="the model folder it started from (default: recorded)"
    )
    args = parser.parse_args(argv)
    if args.out is None and args.gguf is None:
        parser.error("give --out DIR, --gguf FILE, or both")
    try:
        if args.gguf is not None:
            from repro.models.gguf_export import check_exportable, origin_gguf, write_gguf
            from repro.models.hf_folder import model_folder, read_config

            hp, _ = pretrained_weights(args.ckpt)
            source = model_folder(args.pretrained or hp["pretrained"])
            check_exportable(read_config(source), args.gguf_type)  # before the work
        with tempfile.TemporaryDirectory(prefix="repro-export-") as scratch:
            out = export_checkpoint(args.ckpt, args.out or Path(scratch) / "hf", args.pretrained)
            if args.out is not None:
                print(f"wrote {out} (from_pretrained reads it)")
            if args.gguf is not None:
                written = write_gguf(out, args.gguf, args.gguf_type, args.gguf_pre, origin_gguf(source))
                print(f"wrote {written} ({args.gguf_type}; llama.cpp runs it, repro gguf reads it back)")
    except (ValueError, FileNotFoundError, HFModelError) as exc:
        print(f"repro export: error: {exc}", file=sys.stderr)
        return 2
    return 0
