"""LightningModule around the plain-torch GPT: next-token loss, validation loss and perplexity,
AdamW (or SGD with momentum) with linear warmup and cosine decay, TensorBoard logging. It knows
nothing of parallelism: the pipeline strategy cuts its ``model`` with its own GPT adapter."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torchmetrics import MeanMetric

from repro.arguments import (
    BelowOne,
    ClosedUnitInterval,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    check_fields,
)
from repro.compile_option import check_compile_backend
from repro.deferred_init import deferring
from repro.models import GPTConfig
from repro.models.gpt import GPT

from .checkpoints import check_checkpoint_matches, read_checkpoint
from .stages import GPTStages


@dataclass
class OptimConfig:
    name: Literal["adamw", "sgd"] = "adamw"
    """optimizer: AdamW, or SGD with momentum (Clapping's theory)"""
    momentum: BelowOne = 0.9
    """SGD momentum m (0 = plain SGD); ignored by AdamW"""
    lr: PositiveFloat = 3e-3
    """peak learning rate"""
    weight_decay: NonNegativeFloat = 0.1
    """decoupled weight decay on matrices (not on norms, biases)"""
    beta1: BelowOne = 0.9
    """AdamW beta1"""
    beta2: BelowOne = 0.95
    """AdamW beta2"""
    eps: float = 1e-8
    """AdamW epsilon"""
    warmup_steps: NonNegativeInt = 100
    """linear warmup from 0 to lr over this many optimizer steps"""
    schedule: Literal["cosine", "constant"] = "cosine"
    """after warmup: cosine decay, or constant lr"""
    decay_steps: PositiveInt | None = None
    """steps of warmup + decay; None = the trainer's estimated total steps"""
    min_lr_ratio: ClosedUnitInterval = 0.1
    """cosine decays to lr * min_lr_ratio"""
    fused: bool | None = None
    """fused optimizer kernel (one launch for all parameters); None = on CUDA only"""

    def __post_init__(self) -> None:
        check_fields(self, "optim.")  # each field's type and range


class MeanExp(MeanMetric):
    """exp of a weighted mean (the perplexity of a mean next-token loss)."""

    def compute(self) -> torch.Tensor:
        return torch.exp(super().compute())


def lr_multiplier(
    step: int, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Learning-rate factor at an optimizer step: linear warmup, then cosine (or constant)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


NONFINITE_CHECKS = ("auto", "every_step", "deferred")


class DeferredCheck:
    """Non-finite losses found without a host synchronisation: the step's flag goes to the fused
    optimizer's ``found_inf`` (it then leaves weights and state as they were), and two device
    counters keep how many steps were non-finite and the first of them."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.found_inf = torch.zeros((), device=device)  # read by the fused optimizer step
        optimizer.found_inf = self.found_inf
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self.first = torch.full((), -1, dtype=torch.long, device=device)

    def record(self, loss: torch.Tensor, step: int) -> None:
        bad = ~torch.isfinite(loss.detach())
        self.found_inf.copy_(bad)
        self.count.add_(bad)
        self.first.copy_(torch.where(bad & (self.first < 0), step, self.first))

    def read(self) -> tuple[int, int]:
        return int(self.count), int(self.first)


class GPTLightningModule(L.LightningModule):
    """A GPT with per-layer RoPE widths, trained on next-token prediction.

    Args:
        gpt: Architecture of the model (per-layer RoPE widths, MHA or MLA, sizes).
        optim: Optimizer and learning-rate schedule.
        init_checkpoint: Fine-tune: start ``fit`` from this checkpoint's weights (same architecture).
        nonfinite: A NaN or inf training loss: 'raise' (stop, naming the step) or 'skip' the step's
            update. (With strategy='clapping' the strategy's own ``nonfinite`` option applies.)
        nonfinite_check: When the loss is checked: 'every_step' (the host reads it each step: a
            synchronisation), 'deferred' (no synchronisation: the fused optimizer skips a non-finite
            step on the device, and the host reads the counters every ``log_every_n_steps`` steps and at
            the end, then raises or warns naming the first such step), or 'auto' (deferred with a fused
            optimizer on CUDA, every_step otherwise).
        compile: ``torch.compile`` the model: false, true (the inductor backend) or a backend name
            ('inductor', 'aot_eager', ...). Weights and checkpoints are those of the plain model.
    """

    pipeline_replaces_steps = True  # its steps compute what GPTStages' loss does (see the pipeline strategy)

    def __init__(
        self,
        gpt: GPTConfig,
        optim: OptimConfig | None = None,
        nonfinite: Literal["raise", "skip"] = "raise",
        init_checkpoint: str | None = None,
        nonfinite_check: Literal["auto", "every_step", "deferred"] = "auto",
        compile: bool | str = False,
    ) -> None:
        super().__init__()
        self._training_options(nonfinite, nonfinite_check, compile)
        self.init_checkpoint = init_checkpoint
        # load_from_checkpoint passes the saved hyperparameters back as plain dicts
        gpt = GPTConfig(**gpt) if isinstance(gpt, dict) else gpt
        optim = OptimConfig(**optim) if isinstance(optim, dict) else optim
        self.gpt_config = gpt
        self.optim_config = optim or OptimConfig()
        self.save_hyperparameters({"gpt": asdict(gpt), "optim": asdict(self.optim_config)})
        self.model = GPT.build(gpt)  # on meta when built for a pipeline: each stage draws its own weights
        if self.compile_backend:
            self.model.compile(backend=self.compile_backend)  # in place: parameter names unchanged
        self.eval_loss = MeanMetric()  # token-weighted mean next-token loss of an evaluation
        self.eval_ppl = MeanExp()  # exp of that mean: the perplexity

    def _training_options(self, nonfinite: str, nonfinite_check: str, compile: bool | str) -> None:
        """The options every causal LM module of the suite shares, checked (one line each)."""
        if nonfinite not in ("raise", "skip"):
            raise ValueError(f"model.nonfinite={nonfinite!r}: allowed values are ('raise', 'skip')")
        if nonfinite_check not in NONFINITE_CHECKS:
            raise ValueError(
                f"model.nonfinite_check={nonfinite_check!r}: allowed values are {NONFINITE_CHECKS}"
            )
        check_compile_backend(compile, "model.compile")
        self.nonfinite, self.nonfinite_check = nonfinite, nonfinite_check
        self.compile_backend = ("inductor" if compile is True else compile) or None
        self.deferred = None  # the counters of a deferred check, once the optimizer exists
        self.skipped_steps = 0

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def setup(self, stage: str) -> None:
        """Fine-tuning: a fit starts from ``init_checkpoint``'s weights (a resumed fit then restores its
        own checkpoint over them; a model built deferred copies them when it is materialized)."""
        if stage == "fit" and self.init_checkpoint:
            self.load_weights(self.init_checkpoint)

    def configure_model(self) -> None:
        """Lightning's hook, run inside the strategy's ``model_sharded_context()``. A strategy that
        builds a model's parts on their own processes (the pipeline's) defers there, and each rank
        materializes only its own stage; any other has the whole model drawn (or its checkpoint's
        weights copied) here, on the CPU as it was built: the strategy moves and casts it."""
        if not deferring():
            with torch.device("cpu"):
                self.model.materialize()

    def pipeline_stages(self) -> GPTStages:
        """The model cut into pipeline stages (embedding, blocks, final norm and head)."""
        return GPTStages(self.model)

    @staticmethod
    def config_layers(model: dict) -> tuple[int | None, str]:
        """The layers a config's ``model`` section builds and the field that sets them (what the
        pipeline strategy checks a stage per process against, before any process starts)."""
        gpt = model.get("gpt")
        if gpt is None:
            return None, ""
        fields = dict(gpt.as_dict() if hasattr(gpt, "as_dict") else gpt)
        return fields.get("n_layer"), "model.gpt.n_layer"

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """A state dict into a model still on meta (the launching process of a pipeline, whose ranks
        drew the weights) draws the model first, then copies the state over it."""
        if isinstance(self.model, GPT):  # (a Hugging Face module reads its own, see HFCausalLMModule)
            self.model.materialize()
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def load_weights(self, path: str) -> None:
        """The model weights of a checkpoint of the same architecture (every differing field named)."""
        ckpt = read_checkpoint(path, mmap=True)  # tensors read when copied: a stage reads its own
        saved = ckpt.get("hyper_parameters", {}).get("gpt")
        if saved is None or "state_dict" not in ckpt:
            raise ValueError(f"model.init_checkpoint={path!r}: not a repro GPT checkpoint")
        check_checkpoint_matches(saved, self.gpt_config, path)
        state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
        try:  # a deferred model (a pipeline's) copies each stage's weights from it, drawing none
            self.model.load_weights(state)
        except ValueError as exc:
            raise ValueError(f"model.init_checkpoint={path!r}: {exc}") from None

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        _, loss = self.model(batch["input_ids"], batch["targets"])
        # on the progress bar only when there is one: Lightning reads progress-bar values on the
        # host after every batch (a synchronisation); logged values are read every log_every_n_steps
        shown = self._trainer is not None and self.trainer.progress_bar_callback is not None
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=shown)
        if self.deferred is not None:
            self.deferred.record(loss, self.global_step)
            return loss
        if not bool(torch.isfinite(loss)):
            if self.nonfinite == "raise":
                raise FloatingPointError(
                    f"non-finite training loss ({float(loss)}) at training step {self.global_step}; training stopped "
                    f"before the optimizer step (set model.nonfinite='skip' to skip such steps)"
                )
            self.skipped_steps += 1
            return None  # Lightning skips the backward pass and the optimizer step
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        every = self.trainer.log_every_n_steps if self._trainer is not None else 0
        if self.deferred is not None and every and self.global_step % every == 0:
            self._read_deferred()

    def on_train_end(self) -> None:
        if self.deferred is not None:
            self._read_deferred()

    def _read_deferred(self) -> None:
        """The host reads the deferred counters: raise, or count and warn, naming the first step."""
        count, first = self.deferred.read()
        if count <= self.skipped_steps:
            return
        if self.nonfinite == "raise":
            raise FloatingPointError(
                f"non-finite training loss at training step {first} ({count} such step(s) by step "
                f"{self.global_step}); the fused optimizer did not apply them, training stopped at this check "
                f"(set model.nonfinite='skip' to skip such steps)"
            )
        self.skipped_steps = count
        rank_zero_warn(f"skipped {count} training step(s) with a non-finite loss, the first at step {first}")

    def record_eval_loss(self, split: str, loss: torch.Tensor, n_tokens: int) -> None:
        """Log a batch's mean next-token loss over ``n_tokens`` tokens as ``<split>/loss``, and the
        perplexity exp(mean loss) of the whole evaluation as ``<split>/ppl``. A strategy that computes
        the loss itself (the pipeline) calls this too."""
        self.eval_loss.update(loss.detach().float(), weight=n_tokens)
        self.eval_ppl.update(loss.detach().float(), weight=n_tokens)
        self.log(f"{split}/loss", self.eval_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log(f"{split}/ppl", self.eval_ppl, on_step=False, on_epoch=True)

    def _evaluate(self, batch: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
        _, loss = self.model(batch["input_ids"], batch["targets"])
        self.record_eval_loss(prefix, loss, int((batch["targets"] != -100).sum()))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "test")

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        """Lightning's clipping, except for a fused optimizer under mixed precision with no loss scaler
        (bf16-mixed): Lightning's mixed-precision plugin refuses to clip for any fused optimizer, since
        under fp16 it would unscale the gradients inside its step; under bf16 nothing is scaled, so
        clip as the plain precision plugin does (a pipeline strategy's norm over all stages included)."""
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and optimizer.defaults.get("fused") and getattr(plugin, "scaler", None) is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            Precision.clip_gradients(plugin, optimizer, float(gradient_clip_val), algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        cfg = self.optim_config
        decay, no_decay = [], []
        for p in self.model.parameters():
            if p.requires_grad:
                (decay if p.dim() >= 2 else no_decay).append(p)
        groups = [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        device = next(self.model.parameters()).device
        # null: fused on CUDA, except under fp16's loss scaler (a fused optimizer unscales inside its
        # step, after clipping would have seen scaled gradients)
        scaled = self._trainer is not None and self.trainer.precision == "16-mixed"
        fused = cfg.fused if cfg.fused is not None else device.type == "cuda" and not scaled
        if cfg.name == "sgd":
            optimizer = torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, fused=fused or None)
        else:
            optimizer = torch.optim.AdamW(
                groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused or None
            )
        deferred = self.nonfinite_check == "deferred" or (
            self.nonfinite_check == "auto" and fused and device.type == "cuda"
        )
        if deferred and not fused:
            raise ValueError(
                "model.nonfinite_check='deferred' needs a fused optimizer (optim.fused: true, or null on CUDA): "
                "it skips a non-finite step on the device"
            )
        self.deferred = DeferredCheck(optimizer, device) if deferred else None
        total = cfg.decay_steps
        if total is None:
            total = int(self.trainer.estimated_stepping_batches) if self._trainer is not None else 1
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: lr_multiplier(step, cfg.warmup_steps, total, cfg.schedule, cfg.min_lr_ratio),
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
