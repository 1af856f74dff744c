"""torch.compile of the model: per-layer RoPE widths (0 included) and phase-off compile into one
graph (no graph break) and give the eager loss and gradients; the Lightning module's ``compile``
option trains like the eager module. The aot_eager backend runs dynamo and AOT autograd (the
graph capture the GPU's inductor also uses) without a C++ build, so this stays fast on CPU."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from repro.models import GPTConfig
from repro.models.gpt import GPT

CONFIGS = {
    "mha": GPTConfig(n_layer=3, n_embd=32, n_head=2, rope_dims=[0, 8, 16], vocab_size=64, block_size=32),
    "mla": GPTConfig(
        n_layer=3,
        n_embd=32,
        n_head=2,
        attention="mla",
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        v_head_dim=8,
        qk_rope_head_dim=[0, 4, 8],
        vocab_size=64,
        block_size=32,
    ),
}


def _loss_and_grads(model: torch.nn.Module, forward, idx: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    _, loss = forward(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("arch", ["mha", "mla"])
@pytest.mark.parametrize("phase_off", [None, {1: None}, {2: [1]}])
def test_compiled_model_gives_the_eager_loss_and_gradients(arch, phase_off):
    torch.manual_seed(0)
    model = GPT(CONFIGS[arch])
    if phase_off:
        model.set_phase_off(phase_off)
    idx = torch.randint(0, 64, (2, 17))
    eager = _loss_and_grads(model, model, idx)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break fails
    got = _loss_and_grads(model, compiled, idx)
    assert got[0] == pytest.approx(eager[0], abs=1e-5)
    for a, b in zip(got[1], eager[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_module_compile_option_trains_like_eager(corpus, tmp_path):
    from test_resume_determinism import OPTIM, small_dm

    from repro.lit import GPTLightningModule

    losses = {}
    for compile in (False, "aot_eager"):
        torch._dynamo.reset()
        L.seed_everything(0, verbose=False)
        module = GPTLightningModule(CONFIGS["mha"], OPTIM, compile=compile)
        trainer = L.Trainer(
            accelerator="cpu",
            max_steps=3,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        )
        trainer.fit(module, small_dm(corpus, tmp_path / "c"))
        losses[compile] = [p.detach().clone() for p in module.parameters()]
    for a, b in zip(losses[False], losses["aot_eager"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_compile_keeps_checkpoint_names():
    eager = GPT(CONFIGS["mla"])
    compiled = GPT(CONFIGS["mla"])
    compiled.compile(backend="aot_eager")
    assert list(compiled.state_dict()) == list(eager.state_dict())


@pytest.mark.parametrize("bad", ["", 3, None])
def test_bad_compile_value_is_one_line(bad):
    from repro.lit import GPTLightningModule

    with pytest.raises(ValueError, match=r"model.compile="):
        GPTLightningModule(CONFIGS["mha"], compile=bad)
