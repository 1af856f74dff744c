"""The one state object of a pipeline run, owned by the strategy: this rank's channel ends
(codecs), the training sampler, the run's byte totals and the steps done. A checkpoint's state comes
back through ``load_state_dict`` (after the strategy's setup, before the training loader exists);
what it holds for codecs or a sampler not built yet is applied when ``attach_codecs`` and
``attach_sampler`` give them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from repro.data.sampler import LazyBatchSampler

from ..codecs import ChannelCodec
from .step_report import RunTotals


@dataclass
class PipelineState:
    codecs: dict[tuple[str, str], ChannelCodec] = field(default_factory=dict)  # this rank's channel ends
    sampler: LazyBatchSampler | None = None  # the training batches (lazy reuse)
    totals: RunTotals = field(default_factory=RunTotals)  # cumulative statistics (identical on every rank)
    steps_done: int = 0  # training steps (batches) run so far
    # restored state of codecs or a sampler not built yet
    waiting: dict[str, Any] = field(default_factory=dict)

    def attach_sampler(self, sampler: LazyBatchSampler) -> None:
        """The run's sampler, started at ``steps_done`` (the one source of a run's step); a
        checkpoint's sampler state is checked against it (same p, seed, dataset and batch size)."""
        self.sampler = sampler
        if "sampler" in self.waiting:
            sampler.load_state_dict(self.waiting.pop("sampler"))
        sampler.set_step(self.steps_done)

    def attach_codecs(self, codecs: dict[tuple[str, str], ChannelCodec], device: torch.device) -> None:
        """This rank's channel ends (once), with the buffers a checkpoint left for them."""
        self.codecs.update(codecs)
        for key, codec_state in self.waiting.pop("codecs", {}).items():
            self.codecs[tuple(key.split(":"))].load_state_dict(codec_state, device)

    def fresh_batches(self) -> int:
        """Batches drawn fresh so far (the others were reused by lazy sampling)."""
        return self.sampler.fresh_before(self.steps_done) if self.sampler is not None else self.steps_done

    def rank_codec_states(self, with_sample_rows: bool) -> dict[str, Any]:
        """This rank's codec states, keyed 'direction:role' (a checkpoint gathers every rank's)."""
        return {f"{d}:{r}": c.state_dict(with_sample_rows) for (d, r), c in self.codecs.items()}

    def state_dict(self) -> dict[str, Any]:
        """Steps, sampler and totals (the same on every rank; the codecs are per rank)."""
        return {
            "steps_done": self.steps_done,
            "sampler": self.sampler.state_dict(self.steps_done) if self.sampler is not None else None,
            "totals": self.totals.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], codecs: dict[str, Any], device: torch.device) -> None:
        """A checkpoint's state and this rank's codec states (now, or once the codecs exist)."""
        self.steps_done = int(state["steps_done"])
        self.totals.load_state_dict(state.get("totals", {}))
        if state.get("sampler") is not None:
            self.waiting["sampler"] = state["sampler"]
            if self.sampler is not None:
                self.attach_sampler(self.sampler)
        self.waiting["codecs"] = codecs
        if self.codecs:
            self.attach_codecs({}, device)
