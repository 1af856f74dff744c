"""Keep only this stage's parts of a module: every parameter and buffer that belongs to another
stage's parts is replaced by an empty placeholder (its memory is freed, the module's structure and
state-dict keys stay). Parameters held by several stages (tied weights, like a token embedding
shared with the output head) stay on each of them; their gradients are summed between those
stages after every backward pass (``tied_gradients.py``), so the copies stay equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from .stage_parts import StageSplit


@dataclass
class TiedParameter:
    name: str  # the parameter's first state-dict name
    param: nn.Parameter  # this rank's copy
    stages: tuple[int, ...]  # the stages that hold it


@dataclass
class LocalModel:
    """What a rank keeps after the split."""

    freed_keys: set[str] = field(default_factory=set)  # state-dict entries that live on other stages
    tied: list[TiedParameter] = field(default_factory=list)  # parameters this rank shares with other stages
    tied_groups: list[tuple[int, ...]] = field(
        default_factory=list
    )  # every distinct set of sharing stages (all ranks)
    secondary: set[int] = field(
        default_factory=set
    )  # ids of tied params counted on a lower stage (grad norm)
    owned_bytes: int = 0


def _owners(split: StageSplit) -> dict[int, set[int]]:
    owners: dict[int, set[int]] = {}
    for stage in range(split.num_stages):
        for module in split.modules_of(stage):
            for t in list(module.parameters()) + list(module.buffers()):
                owners.setdefault(id(t), set()).add(stage)
    return owners


def keep_local_parts(module: nn.Module, split: StageSplit) -> LocalModel:
    """Free every parameter and buffer of ``module`` that only other stages hold."""
    owners = _owners(split)
    rank = split.stage
    names = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    orphans = [name for name, p in module.named_parameters() if id(p) not in owners]
    if orphans:
        raise ValueError(
            f"{type(module).__name__}: parameters {orphans[:5]}{'...' if len(orphans) > 5 else ''} belong to no part "
            f"returned by the stage adapter's parts(); every parameter must be in first, layers or last"
        )
    local = LocalModel()
    groups = sorted({tuple(sorted(s)) for s in owners.values() if len(s) > 1})
    local.tied_groups = groups
    seen: set[int] = set()
    for _, p in module.named_parameters(remove_duplicate=False):
        stages = owners[id(p)]
        if id(p) in seen or rank not in stages:
            continue
        seen.add(id(p))
        local.owned_bytes += p.numel() * p.element_size()
        if len(stages) > 1:
            ordered = tuple(sorted(stages))
            local.tied.append(TiedParameter(names[id(p)], p, ordered))
            if ordered[0] != rank:
                local.secondary.add(id(p))

    placeholders: set[int] = set()
    for sub in module.modules():
        for pname, p in list(sub._parameters.items()):
            if p is not None and id(p) in owners and rank not in owners[id(p)]:
                device = "cpu" if p.is_meta else p.device  # a part never read (meta) frees to the CPU
                empty = nn.Parameter(torch.empty(0, dtype=p.dtype, device=device), requires_grad=False)
                sub._parameters[pname] = empty
                placeholders.add(id(empty))
        for bname, b in list(sub._buffers.items()):
            if b is not None and id(b) in owners and rank not in owners[id(b)]:
                empty = torch.empty(0, dtype=b.dtype, device="cpu" if b.is_meta else b.device)
                sub._buffers[bname] = empty
                placeholders.add(id(empty))
    local.freed_keys = {k for k, v in module.state_dict(keep_vars=True).items() if id(v) in placeholders}
    return local


def clip_global_grad_norm(
    params: list[nn.Parameter], local: LocalModel, device: torch.device, max_norm: float
) -> None:
    """Gradient-norm clipping over all stages (a tied parameter counts once, on its lowest stage)."""
    params = [p for p in params if p.grad is not None]
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        if id(p) not in local.secondary:
            sq += p.grad.detach().double().pow(2).sum()
    dist.all_reduce(sq)
    coef = torch.clamp(float(max_norm) / (sq.sqrt().float() + 1e-6), max=1.0)
    for p in params:
        p.grad.detach().mul_(coef.to(p.grad.device, p.grad.dtype))
