"""Where runs go: the one place that decides which device a run gets and how many torch threads
each of its processes uses. Pure functions of the machine's counts, so they are tested with
simulated machines.

- CPU: ``workers`` single-process runs side by side, each with ``cores // workers`` threads; a
  pipeline run of K stages takes the machine (K processes of ``cores // K`` threads).
- GPU: one slot per visible GPU and ``runs_per_gpu`` runs on each; a pipeline run of K stages
  takes K GPUs (one stage each, NCCL), or shares the GPUs over gloo when there are fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.cores import threads_per_process

ACCELERATORS = ("cpu", "gpu")


@dataclass(frozen=True)
class Slot:
    """Room for one run: its accelerator, devices, and torch threads per process."""

    accelerator: str  # 'cpu' or 'gpu'
    devices: tuple[int, ...]  # GPU indices (empty on CPU)
    threads: int  # torch threads of each of the run's processes

    @property
    def device(self) -> str:
        return "cpu" if self.accelerator == "cpu" else f"cuda:{self.devices[0]}"


def check_accelerator(accelerator: str, gpus: int | None = None) -> None:
    """Fail before any run when the settings ask for a GPU that this machine does not have."""
    if accelerator not in ACCELERATORS + ("cuda",):
        raise ValueError(f"accelerator={accelerator!r}: allowed 'cpu' or 'gpu'")
    gpus = torch.cuda.device_count() if gpus is None else gpus
    if accelerator in ("gpu", "cuda") and gpus == 0:
        raise ValueError(
            f"accelerator={accelerator!r} but no CUDA GPU is visible here; run this scale on a GPU "
            "machine, or give the settings accelerator: cpu (or --accelerator cpu) to run it on the CPU"
        )


def single_run_slots(
    accelerator: str, workers: int, runs_per_gpu: int = 1, cores: int | None = None, gpus: int | None = None
) -> list[Slot]:
    """The slots that single-process runs share: ``workers`` CPU slots, or ``runs_per_gpu`` per GPU."""
    for name, value in (("workers", workers), ("runs_per_gpu", runs_per_gpu)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    if accelerator == "cpu":
        return [Slot("cpu", (), threads_per_process(workers, cores)) for _ in range(workers)]
    gpus = torch.cuda.device_count() if gpus is None else gpus
    n = gpus * runs_per_gpu
    return [Slot("gpu", (i % gpus,), threads_per_process(n, cores)) for i in range(n)]


def pipeline_slots(
    accelerator: str, stages: int, cores: int | None = None, gpus: int | None = None
) -> tuple[list[Slot], str]:
    """The slots of pipeline runs of ``stages`` processes, and their process-group backend.

    CPU: one slot, the machine. GPU: one slot per ``stages`` GPUs (one stage per GPU, NCCL), so a
    node of G GPUs trains G // stages such runs side by side; with fewer GPUs than stages, one run
    at a time whose stages share the GPUs over gloo."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages={stages!r}: must be a positive integer")
    if accelerator == "cpu":
        return [Slot("cpu", (), threads_per_process(stages, cores))], "gloo"
    gpus = torch.cuda.device_count() if gpus is None else gpus
    if gpus >= stages:
        runs = gpus // stages
        threads = threads_per_process(runs * stages, cores)
        return [Slot("gpu", tuple(range(r * stages, (r + 1) * stages)), threads) for r in range(runs)], "nccl"
    return [Slot("gpu", tuple(i % gpus for i in range(stages)), threads_per_process(stages, cores))], "gloo"
