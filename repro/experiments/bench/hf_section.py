"""Pretrained-model benchmark, on a random-initialised Llama of the bench's size saved locally:

- per-rank memory of a K-stage split: the parameter bytes each rank reads (only its own stage,
  through the meta device) against the whole model (goal: the largest rank at most 1/K + 10 %);
- the clapping strategy (method none) against ``torch.distributed.pipelining`` on the same model
  and the same stage cut, the two taking turns step by step, at every K of the bench (goal >= 1.0);
- the Lightning path (Trainer + ``HFCausalLMModule``) against a plain loop on the Hugging Face
  model's own forward, the two alternating step by step on the same batches (goal >= 0.97).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from repro.experiments.kit.step_time import PlainLoop, timed_fit

from .measure import row
from .settings import BenchSettings
from .single_process import _PairedPlainSteps, lightning_rows
from .versus_torch import paired_runs, versus_torch_rows
from .workload import OPTIM, loader


def tiny_llama(s: BenchSettings, folder: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.n_embd,
        intermediate_size=4 * s.n_embd,
        num_hidden_layers=s.n_layer,
        num_attention_heads=s.n_head,
        num_key_value_heads=s.n_head,
        max_position_embeddings=max(s.seq_lengths),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    return folder


def stage_bytes(folder: Path, stages: int) -> tuple[list[int], int]:
    """(parameter bytes each rank reads, bytes of the whole model), by materializing each stage's
    parts alone in a model built on the meta device."""
    from repro.lit.stages import HFStages
    from repro.models.hf_causal_lm import HFCausalLM
    from repro.pipeline.stage_parts import StageSplit, layers_per_stage

    per_rank = []
    for rank in range(stages):
        model = HFCausalLM(str(folder))
        parts = HFStages(model).parts()
        split = StageSplit(rank, stages, layers_per_stage(len(parts.layers), stages), parts)
        model.materialize(split.modules_of(rank))
        per_rank.append(sum(p.numel() * p.element_size() for p in model.hf.parameters() if not p.is_meta))
    whole = HFCausalLM(str(folder))
    total = sum(p.numel() * p.element_size() for p in whole.hf.parameters())
    return per_rank, total


def plain_hf_loop(folder: Path) -> PlainLoop:
    """The same fine-tuning as a plain loop on the Hugging Face model's own forward (cross-entropy
    of its logits)."""
    from repro.lit.hf_module import HFCausalLMModule

    module = HFCausalLMModule(str(folder), OPTIM)
    module.model.materialize()

    def loss(m, batch):
        logits = m.model.hf(batch["input_ids"]).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())

    return PlainLoop(module, loss)


def bench_hf(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    from repro.lit.hf_module import HFCausalLMModule

    rows = []
    with tempfile.TemporaryDirectory(prefix="repro-bench-hf-") as tmp:
        folder = tiny_llama(s, Path(tmp) / "llama")
        for k in s.stages:
            progress(f"hf: parameter bytes per rank of a {k}-stage split")
            per_rank, total = stage_bytes(folder, k)
            rows.append(
                row(
                    "hf",
                    f"largest rank of a K={k} split: parameters read",
                    "parameter memory",
                    "bytes",
                    [max(per_rank)],
                    reference="the whole model",
                    ratios=[max(per_rank) / total],
                    ratio_meaning="the largest rank's parameter bytes over the whole model's (each rank reads "
                    "only its stage; goal at most 1/K + 0.1)",
                    goal=1 / k + 0.1,
                    goal_kind="max",
                    extra={"stages": k, "per_rank_bytes": per_rank, "model_bytes": total},
                )
            )
        rows += hf_pipeline_rows(folder, s, progress)
        steps = s.warmup_steps + s.timed_steps
        tokens = s.batch_size * s.block_size
        ours, plain = [], []
        for r in range(s.repeats):
            progress(f"hf: Lightning against the plain Hugging Face loop, repeat {r + 1} of {s.repeats}")
            data = loader(s, steps)
            pairs = _PairedPlainSteps(plain_hf_loop(folder), list(data))
            module = HFCausalLMModule(str(folder), OPTIM)
            timed_fit(module, data, steps, pairs)
            ours.append(tokens * s.timed_steps / sum(pairs.lightning_s[s.warmup_steps :]))
            plain.append(tokens * s.timed_steps / sum(pairs.plain_s[s.warmup_steps :]))
        rows += lightning_rows(
            "hf", "plain loop on the Hugging Face model", "Lightning Trainer + HFCausalLMModule", ours, plain
        )
    return rows


def hf_pipeline_rows(folder: Path, s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """The clapping strategy (method none) against torch.distributed.pipelining on the same Hugging
    Face model, cut by the same stage adapter, each rank reading only its own stage; the two
    taking turns step by step (goal >= 1.0)."""
    tokens = s.batch_size * s.block_size
    rows = []
    for k in s.stages:
        ours, ref = [], []
        for r in range(s.pipe_repeats):
            progress(
                f"hf: repeat {r + 1} of {s.pipe_repeats}: K={k} clapping and torch.distributed.pipelining, taking turns"
            )
            mine, theirs = paired_runs(folder, s, k, seed=r)
            ours.append(mine)
            ref.append(theirs)
        rows += versus_torch_rows("hf", "HF Llama ", k, tokens, ours, ref, ", same HF model")
    return rows
