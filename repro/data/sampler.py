"""The one training sampler of the suite: shuffled batches with lazy reuse (Clapping spec section
4), resumable at any step. With ``p = 1`` it is ordinary shuffled sampling, in exactly the order
of ``DataLoader(shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(seed))`` as
Lightning consumes it, so single-process runs and pipeline runs at p = 1 see the same batches.

At step ``t``, with probability ``p`` the next batch of the shuffled stream is taken; otherwise
the previous batch is repeated exactly (same sample ids, same order, so the same micro-batch
split). Step ``t`` is fresh when a coin seeded by ``(seed, t)`` falls below ``p`` (step 0 always
is). The ``j``-th fresh batch is batch ``j mod n_batches`` of pass ``j // n_batches`` of the
shuffled stream. The whole state is therefore the number of steps taken, which makes a resume
exact and cheap. One epoch is ``n_batches = num_samples // batch_size`` steps, whatever ``p`` is.

The stream replays a seeded DataLoader: each pass, torch draws from the loader's generator one
int64 (the iterator's base seed) and then the permutation (Lightning stops after ``len(loader)``
batches, so RandomSampler's trailing ``randperm(n)[:0]`` is never reached).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of ``epoch`` (0-based) of a shuffled DataLoader seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epoch + 1):
        order = _next_pass(gen, n)
    return order


def _next_pass(gen: torch.Generator, n: int) -> torch.Tensor:
    torch.empty((), dtype=torch.int64).random_(generator=gen)  # the iterator's base seed
    return torch.randperm(n, generator=gen)


class LazyBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices, shuffled each pass, with lazy reuse.

    Args:
        num_samples: Dataset size.
        batch_size: Indices per batch (the last incomplete batch of a pass is dropped).
        p: Probability that a step draws a fresh batch, in (0, 1]; 1 is ordinary shuffled sampling.
        seed: Seed of the shuffle and of the fresh/reuse coins.
        start_step: Step the next iteration starts at (a restored run's step count).
    """

    def __init__(
        self, num_samples: int, batch_size: int, p: float = 1.0, seed: int = 0, start_step: int = 0
    ) -> None:
        if not isinstance(num_samples, int) or num_samples <= 0:
            raise ValueError(f"sampler num_samples={num_samples!r}: must be a positive integer")
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"sampler batch_size={batch_size!r}: must be a positive integer")
        if batch_size > num_samples:
            raise ValueError(
                f"data.batch_size={batch_size}: larger than the {num_samples} samples of the dataset"
            )
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
            raise ValueError(f"p={p!r}: the lazy-sampling probability must be in (0, 1]")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.p = float(p)
        self.seed = int(seed)
        self.n_batches = num_samples // batch_size
        self._gen: torch.Generator | None = None  # the stream's generator, positioned after pass _pass
        self._pass = -1
        self._order: list[int] = []
        self._memo = (0, 0)  # (step, fresh batches drawn before it): sequential queries are O(1)
        self.step = 0
        self.set_step(start_step)

    # ------------------------------------------------------------------ pure functions of the step
    def is_fresh(self, step: int) -> bool:
        """Whether ``step`` draws a new batch (step 0 always does)."""
        if step == 0 or self.p >= 1.0:
            return True
        return bool(np.random.default_rng([self.seed, 1, step]).random() < self.p)

    def fresh_before(self, step: int) -> int:
        """Fresh batches drawn by steps ``0..step-1``."""
        if self.p >= 1.0:
            return step
        known, count = self._memo if self._memo[0] <= step else (0, 0)
        for s in range(known, step):
            count += self.is_fresh(s)
        self._memo = (step, count)
        return count

    def stream_batch(self, j: int) -> list[int]:
        """The ``j``-th batch of the shuffled stream."""
        pass_index, within = divmod(j, self.n_batches)
        if pass_index < self._pass or self._gen is None:
            self._gen, self._pass = torch.Generator().manual_seed(self.seed), -1
        while self._pass < pass_index:
            self._order = _next_pass(self._gen, self.num_samples).tolist()
            self._pass += 1
        start = within * self.batch_size
        return self._order[start : start + self.batch_size]

    def batch_at(self, step: int) -> list[int]:
        """The batch of ``step``: the latest fresh batch drawn at or before it."""
        return self.stream_batch(self.fresh_before(step + 1) - 1)

    # ------------------------------------------------------------------ iteration
    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[list[int]]:
        """The steps from the current one to the end of its epoch."""
        end = (self.step // self.n_batches + 1) * self.n_batches
        while self.step < end:
            batch = self.batch_at(self.step)
            self.step += 1
            yield batch

    def set_step(self, step: int) -> None:
        """Continue from ``step`` (used when a run is restored)."""
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"sampler step={step!r}: must be an integer >= 0")
        self.step = step

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """State at ``step`` (default: the sampler's own counter, which may run ahead of training
        by the batches a DataLoader prefetched)."""
        step = self.step if step is None else step
        return {
            "step": step,
            "fresh_batches": self.fresh_before(step),
            "p": self.p,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("p", "seed", "num_samples", "batch_size"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"lazy sampler state: the checkpoint has {key}={state.get(key)!r}, this run has "
                    f"{key}={getattr(self, key)!r}; resume with the same settings"
                )
        self.set_step(int(state["step"]))
