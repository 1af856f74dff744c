"""One stage's training step: the forward (F) and backward (B) of each micro-batch in the
schedule's order, with its messages received, decoded, encoded and sent (``runner.py`` runs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .codecs import MessageContext
from .compressors import Payload
from .schedule import Action


class TrainStep:
    """The state of one training step on one stage (what is in flight, what is done)."""

    def __init__(
        self,
        runner: Any,  # the StageRunner (runner.py) whose step this is
        micro_batches: Sequence[Any],
        contexts: Sequence[MessageContext],
        loss_scale: float,
        stats: Any,  # the step's StepStats (runner.py), filled as messages are sent
        signatures: list[tuple],
    ) -> None:
        self.r, self.micro, self.contexts, self.scale, self.stats = (
            runner,
            micro_batches,
            contexts,
            loss_scale,
            stats,
        )
        self.signatures = signatures
        self.codecs = {key: runner.codecs.get(key) for key in (("fwd", "recv"), ("bwd", "recv"), ("fwd", "send"),
                                                                  ("bwd", "send"))}  # fmt: skip
        self.pending_in: dict[int, Any] = {}
        self.pending_grad: dict[int, Any] = {}
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.loss_sum: torch.Tensor | None = None
        split = runner.split
        if not split.is_first:  # post every input receive whose size is known
            for m in range(len(micro_batches)):
                if signatures[m] in runner.shapes:
                    self._post_input(m)

    # ------------------------------------------------------------------ messages
    def _post_input(self, m: int) -> None:
        r = self.r
        shape, dtype = r._input_shape(self.signatures[m], m)
        nbytes = self.codecs["fwd", "recv"].payload_nbytes(shape, dtype, m, self.contexts[m])
        self.pending_in[m] = r.links.recv(nbytes, r.stage - 1, "fwd", 2 * m, f"activation {m}")

    # ------------------------------------------------------------------ work
    def forward(self, m: int) -> None:
        r, split, timeline = self.r, self.r.split, self.r.links.timeline
        if split.is_first:
            x = r.input_fn(self.micro[m])
        else:
            shape, dtype = r._input_shape(self.signatures[m], m)
            if m not in self.pending_in:
                self._post_input(m)
            data = self.pending_in.pop(m).wait()
            with timeline.span(f"decode fwd {m}", "codec"):
                x = self.codecs["fwd", "recv"].decode(Payload(data), shape, dtype, m, self.contexts[m])
            x = x.detach().requires_grad_(True)
        with timeline.span(f"F{m}", "compute"):
            y = split.forward(x)
            loss = r.loss_fn(y, self.micro[m]) if split.is_last else None
        self.inputs[m] = x
        if split.is_last:
            self.outputs[m] = loss
            value = loss.detach().float()
            self.loss_sum = value if self.loss_sum is None else self.loss_sum + value
            return
        self.outputs[m] = y
        r._send_forward(y, m, self.signatures[m], self.codecs["fwd", "send"], self.contexts[m], self.stats)
        nbytes = self.codecs["bwd", "recv"].payload_nbytes(tuple(y.shape), y.dtype, m, self.contexts[m])
        self.pending_grad[m] = r.links.recv(nbytes, r.stage + 1, "bwd", 2 * m, f"gradient {m}")

    def backward(self, m: int) -> None:
        r, split, timeline = self.r, self.r.split, self.r.links.timeline
        out = self.outputs.pop(m)
        if split.is_last:
            with timeline.span(f"B{m}", "compute"):
                (out * self.scale).backward()
        else:
            data = self.pending_grad.pop(m).wait()
            with timeline.span(f"decode bwd {m}", "codec"):
                g = self.codecs["bwd", "recv"].decode(
                    Payload(data), tuple(out.shape), out.dtype, m, self.contexts[m]
                )
            with timeline.span(f"B{m}", "compute"):
                out.backward(g)
        x = self.inputs.pop(m)
        if not split.is_first:
            grad = x.grad if x.grad is not None else torch.zeros_like(x)
            r._send(grad, m, "bwd", r.stage - 1, self.codecs["bwd", "send"], self.contexts[m], self.stats.bwd)

    def run(self, schedule: Sequence[Action]) -> None:
        for action in schedule:
            (self.forward if action.kind == "F" else self.backward)(action.micro_batch)
