"""A Hugging Face causal LM as a LightningModule: the suite's optimizer, schedule, logging and
checkpoints (everything of ``GPTLightningModule`` but the model), on a model read from a local
folder (or a hub id). On one process the whole model is read in ``setup``; under the pipeline
strategy each rank reads only its own stage (the stage adapter's ``materialize``).

A config says ``model: {pretrained: <folder>, ...}`` instead of ``model: {gpt: ...}``; its data
are tokenized with the model's own tokenizer (``data.tokenizer_file`` is linked to the folder).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal

import lightning as L
from torchmetrics import MeanMetric

from repro.deferred_init import deferring
from repro.models.hf_causal_lm import HFCausalLM, HFModelError
from repro.models.hf_folder import model_folder, num_layers, read_config

from .checkpoints import HF_PREFIX
from .gpt_module import GPTLightningModule, MeanExp, OptimConfig
from .stages import HFStages


class HFCausalLMModule(GPTLightningModule):
    """A pretrained causal LM, fine-tuned on next-token prediction.

    Args:
        pretrained: A local model folder (config.json and safetensors) or a hub id.
        optim: Optimizer and learning-rate schedule.
        attention: 'sdpa' or 'eager' (both get an explicit causal structure, see repro.models.hf_causal_lm).
        tie_embeddings: 'auto' (as the model's config says) or 'untied' (the head gets its own copy).
        nonfinite: A NaN or inf training loss: 'raise' or 'skip' the step's update.
        nonfinite_check: When the loss is checked: 'every_step', 'deferred' or 'auto' (as for the GPT).
        compile: ``torch.compile`` each part: false, true (inductor) or a backend name.
        rotary: Per layer, the fraction of its rotary pairs that keep their phase (its highest
            frequencies; 1.0 as trained, 0.0 none: NoPE); null: every layer as trained. Llama family.
        rotary_order: With rotary: which pairs each key/value head keeps, a file of ``repro profile
            pair-order`` (MHA2MLA's q.k 2-norm order); null: the highest frequencies.
    """

    def __init__(
        self,
        pretrained: str,
        optim: OptimConfig | None = None,
        attention: Literal["sdpa", "eager"] = "sdpa",
        tie_embeddings: Literal["auto", "untied"] = "auto",
        nonfinite: Literal["raise", "skip"] = "raise",
        nonfinite_check: Literal["auto", "every_step", "deferred"] = "auto",
        compile: bool | str = False,
        rotary: list[float] | None = None,
        rotary_order: str | None = None,
    ) -> None:
        L.LightningModule.__init__(self)
        self._training_options(nonfinite, nonfinite_check, compile)
        optim = OptimConfig(**optim) if isinstance(optim, dict) else optim
        self.init_checkpoint = None
        self.optim_config = optim or OptimConfig()
        try:
            self.model = HFCausalLM(pretrained, attention, tie_embeddings)
        except HFModelError as exc:
            raise ValueError(str(exc)) from None
        if rotary_order is not None and rotary is None:
            raise ValueError(
                "model.rotary_order: give model.rotary too (the fraction of pairs each layer keeps)"
            )
        if rotary is not None:
            self._set_rotary(list(rotary), rotary_order)
        self.save_hyperparameters(
            {
                "pretrained": str(pretrained),
                "attention": attention,
                "tie_embeddings": tie_embeddings,
                "optim": asdict(self.optim_config),
                "rotary": None if rotary is None else [float(f) for f in rotary],
                "rotary_order": None if rotary_order is None else str(rotary_order),
            }
        )
        self.eval_loss, self.eval_ppl = MeanMetric(), MeanExp()

    def _set_rotary(self, rotary: list[float], order: str | None = None) -> None:
        n = self.model.n_layer
        if len(rotary) != n or any(isinstance(f, bool) or not 0.0 <= float(f) <= 1.0 for f in rotary):
            raise ValueError(
                f"model.rotary={rotary!r}: give one fraction in [0, 1] per layer ({n} layers), or null"
            )
        if self.model.family == "gpt2":
            raise ValueError("model.rotary: GPT-2 has no rotary phase (learned positions)")
        try:
            self.model.set_rotary(dict(enumerate(float(f) for f in rotary)), order)
        except HFModelError as exc:
            raise ValueError(f"model.rotary_order: {exc}") from None

    @property
    def gpt_config(self):  # the GPT module's checks read it; an HF model has none
        return None

    def configure_model(self) -> None:
        """As the GPT module's: the whole model read here, unless the strategy reads each stage on
        its own rank (its ``model_sharded_context()`` defers); then each part compiled."""
        super().configure_model()
        if self.compile_backend and not deferring():
            for part in (self.model.embed, *self.model.layers, self.model.head):
                part.compile(backend=self.compile_backend)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """A full state dict into a model still on the meta device (the launching process of a
        pipeline, which never read the weights) materializes it from that state first."""
        if not self.model.is_materialized:
            self.model.materialize(source=lambda name: state_dict[HF_PREFIX + name])
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def pipeline_stages(self) -> HFStages:
        """The model cut into pipeline stages (embedding, decoder layers, norm and head)."""
        return HFStages(self.model)

    @staticmethod
    def config_layers(model: dict) -> tuple[int | None, str]:
        """The decoder layers of the config's pretrained model (its folder's config.json)."""
        location = model.get("pretrained")
        if not location:
            return None, ""
        try:
            return num_layers(read_config(model_folder(location))), "the pretrained model's layers"
        except HFModelError as exc:
            raise ValueError(str(exc)) from None
