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
        # placement 'v', last stage: the first part's outputs sent to stage 0, their gradients' receives
        self.first_out: dict[int, torch.Tensor] = {}
        self.pending_first_grad: dict[int, Any] = {}
        split = runner.split
        if split.receives_input:  # post every input receive whose size is known
            for m in range(len(micro_batches)):
                if signatures[m] in runner.shapes:
                    self._post_input(m)

    # ------------------------------------------------------------------ messages
    def _post_input(self, m: int) -> None:
        r = self.r
        shape, dtype = r._input_shape(self.signatures[m], m)
        nbytes = self.codecs["fwd", "recv"].payload_nbytes(shape, dtype, m, self.contexts[m])
        self.pending_in[m] = r.links.recv(nbytes, r.split.previous, "fwd", 2 * m, f"activation {m}")

    def _send_and_await_gradient(self, y: torch.Tensor, m: int) -> Any:
        """Send a forward message and post the receive of its gradient."""
        r = self.r
        r._send_forward(y, m, self.signatures[m], self.codecs["fwd", "send"], self.contexts[m], self.stats)
        nbytes = self.codecs["bwd", "recv"].payload_nbytes(tuple(y.shape), y.dtype, m, self.contexts[m])
        return r.links.recv(nbytes, r.split.next, "bwd", 2 * m, f"gradient {m}")

    # ------------------------------------------------------------------ work
    def first_forward(self, m: int) -> None:
        """``placement='v'``, last stage: the first part of micro-batch ``m``, sent to stage 0."""
        r, timeline = self.r, self.r.links.timeline
        with timeline.span(f"F{m} first part", "compute"):
            e = r.split.forward_first(r.input_fn(self.micro[m]))
        self.first_out[m] = e
        self.pending_first_grad[m] = self._send_and_await_gradient(e, m)

    def first_backwards(self) -> None:
        """The first part's backward of every micro-batch, in micro-batch order (the same sums every run)."""
        for m in range(len(self.micro)):
            self._backward_received(self.first_out.pop(m), self.pending_first_grad.pop(m), m, " first part")

    def _backward_received(self, out: torch.Tensor, pending: Any, m: int, what: str = "") -> None:
        """The backward of ``out`` from its gradient's message (received, decoded)."""
        timeline = self.r.links.timeline
        data = pending.wait()
        with timeline.span(f"decode bwd {m}{what}", "codec"):
            g = self.codecs["bwd", "recv"].decode(
                Payload(data), tuple(out.shape), out.dtype, m, self.contexts[m]
            )
        with timeline.span(f"B{m}{what}", "compute"):
            out.backward(g)

    def forward(self, m: int) -> None:
        r, split, timeline = self.r, self.r.split, self.r.links.timeline
        if split.receives_input:
            if m not in self.pending_in:
                self._post_input(m)
            shape, dtype = r._input_shape(self.signatures[m], m)
            data = self.pending_in.pop(m).wait()
            with timeline.span(f"decode fwd {m}", "codec"):
                x = self.codecs["fwd", "recv"].decode(Payload(data), shape, dtype, m, self.contexts[m])
            x = x.detach().requires_grad_(True)
        else:
            x = r.input_fn(self.micro[m])
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
        self.pending_grad[m] = self._send_and_await_gradient(y, m)

    def backward(self, m: int) -> None:
        r, split, timeline = self.r, self.r.split, self.r.links.timeline
        out = self.outputs.pop(m)
        if split.is_last:
            with timeline.span(f"B{m}", "compute"):
                (out * self.scale).backward()
        else:
            self._backward_received(out, self.pending_grad.pop(m), m)
        x = self.inputs.pop(m)
        if split.receives_input:
            grad = x.grad if x.grad is not None else torch.zeros_like(x)
            r._send(
                grad, m, "bwd", split.previous, self.codecs["bwd", "send"], self.contexts[m], self.stats.bwd
            )

    def run(self, schedule: Sequence[Action], feed_ahead: int | None = None) -> None:
        """The schedule's actions. With ``placement='v'`` the last stage also runs the first part:
        ``feed_ahead`` micro-batches before its schedule (all when None), one more after each of its
        backwards, and every first-part backward at the end. Paced so, its messages to stage 0 share
        its uplink with the gradients stage 0 waits for only as far as stage 0 can use them (sent
        all at once, they held those gradients back: 0.71 of the link limit at 25 Mbit/s, K = 2,
        against 0.85-0.88 paced)."""
        feeds_first = self.r.split.wraps and self.r.split.is_last
        m_count = len(self.micro)
        ahead = 0

        def feed(until: int) -> None:
            nonlocal ahead
            while ahead < min(until, m_count):
                self.first_forward(ahead)
                ahead += 1

        if feeds_first:
            feed(m_count if feed_ahead is None else feed_ahead)
        for action in schedule:
            (self.forward if action.kind == "F" else self.backward)(action.micro_batch)
            if feeds_first and action.kind == "B":
                feed(ahead + 1)
        if feeds_first:
            feed(m_count)
            self.first_backwards()
