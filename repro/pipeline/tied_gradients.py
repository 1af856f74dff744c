"""The sum of a tied parameter's gradient between the stages that hold it (a token embedding shared
with the output head lives on the first and the last stage).

Each stage sends its gradient to every other holder with point-to-point messages and every holder
adds the holders' gradients in stage order, so all copies get the same sum, bit for bit, and the
bytes on the wire are counted like the boundary messages (an all-reduce would send them too, but
uncounted, by an algorithm of the backend's choosing). Each sending stage has a process group (a
connection) of its own: gloo carries one large message at a time per connection, so two stages
sending to each other over one connection took turns (measured: 1.7 s for 1 MiB each way at
10 Mbit/s, against 0.9 s on two). With a compressor (``tied_compressor``),
what a stage sends is its gradient plus the error it kept from earlier steps (error feedback), and
every holder, the sender included, adds the decoded messages: both ends still hold the same sum.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .compressors import Compressor, Payload
from .model_split import LocalModel
from .timeline import NO_TIMELINE

TAG = 1_000_000  # message tags of the tied sums (above every boundary message's 2m, 2m + 1)


class TiedGradients:
    """The tied parameters of one rank and the error kept for each (compressed sums only).

    Args:
        local: What the rank kept after the split (its tied parameters and their stages).
        rank: This rank (= stage).
        backend: The process groups' backend (every rank builds them, in the same order).
        compressor: How a stage's gradient is sent (``identity``: exactly).
        seed: Base seed of a compressor's shared randomness (per step and parameter).
        groups: The dict its process groups are added to, under (stages, sending stage): the
            strategy's own, so that one release at exit drops them all.
    """

    def __init__(
        self, local: LocalModel, rank: int, backend: str | None, compressor: Compressor, seed: int = 0,
        groups: dict | None = None,
    ) -> None:  # fmt: skip
        self.local, self.rank, self.compressor, self.seed = local, rank, compressor, seed
        self.groups: dict[Any, Any] = {} if groups is None else groups  # (stages, sending stage) -> group
        for stages in local.tied_groups:  # every rank creates every group, in the same order
            for sender in stages:
                self.groups[stages, sender] = dist.new_group(ranks=list(stages), backend=backend)
        self.errors: dict[str, torch.Tensor] = {}  # parameter name -> error kept (error feedback)
        self.timeline = NO_TIMELINE

    def broadcast_from_first(self) -> None:
        """Every copy starts from the lowest stage's values."""
        for tied in self.local.tied:
            dist.broadcast(
                tied.param.data, src=tied.stages[0], group=self.groups[tied.stages, tied.stages[0]]
            )

    def sum(self, step: int) -> tuple[int, int]:
        """Sum every tied gradient between its stages (a collective of the holders). Returns the
        bytes this rank sent and the bytes exact messages would have taken."""
        sent = raw = 0
        for index, tied in enumerate(self.local.tied):
            p = tied.param
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad = p.grad
            shape, dtype = tuple(grad.shape), grad.dtype
            seed = self.seed * 1_000_003 + step * 101 + index
            own = grad + self.errors[tied.name] if tied.name in self.errors else grad
            payload = self.compressor.compress(own.detach(), seed)
            decoded = (
                own
                if self.compressor.is_identity
                else self.compressor.decompress(payload, shape, dtype, seed)
            )
            if not self.compressor.is_identity:
                self.errors[tied.name] = own - decoded
            others = [s for s in tied.stages if s != self.rank]
            mine = self.groups[tied.stages, self.rank]
            data = payload.data.contiguous()
            with self.timeline.span(f"tied sum {tied.name}", "collective", bytes=data.numel() * len(others)):
                works = [dist.isend(data, dst=s, group=mine, tag=TAG + index) for s in others]
                received = {}
                for s in others:
                    buffer = torch.empty(data.numel(), dtype=torch.uint8, device=data.device)
                    dist.irecv(buffer, src=s, group=self.groups[tied.stages, s], tag=TAG + index).wait()
                    received[s] = self.compressor.decompress(Payload(buffer), shape, dtype, seed)
                for work in works:
                    work.wait()
            total = None
            for s in tied.stages:  # in stage order on every holder: the same sum everywhere
                part = decoded if s == self.rank else received[s]
                total = part.clone() if total is None else total + part
            p.grad.copy_(total)
            sent += data.numel() * len(others)
            raw += grad.numel() * grad.element_size() * len(others)
        return sent, raw

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: e.detach().cpu().clone() for name, e in self.errors.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], device: torch.device) -> None:
        self.errors = {name: e.to(device) for name, e in state.items()}
