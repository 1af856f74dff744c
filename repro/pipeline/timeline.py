"""Where a pipeline step's time goes, per rank: spans of compute (each micro-batch's forward and
backward), of the codec (encode, decode), of waiting (for a message, for the sends to be taken,
for a collective) and instants (a send or receive posted), in the Chrome trace format
(``chrome://tracing``, Perfetto: one process per rank, one row per kind of work).

Times are the wall clock in microseconds (``time.time_ns``), so the files of ranks on one machine
(or in network namespaces of one machine) line up. A disabled timeline (``NO_TIMELINE``) records
nothing and costs a function call per span.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

# Chrome trace rows (tid) of a rank, by kind of work
ROWS = {"compute": 0, "codec": 1, "wait": 2, "send": 3, "recv": 4, "collective": 5, "step": 6}


def _now_us() -> float:
    return time.time_ns() / 1000.0


class Timeline:
    """The events of one rank (``rank`` is the trace's process id)."""

    enabled = True

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events: list[dict[str, Any]] = []
        self.step: int | None = None  # the training step under way (each event carries it)

    @contextmanager
    def span(self, name: str, row: str, **args: Any) -> Iterator[None]:
        start = _now_us()
        try:
            yield
        finally:
            self.events.append(
                {"name": name, "ph": "X", "ts": start, "dur": _now_us() - start, "pid": self.rank,
                 "tid": ROWS[row], "cat": row, "args": {"step": self.step, **args}}
            )  # fmt: skip

    def instant(self, name: str, row: str, **args: Any) -> None:
        self.events.append(
            {"name": name, "ph": "i", "s": "t", "ts": _now_us(), "pid": self.rank, "tid": ROWS[row],
             "cat": row, "args": {"step": self.step, **args}}
        )  # fmt: skip

    def chrome_trace(self) -> dict[str, Any]:
        """The trace of this rank, with its process and row names."""
        names = [
            {"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}},
            *[{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": row}}
              for row, tid in ROWS.items()],
        ]  # fmt: skip
        return {"traceEvents": names + self.events, "displayTimeUnit": "ms"}


class _NoTimeline(Timeline):
    enabled = False

    def __init__(self) -> None:
        super().__init__(-1)

    def span(self, name: str, row: str, **args: Any):  # type: ignore[override]
        return nullcontext()

    def instant(self, name: str, row: str, **args: Any) -> None:
        return None


NO_TIMELINE = _NoTimeline()
