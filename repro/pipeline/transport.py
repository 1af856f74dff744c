"""Point-to-point transport between neighbouring stages, over ``torch.distributed``.

Every message is one flat uint8 tensor (a payload or a small shape header), so any backend and any
dtype work the same way and the byte count is exact. Forward messages travel on one process group
and backward messages on another: on NCCL, sends and receives between a pair of ranks are ordered
per communicator, and keeping the two directions apart means a 1F1B schedule cannot deadlock.

- Sends are asynchronous (``isend``); :meth:`StageLinks.finish_sends` waits for them at the end of
  a step. With ``bandwidth_mbps`` set, each send first waits ``bytes * 8 / bandwidth`` seconds to
  emulate a slow link; that time is counted apart.
- Receives are posted early (``irecv``) and waited for with a timeout: a stage whose neighbour has
  died raises :class:`PipelineTimeout` instead of hanging.
- With the gloo backend and CUDA tensors, payloads are staged through host memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from .timeline import NO_TIMELINE

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.uint8]
_HEADER_LEN = 10  # ndim, 8 dims, dtype code


class PipelineTimeout(RuntimeError):
    """A neighbouring stage did not send in time (it has most likely failed)."""


# how gloo and NCCL say that a peer's connection is gone (the peer process died), and that it hung
_CLOSED = ("Connection reset", "Connection closed", "closed by peer", "Broken pipe", "Read error", "Write error",
           "remote process exited")  # fmt: skip
_TIMED_OUT = ("Timed out", "timed out", "operation timeout")


@contextmanager
def stage_collectives(rank: int, what: str) -> Iterator[None]:
    """Around the collectives of the stage processes (a step's reductions, the tied gradients'
    sum, clipping, an evaluation's loss): a stage process that died mid-collective shows as a
    broken connection or a timeout in the backend's many-line error; it is raised instead as a
    :class:`PipelineTimeout` that names this stage and what was under way, as the transport's
    own receives do. Any other error passes through unchanged."""
    try:
        yield
    except PipelineTimeout:
        raise
    except RuntimeError as exc:
        text = str(exc)
        if any(s in text for s in _CLOSED):
            raise PipelineTimeout(
                f"stage {rank}: the connection closed during {what}: a stage process has died (the first "
                f"error or 'killed' message above names it)"
            ) from None
        if any(s in text for s in _TIMED_OUT):
            raise PipelineTimeout(
                f"stage {rank}: {what} timed out: a stage process has most likely failed, see its error. "
                f"({text.splitlines()[0] if text else ''})"
            ) from exc
        raise


@dataclass
class LinkCounters:
    bytes_sent: dict[str, int] = field(
        default_factory=lambda: {"fwd": 0, "bwd": 0}
    )  # payload bytes per direction
    emulated_seconds: float = 0.0  # time the emulated link added (bandwidth_mbps)


class PendingRecv:
    def __init__(
        self, links: StageLinks, work, buffer: torch.Tensor, device: torch.device, what: str, src: int
    ):
        self.links, self.work, self.buffer, self.device, self.what, self.src = (
            links,
            work,
            buffer,
            device,
            what,
            src,
        )

    def wait(self) -> torch.Tensor:
        with self.links.timeline.span(f"wait for {self.what}", "wait", src=self.src):
            self.links._wait(self.work, self.what, self.src)
        return (
            self.buffer.to(self.device, non_blocking=False)
            if self.buffer.device != self.device
            else self.buffer
        )


class StageLinks:
    """The sends and receives of one rank.

    Args:
        rank: This rank (= stage).
        groups: Process group per direction, {'fwd': ..., 'bwd': ...}.
        device: Where compute happens (payloads arrive there).
        timeout_s: Seconds any receive may wait.
        bandwidth_mbps: Emulated link bandwidth (None = no emulation).
        stage_through_host: Copy payloads to host memory before sending (gloo with CUDA tensors).
        wrap_from: The last stage when it feeds stage 0 (placement 'v'): the messages of that
            wrap-around boundary (forward from it, backward from stage 0) travel on the groups
            'wrap_fwd' and 'wrap_bwd'.
    """

    def __init__(
        self,
        rank: int,
        groups: dict,
        device: torch.device,
        timeout_s: float,
        bandwidth_mbps: float | None = None,
        stage_through_host: bool = False,
        wrap_from: int | None = None,
    ) -> None:
        self.rank = rank
        self.wrap_from = wrap_from
        self.groups = groups
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.bandwidth_mbps = bandwidth_mbps
        self.stage_through_host = stage_through_host
        self.counters = LinkCounters()
        self._sends: list[tuple[object, torch.Tensor]] = []
        self.timeline = NO_TIMELINE  # the strategy's, when it records one

    def _group(self, direction: str, src: int):
        """The process group of a message from stage ``src``."""
        wraps = self.wrap_from is not None and src == (self.wrap_from if direction == "fwd" else 0)
        return self.groups[f"wrap_{direction}" if wraps else direction]

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        return t.cpu() if self.stage_through_host and t.device.type != "cpu" else t.contiguous()

    def _emulate(self, nbytes: int) -> None:
        if self.bandwidth_mbps:
            seconds = nbytes * 8 / (self.bandwidth_mbps * 1e6)
            time.sleep(seconds)
            self.counters.emulated_seconds += seconds

    def send(self, data: torch.Tensor, dst: int, direction: str, tag: int) -> None:
        """Post an asynchronous send of a uint8 payload; its bytes are counted."""
        assert data.dtype == torch.uint8 and data.dim() == 1
        wire = self._wire(data)
        self._emulate(wire.numel())
        work = dist.isend(wire, dst=dst, group=self._group(direction, self.rank), tag=tag)
        self._sends.append((work, wire))
        self.counters.bytes_sent[direction] += wire.numel()
        self.timeline.instant(f"send {direction} tag {tag}", "send", dst=dst, bytes=wire.numel())

    def recv(self, nbytes: int, src: int, direction: str, tag: int, what: str) -> PendingRecv:
        """Post a receive of ``nbytes``; ``.wait()`` returns the bytes (or raises on timeout)."""
        on_host = self.stage_through_host and self.device.type != "cpu"
        buffer = torch.empty(nbytes, dtype=torch.uint8, device="cpu" if on_host else self.device)
        work = dist.irecv(buffer, src=src, group=self._group(direction, src), tag=tag)
        self.timeline.instant(f"receive posted: {what}", "recv", src=src, bytes=nbytes)
        return PendingRecv(self, work, buffer, self.device, what, src)

    def send_header(
        self, shape: tuple[int, ...], dtype: torch.dtype, dst: int, direction: str, tag: int
    ) -> None:
        if len(shape) > 8:
            raise ValueError(f"pipeline messages may have at most 8 dimensions, got shape {tuple(shape)}")
        if dtype not in _DTYPES:
            raise ValueError(f"pipeline messages of dtype {dtype} are not supported; allowed: {_DTYPES}")
        header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
        header[0] = len(shape)
        header[1 : 1 + len(shape)] = torch.tensor(shape, dtype=torch.int64)
        header[9] = _DTYPES.index(dtype)
        wire = header.view(torch.uint8).to(self.device if not self.stage_through_host else "cpu")
        work = dist.isend(wire, dst=dst, group=self._group(direction, self.rank), tag=tag)
        self._sends.append((work, wire))

    def recv_header(
        self, src: int, direction: str, tag: int, what: str
    ) -> tuple[tuple[int, ...], torch.dtype]:
        data = self.recv(_HEADER_LEN * 8, src, direction, tag, what).wait().cpu()
        header = data.view(torch.int64)
        ndim = int(header[0])
        return tuple(int(v) for v in header[1 : 1 + ndim]), _DTYPES[int(header[9])]

    def _wait(self, work, what: str, src: int) -> None:
        start = time.perf_counter()
        try:
            work.wait(self.timeout)
        except RuntimeError as exc:
            if time.perf_counter() - start < 0.9 * self.timeout_s:  # not a timeout: the link broke
                raise PipelineTimeout(
                    f"stage {self.rank}: the connection closed while it waited for {what} from stage {src}: a "
                    f"stage process has died (the first error or 'killed' message above names it)"
                ) from None
            raise PipelineTimeout(
                f"stage {self.rank}: no {what} from stage {src} within {self.timeout_s:g} s (timeout_s); "
                f"that stage has most likely failed, see its error. ({exc})"
            ) from exc

    def finish_sends(self) -> None:
        """Wait for every send posted so far."""
        with self.timeline.span("wait for the sends to be taken", "wait", sends=len(self._sends)):
            self._finish_sends()

    def _finish_sends(self) -> None:
        for work, _ in self._sends:
            try:
                work.wait(self.timeout)
            except RuntimeError as exc:
                raise PipelineTimeout(
                    f"stage {self.rank}: a send was not received within {self.timeout_s:g} s (timeout_s); "
                    f"the receiving stage has most likely failed, see its error. ({exc})"
                ) from exc
        self._sends.clear()
