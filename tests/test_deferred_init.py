"""A GPT built on meta and drawn later, part by part: the drawn weights and the random state after
the build are bitwise those of ``GPT(config)``, a stage draws only its own parts (the others are
never allocated), and a constructor the replay cannot follow is refused, naming what it ran."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repro.deferred_init import InitTrace, deferred_init
from repro.lit.stages import GPTStages
from repro.models import GPTConfig
from repro.models.gpt import GPT
from repro.pipeline.stage_parts import StageSplit, layers_per_stage

CONFIGS = {
    "mha_gqa": dict(attention="mha", rope_dims=[16, 8, 0, 16], n_kv_head=2),
    "mla_low_rank_q": dict(attention="mla", q_lora_rank=16, qk_rope_head_dim=[8, 0, 4, 8]),
    "untied_gelu_bias": dict(tie_embeddings=False, mlp="gelu", bias=True),
}


def config(name: str) -> GPTConfig:
    return GPTConfig(vocab_size=300, n_layer=4, n_embd=64, n_head=4, **CONFIGS[name])


def built_whole_and_deferred(cfg: GPTConfig) -> tuple[GPT, torch.Tensor, GPT, torch.Tensor]:
    torch.manual_seed(11)
    whole = GPT(cfg)
    after_whole = torch.randn(4)  # what the process draws next
    torch.manual_seed(11)
    with deferred_init():
        deferred = GPT.build(cfg)
    return whole, after_whole, deferred, torch.randn(4)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_deferred_gpt_draws_the_weights_of_the_gpt_built_whole_and_leaves_the_random_state_as_it(name):
    cfg = config(name)
    whole, after_whole, deferred, after_deferred = built_whole_and_deferred(cfg)
    assert torch.equal(after_whole, after_deferred)
    assert all(p.is_meta for p in deferred.parameters()) and not deferred.is_materialized
    deferred.materialize()
    assert deferred.is_materialized
    expected = dict(whole.named_parameters(remove_duplicate=False))
    for name_, p in deferred.named_parameters(remove_duplicate=False):
        assert torch.equal(p, expected[name_]), name_
    assert (deferred.lm_head.weight is deferred.wte.weight) == cfg.tie_embeddings
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    assert torch.equal(deferred(ids), whole(ids))


def test_a_stage_draws_only_its_own_parts_and_the_others_are_never_allocated():
    cfg = config("mha_gqa")  # tied: the embedding is on stage 0 and on the last stage
    whole, _, deferred, _ = built_whole_and_deferred(cfg)
    parts = GPTStages(deferred).parts()
    split = StageSplit(1, 2, layers_per_stage(4, 2), parts)
    GPTStages(deferred).materialize(split.modules_of(1))
    mine = {id(p) for m in split.modules_of(1) for p in m.parameters()}
    expected = dict(whole.named_parameters(remove_duplicate=False))
    for name, p in deferred.named_parameters(remove_duplicate=False):
        assert p.is_meta == (id(p) not in mine), name
        if not p.is_meta:
            assert torch.equal(p, expected[name]), name
    assert deferred.lm_head.weight is deferred.wte.weight  # still one tied parameter
    drawn = deferred.blocks[3].mlp.up_proj.weight
    deferred.materialize(split.modules_of(1))  # again: what is drawn stays (an optimizer may hold it)
    assert deferred.blocks[3].mlp.up_proj.weight is drawn
    assert deferred.blocks[0].mlp.up_proj.weight.is_meta


def test_a_gpt_built_outside_deferred_init_is_built_whole():
    model = GPT.build(config("mha_gqa"))
    assert model.is_materialized
    model.materialize()  # nothing to draw
    assert model.is_materialized


class _RandomOutOfPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))


class _WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("scale", torch.ones(2))


def test_a_constructor_the_replay_cannot_follow_is_refused_naming_it():
    with pytest.raises(NotImplementedError, match=r"runs aten\.randn"):
        InitTrace.build(_RandomOutOfPlace)
    with pytest.raises(NotImplementedError, match="buffers"):
        InitTrace.build(_WithBuffer)


def test_a_deferred_stage_copies_its_weights_from_a_checkpoint_and_draws_none(monkeypatch, tmp_path):
    """A fine-tune from ``init_checkpoint`` under a pipeline: each rank copies its own stage's tensors
    from the (memory-mapped) checkpoint; nothing is drawn and the other stages stay on meta."""
    from repro.lit.gpt_module import GPTLightningModule

    cfg = config("mha_gqa")
    torch.manual_seed(3)
    base = GPTLightningModule(cfg)
    path = tmp_path / "base.ckpt"
    torch.save({"hyper_parameters": dict(base.hparams), "state_dict": base.state_dict()}, path)
    with deferred_init():
        module = GPTLightningModule(cfg, init_checkpoint=str(path))
    monkeypatch.setattr(InitTrace, "materialize", lambda *a: pytest.fail("a checkpoint's stage was drawn"))
    before = torch.get_rng_state()
    module.load_weights(str(path))
    assert not module.model.is_materialized  # nothing copied yet
    parts = GPTStages(module.model).parts()
    split = StageSplit(1, 2, layers_per_stage(4, 2), parts)
    GPTStages(module.model).materialize(split.modules_of(1))
    mine = {id(p) for m in split.modules_of(1) for p in m.parameters()}
    expected = dict(base.model.named_parameters(remove_duplicate=False))
    for name, p in module.model.named_parameters(remove_duplicate=False):
        assert p.is_meta == (id(p) not in mine), name
        if not p.is_meta:
            assert torch.equal(p, expected[name]), name
    assert module.model.lm_head.weight is module.model.wte.weight  # tied: one tensor
    assert torch.equal(torch.get_rng_state(), before)
    module.model.materialize()  # the rest (one process): every weight the checkpoint's
    assert all(torch.equal(p, expected[n]) for n, p in module.model.named_parameters())


def test_weights_that_do_not_fit_a_deferred_gpt_are_refused_naming_them():
    with deferred_init():
        model = GPT.build(config("mha_gqa"))
    state = GPT(config("mha_gqa")).state_dict()
    state["extra.weight"] = state.pop("blocks.0.mlp.up_proj.weight")
    with pytest.raises(
        ValueError, match=r"missing \['blocks\.0\.mlp\.up_proj\.weight'\], unexpected \['extra"
    ):
        model.load_weights(state)
