"""Micro-batch schedules: the order in which one stage runs forward (F) and backward (B) passes.

- ``gpipe``: all M forwards, then all M backwards (in reverse order), on every stage.
- ``1f1b``: stage k runs ``min(K - 1 - k, M)`` warm-up forwards, then alternates one forward and
  one backward, then drains the remaining backwards; at most ``K - k`` micro-batches are in
  flight on stage k instead of M. With ``extra_warmup`` = e, every stage but the last runs e more
  warm-up forwards (``min(K - 1 - k + e, M)``; the last stage's backward still follows its forward
  at once, since its gradient is what the others wait for): on a link whose message takes about as
  long as a micro-batch's compute, K - k in flight turn the step into a chain of round trips, and
  each extra one hides another message; each holds one more micro-batch's activations. The
  warm-ups never grow from one stage to the next, so no stage waits for a forward its predecessor
  has not scheduled (no deadlock), and every stage still runs its backwards in micro-batch order,
  so the gradients add up in the same order (the same bits) for every e.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

SCHEDULES = ("gpipe", "1f1b")


class Action(NamedTuple):
    kind: Literal["F", "B"]
    micro_batch: int


def stage_schedule(
    name: str, stage: int, num_stages: int, micro_batches: int, extra_warmup: int = 0
) -> list[Action]:
    """The actions of ``stage`` (0-based) for one optimizer step."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r}: allowed values are {SCHEDULES}")
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage={stage}: must be in 0..{num_stages - 1}")
    m = micro_batches
    if name == "gpipe":
        return [Action("F", i) for i in range(m)] + [Action("B", i) for i in reversed(range(m))]
    last = (
        stage == num_stages - 1
    )  # its backward follows its forward at once: its gradient is what the others wait for
    warmup = min(num_stages - 1 - stage + (0 if last else extra_warmup), m)
    actions = [Action("F", i) for i in range(warmup)]
    next_f, next_b = warmup, 0
    while next_f < m:
        actions.append(Action("F", next_f))
        next_f += 1
        actions.append(Action("B", next_b))
        next_b += 1
    actions.extend(Action("B", i) for i in range(next_b, m))
    return actions


def forward_schedule(micro_batches: int) -> list[Action]:
    """Evaluation: forwards only."""
    return [Action("F", i) for i in range(micro_batches)]


def first_part_lead(name: str, num_stages: int, micro_batches: int, extra_warmup: int = 0) -> int:
    """``placement='v'``: how many micro-batches the last stage's first part runs before its own
    schedule, one more than stage 0 can run forward before its first backward (1f1b; all M for
    gpipe, whose stage 0 runs every forward first)."""
    actions = stage_schedule(name, 0, num_stages, micro_batches, extra_warmup)
    before_first_backward = next(i for i, a in enumerate(actions) if a.kind == "B")
    return min(before_first_backward + 1, micro_batches)
