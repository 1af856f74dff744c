"""``ClappingStrategy``: pipeline-parallel training in Lightning, with compressed messages between
stages (Clapping spec sections 1 to 6).

One process per stage. ``setup`` splits the LightningModule through the stage protocol and frees
the other stages' parts. A training step runs the whole micro-batch schedule (GPipe or 1F1B)
inside ``training_step``: Lightning's automatic optimization zeroes the gradients after
``training_step`` and before ``backward``, so the gradients the schedule produced are set aside
there and put back in ``backward``. Every rank then sees the same loss (sent from the last stage),
the same logged statistics and the same decisions. Validation and test run through the pipeline
with exact messages. Gradient-norm clipping uses the norm over all stages.

Checkpoints hold the full model (gathered on rank 0; loadable by a single-process Trainer), the
optimizer state of every stage, the method buffers of every rank and the lazy sampler's step.
"""

from __future__ import annotations

import math
import time
import types
import warnings
from collections import OrderedDict
from datetime import timedelta
from typing import Any, Literal, Optional

import torch
import torch.distributed as dist
from lightning.fabric.utilities.distributed import _distributed_is_initialized, _init_dist_connection, _sync_ddp_if_available
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from torch.utils.data import DataLoader

from repro.data.lazy_sampler import LazyBatchSampler

from .launcher import PipelineMultiProcessingLauncher
from .methods import ChannelCodec, MessageContext
from .model_split import LocalModel, keep_local_parts
from .options import PipelineOptions
from .p2p import StageLinks
from .runner import NonFiniteError, StageRunner, StepStats, split_batch
from .sample_buffers import SampleBuffers
from .schedule import stage_schedule
from .stage_protocol import StageSplit, check_stage_protocol, layers_per_stage
from .watchdog import exit_when_parent_dies

_STAT_FIELDS = ("payload_bytes", "raw_bytes", "rel_error_sum", "messages", "nonfinite")


class ClappingStrategy(ParallelStrategy):
    """Pipeline-parallel training with compressed activations and gradients (Clapping).

    Args:
        micro_batches: Micro-batches per batch (M); the training batch size must divide by it.
        schedule: 'gpipe' (all forwards, then all backwards) or '1f1b'.
        method: none | direct | ef21 | aqsgd | clapping_fc | clapping_fu.
        fwd_compressor: Compressor of activations: identity, fp16, bf16, topk(r), randk(r), quant(bits).
        bwd_compressor: Compressor of activation gradients (same choices).
        p: Lazy sampling: probability that a step draws a fresh batch, in (0, 1]; 1 = ordinary sampling.
        stages: Pipeline stages K; None = the number of processes. Must equal devices x nodes.
        layers_per_stage: Explicit layer count of each stage; None = as even as possible.
        sampler_seed: Seed of the shuffle and of the lazy coins; None = the datamodule's shuffle_seed (or 0).
        compression_seed: Base seed of the per-message seeds (randk entries, stochastic rounding).
        warmup_epochs: AQ-SGD: epochs sent uncompressed while its per-sample buffers fill.
        aqsgd_num_samples: AQ-SGD: rows per buffer (one more than the largest sample id); None = training set size.
        aqsgd_storage: AQ-SGD buffers in 'memory' or in a disk 'memmap' under aqsgd_dir.
        aqsgd_dir: Directory of AQ-SGD's memmap files.
        aqsgd_checkpoint_buffers: AQ-SGD: save its per-sample rows in checkpoints (N x T x d per boundary end,
            gigabytes); off (default): a resumed run refills them, sending each sample's next message exact.
        sample_id_key: Batch key of the sample ids AQ-SGD keys its buffers by.
        bandwidth_mbps: Emulated link bandwidth in Mbit/s (each send waits bytes*8/bandwidth); None = off.
        timeout_s: Seconds any receive or collective may wait; a rank whose neighbour died fails after it.
        process_group_backend: 'gloo' or 'nccl'; None = gloo on CPU, nccl on CUDA.
        start_method: How processes start: 'popen' (CLI, torchrun, SLURM), 'spawn' or 'fork'.
    """

    strategy_name = "clapping"

    def __init__(
        self,
        micro_batches: int = 4,
        schedule: Literal["gpipe", "1f1b"] = "gpipe",
        method: str = "none",
        fwd_compressor: str = "identity",
        bwd_compressor: str = "identity",
        p: float = 1.0,
        stages: Optional[int] = None,
        layers_per_stage: Optional[list[int]] = None,
        sampler_seed: Optional[int] = None,
        compression_seed: int = 0,
        warmup_epochs: int = 1,
        aqsgd_num_samples: Optional[int] = None,
        aqsgd_storage: Literal["memory", "memmap"] = "memory",
        aqsgd_dir: Optional[str] = None,
        aqsgd_checkpoint_buffers: bool = False,
        sample_id_key: str = "sample_id",
        bandwidth_mbps: Optional[float] = None,
        timeout_s: float = 300.0,
        nonfinite: Literal["raise", "skip"] = "raise",
        process_group_backend: Optional[str] = None,
        start_method: Literal["popen", "spawn", "fork"] = "popen",
        accelerator=None,
        parallel_devices=None,
        cluster_environment=None,
        checkpoint_io=None,
        precision_plugin=None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.options = PipelineOptions(
            stages=stages,
            layers_per_stage=layers_per_stage,
            micro_batches=micro_batches,
            schedule=schedule,
            method=method,
            fwd_compressor=fwd_compressor,
            bwd_compressor=bwd_compressor,
            p=p,
            sampler_seed=sampler_seed,
            compression_seed=compression_seed,
            warmup_epochs=warmup_epochs,
            aqsgd_num_samples=aqsgd_num_samples,
            aqsgd_storage=aqsgd_storage,
            aqsgd_dir=aqsgd_dir,
            aqsgd_checkpoint_buffers=aqsgd_checkpoint_buffers,
            sample_id_key=sample_id_key,
            bandwidth_mbps=bandwidth_mbps,
            timeout_s=timeout_s,
            nonfinite=nonfinite,
        )
        if process_group_backend not in (None, "gloo", "nccl"):
            raise ValueError(f"strategy process_group_backend={process_group_backend!r}: allowed None, 'gloo', 'nccl'")
        if start_method not in ("popen", "spawn", "fork"):
            raise ValueError(f"strategy start_method={start_method!r}: allowed 'popen', 'spawn', 'fork'")
        self._process_group_backend = process_group_backend
        self._start_method = start_method
        self._num_nodes = 1
        self.split: StageSplit | None = None
        self.local: LocalModel | None = None
        self.runner: StageRunner | None = None
        self.codecs: dict[tuple[str, str], ChannelCodec] = {}
        self.sampler: LazyBatchSampler | None = None
        self.steps_done = 0  # training steps (batches) run so far
        self.totals: dict[str, float] = {}  # cumulative statistics (identical on every rank)
        self._groups: dict[str, Any] = {}
        self._tied_process_groups: dict[tuple[int, ...], Any] = {}
        self._stashed_grads: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._pending: dict[str, Any] = {}
        self._fit_start: float | None = None
        self._previous_ids: torch.Tensor | None = None

    # ------------------------------------------------------------------ processes
    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def num_stages(self) -> int:
        return self.world_size

    @property
    def is_distributed(self) -> bool:
        # every stage sees the same batches: no DistributedSampler
        return False

    @property
    def distributed_sampler_kwargs(self) -> None:
        return None

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if self._start_method == "popen":
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)
        else:
            self._launcher = PipelineMultiProcessingLauncher(self, start_method=self._start_method)

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    def _backend(self) -> str:
        if self._process_group_backend:
            return self._process_group_backend
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
        if self._start_method in ("spawn", "fork"):
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
        if not _distributed_is_initialized():
            _init_dist_connection(self.cluster_environment, backend, **kwargs)
        # one group per direction (ordering on NCCL), and a gloo group for Python objects
        self._groups = {
            "fwd": dist.new_group(backend=backend, timeout=timeout),
            "bwd": dist.new_group(backend=backend, timeout=timeout),
            "objects": dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD,
        }

    # ------------------------------------------------------------------ model split
    def setup(self, trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        module = self.lightning_module
        check_stage_protocol(module)
        precision = getattr(self.precision_plugin, "precision", "32-true")
        if str(precision) in ("16-mixed", "16"):
            raise ValueError(
                f"trainer.precision={precision!r} is not supported by strategy='clapping' (it needs a gradient "
                f"scaler across stages); use '32-true', 'bf16-mixed' or 'bf16-true'"
            )
        parts = module.pipeline_parts()
        counts = layers_per_stage(len(parts.layers), self.num_stages, self.options.layers_per_stage)
        self.split = StageSplit(self.global_rank, self.num_stages, counts, parts)
        self.local = keep_local_parts(module, self.split)
        self.precision_plugin.convert_module(module)
        self.model_to_device()
        self._setup_tied_parameters()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self._drop_foreign_from_optimizers()
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)
        self.precision_plugin.clip_grad_by_norm = types.MethodType(_make_global_clip(self), self.precision_plugin)
        links = StageLinks(
            self.global_rank,
            self._groups,
            self.root_device,
            self.options.timeout_s,
            self.options.bandwidth_mbps,
            stage_through_host=self._backend() == "gloo" and self.root_device.type != "cpu",
        )
        self.runner = StageRunner(self.split, links, self.codecs, module.pipeline_input, module.pipeline_loss)

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def _setup_tied_parameters(self) -> None:
        assert self.local is not None
        for stages in self.local.tied_groups:  # every rank creates every group, in the same order
            self._tied_process_groups[stages] = dist.new_group(ranks=list(stages), backend=self._backend())
        for tied in self.local.tied:  # start from the lowest stage's values
            dist.broadcast(tied.param.data, src=tied.stages[0], group=self._tied_process_groups[tied.stages])

    def _drop_foreign_from_optimizers(self) -> None:
        keep = {id(p) for p in self.lightning_module.parameters() if p.numel() > 0}
        for optimizer in self.optimizers:
            opt = optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
            for group in opt.param_groups:
                group["params"] = [p for p in group["params"] if id(p) in keep]

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or trainer.state.stage != RunningStage.TRAINING or not isinstance(dataloader, DataLoader):
            return dataloader
        batch_size = dataloader.batch_size or getattr(dataloader.batch_sampler, "batch_size", None)
        if batch_size is None:
            raise ValueError("strategy='clapping' needs a training DataLoader with a batch_size")
        m = self.options.micro_batches
        if batch_size % m:
            raise ValueError(
                f"strategy micro_batches={m}: the training batch size {batch_size} does not divide into {m} equal "
                f"micro-batches; choose a batch size divisible by micro_batches"
            )
        seed = self.options.sampler_seed
        if seed is None:
            seed = getattr(trainer.datamodule, "shuffle_seed", 0) if trainer.datamodule is not None else 0
        self.sampler = LazyBatchSampler(len(dataloader.dataset), batch_size, self.options.p, int(seed), self.steps_done)
        if "sampler" in self._pending:
            self.sampler.load_state_dict(self._pending.pop("sampler"))
            self.sampler.set_step(self.steps_done)
        self._build_codecs(len(dataloader.dataset))
        workers = dataloader.num_workers
        return DataLoader(
            dataloader.dataset,
            batch_sampler=self.sampler,
            num_workers=workers,
            collate_fn=dataloader.collate_fn,
            pin_memory=dataloader.pin_memory,
            worker_init_fn=dataloader.worker_init_fn,
            persistent_workers=dataloader.persistent_workers if workers > 0 else False,
        )

    def _build_codecs(self, dataset_size: int) -> None:
        if self.codecs:
            return
        opts, rank, k = self.options, self.global_rank, self.num_stages
        n_samples = opts.aqsgd_num_samples or dataset_size
        ends = []  # (direction, role, boundary)
        if rank < k - 1:
            ends += [("fwd", "send", rank), ("bwd", "recv", rank)]
        if rank > 0:
            ends += [("fwd", "recv", rank - 1), ("bwd", "send", rank - 1)]
        for direction, role, boundary in ends:
            buffers = None
            if opts.method == "aqsgd" and direction == "fwd":
                buffers = SampleBuffers(n_samples, opts.aqsgd_storage, opts.aqsgd_dir, f"aqsgd-b{boundary}-{role}")
            self.codecs[(direction, role)] = ChannelCodec(
                opts.method, opts.compressors[direction], boundary, direction, opts.compression_seed, buffers
            )
        if "codecs" in self._pending:
            for key, state in self._pending.pop("codecs").items():
                self.codecs[tuple(key.split(":"))].load_state_dict(state, self.root_device)

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any):
        batch = args[0] if args else kwargs["batch"]
        trainer = self.lightning_module.trainer
        opts = self.options
        if self._fit_start is None:
            self._fit_start = time.perf_counter()
        step = self.steps_done
        fresh = self.sampler.is_fresh(step) if self.sampler is not None else True
        ids = batch.get(opts.sample_id_key) if isinstance(batch, dict) else None
        self._check_reuse(ids, fresh, step)
        if opts.method == "aqsgd" and ids is None:
            raise ValueError(
                f"strategy method='aqsgd' keys its buffers by sample id, but the batch has no {opts.sample_id_key!r} "
                f"entry (set sample_id_key)"
            )
        micro = split_batch(batch, opts.micro_batches, equal=True)
        warmup = trainer.current_epoch < opts.warmup_epochs
        contexts = [
            MessageContext(step, fresh, warmup, mb.get(opts.sample_id_key) if isinstance(mb, dict) else None)
            for mb in micro
        ]
        schedule = stage_schedule(opts.schedule, self.global_rank, self.num_stages, len(micro))
        scale = 1.0 / (len(micro) * trainer.accumulate_grad_batches)
        params = [p for p in self.lightning_module.parameters() if p.requires_grad]
        earlier = [(p, p.grad) for p in params]
        for p in params:
            p.grad = None
        snapshots = None
        if opts.nonfinite == "skip":
            snapshots = {key: codec.snapshot(ids) for key, codec in self.codecs.items()}
        with self.precision_plugin.train_step_context():
            loss_sum, stats = self.runner.train_step(micro, contexts, schedule, scale)
        self._sum_tied_gradients()
        self._stashed_grads = [(p, p.grad) for p in params if p.grad is not None]
        for p, g in earlier:
            p.grad = g
        loss = self._reduce_step(loss_sum, len(micro), stats)
        faults = self._nonfinite_faults()
        if faults:
            where = "; ".join(faults)
            if opts.nonfinite == "raise":
                raise NonFiniteError(
                    f"strategy='clapping': non-finite values (NaN or inf) at training step {step}: {where}. "
                    f"Training stopped before the optimizer step (set nonfinite='skip' to skip such steps)"
                )
            # skip: no update from this step, and the codecs as they were before it
            self._stashed_grads = []
            for key, codec in self.codecs.items():
                codec.restore(snapshots[key])
            self.totals["skipped_steps"] = self.totals.get("skipped_steps", 0.0) + 1
            if self.global_rank == 0:
                warnings.warn(f"strategy='clapping': skipped training step {step} (non-finite values: {where})")
        self.steps_done += 1
        self._log_step(loss, batch, fresh)
        return loss

    def _nonfinite_faults(self) -> list[str]:
        """Where this step's NaN or inf came from (the same list on every rank)."""
        faults = []
        for b in range(self.num_stages - 1):
            for direction, what in (("fwd", "activations"), ("bwd", "gradients")):
                if self._step_stats.get(f"nonfinite/b{b}_{direction}", 0.0) > 0:
                    src, dst = (b, b + 1) if direction == "fwd" else (b + 1, b)
                    faults.append(f"the {direction} message ({what}) of boundary {b}, stage {src} -> {dst}")
        if not math.isfinite(self._step_stats["loss"]):
            faults.append(f"the loss (stage {self.num_stages - 1})")
        return faults

    def backward(self, closure_loss: torch.Tensor, optimizer, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The schedule already ran backward; put its gradients back after Lightning's zero_grad."""
        module = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        for p, g in self._stashed_grads:
            p.grad = g if p.grad is None else p.grad + g
        self._stashed_grads = []
        return self.precision_plugin.post_backward(closure_loss, module)

    def _sum_tied_gradients(self) -> None:
        for tied in self.local.tied:
            p = tied.param
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self._tied_process_groups[tied.stages])

    def _check_reuse(self, ids: torch.Tensor | None, fresh: bool, step: int) -> None:
        if ids is None:
            return
        if not fresh and self._previous_ids is not None and not torch.equal(ids.cpu(), self._previous_ids):
            raise RuntimeError(
                f"lazy sampling: step {step} should repeat the previous batch but got other sample ids; the training "
                f"DataLoader was replaced after the strategy set its sampler"
            )
        self._previous_ids = ids.detach().cpu().clone()

    def _evaluate(self, split_name: str, batch: Any) -> torch.Tensor:
        micro = split_batch(batch, self.options.micro_batches, equal=False)
        with self.precision_plugin.val_step_context():
            total, count = self.runner.eval_step(micro)
        vec = torch.zeros(2, dtype=torch.float64, device=self.root_device)
        if total is not None:
            vec[0], vec[1] = float(total), float(count)
        dist.all_reduce(vec)
        loss = (vec[0] / vec[1]).float()
        log = getattr(self.lightning_module, "pipeline_log", None)
        if callable(log):
            log(split_name, loss, batch)
        else:
            self.lightning_module.log(f"{split_name}/loss", loss, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, *args: Any, **kwargs: Any):
        return self._evaluate("val", args[0] if args else kwargs["batch"])

    def test_step(self, *args: Any, **kwargs: Any):
        return self._evaluate("test", args[0] if args else kwargs["batch"])

    def predict_step(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(
            "strategy='clapping' does not predict; load its checkpoint (the full model) into a single-process "
            "Trainer for predictions"
        )

    # ------------------------------------------------------------------ statistics and logging
    def _reduce_step(self, loss_sum: torch.Tensor | None, micro_batches: int, stats: StepStats) -> torch.Tensor:
        """One all-reduce carries the loss and every rank's statistics to every rank."""
        k, rank = self.num_stages, self.global_rank
        n_fields = len(_STAT_FIELDS)
        boundary_block = 2 * n_fields
        size = 1 + (k - 1) * boundary_block + 3 * k
        vec = torch.zeros(size, dtype=torch.float64)
        if loss_sum is not None:
            vec[0] = float(loss_sum) / micro_batches

        def put(boundary: int, direction: str, d) -> None:
            base = 1 + boundary * boundary_block + (0 if direction == "fwd" else n_fields)
            for i, name in enumerate(_STAT_FIELDS):
                vec[base + i] = float(getattr(d, name))

        if rank < k - 1:
            put(rank, "fwd", stats.fwd)
        if rank > 0:
            put(rank - 1, "bwd", stats.bwd)
        tail = 1 + (k - 1) * boundary_block
        vec[tail + rank] = float(sum(c.buffer_nbytes for c in self.codecs.values()))
        vec[tail + k + rank] = self.runner.links.counters.emulated_seconds
        vec[tail + 2 * k + rank] = float(self.local.owned_bytes)
        vec = vec.to(self.root_device)
        dist.all_reduce(vec)
        vec = vec.cpu()
        step_stats: dict[str, float] = {}
        for b in range(k - 1):
            for j, direction in enumerate(("fwd", "bwd")):
                base = 1 + b * boundary_block + j * n_fields
                values = dict(zip(_STAT_FIELDS, vec[base : base + n_fields].tolist()))
                tag = f"b{b}_{direction}"
                step_stats[f"bytes/{tag}"] = values["payload_bytes"]
                step_stats[f"raw_bytes/{tag}"] = values["raw_bytes"]
                step_stats[f"rel_error/{tag}"] = values["rel_error_sum"] / max(values["messages"], 1)
                step_stats[f"nonfinite/{tag}"] = values["nonfinite"]
        step_stats["loss"] = float(vec[0])
        step_stats["bytes"] = sum(v for key, v in step_stats.items() if key.startswith("bytes/"))
        step_stats["raw_bytes"] = sum(v for key, v in step_stats.items() if key.startswith("raw_bytes/"))
        for key in list(step_stats):
            if key.startswith("bytes") or key.startswith("raw_bytes"):
                self.totals[key] = self.totals.get(key, 0.0) + step_stats[key]
        self._step_stats = step_stats
        self._buffer_bytes = vec[tail : tail + k].tolist()
        self._emulated = vec[tail + k : tail + 2 * k].tolist()
        self._param_bytes = vec[tail + 2 * k : tail + 3 * k].tolist()
        return vec[0].to(torch.float32).to(self.root_device)

    def _log_step(self, loss: torch.Tensor, batch: Any, fresh: bool) -> None:
        module = self.lightning_module
        log = getattr(module, "pipeline_log", None)
        if callable(log):
            log("train", loss, batch)
        else:
            module.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        s, t = self._step_stats, self.totals
        values: dict[str, float] = {}
        for key, value in s.items():
            if key.startswith("bytes") or key.startswith("rel_error"):
                values[f"pipe/{key}"] = value
        for key, value in t.items():
            if key.startswith("bytes"):
                values[f"pipe/bytes_total{key[5:]}"] = value
        values["pipe/compression_ratio"] = t["bytes"] / t["raw_bytes"] if t.get("raw_bytes") else 1.0
        values["pipe/compression_ratio_step"] = s["bytes"] / s["raw_bytes"] if s.get("raw_bytes") else 1.0
        for r, nbytes in enumerate(self._buffer_bytes):
            values[f"pipe/buffer_bytes/rank{r}"] = nbytes
        values["pipe/buffer_bytes_max"] = max(self._buffer_bytes)
        for r, seconds in enumerate(self._emulated):
            values[f"pipe/net_time_s/rank{r}"] = seconds
        values["pipe/net_time_s"] = max(self._emulated)
        for r, nbytes in enumerate(self._param_bytes):
            values[f"pipe/param_bytes/rank{r}"] = nbytes
        fresh_count = self.sampler.fresh_before(self.steps_done) if self.sampler is not None else self.steps_done
        values["pipe/skipped_steps"] = t.get("skipped_steps", 0.0)
        values["pipe/fresh_batches"] = fresh_count
        values["pipe/reused_batches"] = self.steps_done - fresh_count
        values["pipe/wall_s"] = time.perf_counter() - self._fit_start
        self._publish(values)

    def _publish(self, values: dict[str, float]) -> None:
        """Put the step's ``pipe/*`` scalars in ``trainer.callback_metrics`` (every step) and write
        them to the loggers on the steps Lightning writes ``train/loss`` (every
        ``log_every_n_steps``), at the same step number. ``self.log`` is not used: under cProfile each call
        cost about 1.5 ms in Lightning's result collection, 37 ms per step for 25 scalars."""
        trainer = self.lightning_module.trainer
        trainer.callback_metrics.update({k: torch.tensor(float(v)) for k, v in values.items()})
        n = trainer.log_every_n_steps
        if not trainer.loggers or not n or trainer.fit_loop._should_accumulate():
            return
        # Lightning increments this after the optimizer step, then logs at that value when
        # (value + 1) % log_every_n_steps == 0 (LoggerConnector.update_train_step_metrics)
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
        if (step + 1) % n == 0 or trainer.should_stop:
            if self.global_rank == 0:
                for logger in trainer.loggers:
                    logger.log_metrics({k: float(v) for k, v in values.items()}, step=step)

    # ------------------------------------------------------------------ collectives
    def barrier(self, name: Optional[str] = None) -> None:
        if _distributed_is_initialized():
            dist.barrier(group=self._groups.get("objects", dist.group.WORLD))

    def broadcast(self, obj, src: int = 0):
        if not _distributed_is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src, group=self._groups.get("objects", dist.group.WORLD))
        return box[0]

    def reduce(self, tensor, group: Optional[Any] = None, reduce_op="mean"):
        if isinstance(tensor, torch.Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def _gather(self, obj: Any) -> list[Any] | None:
        """Python objects from every rank, on rank 0 (None elsewhere)."""
        group = self._groups.get("objects", dist.group.WORLD)
        out = [None] * self.world_size if self.is_global_zero else None
        dist.gather_object(obj, out, dst=0, group=group)
        return out

    # ------------------------------------------------------------------ checkpoints
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full model's state dict on rank 0 (gathered from every stage)."""
        module = self.lightning_module
        full = module.state_dict()
        if self.local is None or self.world_size == 1:
            return full
        mine = {k: v.detach().cpu() for k, v in full.items() if k not in self.local.freed_keys}
        gathered = self._gather(mine)
        if not self.is_global_zero:
            return mine
        merged: OrderedDict[str, Any] = OrderedDict()
        for key in full:
            for part in gathered:
                if key in part:
                    merged[key] = part[key]
                    break
        return merged

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        opt = optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
        gathered = self._gather(opt.state_dict())
        return {"pipeline_stages": gathered} if self.is_global_zero else {}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        with_rows = self.options.aqsgd_checkpoint_buffers
        rank_state = {f"{d}:{r}": c.state_dict(with_rows) for (d, r), c in self.codecs.items()}
        gathered = self._gather(rank_state)
        if self.is_global_zero:
            checkpoint["clapping"] = {
                "num_stages": self.num_stages,
                "layers_per_stage": self.split.counts if self.split else None,
                "options": self.options.as_dict(),
                "steps_done": self.steps_done,
                "sampler": self.sampler.state_dict(self.steps_done) if self.sampler is not None else None,
                "codecs": gathered,
                "totals": dict(self.totals),
            }
            self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        self.barrier("save_checkpoint")

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> dict[str, Any]:
        checkpoint = self.checkpoint_io.load_checkpoint(checkpoint_path, weights_only=False)
        state = checkpoint.get("clapping")
        if state is not None:
            if state["num_stages"] != self.num_stages or (self.split and state["layers_per_stage"] != self.split.counts):
                raise ValueError(
                    f"checkpoint {checkpoint_path}: written by a {state['num_stages']}-stage pipeline with layers "
                    f"{state['layers_per_stage']} per stage; this run has {self.num_stages} stages with "
                    f"{self.split.counts if self.split else None}. Resume with the same stages, or load the full "
                    f"model with a single-process Trainer"
                )
            self.steps_done = int(state["steps_done"])
            self.totals = dict(state.get("totals", {}))
            if state.get("sampler") is not None:
                self._pending["sampler"] = state["sampler"]
            codecs = state["codecs"][self.global_rank] if state.get("codecs") else {}
            if self.codecs:
                for key, codec_state in codecs.items():
                    self.codecs[tuple(key.split(":"))].load_state_dict(codec_state, self.root_device)
            else:
                self._pending["codecs"] = codecs
        return checkpoint

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        module = self.lightning_module
        state = checkpoint["state_dict"]
        freed = self.local.freed_keys if self.local is not None else set()
        mine = {k: v for k, v in state.items() if k not in freed}
        result = module.load_state_dict(mine, strict=False)
        missing = [k for k in result.missing_keys if k not in freed]
        if strict and missing:
            raise KeyError(f"checkpoint lacks this stage's entries: {missing[:5]}")

    def load_optimizer_state_dict(self, checkpoint) -> None:
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            if "pipeline_stages" in state:
                state = state["pipeline_stages"][self.global_rank]
            optimizer.load_state_dict(state)
        _optimizers_to_device(self.optimizers, self.root_device)

    # ------------------------------------------------------------------ inspection (tests, tools)
    def buffer_digests(self) -> dict[str, str]:
        """{'b<boundary>_<direction>_<role>': sha256 of the buffers} of this rank's channel ends."""
        return {f"b{c.boundary}_{d}_{r}": c.digest() for (d, r), c in self.codecs.items()}

    def teardown(self) -> None:
        for codec in self.codecs.values():
            if codec.sample_buffers is not None:
                codec.sample_buffers.close()
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        for name, start in (("clapping", "popen"), ("clapping_spawn", "spawn"), ("clapping_fork", "fork")):
            if name not in strategy_registry:
                strategy_registry.register(
                    name, cls, description=f"Clapping pipeline-parallel strategy (start_method '{start}')", start_method=start
                )


def _make_global_clip(strategy: ClappingStrategy):
    """Gradient-norm clipping over all stages (a tied parameter counts once)."""

    def clip_grad_by_norm(self, optimizer, clip_val) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        device = strategy.root_device
        sq = torch.zeros((), dtype=torch.float64, device=device)
        for p in params:
            if id(p) not in strategy.local.secondary:
                sq += p.grad.detach().double().pow(2).sum()
        dist.all_reduce(sq)
        total = sq.sqrt().float()
        coef = torch.clamp(float(clip_val) / (total + 1e-6), max=1.0)
        for p in params:
            p.grad.detach().mul_(coef.to(p.grad.device, p.grad.dtype))

    return clip_grad_by_norm
