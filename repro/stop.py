"""Stopping a fit on a signal at a step boundary, so that what is saved resumes exactly (plain
Python: the checkpoint callback, the pipeline's launcher and ``repro fit`` share it).

A process that trains records the first stop signal it receives and carries on to the end of the
step: SIGINT (Ctrl-C), SIGTERM (what a scheduler sends at a time limit or a preemption) and, under
SLURM with auto-requeue, its requeue signal (``sbatch --signal=SIGUSR1@90``). ``FinalCheckpoint``
reads it after every training batch; in a run of several processes the ranks agree (any rank's
signal stops all of them at the same step), write the checkpoint together and stop. A second
Ctrl-C stops at once (the exception path: a single process still saves its checkpoint).

Roles: a ``process`` (one process, or a rank started by torchrun or srun, which get the signal
themselves) stops on any of them; a ``rank`` started by the suite's own fork/spawn launcher
ignores SIGINT, because Ctrl-C reaches the launching process too, which forwards the stop to its
ranks as SIGTERM once (``launcher``). Exit codes: 128 + the signal (130 for SIGINT, 143 for SIGTERM).

The orchestrators (Table 1, the Clapping grid, the profiles) run many fits in one process; between
them ``stop_if_interrupted`` ends the orchestrator on a Ctrl-C even when its exception was lost
(Python raises KeyboardInterrupt from its SIGINT handler wherever the main thread is; raised inside
an at-fork callback, as when the fork launcher starts ranks with os.fork, it is printed as
"Exception ignored" and dropped). ``interrupted_line`` is what an orchestrator prints then.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ROLES = ("process", "rank", "launcher")


@dataclass
class Stopped:
    """How a fit stopped early: the signal, the step it stopped after, and the checkpoint."""

    signum: int
    step: int
    path: str | None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopRequest:
    """This process's stop signal (the first one received), with the handlers that record it."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stopped: Stopped | None = None  # set when a fit of this process stopped on a signal
        self.role = "process"
        self._previous: dict[int, Any] = {}
        self._forwarded = False
        self.interrupts: list[int] = []  # SIGINTs seen by an orchestrator inside ``remember_interrupts``

    def install(self, role: str, extra_signals: tuple[int, ...] = ()) -> None:
        """Record stop signals from now on (the previous handlers are kept for ``restore``)."""
        if role not in ROLES:
            raise ValueError(f"stop role {role!r}: allowed {ROLES}")
        self.signum, self.stopped, self.role, self._forwarded = None, None, role, False
        for signum in (*STOP_SIGNALS, *extra_signals):
            if signum not in self._previous:
                self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.role == "rank":
            return  # the launching process got this Ctrl-C too and forwards a stop
        if signum == signal.SIGINT and self.signum is not None:
            self.restore()
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if self.signum is None:
            self.signum = signum
        if self.role == "launcher" and not self._forwarded:
            self._forwarded = True
            for child in multiprocessing.active_children():
                if child.pid is not None:
                    os.kill(child.pid, signal.SIGTERM)

    def stop_after(self, signum: int, step: int) -> Stopped:
        """The stop agreed at a step boundary (one process's own signal, or the signal a pipeline's
        ranks agreed on): the first agreement stands."""
        if self.stopped is None:
            self.stopped = Stopped(signum, step, None)
        return self.stopped

    def _remember(self, signum, frame) -> None:
        self.interrupts.append(signum)
        raise KeyboardInterrupt


STOP = StopRequest()  # one per process


def install_stop(role: str, requeue: int | None) -> tuple[int, ...]:
    """Record stop signals in this training process (``role``; ``requeue``: SLURM's requeue signal
    or None); returns the stop signals in the order ranks agree on them (a requeue first)."""
    STOP.install(role, (requeue,) if requeue is not None else ())
    return tuple(s for s in (requeue, signal.SIGTERM, signal.SIGINT) if s is not None)


@contextmanager
def remember_interrupts() -> Iterator[None]:
    """Within the block (an orchestrator's runs), SIGINT raises KeyboardInterrupt as usual and is
    also remembered, so that ``stop_if_interrupted`` sees one whose exception was swallowed."""
    STOP.interrupts.clear()
    previous = signal.signal(signal.SIGINT, STOP._remember)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        STOP.interrupts.clear()  # outside the block, nothing is remembered


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt when a SIGINT arrived, even one whose exception was swallowed."""
    if STOP.interrupts:
        raise KeyboardInterrupt(
            f"interrupted (signal {STOP.interrupts[0]}); finished runs are kept, rerun to resume"
        )


def finished_runs(out) -> int:
    """How many finished run results are kept under ``out`` (what a rerun reuses)."""
    count = 0
    for path in Path(out).rglob("*.json"):
        if ".partial" in path.parts:
            continue
        try:
            head = path.read_text()[:4096]
        except OSError:
            continue
        count += '"fingerprint"' in head and '"val_curve"' in head
    return count


def interrupted_line(command: str, out) -> str:
    """What an experiment prints, in one line, when Ctrl-C (or SIGTERM) stops it."""
    return (
        f"repro {command}: interrupted: {finished_runs(out)} finished runs kept in {out}; "
        f"rerun the same command to resume"
    )
