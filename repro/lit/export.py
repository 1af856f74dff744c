"""``repro export --ckpt CKPT --out DIR``: a checkpoint of a pretrained model's fine-tuning (one
process or a pipeline: both hold the full model) back as a Hugging Face folder that
``from_pretrained`` and any evaluation tool read: config, sharded safetensors, tokenizer files."""

from __future__ import annotations

import sys
from pathlib import Path

from repro.arguments import Parser
from repro.models.hf_causal_lm import HFCausalLM, HFModelError

from .checkpoints import pretrained_weights


def export_checkpoint(ckpt: str | Path, out: str | Path, pretrained: str | None = None) -> Path:
    hp, state = pretrained_weights(ckpt, mmap=False)
    source = pretrained or hp["pretrained"]
    model = HFCausalLM(source, hp.get("attention", "sdpa"), hp.get("tie_embeddings", "auto"))
    return model.save_pretrained(out, state)


def main(argv: list[str]) -> int:
    parser = Parser(prog="repro export", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ckpt", required=True, help="a checkpoint of repro fit on a model.pretrained config"
    )
    parser.add_argument("--out", required=True, help="the Hugging Face folder to write")
    parser.add_argument(
        "--pretrained", default=None, help="the model folder it started from (default: recorded)"
    )
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(args.ckpt, args.out, args.pretrained)
    except (ValueError, FileNotFoundError, HFModelError) as exc:
        print(f"repro export: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} (from_pretrained reads it)")
    return 0
