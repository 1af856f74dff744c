"""Train many runs: finished ones are reused, the others are trained on the slots of the machine
(``placement``), one progress line each.

Runs go to worker processes (spawned, so each has a clean torch; one per slot) when there is
more than one slot: single-process runs take one CPU share or one GPU share each (``runs_per_gpu``
per GPU), pipeline runs of K stages take K GPUs each. With one slot they are trained one after
another by the main process (a pipeline run on CPU takes the machine for its K stage processes).
Every run writes its own result file when it ends, so an interrupted experiment resumes where it
stopped.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager

from repro.stop import stop_if_interrupted

from .build import quiet_lightning, train_run
from .placement import Slot, check_accelerator, pipeline_slots, single_run_slots
from .spec import RunSpec
from .store import RunResult, load_finished


class Progress:
    """One line per run on stderr: ``[label] run i/N name status loss; elapsed, eta``.

    The estimate is by optimizer steps (runs of different lengths, such as profile runs and full
    runs, share one progress). ``extend`` adds runs that become known later (a later stage)."""

    def __init__(
        self, label: str, total_runs: int = 0, total_steps: int = 0, parallel: int = 1, quiet: bool = False
    ) -> None:
        self.label, self.total, self.total_steps, self.parallel, self.quiet = (
            label,
            total_runs,
            total_steps,
            parallel,
            quiet,
        )
        self.done = self.done_steps = self.trained = self.trained_steps = 0
        self.trained_s = 0.0
        self.start = time.perf_counter()

    def extend(self, runs: int, steps: int) -> None:
        self.total += runs
        self.total_steps += steps

    def note(self, message: str) -> None:
        if not self.quiet:
            print(f"[{self.label}] {message}", file=sys.stderr, flush=True)

    def update(self, spec: RunSpec, result: RunResult) -> None:
        self.done += 1
        self.done_steps += spec.steps
        if not result.reused:
            self.trained += 1
            self.trained_s += result.wall_s
            self.trained_steps += spec.steps
        if self.quiet:
            return
        status = "reused" if result.reused else f"trained in {result.wall_s:.1f} s"
        loss = result.val_curve[-1][1] if result.val_curve else float("nan")
        left = ""
        if self.trained_steps:
            seconds = (
                self.trained_s
                / self.trained_steps
                * max(0, self.total_steps - self.done_steps)
                / self.parallel
            )
            left = f", about {_duration(seconds)} left"
        elapsed = time.perf_counter() - self.start
        print(
            f"[{self.label}] run {self.done}/{max(self.total, self.done)} {spec.display}: {status}, "
            f"val loss {loss:.4f}; elapsed {_duration(elapsed)}{left}",
            file=sys.stderr,
            flush=True,
        )


def count_progress(label: str, what: str, quiet: bool = False):
    """``report(done, total)``: one line on stderr per unit of work done (``[label] i/N what;
    elapsed, about T left``), for long work that is not runs (e.g. a profile's evaluations)."""
    start = time.perf_counter()

    def report(done: int, total: int) -> None:
        if quiet:
            return
        elapsed = time.perf_counter() - start
        left = elapsed / done * (total - done) if done else 0.0
        print(
            f"[{label}] {done}/{total} {what}; elapsed {_duration(elapsed)}, about {_duration(left)} left",
            file=sys.stderr,
            flush=True,
        )

    return report


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


_WORKER: dict = {}


def _worker_init(cache_dir: str | None) -> None:
    quiet_lightning()
    _WORKER["cache_dir"] = cache_dir
    # Ctrl-C reaches the whole process group: a worker's unfinished run is dropped without a
    # traceback (the main process says what is kept; a rerun trains that run again)
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(128 + signum))


def _worker_train(spec: RunSpec, slot: Slot, fingerprint: str, backend: str | None) -> RunResult:
    return train_run(spec, slot, _WORKER["cache_dir"], backend, fingerprint)


class SlotPool:
    """Which slots are free: a run takes one, and gives it back when it ends, failed or not."""

    def __init__(self, slots: Sequence[Slot]) -> None:
        self.slots = list(slots)
        self.free = list(range(len(self.slots)))

    def acquire(self) -> int | None:
        return self.free.pop(0) if self.free else None

    def release(self, index: int) -> None:
        if index in self.free:
            raise ValueError(f"slot {index} released twice")
        self.free.append(index)


@contextmanager
def environment(env: dict[str, str] | None) -> Iterator[None]:
    """Extra environment variables for the processes started inside the block."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def train_all(
    specs: Sequence[RunSpec],
    accelerator: str = "cpu",
    workers: int = 1,
    cache_dir: str | None = None,
    progress: Progress | None = None,
    runs_per_gpu: int = 1,
    env: dict[str, str] | None = None,
) -> dict[str, RunResult]:
    """Train (or reuse) every run; returns ``spec.key -> result``. With ``env``, single-process runs
    train in worker processes started with those environment variables (e.g. another kernel path)."""
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"run names are not unique: {sorted({k for k in keys if keys.count(k) > 1})}")
    check_accelerator(accelerator)
    slots = single_run_slots(accelerator, workers, runs_per_gpu)
    progress = progress or Progress("runs", len(specs), sum(s.steps for s in specs), len(slots))
    results: dict[str, RunResult] = {}
    pending: list[tuple[RunSpec, str]] = []

    def finish(spec: RunSpec, result: RunResult) -> None:
        results[spec.key] = result
        progress.update(spec, result)

    for spec in specs:  # finished runs are reused here, without starting a worker for them
        fingerprint = spec.fingerprint()
        finished = load_finished(spec, fingerprint)
        if finished is not None:
            finish(spec, finished)
        else:
            pending.append((spec, fingerprint))
    pipelines = [(s, f) for s, f in pending if s.stages > 1]
    singles = [(s, f) for s, f in pending if s.stages == 1]
    quiet_lightning()
    if singles and (len(slots) > 1 and len(singles) > 1 or env):
        with environment(env):
            _train_in_workers(singles, SlotPool(slots), cache_dir, finish)
    else:
        for spec, fingerprint in singles:
            stop_if_interrupted()
            finish(spec, train_run(spec, slots[0], cache_dir, fingerprint=fingerprint))
    for stages in sorted({s.stages for s, _ in pipelines}):
        group = [(s, f) for s, f in pipelines if s.stages == stages]
        pipe_slots, backend = pipeline_slots(accelerator, stages)
        if len(pipe_slots) > 1 and len(group) > 1:
            _train_in_workers(group, SlotPool(pipe_slots), cache_dir, finish, backend)
            continue
        for spec, fingerprint in group:
            stop_if_interrupted()  # a Ctrl-C lost during a fork still ends the experiment here
            finish(spec, train_run(spec, pipe_slots[0], cache_dir, backend, fingerprint))
    return {key: results[key] for key in keys}


def _train_in_workers(
    jobs: list[tuple[RunSpec, str]],
    slots: SlotPool,
    cache_dir: str | None,
    finish: Callable[[RunSpec, RunResult], None],
    backend: str | None = None,
) -> None:
    """Each slot runs one job at a time in a spawned process. A failed run gives its slot back and
    the others go on; the failures are raised together at the end, naming the runs."""
    todo = list(jobs)
    running: dict[Future, tuple[RunSpec, int]] = {}
    failures: list[str] = []
    with ProcessPoolExecutor(
        max_workers=min(len(slots.slots), len(jobs)),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=(cache_dir,),
    ) as pool:
        while todo or running:
            while todo and slots.free:
                spec, fingerprint = todo.pop(0)
                slot = slots.acquire()
                running[pool.submit(_worker_train, spec, slots.slots[slot], fingerprint, backend)] = (
                    spec,
                    slot,
                )
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                spec, slot = running.pop(future)
                slots.release(slot)
                try:
                    finish(spec, future.result())
                except Exception as exc:  # the run failed: its slot is free again, the others go on
                    failures.append(
                        f"{spec.display}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    )
    if failures:
        raise RuntimeError(
            f"{len(failures)} run(s) failed (the others finished and are kept): " + "; ".join(failures)
        )
