"""Pipeline parts that need no processes: schedules, the lazy sampler, method codecs, options."""

from __future__ import annotations

import math

import pytest
import torch

from repro.data.sampler import LazyBatchSampler
from repro.pipeline.codecs import ChannelCodec, MessageContext
from repro.pipeline.compressors import build_compressor
from repro.pipeline.options import PipelineOptions
from repro.pipeline.sample_buffers import SampleBuffers
from repro.pipeline.schedule import first_part_lead, stage_schedule
from repro.pipeline.stage_parts import layers_per_stage


# ---------------------------------------------------------------------- schedules
def _simulate(name: str, k: int, m: int, extra: int = 0) -> int:
    """Run every stage's schedule with blocking receives; return the number of rounds (raises on deadlock)."""
    queues = [list(stage_schedule(name, s, k, m, extra)) for s in range(k)]
    done_f = [set() for _ in range(k)]
    done_b = [set() for _ in range(k)]
    rounds = 0
    while any(queues):
        progressed = False
        for s in range(k):
            if not queues[s]:
                continue
            kind, i = queues[s][0]
            ready = (
                (s == 0 or i in done_f[s - 1])
                if kind == "F"
                else (i in done_f[s] and (s == k - 1 or i in done_b[s + 1]))
            )
            if ready:
                (done_f if kind == "F" else done_b)[s].add(i)
                queues[s].pop(0)
                progressed = True
        if not progressed:
            raise AssertionError(f"{name} deadlocks with K={k}, M={m}")
        rounds += 1
    return rounds


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("k, m", [(1, 1), (2, 4), (4, 4), (4, 8), (4, 2), (3, 5)])
def test_schedules_run_every_micro_batch_once_each_way_without_deadlock(name, k, m):
    for s in range(k):
        actions = stage_schedule(name, s, k, m)
        assert sorted(i for kind, i in actions if kind == "F") == list(range(m))
        assert sorted(i for kind, i in actions if kind == "B") == list(range(m))
        for kind, i in actions:
            if kind == "B":
                assert actions.index(("F", i)) < actions.index(("B", i))
    _simulate(name, k, m)


@pytest.mark.parametrize("k, m, extra", [(4, 8, 0), (2, 6, 0), (2, 16, 2), (4, 8, 1), (3, 4, 5)])
def test_1f1b_keeps_at_most_k_minus_stage_plus_extra_micro_batches_in_flight(k, m, extra):
    """extra_warmup e: e more forwards ahead on every stage but the last, backwards still in
    micro-batch order (the gradients add up in the same order), and no deadlock."""
    for s in range(k):
        in_flight = peak = 0
        actions = stage_schedule("1f1b", s, k, m, extra)
        for kind, _ in actions:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(k - s + (extra if s < k - 1 else 0), m)
        assert [i for kind, i in actions if kind == "B"] == list(range(m))
    _simulate("1f1b", k, m, extra)
    assert (
        max(  # GPipe holds all M
            sum(1 for kind, _ in stage_schedule("gpipe", 0, k, m)[:i] if kind == "F") for i in range(2 * m)
        )
        == m
    )


def test_placement_v_puts_the_first_part_beside_the_last_with_one_copy_of_a_tied_weight(tmp_path):
    """'v': the last stage runs the first part (a token embedding tied to its head) and feeds stage 0
    over boundary K - 1; the tied weight is then held by one stage only (no gradient sum), and a
    checkpoint of one placement is refused by the other in one line."""
    from repro.lit.stages import GPTStages
    from repro.models import GPTConfig
    from repro.models.gpt import GPT
    from repro.pipeline.codecs import channel_ends
    from repro.pipeline.lightning.checkpoint import check_same_pipeline
    from repro.pipeline.model_split import keep_local_parts
    from repro.pipeline.stage_parts import StageSplit, parameters_line

    cfg = GPTConfig(n_layer=3, n_embd=16, n_head=2, rope_dims=[4] * 3, vocab_size=32, block_size=8)
    for placement, tied_groups in (("linear", [(0, 2)]), ("v", [])):
        parts = GPTStages(GPT(cfg)).parts()
        splits = [StageSplit(s, 3, [1, 1, 1], parts, placement) for s in range(3)]
        held = [m for split in splits for m in split.modules_of(split.stage)]
        assert sorted(map(id, held)) == sorted(map(id, [parts.first, *parts.layers, parts.last]))  # each once
        assert (parts.first in splits[2].modules_of(2)) == (placement == "v")
        assert [split.receives_input for split in splits] == [placement == "v", True, True]
        assert splits[0].chain_of(0) == (
            [parts.layers[0]] if placement == "v" else [parts.first, parts.layers[0]]
        )
        model = GPT(cfg)
        split = StageSplit(2, 3, [1, 1, 1], GPTStages(model).parts(), placement)
        whole = sum(p.numel() for p in model.parameters())  # the tied weight once
        copies = whole + (
            model.wte.weight.numel() if placement == "linear" else 0
        )  # once per stage holding it
        assert f" {copies:,} in all" in parameters_line(split)
        assert keep_local_parts(model, split).tied_groups == tied_groups
    assert channel_ends(0, 3, wraps=True) == [("fwd", "send", 0), ("bwd", "recv", 0), ("fwd", "recv", 2),
                                              ("bwd", "send", 2)]  # fmt: skip
    assert channel_ends(2, 3, wraps=True) == [("fwd", "recv", 1), ("bwd", "send", 1), ("fwd", "send", 2),
                                              ("bwd", "recv", 2)]  # fmt: skip
    with pytest.raises(ValueError, match="needs at least 2 stages"):
        StageSplit(0, 1, [3], parts, "v")
    from repro.pipeline.lightning.run_checks import check_pipeline_config

    with pytest.raises(
        ValueError, match=r"placement='v' .* trainer.devices=1 x trainer.num_nodes=1 gives one stage"
    ):
        check_pipeline_config({"trainer": {"devices": 1}}, {"placement": "v"})
    # the last stage's first part runs one micro-batch beyond stage 0's forwards before its first backward
    assert first_part_lead("1f1b", 2, 16, 1) == 4 and first_part_lead("1f1b", 4, 16, 0) == 5
    assert first_part_lead("gpipe", 4, 16) == 16 and first_part_lead("1f1b", 4, 3, 2) == 3
    written = {"num_stages": 3, "layers_per_stage": [1, 1, 1], "options": {"placement": "linear"}}
    check_same_pipeline(written, 3, [1, 1, 1], "a.ckpt", "linear")
    with pytest.raises(
        ValueError, match="written with strategy placement='linear'; this run has placement='v'"
    ):
        check_same_pipeline(written, 3, [1, 1, 1], "a.ckpt", "v")


def test_placement_auto_takes_v_exactly_when_the_tied_sum_would_send_more_and_resumes_as_written(tmp_path):
    """auto: 'v' when both ends' tied-gradient payloads exceed the first part's output and gradient
    a step (their compressors' payloads), 'linear' otherwise, untied, on one stage or unpriced; a
    resumed run keeps the placement its checkpoint was written with."""
    from dataclasses import replace
    from types import SimpleNamespace

    from repro.lit.stages import GPTStages
    from repro.models import GPTConfig
    from repro.models.gpt import GPT
    from repro.pipeline.auto_placement import choose_placement
    from repro.pipeline.compressors import build_compressor
    from repro.pipeline.lightning.seams import resolve_placement

    exact, q4, q8 = (build_compressor(s) for s in ("identity", "quant(4)", "quant(8)"))

    def parts(vocab, tie=True):
        cfg = GPTConfig(n_layer=2, n_embd=32, n_head=2, rope_dims=[8, 8], vocab_size=vocab, block_size=32)
        return GPTStages(GPT(replace(cfg, tie_embeddings=tie))).parts()

    def choose(p, stages=2, shape=(8, 32), fwd=exact, bwd=exact, tied=exact):
        return choose_placement(p, stages, 4, shape, fwd, bwd, tied)

    # exact messages: the sum sends 2 x vocab x 32 x 4 B, v 2 x 8 x 32 x 32 x 4 B (65.5 kB): break-even at 256
    assert choose(parts(64)).placement == "linear" and choose(parts(1024)).placement == "v"
    assert choose(parts(255)).placement == "linear" and choose(parts(256)).placement == "v"  # equal: v
    line = choose(parts(1024)).line()
    assert line.startswith("[clapping] placement auto: v (") and "0.262 MB" in line and "0.0655 MB" in line
    assert choose(parts(64), fwd=q4, bwd=q8).placement == "v"  # compressed boundaries make v cheap
    assert choose(parts(1024), tied=q8, fwd=exact).placement == "v"
    assert choose(parts(256), tied=q8).placement == "linear"  # a compressed sum: linear again
    assert choose(parts(1024), stages=1).placement == "linear"
    assert choose(parts(1024, tie=False)).why == "no weight is tied between the first and the last part"
    unpriced = choose(parts(1024), shape=None)
    assert unpriced.placement == "linear" and "the batch shape is not known" in unpriced.why
    # resuming: the checkpoint's placement, whatever the rule would say now
    ckpt = tmp_path / "a.ckpt"
    torch.save({"clapping": {"options": {"placement": "v"}}}, ckpt)
    strategy = SimpleNamespace(options=PipelineOptions(), num_stages=2)
    assert strategy.options.placement == "auto"
    placement, why = resolve_placement(strategy, SimpleNamespace(ckpt_path=str(ckpt)), parts(64))
    assert (placement, why) == ("v", "[clapping] placement auto: v (as the checkpoint was written)")
    dm = SimpleNamespace(batch_size=8, block_size=32)
    assert (
        resolve_placement(strategy, SimpleNamespace(ckpt_path=None, datamodule=dm), parts(64))[0] == "linear"
    )
    # a DataLoader passed to fit: priced from its batch size and its dataset's first item, no batch drawn
    from torch.utils.data import DataLoader, IterableDataset

    from repro.pipeline.lightning.seams import loader_batch_shape

    blocks = [{"input_ids": torch.zeros(32, dtype=torch.long)}] * 16
    shuffled = DataLoader(blocks, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    state = shuffled.generator.get_state()
    assert loader_batch_shape(shuffled) == (8, 32) and torch.equal(shuffled.generator.get_state(), state)
    assert loader_batch_shape(DataLoader([(torch.zeros(7), 1)], batch_size=2)) == (2, 7)

    class Stream(IterableDataset):
        def __iter__(self):
            yield from blocks

    assert loader_batch_shape(DataLoader(Stream(), batch_size=2)) is None  # no first item without drawing
    passed = SimpleNamespace(ckpt_path=None, datamodule=None, fit_loop=SimpleNamespace(_data_source=SimpleNamespace(
        instance=DataLoader(blocks, batch_size=8))))  # fmt: skip
    assert resolve_placement(strategy, passed, parts(1024)) == ("v", choose(parts(1024)).line())


def test_layers_are_split_evenly_or_as_listed_and_bad_splits_fail():
    assert layers_per_stage(6, 4) == [2, 2, 1, 1]
    assert layers_per_stage(4, 4) == [1, 1, 1, 1]
    assert layers_per_stage(6, 2, [1, 5]) == [1, 5]
    with pytest.raises(ValueError, match="only 3 layers"):
        layers_per_stage(3, 4)
    with pytest.raises(ValueError, match="layers_per_stage"):
        layers_per_stage(6, 2, [2, 2])


# ---------------------------------------------------------------------- lazy sampler
def test_lazy_sampler_fresh_fraction_is_near_p_and_reuse_repeats_exactly():
    for p in (0.25, 0.5):
        s = LazyBatchSampler(1000, 10, p=p, seed=1)
        n = 4000
        fresh = sum(s.is_fresh(t) for t in range(1, n + 1))
        assert abs(fresh / n - p) < 4 * math.sqrt(p * (1 - p) / n)
        for t in range(1, 200):
            if not s.is_fresh(t):
                assert s.batch_at(t) == s.batch_at(t - 1)
            else:
                assert s.batch_at(t) != s.batch_at(t - 1)


def test_lazy_sampler_with_p_one_is_ordinary_shuffled_sampling():
    s = LazyBatchSampler(100, 10, p=1.0, seed=3)
    epoch = [i for batch in s for i in batch]
    assert sorted(epoch) == list(range(100))
    second = [i for batch in s for i in batch]
    assert sorted(second) == list(range(100)) and second != epoch
    assert s.fresh_before(20) == 20


def test_lazy_sampler_state_round_trip_continues_the_same_stream():
    a = LazyBatchSampler(200, 8, p=0.5, seed=9)
    first = list(a) + list(a)  # two epochs
    b = LazyBatchSampler(200, 8, p=0.5, seed=9)
    it = iter(b)
    head = [next(it) for _ in range(11)]
    state = b.state_dict(step=11)
    c = LazyBatchSampler(200, 8, p=0.5, seed=9)
    c.load_state_dict(state)
    rest = list(c) + list(c)
    assert head + rest == first
    assert state["fresh_batches"] == sum(b.is_fresh(t) for t in range(11))
    with pytest.raises(ValueError, match="p=0.5"):
        LazyBatchSampler(200, 8, p=0.25, seed=9).load_state_dict(state)


@pytest.mark.parametrize("p", [0.0, -0.5, 1.5])
def test_lazy_sampler_rejects_p_outside_zero_one(p):
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        LazyBatchSampler(100, 10, p=p)


# ---------------------------------------------------------------------- method codecs
def _pair(method, spec, direction="fwd", n_samples=16):
    comp = build_compressor(spec)
    bufs = (SampleBuffers(n_samples), SampleBuffers(n_samples)) if method == "aqsgd" else (None, None)
    return (
        ChannelCodec(method, comp, 0, direction, 5, bufs[0]),
        ChannelCodec(method, comp, 0, direction, 5, bufs[1]),
    )


def _exchange(sender, receiver, x, slot, ctx):
    payload, x_hat_sender = sender.encode(x, slot, ctx)
    data = payload.data.clone()  # what arrives
    x_hat = receiver.decode(type(payload)(data), x.shape, x.dtype, slot, ctx)
    return payload, x_hat_sender, x_hat


@pytest.mark.parametrize("method", ["none", "direct", "ef21", "aqsgd", "clapping_fc", "clapping_fu"])
@pytest.mark.parametrize("spec", ["quant(4)", "topk(0.1)", "randk(0.2)"])
def test_sender_and_receiver_buffers_stay_bit_identical(method, spec):
    if method == "none":
        spec = "identity"
    sender, receiver = _pair(method, spec)
    torch.manual_seed(0)
    ids = [torch.arange(0, 2), torch.arange(2, 4)]
    for step in range(6):
        fresh = step % 3 == 0
        for slot in range(2):
            ctx = MessageContext(step, fresh, warmup=step < 1, sample_ids=ids[slot])
            x = torch.randn(2, 4, 8) + step
            _, a, b = _exchange(sender, receiver, x, slot, ctx)
            assert torch.equal(a, b)
        assert sender.digest() == receiver.digest()


def test_error_feedback_converges_to_a_repeated_message():
    sender, receiver = _pair("clapping_fc", "quant(2)")
    x = torch.randn(2, 4, 8)
    errors = []
    for step in range(30):
        _, _, x_hat = _exchange(sender, receiver, x, 0, MessageContext(step, False, False))
        errors.append(float((x_hat - x).norm() / x.norm()))
    assert errors[-1] < 1e-3 < errors[0]


def test_clapping_fu_sends_exact_on_fresh_steps_and_compressed_deltas_on_reuse():
    sender, receiver = _pair("clapping_fu", "quant(4)")
    x = torch.randn(2, 4, 8)
    full = x.numel() * 4
    p1, _, x_hat = _exchange(sender, receiver, x, 0, MessageContext(0, True, False))
    assert p1.nbytes == full and torch.equal(x_hat, x)
    p2, _, _ = _exchange(sender, receiver, x + 0.01, 0, MessageContext(1, False, False))
    assert p2.nbytes == build_compressor("quant(4)").payload_nbytes(x.shape, x.dtype) < full


def test_clapping_fc_on_fresh_steps_is_ef21():
    a_send, a_recv = _pair("clapping_fc", "topk(0.2)")
    b_send, b_recv = _pair("ef21", "topk(0.2)")
    for step in range(5):
        x = torch.randn(2, 4, 8)
        ctx = MessageContext(step, True, False)
        pa, _, xa = _exchange(a_send, a_recv, x, 0, ctx)
        pb, _, xb = _exchange(b_send, b_recv, x, 0, ctx)
        assert torch.equal(pa.data, pb.data) and torch.equal(xa, xb)


def test_aqsgd_sends_exact_while_warming_up_then_deltas_against_each_samples_buffer():
    sender, receiver = _pair("aqsgd", "quant(4)", n_samples=8)
    ids = torch.tensor([3, 5])
    x = torch.randn(2, 4, 8)
    p1, _, x_hat = _exchange(sender, receiver, x, 0, MessageContext(0, True, True, ids))
    assert p1.nbytes == x.numel() * 4 and torch.equal(x_hat, x)
    other = torch.tensor([1, 2])  # after warm-up, never seen: still exact
    p2, _, _ = _exchange(sender, receiver, x, 1, MessageContext(1, True, False, other))
    assert p2.nbytes == x.numel() * 4
    p3, _, x_hat3 = _exchange(sender, receiver, x + 0.1, 0, MessageContext(2, True, False, ids))
    assert p3.nbytes < x.numel() * 4
    assert sender.digest() == receiver.digest()
    assert sender.buffer_nbytes == 8 * 4 * 8 * 4  # N x T x d floats, whatever the batch
    with pytest.raises(ValueError, match="outside 0..7"):
        sender.encode(x, 0, MessageContext(3, True, False, torch.tensor([3, 8])))


# ---------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"p": 0.0}, "p=0.0"),
        ({"p": 1.5}, "p=1.5"),
        ({"method": "zip"}, "method='zip'"),
        ({"method": "direct", "fwd_compressor": "topk(0)"}, "(0, 1]"),
        ({"method": "direct", "bwd_compressor": "quant(9)"}, "2..8"),
        ({"fwd_compressor": "quant(4)"}, "method='none' sends exact"),
        ({"micro_batches": 0}, "micro_batches=0"),
        ({"schedule": "zigzag"}, "schedule='zigzag'"),
        ({"schedule": "1f1b", "extra_warmup": -1}, "extra_warmup=-1: must be >= 0"),
        ({"extra_warmup": 2}, "applies to schedule='1f1b'"),
        ({"method": "aqsgd", "aqsgd_storage": "memmap"}, "aqsgd_dir"),
        ({"bandwidth_mbps": -1}, "bandwidth_mbps"),
        ({"placement": "ring"}, "placement='ring': allowed values are ('auto', 'linear', 'v')"),
        ({"placement": "v", "stages": 1}, "needs stages >= 2"),
    ],
)
def test_bad_strategy_options_fail_before_any_process_starts(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        PipelineOptions(**kwargs)
    assert fragment in str(info.value)


def test_1f1b_keeps_one_more_micro_batch_in_flight_unless_told():
    """extra_warmup unset: 1 under 1f1b (the links bench: a message hidden on a slow link, the same
    gradients), 0 under gpipe, which already runs every forward first; a given value is kept."""
    assert PipelineOptions(schedule="1f1b").extra_warmup == 1
    assert PipelineOptions(schedule="gpipe").extra_warmup == 0
    assert PipelineOptions(schedule="1f1b", extra_warmup=0).extra_warmup == 0
