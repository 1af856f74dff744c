"""One process per pipeline stage: the ranks, how they are launched (Lightning's launchers through
``compat``), the process groups (one per message direction, and a gloo group for Python objects),
the collectives Lightning asks a strategy for, and a watchdog that ends a rank whose launcher died."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from repro import lightning_compat as compat
from repro.cores import threads_per_process

from ..options import PipelineOptions
from ..watchdog import exit_when_parent_dies
from .rendezvous import choose_gloo_interface, rendezvous_failed
from .run_checks import check_pipeline_config


class StageProcesses(ParallelStrategy):
    """The process side of the pipeline strategy (``ClappingStrategy`` adds the model, data and steps)."""

    options: PipelineOptions
    _groups: dict[str, Any]
    _num_nodes: int
    check_config = staticmethod(check_pipeline_config)  # a run's config, checked before its processes start

    # the ranks as DDPStrategy has them: one process per device, num_nodes machines
    root_device = DDPStrategy.root_device
    num_nodes = DDPStrategy.num_nodes
    num_processes = DDPStrategy.num_processes
    set_world_ranks = DDPStrategy.set_world_ranks

    @property
    def num_stages(self) -> int:
        return self.world_size

    @property
    def is_distributed(self) -> bool:
        return False  # every stage sees the same batches: no DistributedSampler

    @property
    def distributed_sampler_kwargs(self) -> None:
        return None

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @property
    def object_group(self):
        """The gloo group that carries Python objects (checkpoint state)."""
        return self._groups.get("objects", dist.group.WORLD)

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        external = self.cluster_environment.creates_processes_externally
        if external and self.options.start_method in ("fork", "spawn"):
            raise ValueError(
                f"strategy start_method={self.options.start_method!r}, but {type(self.cluster_environment).__name__} "
                f"(torchrun, srun) already started every process: each would start {self.num_processes} more. Use "
                f"start_method: popen (it launches nothing when the processes exist)"
            )
        if self.options.start_method == "popen":
            launcher = compat.script_launcher(self.cluster_environment, self.num_processes, self.num_nodes)
        else:
            launcher = compat.FullModelLauncher(self, start_method=self.options.start_method)
        compat.set_launcher(self, launcher)

    def _backend(self) -> str:
        if self.options.process_group_backend:
            return self.options.process_group_backend
        return "nccl" if self.root_device.type == "cuda" else "gloo"

    def setup_environment(self) -> None:
        stages = self.options.stages
        if stages is not None and stages != self.num_nodes * self.num_processes:
            raise ValueError(
                f"strategy stages={stages}, but the run has {self.num_nodes * self.num_processes} processes "
                f"(devices={self.num_processes} x num_nodes={self.num_nodes}); the pipeline needs one process per "
                f"stage, so set trainer.devices to {stages} (or leave stages unset)"
            )
        super().setup_environment()
        self.set_world_ranks()
        self._share_cores()
        if self.options.start_method in ("spawn", "fork"):
            exit_when_parent_dies(f"rank {self.global_rank}", "the main process that started the ranks")
        elif self.local_rank > 0:  # popen: rank 0 of this node started this rank (torchrun: its agent)
            exit_when_parent_dies(f"rank {self.global_rank}", "rank 0 of this node, which launched it")
        backend = self._backend()
        timeout = timedelta(seconds=self.options.timeout_s)
        kwargs: dict[str, Any] = {"timeout": timeout}
        if backend == "nccl":
            devices = [str(d) for d in self.parallel_devices or []]
            if len(set(devices)) < len(devices):
                raise ValueError(
                    f"process_group_backend='nccl' needs one GPU per stage, but stages share devices {devices}; "
                    f"use process_group_backend='gloo' (payloads staged through host memory) to put several "
                    f"stages on one GPU"
                )
            kwargs["device_id"] = self.root_device
        line = choose_gloo_interface()  # several machines: the interface that reaches MASTER_ADDR
        if line and self.local_rank == 0:
            print(f"[clapping] node {self.node_rank}: {line}", file=sys.stderr, flush=True)
        try:
            if not dist.is_initialized():
                compat.init_process_group(self.cluster_environment, backend, **kwargs)
            _release_at_exit()  # whoever made the default group: this strategy's groups are its own
            _HOLDERS.add(self)
            # one group per direction (ordering on NCCL), and a gloo group for Python objects; with
            # placement 'v' the wrap-around boundary (last stage -> stage 0) has its own two: gloo
            # carries one message at a time per connection, so at K = 2 the two directions of a
            # group would take turns
            self._groups = {
                "fwd": dist.new_group(backend=backend, timeout=timeout),
                "bwd": dist.new_group(backend=backend, timeout=timeout),
                "objects": dist.new_group(backend="gloo", timeout=timeout)
                if backend != "gloo"
                else dist.group.WORLD,
            }
            if self.options.placement in ("v", "auto"):  # auto: decided at setup, from the model
                for name in ("wrap_fwd", "wrap_bwd"):
                    self._groups[name] = dist.new_group(backend=backend, timeout=timeout)
        except (RuntimeError, TimeoutError) as exc:  # gloo's and the store's errors are many lines
            raise rendezvous_failed(exc, self.global_rank) from None

    def release_groups(self) -> None:
        """Drop this strategy's references to its process groups (at the rank's exit, after
        ``destroy_process_group``): the last reference gone, a group's threads are joined."""
        self._groups.clear()  # in place: the stage links and the tied sums hold the same dict

    def teardown(self) -> None:
        module = self.lightning_module
        if module is None or not any(t.is_meta for t in (*module.parameters(), *module.buffers())):
            super().teardown()
            return
        # A rank that stopped before it read its stage (the process group did not form, say) holds a
        # model on the meta device: Lightning's teardown would copy it to the CPU and fail, burying
        # the error that stopped the run under a second one. The rest of its teardown, as it is.
        assert self.cluster_environment is not None and self.accelerator is not None
        self.cluster_environment.teardown()
        compat.optimizers_to_device(self.optimizers, torch.device("cpu"))
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()

    # ------------------------------------------------------------------ collectives
    def barrier(self, name: str | None = None) -> None:
        if dist.is_initialized():
            dist.barrier(group=self.object_group)

    def broadcast(self, obj, src: int = 0):
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src, group=self.object_group)
        return box[0]

    def reduce(self, tensor, group: Any | None = None, reduce_op="mean"):
        if not isinstance(tensor, torch.Tensor) or not dist.is_initialized():
            return tensor
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out / self.world_size if reduce_op in ("mean", "avg") else out

    def _share_cores(self) -> None:
        """The stage processes of a machine share its cores: each takes cores // processes torch
        threads (never more than it already has), unless OMP_NUM_THREADS chose for them."""
        if os.environ.get("OMP_NUM_THREADS"):
            return
        cores = os.cpu_count() or 1
        torch.set_num_threads(min(threads_per_process(self.num_processes, cores), torch.get_num_threads()))
        if self.global_rank == 0:
            rank_zero_info(
                f"[clapping] {self.num_processes} stage processes on {cores} cores: "
                f"{torch.get_num_threads()} torch thread(s) each (OMP_NUM_THREADS overrides)"
            )


_HOLDERS: weakref.WeakSet[StageProcesses] = weakref.WeakSet()  # the strategies that made groups here


@functools.cache
def _release_at_exit() -> None:
    """Register :func:`_release_process_groups` at exit, once per process."""
    atexit.register(_release_process_groups)


def _release_process_groups() -> None:
    """At the rank's exit, after every collective, while the interpreter is whole: destroy the
    process groups and drop every strategy's references to them, so that their gloo threads are
    joined here. ``destroy_process_group`` alone leaves a gloo group alive (its shutdown does
    nothing) while a strategy holds it; its threads then outlived the interpreter's finalization,
    and one that let go of a finished collective's tensors then aborted the rank now and then
    ('terminate called without an active exception', SIGABRT, after a run that had succeeded)."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # exiting anyway: nothing left to run on the groups
            dist.destroy_process_group()
    for strategy in list(_HOLDERS):
        strategy.release_groups()
