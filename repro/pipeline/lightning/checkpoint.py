"""Checkpoints of a pipeline run: the full model (every stage's part, gathered on rank 0, so a
single-process Trainer can load it), the optimizer state of every stage, and the pipeline's own
state (method buffers of every rank, the sampler's step, byte totals, options)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from repro import lightning_compat as compat


def gather_objects(obj: Any, world_size: int, is_global_zero: bool, group) -> list[Any] | None:
    """Python objects from every rank, on rank 0 (None elsewhere)."""
    out = [None] * world_size if is_global_zero else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out


def merge_stage_state_dicts(full_keys, parts: list[dict[str, Any]]) -> OrderedDict[str, Any]:
    """The full state dict from every stage's own entries, in the module's key order (a tied
    parameter held by several stages is taken from the lowest one)."""
    merged: OrderedDict[str, Any] = OrderedDict()
    for key in full_keys:
        for part in parts:
            if key in part:
                merged[key] = part[key]
                break
    return merged


TIED = "tied"  # the entry of a rank's codec states that holds its tied sums' error feedback


def pipeline_state(strategy, with_sample_rows: bool) -> dict[str, Any] | None:
    """The ``clapping`` entry of a checkpoint (a collective; rank 0 gets it, others None)."""
    rank_state = strategy.state.rank_codec_states(with_sample_rows)
    if strategy.tied is not None and strategy.tied.errors:  # the tied sums' error feedback
        rank_state[TIED] = strategy.tied.state_dict()
    gathered = gather_objects(rank_state, strategy.world_size, strategy.is_global_zero, strategy.object_group)
    if not strategy.is_global_zero:
        return None
    return {
        "num_stages": strategy.num_stages,
        "layers_per_stage": strategy.split.counts if strategy.split else None,
        "options": {**strategy.options.as_dict(), "placement": placement_of(strategy)},  # auto's choice
        **strategy.state.state_dict(),  # steps_done, sampler, totals
        "codecs": gathered,
    }


def placement_of(strategy) -> str:
    """The placement the run has (``auto`` resolved once the stages are split)."""
    return strategy.split.placement if strategy.split is not None else strategy.options.placement


def written_placement(path) -> str | None:
    """The placement a pipeline checkpoint was written with (``placement: auto`` resumes under it);
    None when ``path`` is no local file or holds no pipeline state."""
    if path is None or not Path(path).is_file():
        return None
    state = torch.load(path, map_location="cpu", mmap=True, weights_only=False).get("clapping")
    return placement_in(state) if state else None


def placement_in(state: dict[str, Any]) -> str:
    """The placement in a checkpoint's pipeline state (checkpoints before the option: linear)."""
    return state.get("options", {}).get("placement", "linear")


def check_same_pipeline(
    state: dict[str, Any], num_stages: int, counts: list[int] | None, path, placement: str = "linear"
) -> None:
    written = placement_in(state)
    if written != placement:  # each stage's optimizer state holds the parameters of its own parts
        raise ValueError(
            f"checkpoint {path}: written with strategy placement={written!r}; this run has placement="
            f"{placement!r}. Resume with the same placement, or load the full model with a single-process Trainer"
        )
    if state["num_stages"] != num_stages or (counts and state["layers_per_stage"] != counts):
        raise ValueError(
            f"checkpoint {path}: written by a {state['num_stages']}-stage pipeline with layers "
            f"{state['layers_per_stage']} per stage; this run has {num_stages} stages with {counts}. Resume with "
            f"the same stages, or load the full model with a single-process Trainer"
        )


def full_state_dict(strategy) -> dict[str, Any]:
    """The full model's state dict on rank 0, gathered from every stage (a collective)."""
    full = strategy.lightning_module.state_dict()
    if strategy.local is None or strategy.world_size == 1:
        return full
    mine = {k: v.detach().cpu() for k, v in full.items() if k not in strategy.local.freed_keys}
    gathered = gather_objects(mine, strategy.world_size, strategy.is_global_zero, strategy.object_group)
    return merge_stage_state_dicts(full, gathered) if strategy.is_global_zero else mine


def stage_optimizer_states(strategy, optimizer) -> dict[str, Any]:
    """Every stage's optimizer state, on rank 0 (a collective)."""
    state = getattr(optimizer, "optimizer", optimizer).state_dict()
    gathered = gather_objects(state, strategy.world_size, strategy.is_global_zero, strategy.object_group)
    return {"pipeline_stages": gathered} if strategy.is_global_zero else {}


def restore_pipeline_state(strategy, ckpt: dict[str, Any], path) -> None:
    """Put a checkpoint's pipeline state back: the tied sums' error feedback, and the strategy's
    ``PipelineState`` (steps, totals, and now or once they exist this rank's codecs and the sampler)."""
    state = ckpt.get("clapping")
    if state is None:
        return
    counts = strategy.split.counts if strategy.split else None
    check_same_pipeline(state, strategy.num_stages, counts, path, placement_of(strategy))
    codecs = dict(state["codecs"][strategy.global_rank]) if state.get("codecs") else {}
    tied = codecs.pop(TIED, None)
    if tied is not None and strategy.tied is not None:
        strategy.tied.load_state_dict(tied, strategy.root_device)
    strategy.state.load_state_dict(state, codecs, strategy.root_device)


def load_stage_weights(strategy, ckpt: dict[str, Any], strict: bool) -> None:
    """This stage's entries of the full model's state dict."""
    freed = strategy.local.freed_keys if strategy.local is not None else set()
    mine = {k: v for k, v in ckpt["state_dict"].items() if k not in freed}
    result = strategy.lightning_module.load_state_dict(mine, strict=False)
    missing = [k for k in result.missing_keys if k not in freed]
    if strict and missing:
        raise KeyError(f"checkpoint lacks this stage's entries: {missing[:5]}")


def load_stage_optimizer_states(strategy, ckpt: dict[str, Any]) -> None:
    for optimizer, state in zip(strategy.optimizers, ckpt["optimizer_states"]):
        if "pipeline_stages" in state:
            state = state["pipeline_stages"][strategy.global_rank]
        optimizer.load_state_dict(state)
    compat.optimizers_to_device(strategy.optimizers, strategy.root_device)


class PipelineCheckpoints:
    """The strategy's checkpoint hooks (Lightning's), each a function above: every stage's weights and
    optimizer state gathered on rank 0, and the pipeline's own state under ``clapping``."""

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return full_state_dict(self)

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        return stage_optimizer_states(self, optimizer)

    def save_checkpoint(self, ckpt: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        self.flush_statistics()  # every rank saves (or reaches the barrier below) at this step
        state = pipeline_state(self, self.options.aqsgd_checkpoint_buffers)
        if self.is_global_zero:
            ckpt["clapping"] = state
            self.checkpoint_io.save_checkpoint(ckpt, filepath, storage_options=storage_options)
        self.barrier("save_checkpoint")

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        ckpt = self.checkpoint_io.load_checkpoint(checkpoint_path, weights_only=False)
        restore_pipeline_state(self, ckpt, checkpoint_path)
        return ckpt

    def load_model_state_dict(self, ckpt, strict: bool = True) -> None:
        load_stage_weights(self, ckpt, strict)

    def load_optimizer_state_dict(self, ckpt) -> None:
        load_stage_optimizer_states(self, ckpt)
