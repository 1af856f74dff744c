"""Ctrl-C that is never lost. Python raises KeyboardInterrupt from its SIGINT handler wherever the
main thread is; raised inside an at-fork callback (the fork launcher starts ranks with os.fork) it
is printed as "Exception ignored" and dropped, and the run goes on. ``remember_interrupts``
records the signal as well, and ``stop_if_interrupted`` between runs ends the orchestrator."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

_received: list[int] = []


def _handler(signum, frame) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


@contextmanager
def remember_interrupts() -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt as usual and is also remembered."""
    _received.clear()
    previous = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _received.clear()  # outside the block, nothing is remembered


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt when a SIGINT arrived, even one whose exception was swallowed."""
    if _received:
        raise KeyboardInterrupt(
            f"interrupted (signal {_received[0]}); finished runs are kept, rerun to resume"
        )


def finished_runs(out) -> int:
    """How many finished run results are kept under ``out`` (what a rerun reuses)."""
    from pathlib import Path

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
