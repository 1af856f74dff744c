"""``ClappingStrategy``: pipeline-parallel training in Lightning, with compressed messages between
stages (PROTOCOL.md §C1 to §C6).

One process per stage. ``setup`` cuts the LightningModule's model into stage parts (its stage
adapter, ``repro.pipeline.stage_parts``) and frees the other stages' parts. A training step runs
the whole micro-batch schedule (GPipe or 1F1B) inside ``training_step``: Lightning's automatic
optimization zeroes the gradients after ``training_step`` and before ``backward``, so the
gradients the schedule produced are set aside there and put back in ``backward``. Every rank then
sees the same loss (sent from the last stage), the same logged statistics and the same decisions.
Validation and test run through the pipeline with exact messages. Gradient-norm clipping uses the
norm over all stages. The options are the fields of :class:`~repro.pipeline.options.PipelineOptions`.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from repro import lightning_compat as compat
from repro.deferred_init import deferred_init
from repro.files import write_json_atomic
from repro.stop import STOP, install_stop

from .. import options as opt
from ..codecs import MessageContext
from ..model_split import LocalModel, clip_global_grad_norm, keep_local_parts
from ..options import OPTION_NAMES, PipelineOptions, options_doc
from ..runner import NonFiniteError, StageRunner, split_batch
from ..schedule import first_part_lead, stage_schedule
from ..stage_parts import (
    MaterializesStages,
    StageAdapter,
    StageSplit,
    layers_per_stage,
    parameters_line,
    stage_adapter_for,
)
from ..tied_gradients import TiedGradients
from ..timeline import Timeline
from ..transport import StageLinks, stage_collectives
from .checkpoint import PipelineCheckpoints
from .evaluation import PipelineEvaluation
from .loader import check_reuse, training_loader
from .processes import StageProcesses
from .seams import resolve_placement, steps_not_run
from .state import PipelineState
from .step_report import (
    StatWindow,
    StepReport,
    logs_this_step,
    pipe_scalars,
    publish,
    reduce_loss,
    reduce_window,
)

_D = PipelineOptions  # the options' defaults (class attributes of the dataclass)


class ClappingStrategy(PipelineCheckpoints, PipelineEvaluation, StageProcesses):
    """Pipeline-parallel training with compressed activations and gradients (Clapping); its options are
    the fields of ``PipelineOptions`` (checked there). A module gives its stages by ``pipeline_stages()``
    (``parts``, ``input``, ``loss``, ``weight``; a missing one is named); its optimizers, hooks and
    callbacks run, its ``*_step`` methods and their ``self.log`` do not (said at start unless
    ``pipeline_replaces_steps``). Example: docs/strategy.md."""

    strategy_name = "clapping"

    def __init__(
        self,
        accelerator=None,
        parallel_devices=None,
        cluster_environment=None,
        checkpoint_io=None,
        precision_plugin=None,
        *,
        stages: opt.PositiveInt | None = _D.stages,
        layers_per_stage: Sequence[opt.PositiveInt] | None = _D.layers_per_stage,
        micro_batches: opt.PositiveInt = _D.micro_batches,
        schedule: opt.Schedule = _D.schedule,
        extra_warmup: opt.NonNegativeInt | None = _D.extra_warmup,
        placement: opt.Placement = _D.placement,
        method: opt.Method = _D.method,
        fwd_compressor: str = _D.fwd_compressor,
        bwd_compressor: str = _D.bwd_compressor,
        p: opt.Probability = _D.p,
        sampler_seed: int | None = _D.sampler_seed,
        compression_seed: int = _D.compression_seed,
        warmup_epochs: opt.NonNegativeInt = _D.warmup_epochs,
        aqsgd_num_samples: opt.PositiveInt | None = _D.aqsgd_num_samples,
        aqsgd_storage: opt.Storage = _D.aqsgd_storage,
        aqsgd_dir: str | None = _D.aqsgd_dir,
        aqsgd_checkpoint_buffers: bool = _D.aqsgd_checkpoint_buffers,
        sample_id_key: str = _D.sample_id_key,
        bandwidth_mbps: opt.PositiveFloat | None = _D.bandwidth_mbps,
        timeout_s: opt.PositiveFloat = _D.timeout_s,
        nonfinite: opt.Nonfinite = _D.nonfinite,
        process_group_backend: opt.Backend = _D.process_group_backend,
        start_method: opt.StartMethod = _D.start_method,
        compile: bool | str = _D.compile,
        tied_compressor: str = _D.tied_compressor,
        timeline_dir: str | None = _D.timeline_dir,
    ) -> None:
        # the options, each with PipelineOptions' default (their one owner, which checks them)
        options = {name: value for name, value in locals().items() if name in OPTION_NAMES}
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.options = PipelineOptions(**options)
        self._num_nodes = 1
        self.adapter: StageAdapter | None = None
        self.split: StageSplit | None = None
        self.local: LocalModel | None = None
        self.runner: StageRunner | None = None
        self.state = PipelineState()  # codecs, sampler, totals, steps done (state_dict / load_state_dict)
        self.last_report: StepReport | None = None  # the statistics of the latest reduction
        self.window = StatWindow()  # this rank's statistics since that reduction
        self._groups: dict[str, Any] = {}
        self.tied: TiedGradients | None = None  # the tied parameters' gradient sums (setup)
        self._stashed_grads: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._fit_start: float | None = None
        self._previous_ids: torch.Tensor | None = None
        self._stop_signals: tuple[int, ...] = ()  # the signals that stop the run (on_train_start)

    # ------------------------------------------------------------------ model split
    @contextlib.contextmanager
    def model_sharded_context(self) -> Iterator[None]:
        """``configure_model`` defers here (where FSDP partitions): ``setup`` draws this rank's stage."""
        with deferred_init():
            yield

    def setup(self, trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        module = self.lightning_module
        self.adapter = stage_adapter_for(module)
        precision = getattr(self.precision_plugin, "precision", "32-true")
        if str(precision) in ("16-mixed", "16"):
            raise ValueError(
                f"trainer.precision={precision!r} is not supported by strategy='clapping' (it needs a gradient "
                f"scaler across stages); use '32-true', 'bf16-mixed' or 'bf16-true'"
            )
        parts = self.adapter.parts()
        counts = layers_per_stage(len(parts.layers), self.num_stages, self.options.layers_per_stage)
        placement, why = resolve_placement(self, trainer, parts)  # auto: which, and why, said at start
        self.split = StageSplit(self.global_rank, self.num_stages, counts, parts, placement)
        if self.global_rank == 0:  # Lightning's model summary sees rank 0's stage only; the steps not run
            rank_zero_info("\n".join(filter(None, (why, parameters_line(self.split), steps_not_run(module)))))
        if isinstance(self.adapter, MaterializesStages):  # read this stage's weights only
            self.adapter.materialize(self.split.modules_of(self.global_rank))
        self.local = keep_local_parts(module, self.split)
        if self.options.compile:  # each block of the stage on its own (parameter names unchanged)
            backend = "inductor" if self.options.compile is True else self.options.compile
            for part in self.split.modules_of(self.global_rank):
                part.compile(backend=backend)
        self.precision_plugin.convert_module(module)
        self.model_to_device()
        self._setup_tied_parameters()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self._drop_foreign_from_optimizers()
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            compat.optimizers_to_device(self.optimizers, self.root_device)
        compat.override_grad_norm_clipping(
            self.precision_plugin,
            lambda optimizer, max_norm: self._clip(optimizer, max_norm),
        )
        links = StageLinks(
            self.global_rank,
            self._groups,
            self.root_device,
            self.options.timeout_s,
            self.options.bandwidth_mbps,
            stage_through_host=self._backend() == "gloo" and self.root_device.type != "cpu",
            wrap_from=self.num_stages - 1 if self.split.wraps else None,
        )
        if self.options.timeline_dir:  # where each step's time goes (timeline.py)
            links.timeline = self.tied.timeline = Timeline(self.global_rank)
        self.runner = StageRunner(self.split, links, self.state.codecs, self.adapter.input, self.adapter.loss)

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def _setup_tied_parameters(self) -> None:
        assert self.local is not None
        self.tied = TiedGradients(self.local, self.global_rank, self._backend(), self.options.tied,
                                  self.options.compression_seed, groups=self._groups)  # fmt: skip
        self.tied.broadcast_from_first()

    def _drop_foreign_from_optimizers(self) -> None:
        keep = {id(p) for p in self.lightning_module.parameters() if p.numel() > 0}
        for optimizer in self.optimizers:
            for group in getattr(optimizer, "optimizer", optimizer).param_groups:
                group["params"] = [p for p in group["params"] if id(p) in keep]

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: object) -> object:
        """The training loader gets the lazy sampler (p = 1: the ordinary shuffled order)."""
        return training_loader(self, dataloader)

    # ------------------------------------------------------------------ steps
    def _clip(self, optimizer, max_norm: float) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        with (
            stage_collectives(self.global_rank, "gradient clipping"),
            self.runner.links.timeline.span("clip", "collective"),
        ):
            clip_global_grad_norm(params, self.local, self.root_device, max_norm)

    def training_step(self, *args: Any, **kwargs: Any):
        timeline = self.runner.links.timeline
        timeline.step = self.state.steps_done
        with (
            timeline.span(f"step {self.state.steps_done}", "step"),
            stage_collectives(self.global_rank, f"training step {self.state.steps_done}"),
        ):
            return self._training_step(*args, **kwargs)

    def _training_step(self, *args: Any, **kwargs: Any):
        batch = args[0] if args else kwargs["batch"]
        trainer = self.lightning_module.trainer
        opts = self.options
        if self._fit_start is None:
            self._fit_start = time.perf_counter()
        step = self.state.steps_done
        fresh = self.state.sampler.is_fresh(step) if self.state.sampler is not None else True
        ids = batch.get(opts.sample_id_key) if isinstance(batch, dict) else None
        self._previous_ids = check_reuse(ids, self._previous_ids, fresh, step)
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
        plan = (opts.schedule, self.num_stages, len(micro), opts.extra_warmup)
        schedule = stage_schedule(opts.schedule, self.global_rank, *plan[1:])
        lead = first_part_lead(*plan) if self.split.wraps else None  # 'v': the last stage's first part ahead
        scale = 1.0 / (len(micro) * trainer.accumulate_grad_batches)
        params = [p for p in self.lightning_module.parameters() if p.requires_grad]
        earlier = [(p, p.grad) for p in params]
        for p in params:
            p.grad = None
        snapshots = (
            {key: codec.snapshot(ids) for key, codec in self.state.codecs.items()}
            if opts.nonfinite == "skip"
            else None
        )
        with self.precision_plugin.train_step_context():
            loss_sum, stats = self.runner.train_step(micro, contexts, schedule, scale, lead)
        self.window.add_tied(*self.tied.sum(step))
        self._stashed_grads = [(p, p.grad) for p in params if p.grad is not None]
        for p, g in earlier:
            p.grad = g
        self.window.add(stats)
        with self.runner.links.timeline.span("loss and flags' all-reduce", "collective"):
            loss_value, nonfinite, stop = reduce_loss(
                loss_sum, len(micro), stats, self.root_device, self._stop_signals, STOP.signum
            )
        if stop is not None and STOP.stopped is None:  # every rank stops after this step, together
            STOP.stop_after(stop, int(trainer.global_step) + 1)
            trainer.should_stop = True
        faulty = nonfinite > 0 or not math.isfinite(loss_value)
        to_loggers = logs_this_step(trainer)
        final = trainer.max_steps > 0 and trainer.global_step + 1 >= trainer.max_steps
        if faulty or to_loggers or final:  # the same decision on every rank: all is known to all
            self._reduce_window(loss_value)
        if faulty:
            where = "; ".join(self.last_report.nonfinite_faults())
            if opts.nonfinite == "raise":
                raise NonFiniteError(
                    f"strategy='clapping': non-finite values (NaN or inf) at training step {step}: {where}. "
                    f"Training stopped before the optimizer step (set nonfinite='skip' to skip such steps)"
                )
            self._stashed_grads = []  # skip: no update from this step, and the codecs as they were before it
            for key, codec in self.state.codecs.items():
                codec.restore(snapshots[key])
            self.state.totals.skipped_steps += 1
            if self.global_rank == 0:
                warnings.warn(
                    f"strategy='clapping': skipped training step {step} (non-finite values: {where})",
                    stacklevel=2,
                )
        self.state.steps_done += 1
        loss = torch.tensor(loss_value, dtype=torch.float32, device=self.root_device)
        self.lightning_module.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        if faulty or to_loggers or final:
            self._publish(to_loggers)
        return loss

    def _reduce_window(self, loss: float) -> StepReport:
        """Reduce the statistics kept since the last reduction into the totals (a collective)."""
        report = reduce_window(
            self.window,
            loss,
            self.global_rank,
            self.num_stages,
            float(sum(c.buffer_nbytes for c in self.state.codecs.values())),
            self.runner.links.counters.emulated_seconds,
            float(self.local.owned_bytes),
            self.root_device,
            self.split.num_boundaries,
        )
        if report.steps:
            self.state.totals.add(report)
            self.last_report = report
        return report

    def _publish(self, to_loggers: bool) -> None:
        fresh = self.state.fresh_batches()
        wall = time.perf_counter() - self._fit_start if self._fit_start else 0.0
        values = pipe_scalars(self.last_report, self.state.totals, fresh, self.state.steps_done, wall)
        publish(self.lightning_module.trainer, values, self.global_rank, to_loggers)

    def flush_statistics(self) -> None:
        """Bring the totals up to date on every rank (a collective), e.g. before they are saved."""
        if self.window.steps:
            with stage_collectives(self.global_rank, "the statistics' reduction"):
                self._reduce_window(self.last_report.loss if self.last_report else float("nan"))
            self._publish(to_loggers=False)

    def on_train_start(self) -> None:
        """Stop signals end the run at a step boundary (``repro.stop``): a rank that the fork or
        spawn launcher started leaves Ctrl-C to the launching process, which forwards it once."""
        trainer = self.lightning_module.trainer
        role = "rank" if compat.launched_ranks(trainer) else "process"
        self._stop_signals = install_stop(role, compat.requeue_signal_of(trainer))
        super().on_train_start()

    def on_validation_start(self) -> None:
        self.flush_statistics()  # callbacks read pipe/bytes_total at each evaluation
        super().on_validation_start()

    def on_train_end(self) -> None:
        self.flush_statistics()
        STOP.restore()
        if self.options.timeline_dir and self.runner is not None:
            path = Path(self.options.timeline_dir) / f"timeline_rank{self.global_rank}.json"
            write_json_atomic(path, self.runner.links.timeline.chrome_trace())
        super().on_train_end()

    def backward(self, closure_loss: torch.Tensor, optimizer, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The schedule already ran backward; put its gradients back after Lightning's zero_grad."""
        module = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        for p, g in self._stashed_grads:
            p.grad = g if p.grad is None else p.grad + g
        self._stashed_grads = []
        return self.precision_plugin.post_backward(closure_loss, module)

    # ------------------------------------------------------------------ logging
    def run_summary(self) -> dict[str, Any]:
        """What the run sent and kept, for result files (the same on every rank; a collective)."""
        self.flush_statistics()
        report = self.last_report
        return {
            "stages": self.num_stages,
            "bytes_total": self.state.totals.total_bytes,
            "raw_bytes_total": self.state.totals.total_raw_bytes,
            "tied_bytes_total": self.state.totals.tied_bytes(),  # (sent, exact) of the tied sums, within the totals
            "bytes_sent_per_rank": self.state.totals.sent_per_rank(self.num_stages),
            "buffer_bytes_per_rank": list(report.buffer_bytes) if report else [0.0] * self.num_stages,
            "fresh_batches": self.state.fresh_batches(),
            "skipped_steps": self.state.totals.skipped_steps,
            "train_wall_s": time.perf_counter() - self._fit_start if self._fit_start else 0.0,
        }

    def buffer_digests(self) -> dict[str, str]:
        """{'b<boundary>_<direction>_<role>': sha256 of the buffers} of this rank's channel ends."""
        return {f"b{c.boundary}_{d}_{r}": c.digest() for (d, r), c in self.state.codecs.items()}

    def teardown(self) -> None:
        STOP.restore()
        for codec in self.state.codecs.values():
            if codec.sample_buffers is not None:
                codec.sample_buffers.close()
        super().teardown()


ClappingStrategy.__init__.__doc__ = options_doc()  # Args: each option's comment in PipelineOptions
