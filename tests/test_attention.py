"""Facts about the attention layers: phase-off, GQA, MLA cache widths and scale, table caching."""

from __future__ import annotations

import pytest
import torch

from repro.models import GPTConfig
from repro.models.gpt import GPT
from repro.models.rope import rope_table_builds


def mha_model(**overrides) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, block_size=32, n_layer=3, n_embd=32, n_head=2, rope_dims=[16, 16, 8])
    cfg.update(overrides)
    return GPT(GPTConfig(**cfg)).eval()


def mla_model(**overrides) -> GPT:
    torch.manual_seed(0)
    cfg = dict(
        vocab_size=64,
        block_size=32,
        n_layer=3,
        n_embd=32,
        n_head=2,
        attention="mla",
        kv_lora_rank=12,
        qk_nope_head_dim=8,
        v_head_dim=6,
        qk_rope_head_dim=[8, 0, 4],
    )
    cfg.update(overrides)
    return GPT(GPTConfig(**cfg)).eval()


def constant_input(model: GPT, T: int = 20) -> torch.Tensor:
    """The same hidden vector at every position: any variation of scores along a row is position."""
    return torch.randn(model.config.n_embd).expand(1, T, -1).contiguous()


def score_spread(scores: torch.Tensor) -> torch.Tensor:
    """Per head, the spread of the visible scores of the last query over key positions."""
    last = scores[0, :, -1, :]  # (H, T): the last query sees every key
    return last.std(dim=-1)


@pytest.mark.parametrize("make", [mha_model, mla_model])
def test_phase_off_makes_the_layer_position_independent(make):
    model = make()
    layer = 0
    x = constant_input(model)
    attn = model.blocks[layer].attn
    assert (score_spread(attn.attention_scores(x)) > 1e-4).all()  # rotation makes scores vary with position
    with model.phase_off([layer]):
        assert attn.phase_off_active
        off = attn.attention_scores(x)
    assert score_spread(off).max() < 1e-5  # identical keys and queries: identical scores everywhere
    assert not attn.phase_off_active  # the context manager restores the switch


@pytest.mark.parametrize("make", [mha_model, mla_model])
def test_phase_off_changes_nothing_in_other_layers(make):
    model = make()
    h = torch.randn(2, 20, model.config.n_embd)
    before = [block.attn(h) for block in model.blocks]
    with model.phase_off([0]):
        after = [block.attn(h) for block in model.blocks]
        logits_off = model(torch.randint(0, 64, (2, 20)))
    assert not torch.allclose(before[0], after[0])
    for layer in (1, 2):
        assert torch.equal(before[layer], after[layer])
    assert torch.isfinite(logits_off).all()


def test_per_head_phase_off_only_affects_chosen_heads():
    model = mha_model(n_head=4, n_kv_head=2, n_embd=64, rope_dims=[16, 16, 16])
    x = constant_input(model)
    attn = model.blocks[1].attn
    with model.phase_off({1: [2]}):
        spread = score_spread(attn.attention_scores(x))
    assert spread[2] < 1e-5
    assert (spread[[0, 1, 3]] > 1e-4).all()


def test_phase_off_is_the_same_as_zero_angle_not_zero_width():
    """Phase-off keeps the rotary dims in the score (angle 0), unlike a NoPE layer of width 0."""
    model = mha_model()
    attn = model.blocks[0].attn
    x = torch.randn(1, 10, model.config.n_embd)
    q = attn.q_proj(x).view(1, 10, 2, 16)
    k = attn.k_proj(x).view(1, 10, 2, 16)
    unrotated = torch.einsum("bthd,bshd->bhts", q, k) * 16**-0.5
    with model.phase_off([0]):
        scores = attn.attention_scores(x)
    mask = torch.ones(10, 10, dtype=torch.bool).triu(1)
    torch.testing.assert_close(scores[..., ~mask], unrotated[..., ~mask], rtol=1e-5, atol=1e-5)


def test_zero_width_layer_is_nope():
    model = mha_model(rope_dims=[0, 16, 8])
    x = constant_input(model)
    assert score_spread(model.blocks[0].attn.attention_scores(x)).max() < 1e-5


def test_gqa_equals_mha_with_shared_kv_heads():
    torch.manual_seed(3)
    gqa = mha_model(n_head=4, n_kv_head=2, n_embd=64, rope_dims=[8, 8, 8])
    mha = mha_model(n_head=4, n_kv_head=None, n_embd=64, rope_dims=[8, 8, 8])
    a_gqa, a_mha = gqa.blocks[0].attn, mha.blocks[0].attn
    with torch.no_grad():
        a_mha.q_proj.weight.copy_(a_gqa.q_proj.weight)
        a_mha.o_proj.weight.copy_(a_gqa.o_proj.weight)
        for name in ("k_proj", "v_proj"):  # kv head j serves query heads 2j and 2j+1
            w = getattr(a_gqa, name).weight.view(2, 16, 64)
            getattr(a_mha, name).weight.copy_(w.repeat_interleave(2, dim=0).reshape(64, 64))
    x = torch.randn(2, 12, 64)
    torch.testing.assert_close(a_gqa(x), a_mha(x), rtol=1e-5, atol=1e-5)
    assert a_gqa.kv_cache_width == 2 * 2 * 16 and a_mha.kv_cache_width == 2 * 4 * 16


def test_mla_shapes_and_cache_width_per_layer():
    model = mla_model()
    x = torch.randn(2, 20, model.config.n_embd)
    for layer, width in enumerate(model.config.qk_rope_head_dim):
        attn = model.blocks[layer].attn
        assert attn(x).shape == (2, 20, model.config.n_embd)
        assert attn.kv_cache_entries(x).shape == (2, 20, model.config.kv_lora_rank + width)
    assert model.kv_cache_elements_per_token() == [12 + 8, 12 + 0, 12 + 4]
    logits = model(torch.randint(0, 64, (2, 20)))
    assert logits.shape == (2, 20, 64)


def test_mla_with_low_rank_query_and_zero_width_trains():
    model = mla_model(q_lora_rank=10, qk_rope_head_dim=[0, 0, 0]).train()
    idx = torch.randint(0, 64, (2, 16))
    _, loss = model(idx, idx.roll(-1, 1))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.blocks[0].attn.q_b_proj.weight.shape == (2 * 8, 10)  # qk head dim = d_nope when d_R = 0


def test_mla_scale_is_one_over_sqrt_nope_plus_rope():
    model = mla_model()
    x = torch.randn(1, 9, model.config.n_embd)
    for layer, width in enumerate(model.config.qk_rope_head_dim):
        attn = model.blocks[layer].attn
        q, k, v = attn._qkv(x)
        manual = torch.einsum("bthd,bshd->bhts", q, k) / (8 + width) ** 0.5
        torch.testing.assert_close(
            attn.attention_scores(x), manual.masked_fill(torch.ones(9, 9).triu(1).bool(), float("-inf"))
        )
        probs = attn.attention_scores(x).softmax(-1)
        y = torch.einsum("bhts,bshd->bthd", probs, v).reshape(1, 9, -1)
        torch.testing.assert_close(attn(x), attn.o_proj(y), rtol=1e-5, atol=1e-5)


def test_forward_reuses_cached_rope_tables():
    model = mha_model(rope_dims=[16, 14, 10], block_size=29)
    idx = torch.randint(0, 64, (1, 29))
    model(idx)
    built = rope_table_builds()
    model(idx)
    model(idx[:, :11])
    assert rope_table_builds() == built


def test_phase_off_rejects_unknown_layers_and_heads():
    model = mha_model()
    with pytest.raises(ValueError, match="allowed layers are 0..2"):
        model.set_phase_off([3])
    with pytest.raises(ValueError, match="allowed heads are 0..1"):
        model.set_phase_off({0: [5]})
