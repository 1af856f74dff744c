"""What the pipeline sent, and the ``pipe/*`` scalars made of it.

Every rank knows what it sent itself. Each step, one all-reduce of two numbers gives every rank
the loss (from the last stage) and the count of non-finite messages, so all ranks take the same
decision (a non-finite message anywhere stops or skips the step on every rank). The statistics
(bytes, errors, buffers) stay on their rank in a ``StatWindow`` and are reduced only when they
are read: on the steps Lightning logs, at a non-finite step, before a checkpoint and at the end of
training. Byte counts are integers, so the totals are exact whatever the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from repro import lightning_compat as compat

from ..runner import StepStats

STAT_FIELDS = ("payload_bytes", "raw_bytes", "rel_error_sum", "messages", "nonfinite")


@dataclass(frozen=True)
class ChannelStep:
    """One direction of one boundary during a step (as its sender counted it)."""

    bytes: float  # payload bytes sent
    raw_bytes: float  # bytes of the exact messages
    rel_error: float  # mean over messages of ||x_hat - x|| / ||x||
    nonfinite: float  # messages whose decoded value held NaN or inf


@dataclass(frozen=True)
class StepReport:
    """The steps since the previous reduction as every rank sees them after this one."""

    loss: float  # mean micro-batch loss of the latest step (from the last stage)
    # 'b<boundary>_<fwd|bwd>' -> what it sent over the window; 'tied<r>': rank r's tied-gradient sums
    channels: dict[str, ChannelStep]
    buffer_bytes: list[float]  # per rank: bytes of the method buffers it holds
    emulated_s: list[float]  # per rank: emulated link time so far
    param_bytes: list[float]  # per rank: parameter bytes of its stage
    steps: int = 1  # training steps the channels sum over

    @property
    def bytes(self) -> float:
        return sum(c.bytes for c in self.channels.values())

    @property
    def raw_bytes(self) -> float:
        return sum(c.raw_bytes for c in self.channels.values())

    def nonfinite_faults(self) -> list[str]:
        """Where a NaN or inf came from (the same list on every rank)."""
        faults = []
        for tag, channel in self.channels.items():
            if channel.nonfinite > 0 and tag.startswith("b"):
                b, direction = tag[1:].split("_")
                b = int(b)
                nxt = (b + 1) % len(self.buffer_bytes)  # boundary K - 1 wraps to stage 0 (placement='v')
                src, dst = (b, nxt) if direction == "fwd" else (nxt, b)
                what = "activations" if direction == "fwd" else "gradients"
                faults.append(f"the {direction} message ({what}) of boundary {b}, stage {src} -> {dst}")
        if not math.isfinite(self.loss):
            faults.append(f"the loss (stage {len(self.buffer_bytes) - 1})")
        return faults


class StatWindow:
    """What this rank sent since the last reduction: sums per direction (device tensors stay there)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.sums: dict[str, list] = {"fwd": [0] * len(STAT_FIELDS), "bwd": [0] * len(STAT_FIELDS)}
        self.tied = [0, 0]  # bytes this rank sent for tied-gradient sums, and their exact size
        self.steps = 0

    def add_tied(self, sent: int, raw: int) -> None:
        self.tied[0] += sent
        self.tied[1] += raw

    def add(self, stats: StepStats) -> None:
        for direction in ("fwd", "bwd"):
            d, sums = getattr(stats, direction), self.sums[direction]
            for i, name in enumerate(STAT_FIELDS):
                sums[i] = sums[i] + getattr(d, name)
        self.steps += 1


def reduce_loss(
    loss_sum: torch.Tensor | None,
    micro_batches: int,
    stats: StepStats,
    device: torch.device,
    stop_signals: tuple[int, ...] = (),
    stop_signal: int | None = None,
) -> tuple[float, float, int | None]:
    """Every step: the loss (from the last stage), the non-finite messages of all ranks, and the
    stop signal they agree on (any rank's, the first of ``stop_signals`` that some rank received)."""
    vec = torch.zeros(2 + len(stop_signals), dtype=torch.float64, device=device)
    if loss_sum is not None:
        vec[0] = loss_sum.double() / micro_batches
    vec[1] = stats.fwd.nonfinite + stats.bwd.nonfinite
    for i, signum in enumerate(stop_signals):
        vec[2 + i] = float(signum == stop_signal)
    dist.all_reduce(vec)
    values = vec.tolist()  # the step's one host synchronisation
    agreed = next((s for s, seen in zip(stop_signals, values[2:]) if seen > 0), None)
    return values[0], values[1], agreed


def reduce_window(
    window: StatWindow,
    loss: float,
    rank: int,
    num_stages: int,
    buffer_bytes: float,
    emulated_s: float,
    param_bytes: float,
    device: torch.device,
    boundaries: int | None = None,
) -> StepReport:
    """Every rank's statistics of the window to every rank (a collective: all ranks call it at the
    same step); the window starts again empty. ``boundaries``: K - 1 (the default), or K when the
    last stage feeds stage 0 (placement='v'): boundary b is from stage b to stage (b + 1) % K."""
    k, n = num_stages, len(STAT_FIELDS)
    nb = k - 1 if boundaries is None else boundaries
    block = 2 * n  # per boundary: fwd fields, then bwd fields
    tail = nb * block
    vec = torch.zeros(tail + 5 * k, dtype=torch.float64, device=device)

    def put(boundary: int, offset: int, sums: list) -> None:
        base = boundary * block + offset
        for i, value in enumerate(sums):
            vec[base + i] = value

    if rank < nb:  # a rank sends activations on boundary rank, gradients on the one before it
        put(rank, 0, window.sums["fwd"])
    if rank > 0 or nb == k:
        put((rank - 1) % k, n, window.sums["bwd"])
    vec[tail + rank] = buffer_bytes
    vec[tail + k + rank] = emulated_s
    vec[tail + 2 * k + rank] = param_bytes
    vec[tail + 3 * k + rank], vec[tail + 4 * k + rank] = window.tied
    dist.all_reduce(vec)
    values = vec.tolist()
    steps = window.steps
    window.clear()
    channels = {}
    for b in range(nb):
        for j, direction in enumerate(("fwd", "bwd")):
            base = b * block + j * n
            f = dict(zip(STAT_FIELDS, values[base : base + n]))
            channels[f"b{b}_{direction}"] = ChannelStep(
                f["payload_bytes"], f["raw_bytes"], f["rel_error_sum"] / max(f["messages"], 1), f["nonfinite"]
            )
    for r in range(k):  # the tied-gradient sums each rank sent (tied models only)
        if values[tail + 4 * k + r] > 0:
            channels[f"tied{r}"] = ChannelStep(values[tail + 3 * k + r], values[tail + 4 * k + r], 0.0, 0.0)
    return StepReport(
        loss,
        channels,
        values[tail : tail + k],
        values[tail + k : tail + 2 * k],
        values[tail + 2 * k : tail + 3 * k],
        steps,
    )


def logs_this_step(trainer) -> bool:
    """Whether Lightning writes ``train/loss`` to the loggers after this training step (every
    ``log_every_n_steps`` optimizer steps, LoggerConnector.update_train_step_metrics), the same
    answer on every rank."""
    n = trainer.log_every_n_steps
    if not trainer.loggers or not n or compat.should_accumulate(trainer):
        return False
    # Lightning increments this after the optimizer step, then logs at that value when
    # (value + 1) % log_every_n_steps == 0
    step = compat.batches_that_stepped(trainer) + 1
    return (step + 1) % n == 0 or trainer.should_stop


@dataclass
class RunTotals:
    """Cumulative bytes per channel and the steps skipped (identical on every rank; checkpointed)."""

    bytes: dict[str, float] = field(default_factory=dict)  # channel tag -> payload bytes so far
    raw_bytes: dict[str, float] = field(default_factory=dict)  # channel tag -> exact-message bytes so far
    skipped_steps: int = 0  # steps dropped by nonfinite='skip'

    def add(self, report: StepReport) -> None:
        for tag, channel in report.channels.items():
            self.bytes[tag] = self.bytes.get(tag, 0.0) + channel.bytes
            self.raw_bytes[tag] = self.raw_bytes.get(tag, 0.0) + channel.raw_bytes

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes.values())

    @property
    def total_raw_bytes(self) -> float:
        return sum(self.raw_bytes.values())

    def tied_bytes(self) -> tuple[float, float]:
        """The tied-gradient sums' bytes so far: as sent, and their exact size."""
        tags = [t for t in self.bytes if t.startswith("tied")]
        return sum(self.bytes[t] for t in tags), sum(self.raw_bytes.get(t, 0.0) for t in tags)

    def sent_per_rank(self, num_stages: int) -> list[float]:
        """Bytes each rank sent: its forward activations, its backward gradients, its tied sums."""
        return [
            self.bytes.get(f"b{r}_fwd", 0.0)
            + self.bytes.get(f"b{r - 1}_bwd", 0.0)
            + self.bytes.get(f"tied{r}", 0.0)
            for r in range(num_stages)
        ]

    def state_dict(self) -> dict:
        return {
            "bytes": dict(self.bytes),
            "raw_bytes": dict(self.raw_bytes),
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state.get("bytes", {}), dict):  # a checkpoint written before this format
            state = {
                "bytes": {k[6:]: v for k, v in state.items() if k.startswith("bytes/")},
                "raw_bytes": {k[10:]: v for k, v in state.items() if k.startswith("raw_bytes/")},
                "skipped_steps": state.get("skipped_steps", 0),
            }
        self.bytes = dict(state.get("bytes", {}))
        self.raw_bytes = dict(state.get("raw_bytes", {}))
        self.skipped_steps = int(state.get("skipped_steps", 0))


def pipe_scalars(
    report: StepReport, totals: RunTotals, fresh_batches: int, steps_done: int, wall_s: float
) -> dict[str, float]:
    """The ``pipe/*`` scalars at a reduction (PROTOCOL.md §C6): per-step values are means over the
    steps since the previous reduction, totals are exact."""
    values: dict[str, float] = {}
    steps = max(report.steps, 1)
    for tag, channel in report.channels.items():
        values[f"pipe/bytes/{tag}"] = channel.bytes / steps
        values[f"pipe/rel_error/{tag}"] = channel.rel_error
        values[f"pipe/bytes_total/{tag}"] = totals.bytes.get(tag, 0.0)
    values["pipe/bytes"] = report.bytes / steps
    values["pipe/bytes_total"] = totals.total_bytes
    values["pipe/compression_ratio"] = (
        totals.total_bytes / totals.total_raw_bytes if totals.total_raw_bytes else 1.0
    )
    values["pipe/compression_ratio_step"] = report.bytes / report.raw_bytes if report.raw_bytes else 1.0
    for r, nbytes in enumerate(report.buffer_bytes):
        values[f"pipe/buffer_bytes/rank{r}"] = nbytes
    values["pipe/buffer_bytes_max"] = max(report.buffer_bytes)
    for r, seconds in enumerate(report.emulated_s):
        values[f"pipe/net_time_s/rank{r}"] = seconds
    values["pipe/net_time_s"] = max(report.emulated_s)
    for r, nbytes in enumerate(report.param_bytes):
        values[f"pipe/param_bytes/rank{r}"] = nbytes
    values["pipe/skipped_steps"] = totals.skipped_steps
    values["pipe/fresh_batches"] = fresh_batches
    values["pipe/reused_batches"] = steps_done - fresh_batches
    values["pipe/wall_s"] = wall_s
    return values


def publish(trainer, values: dict[str, float], rank: int, to_loggers: bool) -> None:
    """Put ``pipe/*`` scalars in ``trainer.callback_metrics`` and, on the steps Lightning writes
    ``train/loss`` (``logs_this_step``), write them to the loggers at the same step number.
    ``self.log`` is not used: under cProfile each call cost about 1.5 ms in Lightning's result
    collection, 37 ms per step for 25 scalars."""
    trainer.callback_metrics.update({k: torch.tensor(float(v)) for k, v in values.items()})
    if to_loggers and rank == 0:
        step = compat.batches_that_stepped(trainer) + 1
        for logger in trainer.loggers:
            logger.log_metrics({k: float(v) for k, v in values.items()}, step=step)
