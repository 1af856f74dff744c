"""`make bench`: the quick preset end to end (every section, well-formed finite JSON, exact
payload sizes, the memory claim), and its settings' bad input."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from repro.cli import run as repro_run
from repro.experiments.bench.compressor_bench import analytical_bytes
from repro.experiments.bench.measure import all_finite, pairwise, row, summary
from repro.experiments.bench.settings import SECTIONS, load_settings
from repro.pipeline.compressors import build_compressor

ROW_KEYS = {
    "section",
    "name",
    "metric",
    "unit",
    "median",
    "min",
    "max",
    "spread",
    "repeats",
    "values",
    "reference",
    "ratio",
    "goal",
    "goal_met",
}


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    assert repro_run(["bench", "--preset", "quick", "--out", str(out), "--quiet"]) == 0
    return json.loads((out / "bench.json").read_text()), out


def test_quick_bench_writes_every_section_with_finite_rows(quick_report):
    report, out = quick_report
    assert report["preset"] == "quick" and report["git_commit"]
    assert set(report["section_seconds"]) == set(SECTIONS)
    sections = {r["section"] for r in report["rows"]}
    assert sections == set(SECTIONS)
    for r in report["rows"]:
        assert set(r) >= ROW_KEYS, r["name"]
        assert all(math.isfinite(v) for v in r["values"]), r["name"]
        assert r["min"] <= r["median"] <= r["max"], r["name"]
        assert len(r["values"]) == r["repeats"]
        if r["reference"] is not None:
            assert r["ratio"] is not None and math.isfinite(r["ratio"]) and r["ratio"] > 0, r["name"]
        if r["goal"] is not None:
            met = r["ratio"] >= r["goal"] if r["goal_kind"] == "min" else r["ratio"] <= r["goal"]
            assert r["goal_met"] == met, r["name"]
    assert all_finite(report)
    table = (out / "bench.md").read_text()
    for r in report["rows"]:
        assert r["name"] in table


def test_the_data_section_compares_prepare_loader_and_memory_with_their_references(quick_report):
    report, _ = quick_report
    timed = [r for r in report["rows"] if r["section"] == "data" and r["unit"] != "bytes"]
    data = {r["name"].split(",")[0].split(" of ")[0]: r for r in timed}
    prepare, loader = data["repro data prepare"], data["shard loader (memmap"]
    encode = data["tokenizer encode_batch"]
    assert prepare["reference"] == encode["name"] and prepare["goal"] == 0.8
    ratio = prepare["median"] / (encode["median"] * prepare["workers"])  # one repeat in the quick preset
    assert prepare["ratio"] == pytest.approx(ratio)
    assert loader["goal"] == 20.0 and loader["ratio"] == pytest.approx(loader["median"] / 651_000.0)
    (memory,) = [r for r in report["rows"] if r["section"] == "data" and r["unit"] == "bytes"]
    assert memory["goal_kind"] == "max" and memory["ratio"] == pytest.approx(memory["median"] / 2**30)
    assert memory["corpus_bytes"] >= 4e6 and memory["tokens"] > 0
    assert 0 < memory["median"] <= memory["peak_rss_sum"]  # shared pages counted once, not per process


def test_quick_bench_measures_what_it_claims(quick_report):
    report, _ = quick_report
    rows = {r["name"]: r for r in report["rows"]}
    # the pipeline is compared with torch.distributed.pipelining and with one process
    assert "torch.distributed.pipelining GPipe K=2" in rows
    ours = rows["clapping none+identity K=2"]
    assert ours["reference"] == "torch.distributed.pipelining GPipe K=2" and ours["goal"] == 1.0
    # every compressor's payload is its analytical size (exactly, for these)
    comp = [r for r in report["rows"] if r["section"] == "compressors"]
    assert comp and all(r["achieved_bytes"] == r["analytical_bytes"] for r in comp)
    # AQ-SGD buffers grow with N, Clapping's do not
    mem = {(r["method"], r["N"]): r["median"] for r in report["rows"] if r.get("method")}
    sizes = sorted({n for _, n in mem})
    assert mem[("aqsgd", sizes[-1])] / mem[("aqsgd", sizes[0])] == pytest.approx(sizes[-1] / sizes[0])
    assert mem[("clapping_fc", sizes[-1])] == mem[("clapping_fc", sizes[0])]
    # a compressed run sends fewer bytes than none on the same emulated link (all bytes: the bench
    # model's tied embedding-gradient sum crosses uncompressed, so the ratio is not the codec's alone)
    net = [r for r in report["rows"] if r["section"] == "network"]
    assert net[0]["compression_ratio"] == 1.0 and net[1]["compression_ratio"] < 0.7
    assert net[1]["bytes_per_step"] < net[0]["bytes_per_step"]
    # the messages' bytes per step grow linearly with the sequence length at fixed K; the tied sum's do not
    curve = sorted(
        (r["seq_len"], r["bytes_per_step"], r["tied_bytes_per_step"])
        for r in report["rows"]
        if r["name"].startswith("T curve")
    )
    (t0, b0, tied0), (t1, b1, tied1) = curve[0], curve[-1]
    assert tied0 == tied1 > 0 and (b1 - tied1) / (b0 - tied0) == pytest.approx(t1 / t0, rel=0.02)
    # on the shaped links every byte the strategy counts crossed the wire, and little else did (TCP/IP
    # headers, acknowledgements, the step's small collectives); torch's pipeline sends the same tensors
    link = {r["name"].split(" @ ")[0]: r for r in report["rows"] if r["section"] == "link"}
    theirs = link.pop("torch.distributed.pipelining")
    for r in link.values():
        for wire, counted in zip(r["wire_bytes_per_step"], r["uplink_bytes_per_step"]):
            assert counted <= wire <= 1.1 * counted + 8192, r["name"]
        assert min(r["cpu_s_per_step"]) > 0
    assert theirs["engine"] == "torch" and theirs["uplink_bytes_per_step"] is None
    assert theirs["wire_bytes_per_step"] == pytest.approx(link["none"]["wire_bytes_per_step"], rel=0.1)


@pytest.mark.parametrize(
    "spec",
    [
        "identity",
        "fp16",
        "bf16",
        "topk(0.01)",
        "topk(0.5)",
        "randk(0.2)",
        "quant(2)",
        "quant(3)",
        "quant(8)",
        "quant(4,scale=fp32)",
    ],
)
@pytest.mark.parametrize("shape", [(3, 5, 7), (4, 128, 128), (2, 300, 200)])
def test_achieved_payload_equals_the_analytical_size(spec, shape):
    comp = build_compressor(spec)
    x = torch.randn(*shape)
    assert comp.compress(x, seed=3).nbytes == analytical_bytes(comp, shape)


def test_summary_and_ratios():
    s = summary([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["repeats"]) == (2.0, 1.0, 3.0, 3)
    assert s["spread"] == pytest.approx(1.0)
    r = row(
        "x",
        "a",
        "throughput",
        "tokens/s",
        [2.0, 4.0],
        reference="b",
        ratios=pairwise([2.0, 4.0], [1.0, 4.0]),
        goal=1.2,
    )
    assert r["ratio"] == pytest.approx(1.5) and r["goal_met"] is True
    # the mean ratio's 95% t interval: 1.5 +- 12.706 * 0.7071 / sqrt(2): the goal is inside it
    assert (r["ratio_ci_low"], r["ratio_ci_high"]) == pytest.approx((1.5 - 6.3531, 1.5 + 6.3531), abs=1e-3)
    assert r["goal_resolved"] is False
    tight = [1.10, 1.12, 1.11]
    assert row("x", "a", "t", "s", tight, reference="b", ratios=tight, goal=1.0)["goal_resolved"] is True
    missed = row("x", "a", "t", "s", tight, reference="b", ratios=tight, goal=1.2)
    assert missed["goal_met"] is False and missed["goal_resolved"] is True
    one = row("x", "a", "t", "s", [1.0], reference="b", ratios=[1.1], goal=1.0)
    assert "ratio_ci_low" not in one and one["goal_met"] is True and one["goal_resolved"] is None
    with pytest.raises(ValueError, match="as many repeats"):
        pairwise([1.0], [1.0, 2.0])
    assert not all_finite({"a": [1.0, float("nan")]})


@pytest.mark.parametrize(
    "text,message",
    [
        ("preset: full\nrepeats: 0\n", r"repeats=0: must be > 0"),
        ("preset: full\nstages: [2, 5]\n", r"stages 5: need 2 <= K and K dividing n_layer=12"),
        ("preset: full\nbatch_size: 10\n", r"batch_size=10 must divide into micro_batches=4"),
        ("preset: full\nmla_rope_widths: [8, 16]\n", r"must include 0"),
        ("preset: full\nseq_lengths: [64]\n", r"must include block_size=128"),
        (
            "preset: full\nnetwork_runs: [{method: ef21, fwd_compressor: quant(4), bwd_compressor: quant(4)}]\n",
            r"must start with method 'none'",
        ),
        (
            "preset: full\nlink_runs: [{method: none}, {method: ef21, engine: torch}]\n",
            r"engine='torch' \(torch.distributed.pipelining\) runs in link_runs only, with method none",
        ),
        (
            "preset: full\nlink_runs: [{method: none}, {method: none, schedule: zbv}]\n",
            r"schedule='zbv': torch's V schedules run with engine torch",
        ),
        (
            "preset: full\nlink_runs: [{method: none}, {method: none, engine: jax}]\n",
            r"link_runs.engine='jax': allowed 'ours', 'torch'",
        ),
        ("preset: full\ncompressors: [quant(9)]\n", r"quant bits=9"),
        ("preset: full\nsections: [speed]\n", r"sections='speed': allowed 'lightning'"),
        ("preset: fast\n", r"preset='fast'"),
        ("preset: full\nrepeat: 3\n", r"unknown fields \['repeat'\]"),
    ],
)
def test_bad_bench_settings_fail_early(tmp_path, text, message):
    path = tmp_path / "bench.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_settings(path)


def test_bench_cli_reports_bad_input_without_writing(tmp_path, capsys):
    out = tmp_path / "out"
    assert repro_run(["bench", "--settings", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # a section that is not one: refused by the parser, one line
        repro_run(["bench", "--preset", "quick", "--sections", "gpu", "--out", str(out)])
    lines = capsys.readouterr().err.splitlines()
    assert (
        usage.value.code == 2
        and len(lines) == 1
        and "--sections (item 1) gpu: allowed 'lightning'" in lines[0]
    )
    assert not out.exists()


def test_shipped_presets_load():
    for preset in ("full", "quick"):
        s = load_settings(preset)
        assert s.preset == preset and s.sections == SECTIONS
    race = load_settings("versus_torch")
    assert race.preset == "versus_torch" and race.sections == ("pipeline", "hf")
    assert (race.n_layer, race.n_embd, race.batch_size, race.micro_batches, race.stages) == (
        (full := load_settings("full")).n_layer,
        full.n_embd,
        full.batch_size,
        full.micro_batches,
        full.stages,
    )  # the full preset's model and batch, more repeats


def test_the_hf_section_races_the_strategy_against_torch_pipelining_on_the_same_hf_model(quick_report):
    report, _ = quick_report
    names = {r["name"]: r for r in report["rows"] if r["section"] == "hf"}
    for k in report["settings"]["stages"]:
        ours = names[f"HF Llama clapping none+identity K={k}"]
        assert ours["reference"] == f"HF Llama torch.distributed.pipelining GPipe K={k}" in names
        assert ours["goal"] == 1.0 and ours["stages"] == k and ours["ratio"] > 0


def test_taking_turns_splits_the_barrier_releases_into_alternate_steps():
    from repro.experiments.bench.versus_torch import turn_times

    ours, theirs = turn_times([10.0, 11.0, 13.0, 14.5, 16.5])  # start, ours 0, theirs 0, ours 1, theirs 1
    assert ours == [1.0, 1.5] and theirs == [2.0, 2.0]
    with pytest.raises(ValueError, match="two per step"):
        turn_times([10.0, 11.0])


def test_a_pipeline_that_fails_while_the_other_waits_for_its_turn_ends_both(monkeypatch):
    """torch's ranks fail while building their stages; ours, waiting at the shared barrier for
    them, stop at once (the barrier is broken) instead of waiting out its timeout."""
    import time

    from repro.experiments.bench import versus_torch
    from repro.experiments.bench.workload import gpt_config

    def broken(*args, **kwargs):
        raise RuntimeError("no stage")

    monkeypatch.setattr(versus_torch, "stage_module", broken)  # the forked workers inherit it
    s = load_settings("quick")
    start = time.perf_counter()
    with pytest.raises(Exception, match="no stage"):  # torch's failure, not ours' broken barrier
        versus_torch.paired_runs(gpt_config(s), s, 2)
    assert time.perf_counter() - start < versus_torch.TURN_TIMEOUT_S / 5


def test_a_link_rows_limit_is_its_busiest_uplink_on_the_wire_or_its_compute():
    """Each link row's limit from what the run measured on every rank: the busiest uplink's wire bytes
    over the rate, or the compute (the busiest rank's CPU time, or the ranks' total over the cores
    when there are more ranks than cores), whichever is larger."""
    from repro.experiments.bench.link_section import _rows, compute_s
    from repro.experiments.bench.settings import NetworkRun

    assert compute_s([0.3, 0.5], cores=2) == 0.5
    assert compute_s([0.3, 0.3, 0.3, 0.3], cores=2) == 0.6
    runs = (NetworkRun("none"), NetworkRun("none", engine="torch"))
    s = replace(load_settings("quick"), link_runs=runs, link_micro_batches=4)

    def run(step, wire, cpu, counted):
        return {"step_s": step, "wire_bytes_per_step": wire, "cpu_s_per_step": cpu, "compression_ratio": 1.0,
                "bytes_per_step": counted and sum(counted), "uplink_bytes_per_step": counted}  # fmt: skip

    measured = {
        (2, 10.0, "none"): [run(2.0, [1.25e6, 1.0e6], [0.5, 0.4], [1.2e6, 1.0e6])] * 2,
        (2, 10.0, "torch.distributed.pipelining"): [run(4.0, [1.25e6, 1.3e6], [0.5, 0.6], None)] * 2,
    }
    ours, theirs = _rows(s, 2, 10.0, measured, cores=2)
    assert ours["link_s_per_step"] == pytest.approx(1.0) and ours["limit_s"] == pytest.approx(1.0)
    assert ours["fraction_of_limit"] == pytest.approx(0.5) and ours["compute_s_per_step"] == 0.5
    assert ours["wire_over_counted"] == pytest.approx(1.25 / 1.2)
    assert theirs["engine"] == "torch" and theirs["wire_over_counted"] is None
    assert theirs["limit_s"] == pytest.approx(1.04) and theirs["ratio"] == pytest.approx(0.5)
    assert ours["fill_s"] == pytest.approx(1.0 / 8 + 0.5 / 4)


def _v_rank(rank: int, k: int, schedule: str, port: int, queue) -> None:
    """One rank of torch's V schedule on the quick bench GPT (tied): rank 0 reports the gradients
    of the tied weight and of its first block after one step."""
    import os

    import torch.distributed as dist

    from repro.experiments.bench.versus_torch import TorchPipelineRank
    from repro.experiments.bench.workload import OPTIM, gpt_config, loader
    from repro.lit import GPTLightningModule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=k)
    try:
        s = load_settings("quick")
        torch.manual_seed(0)
        module = GPTLightningModule(gpt_config(s), OPTIM)
        TorchPipelineRank(module, rank, k, 4, schedule).step(next(iter(loader(s, 1))))
        if rank == 0:
            m = module.model
            queue.put(
                [m.wte.weight.grad.tolist(), m.blocks[0].attn.q_proj.weight.grad.tolist()]
            )  # no shared memory
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_torchs_v_schedules_in_the_bench_give_one_process_gradients_with_the_tied_weight_on_rank_0(schedule):
    """The link section's torch V rows (two chunks a rank: the embedding and its tied head both on
    rank 0) compute the gradients one process does; torch alone drops part of the shared weight's."""
    import torch.multiprocessing as mp
    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    from repro.experiments.bench.workload import OPTIM, gpt_config, loader
    from repro.lit import GPTLightningModule
    from repro.lit.stages import GPTStages

    s = load_settings("quick")
    torch.manual_seed(0)
    module = GPTLightningModule(gpt_config(s), OPTIM)
    batch, adapter = next(iter(loader(s, 1))), GPTStages(module.model)
    micro = [slice(i, i + s.batch_size // 4) for i in range(0, s.batch_size, s.batch_size // 4)]
    loss = sum(
        adapter.loss(module.model(batch["input_ids"][m]), {"targets": batch["targets"][m]}) for m in micro
    )
    (loss / 4).backward()
    queue = mp.get_context("fork").SimpleQueue()
    ranks = mp.start_processes(
        _v_rank,
        args=(2, schedule, find_free_network_port(), queue),
        nprocs=2,
        start_method="fork",
        join=False,
    )
    tied, block = queue.get()  # before the join: rank 0 blocks on a full pipe until it is read
    ranks.join()
    torch.testing.assert_close(torch.tensor(tied), module.model.wte.weight.grad)
    torch.testing.assert_close(torch.tensor(block), module.model.blocks[0].attn.q_proj.weight.grad)


def test_the_plain_loop_trains_as_the_timed_lightning_fit_does():
    """Every bench ratio of Lightning against the plain loop compares the same training: from one
    seed, the plain loop's weights after a few steps are Lightning's (to float rounding), and the
    step clock ticks once per step."""
    from repro.experiments.bench.workload import OPTIM
    from repro.experiments.kit.step_time import PlainLoop, StepClock, synthetic_batches, timed_fit
    from repro.lit import GPTLightningModule
    from repro.models import GPTConfig

    cfg = GPTConfig(n_layer=2, n_embd=32, n_head=2, vocab_size=64, block_size=16)
    batches = synthetic_batches(64, 2, 16, 4, torch.device("cpu"))
    loop = PlainLoop.gpt(cfg, OPTIM, seed=3)
    for batch in batches:
        loop.step(batch)
    torch.manual_seed(3)
    module, clock = GPTLightningModule(cfg, OPTIM), StepClock()
    timed_fit(module, torch.utils.data.DataLoader(batches, batch_size=None), len(batches), clock)
    assert len(clock.times) == len(batches)
    torch.manual_seed(3)
    untrained = GPTLightningModule(cfg, OPTIM)
    for plain, ours, start in zip(loop.module.parameters(), module.parameters(), untrained.parameters()):
        assert not torch.equal(ours, start)  # trained
        torch.testing.assert_close(plain, ours, rtol=0, atol=1e-5)
