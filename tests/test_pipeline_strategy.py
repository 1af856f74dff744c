"""The Clapping strategy across processes (fork launcher, gloo): equivalence with one process,
bit-identical buffers, logged bytes, training progress, checkpoints, failures and bad input."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from repro.data import TextDataModule
from repro.lit import GPTLightningModule
from repro.models import GPTConfig
from repro.pipeline.compressors import build_compressor
from repro.pipeline.lightning import ClappingStrategy
from repro.pipeline.schedule import stage_schedule
from repro.pipeline.stage_parts import StageParts


def make_dm(corpus: Path, cache: Path, batch_size: int = 8) -> TextDataModule:
    return TextDataModule(
        corpus="text_files",
        text_files=[str(corpus / "*.txt")],
        tokenizer="char",
        block_size=32,
        batch_size=batch_size,
        max_val_blocks=16,
        val_fraction=0.2,
        cache_dir=str(cache),
    )


def make_module(n_layer: int = 4, vocab: int = 64, optim: dict | None = None) -> GPTLightningModule:
    cfg = GPTConfig(
        n_layer=n_layer, n_embd=32, n_head=2, rope_dims=[8] * n_layer, vocab_size=vocab, block_size=32
    )
    return GPTLightningModule(cfg, optim or {"lr": 1e-2, "warmup_steps": 0, "schedule": "constant"})


class Recorder(L.Callback):
    """Writes each rank's losses, gradients and buffer digests to <out>/rank<r>.pt."""

    def __init__(self, out: Path, grads: bool = False) -> None:
        self.out, self.grads = out, grads
        self.losses, self.grad_steps, self.digests = [], [], []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.grads:
            self.grad_steps.append(
                {
                    n: p.grad.detach().clone()
                    for n, p in pl_module.named_parameters()
                    if p.numel() and p.grad is not None
                }
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        if isinstance(trainer.strategy, ClappingStrategy):
            self.digests.append(trainer.strategy.buffer_digests())

    def on_train_end(self, trainer, pl_module) -> None:
        record = {
            "losses": self.losses,
            "grads": self.grad_steps,
            "digests": self.digests,
            "threads": torch.get_num_threads(),  # this rank's torch threads (a stage process's share of the cores)
        }
        s = trainer.strategy
        if isinstance(s, ClappingStrategy):
            record.update(
                sent=dict(s.runner.links.counters.bytes_sent),
                placement=s.split.placement,
                totals=s.state.totals.state_dict(),
                metrics={k: float(v) for k, v in trainer.callback_metrics.items()},
            )
        torch.save(record, self.out / f"rank{trainer.global_rank}.pt")


def fit(tmp_path, dm, module, strategy, steps=4, callbacks=(), **trainer_kwargs) -> list[dict]:
    out = tmp_path / "records"
    out.mkdir(exist_ok=True)
    L.seed_everything(0, verbose=False)
    devices = trainer_kwargs.pop("devices", None)
    ckpt_path = trainer_kwargs.pop("ckpt_path", None)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices or 1,
        strategy=strategy,
        max_steps=steps,
        logger=False,
        enable_checkpointing=trainer_kwargs.pop("enable_checkpointing", False),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=trainer_kwargs.pop("limit_val_batches", 0),
        callbacks=[Recorder(out, grads=True), *callbacks],
        **trainer_kwargs,
    )
    trainer.fit(module, dm, ckpt_path=ckpt_path)
    return [torch.load(p) for p in sorted(out.glob("rank*.pt"))]


def pipeline(devices: int, **kwargs) -> ClappingStrategy:
    kwargs.setdefault("micro_batches", 2)
    kwargs.setdefault("timeout_s", 60)
    return ClappingStrategy(start_method="fork", **kwargs)


# ---------------------------------------------------------------------- equivalence
@pytest.fixture(scope="module")
def single_process_reference(corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    dm = make_dm(
        corpus, tmp / "c"
    )  # the datamodule's own loader: the same batches as the pipeline's at p = 1
    L.seed_everything(0, verbose=False)
    module = make_module()
    return fit(tmp, dm, module, "auto", steps=4, gradient_clip_val=0.5)[0]


@pytest.mark.parametrize(
    "k, schedule, more",
    [
        (2, "gpipe", {}),
        (4, "gpipe", {}),
        (4, "1f1b", {"extra_warmup": 1}),  # stage 2 runs 2 forwards ahead, not 1
        (2, "1f1b", {"placement": "v"}),  # the embedding on the last stage, with its tied head
        (4, "gpipe", {"placement": "v"}),
    ],
)
def test_none_identity_through_k_stages_matches_one_process(
    k, schedule, more, corpus, tmp_path, single_process_reference
):
    L.seed_everything(0, verbose=False)
    module = make_module()
    records = fit(
        tmp_path,
        make_dm(corpus, tmp_path / "c"),
        module,
        pipeline(k, schedule=schedule, **more),
        steps=4,
        devices=k,
        gradient_clip_val=0.5,
    )
    ref = single_process_reference
    assert len(records) == k
    for rec in records:  # every rank logs the same loss
        assert rec["losses"] == pytest.approx(ref["losses"], rel=1e-5, abs=1e-6)
    for step, ref_grads in enumerate(ref["grads"]):
        seen = set()
        for rec in records:
            for name, grad in rec["grads"][step].items():
                torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6)
                seen.add(name)
        assert seen == set(ref_grads)  # every parameter lives on some stage


def test_placement_auto_takes_v_for_a_large_tied_vocabulary_and_trains_as_v_does_bit_for_bit(
    corpus, tmp_path
):
    """A tied vocabulary of 1,024 x 32 at 8 x 32 tokens a step: the sum would send 0.26 MB a step, v
    0.066 MB, so auto runs 'v', and trains exactly as an explicit 'v' does (losses, every gradient,
    every byte sent)."""
    runs = {}
    for placement in ("auto", "v"):
        (tmp_path / placement).mkdir()
        L.seed_everything(0, verbose=False)
        module = make_module(n_layer=2, vocab=1024)
        strategy = pipeline(2, placement=placement)
        runs[placement] = fit(tmp_path / placement, make_dm(corpus, tmp_path / "c"), module, strategy,
                              steps=2, devices=2)  # fmt: skip
    for auto, v in zip(runs["auto"], runs["v"], strict=True):
        assert auto["placement"] == v["placement"] == "v"
        assert auto["losses"] == v["losses"] and auto["sent"] == v["sent"]
        for step_auto, step_v in zip(auto["grads"], v["grads"], strict=True):
            assert step_auto.keys() == step_v.keys()
            assert all(torch.equal(step_auto[n], step_v[n]) for n in step_auto)


def test_a_compressed_tied_sum_is_the_same_on_both_stages_and_counts_its_bytes(corpus, tmp_path):
    """tied_compressor quant(8): each end sends its embedding (or head) gradient plus its kept error,
    compressed; both ends add the decoded messages in stage order, so the tied gradient is bitwise the
    same on the first and the last stage at every step, and its bytes are the compressed payloads'."""
    records = fit(
        tmp_path, make_dm(corpus, tmp_path / "c"), make_module(n_layer=2),
        pipeline(2, tied_compressor="quant(8)"), steps=3, devices=2,
    )  # fmt: skip
    first, last = records
    for a, b in zip(first["grads"], last["grads"]):
        assert torch.equal(a["model.wte.weight"], b["model.wte.weight"])
    payload = build_compressor("quant(8)").payload_nbytes((64, 32), torch.float32)
    assert first["totals"]["bytes"]["tied0"] == first["totals"]["bytes"]["tied1"] == 3 * payload
    assert first["totals"]["raw_bytes"]["tied0"] == 3 * 64 * 32 * 4 and payload < 64 * 32 * 4 / 3


# ---------------------------------------------------------------------- compression
@pytest.mark.parametrize("schedule, extra, placement", [("gpipe", 0, "linear"), ("1f1b", 1, "v")])
def test_clapping_buffers_are_bit_identical_and_logged_bytes_are_the_bytes_sent(
    schedule, extra, placement, corpus, tmp_path
):
    """With placement 'v' the embedding runs on the last stage, which sends its output to stage 0
    over a third boundary (2 -> 0) and gets its gradient back: no tied sum, every message counted."""
    k = 3
    nb = k if placement == "v" else k - 1  # boundary b: stage b -> (b + 1) % k
    records = fit(
        tmp_path,
        make_dm(corpus, tmp_path / "c"),
        make_module(n_layer=3),
        pipeline(
            k,
            method="clapping_fc",
            fwd_compressor="quant(4)",
            bwd_compressor="topk(0.1)",
            p=0.5,
            schedule=schedule,
            extra_warmup=extra,
            placement=placement,
            bandwidth_mbps=50.0,
            timeline_dir=str(tmp_path / "timeline"),
        ),
        steps=5,
        devices=k,
    )
    for rank in range(
        k
    ):  # each rank's timeline: the schedule's forwards and backwards in its order, every step
        trace = json.loads((tmp_path / "timeline" / f"timeline_rank{rank}.json").read_text())["traceEvents"]
        compute = [e for e in trace if e.get("cat") == "compute"]
        expected = [f"{kind}{m}" for kind, m in stage_schedule(schedule, rank, k, 2, extra)]
        if placement == "v" and rank == k - 1:  # the first part: every forward first, every backward last
            expected = ["F0 first part", "F1 first part", *expected, "B0 first part", "B1 first part"]
        assert [e["name"] for e in compute] == expected * 5
        assert [e["args"]["step"] for e in compute] == [s for s in range(5) for _ in expected]
        assert all(e["dur"] >= 0 for e in trace if e.get("ph") == "X")
    for step in range(5):
        for b in range(nb):
            for direction, (snd, rcv) in {"fwd": (b, (b + 1) % k), "bwd": ((b + 1) % k, b)}.items():
                send = records[snd]["digests"][step][f"b{b}_{direction}_send"]
                recv = records[rcv]["digests"][step][f"b{b}_{direction}_recv"]
                assert send == recv
    shape, dtype = (4, 32, 32), torch.float32  # micro-batch x block x n_embd
    per_message = {
        "fwd": build_compressor("quant(4)").payload_nbytes(shape, dtype),
        "bwd": build_compressor("topk(0.1)").payload_nbytes(shape, dtype),
    }
    totals = records[0]["totals"]
    for b in range(nb):
        sent_fwd = records[b]["sent"]["fwd"]
        sent_bwd = records[(b + 1) % k]["sent"]["bwd"]
        assert totals["bytes"][f"b{b}_fwd"] == sent_fwd == 5 * 2 * per_message["fwd"]
        assert totals["bytes"][f"b{b}_bwd"] == sent_bwd == 5 * 2 * per_message["bwd"]
    # the tied embedding and head (vocabulary 64 x 32, fp32): the first and the last stage each send
    # their gradient to the other once a step, exactly, and those bytes count too
    # (placement 'v': the one copy of the weight, on the last stage, has no sum to send)
    tied = 5 * 64 * 32 * 4 if placement == "linear" else 0
    assert len(totals["bytes"]) == 2 * nb + (2 if tied else 0)
    if tied:
        assert totals["bytes"]["tied0"] == totals["bytes"][f"tied{k - 1}"] == tied
    messages = sum(v for tag, v in totals["bytes"].items() if tag.startswith("b"))
    assert records[0]["metrics"]["pipe/bytes_total"] == messages + 2 * tied
    raw = 5 * 2 * 4 * 32 * 32 * 4 * 2 * nb
    assert records[0]["metrics"]["pipe/compression_ratio"] == pytest.approx(
        (messages + 2 * tied) / (raw + 2 * tied)
    )
    ends = 2 if placement == "linear" else 4  # stage 0's channel ends, each a buffer per micro-batch slot
    assert all(r["metrics"]["pipe/buffer_bytes/rank0"] == ends * 2 * 4 * 32 * 32 * 4 for r in records)
    for rank, rec in enumerate(
        records
    ):  # each send waited bytes * 8 / bandwidth (payloads only; headers are free)
        sent = rec["sent"]["fwd"] + rec["sent"]["bwd"]
        assert records[0]["metrics"][f"pipe/net_time_s/rank{rank}"] == pytest.approx(
            sent * 8 / 50e6, rel=1e-6
        )


@pytest.mark.parametrize(
    "method, fwd, bwd", [("clapping_fc", "quant(4)", "quant(8)"), ("clapping_fu", "topk(0.1)", "topk(0.1)")]
)
def test_clapping_trains_the_model_well_below_its_starting_loss(method, fwd, bwd, corpus, tmp_path):
    records = fit(
        tmp_path,
        make_dm(corpus, tmp_path / "c"),
        make_module(),
        pipeline(4, method=method, fwd_compressor=fwd, bwd_compressor=bwd, p=0.5),
        steps=40,
        devices=4,
    )
    losses = records[0]["losses"]
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, losses


# ---------------------------------------------------------------------- checkpoints
def test_checkpoint_holds_the_full_model_every_stage_and_the_sampler(corpus, tmp_path):
    """Placement 'v' (the embedding on the last stage): the gathered model is whole all the same, and
    validation through the pipeline is that model's."""
    from repro.lit import FinalCheckpoint

    final = FinalCheckpoint("final.ckpt")
    dm = make_dm(corpus, tmp_path / "c")
    records = fit(
        tmp_path,
        dm,
        make_module(),
        pipeline(
            2,
            method="clapping_fc",
            fwd_compressor="quant(4)",
            bwd_compressor="quant(8)",
            p=0.5,
            placement="v",
        ),
        steps=3,
        devices=2,
        callbacks=[final],
        default_root_dir=str(tmp_path),
        limit_val_batches=2,
        val_check_interval=3,
    )
    path = tmp_path / "checkpoints" / "final.ckpt"
    ckpt = torch.load(path, weights_only=False)
    state = ckpt["clapping"]
    assert state["steps_done"] == 3 and state["sampler"]["step"] == 3 and state["sampler"]["p"] == 0.5
    assert len(ckpt["optimizer_states"][0]["pipeline_stages"]) == 2
    assert (
        set(state["codecs"][0]) == set(state["codecs"][1]) == {"fwd:send", "bwd:recv", "fwd:recv", "bwd:send"}
    )
    full = GPTLightningModule.load_from_checkpoint(path)  # a single-process module takes the whole model
    assert all(v.numel() > 0 for v in full.state_dict().values())
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, limit_val_batches=2
    )
    metrics = trainer.validate(full, dm, verbose=False)[0]
    # validation through the pipeline (exact messages) = validation of the same weights in one process
    assert metrics["val/loss"] == pytest.approx(records[0]["metrics"]["val/loss"], rel=1e-5)
    assert metrics["val/ppl"] == pytest.approx(records[0]["metrics"]["val/ppl"], rel=1e-4)


# ---------------------------------------------------------------------- failures and bad input
class FailOnRank(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == 1 and batch_idx == 2:
            raise RuntimeError("injected failure on rank 1")


def test_an_error_on_one_rank_ends_every_rank_with_its_message(corpus, tmp_path):
    start = time.perf_counter()
    with pytest.raises(Exception, match="injected failure on rank 1"):
        fit(
            tmp_path,
            make_dm(corpus, tmp_path / "c"),
            make_module(),
            pipeline(4, timeout_s=20),
            steps=10,
            devices=4,
            callbacks=[FailOnRank()],
        )
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize(
    "devices, strategy_kwargs, module_kwargs, fragment",
    [
        (4, {}, {"n_layer": 3}, "only 3 layers"),
        (2, {"stages": 4}, {}, "stages=4"),
        (2, {"micro_batches": 3}, {}, "does not divide into 3"),
    ],
)
def test_bad_pipeline_setups_fail_before_training(
    devices, strategy_kwargs, module_kwargs, fragment, corpus, tmp_path
):
    with pytest.raises(Exception, match=fragment):
        fit(
            tmp_path,
            make_dm(corpus, tmp_path / "c"),
            make_module(**module_kwargs),
            pipeline(devices, **strategy_kwargs),
            steps=2,
            devices=devices,
        )


class PlainModule(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(torch.randn(16, 4), batch_size=4)


def test_a_module_without_the_stage_protocol_is_refused(tmp_path):
    with pytest.raises(Exception, match="does not implement the pipeline stage protocol"):
        trainer = L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=pipeline(2),
            max_steps=1,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
        )
        trainer.fit(PlainModule())


@pytest.mark.parametrize("gone", ["parts", "input", "loss", "weight"])
def test_an_adapter_missing_a_protocol_method_is_told_which(gone):
    """One line naming the method the module's adapter lacks (and only it); the steps the module
    defines that the pipeline replaces are named at start unless it declares they compute the same."""
    from repro.pipeline.lightning.seams import steps_not_run
    from repro.pipeline.stage_parts import PROTOCOL, stage_adapter_for

    methods = {name: (lambda self, *args: None) for name in PROTOCOL if name != gone}
    adapter = type("HalfAdapter", (), methods)()
    module = type("HalfModule", (PlainModule,), {"pipeline_stages": lambda self: adapter})()
    with pytest.raises(TypeError) as err:
        stage_adapter_for(module)
    message = str(err.value)
    assert f"lacks {PROTOCOL[gone]};" in message and "\n" not in message
    line = steps_not_run(module)
    assert "HalfModule.training_step will not run" in line and "validation_step" not in line
    module.pipeline_replaces_steps = True
    assert steps_not_run(module) is None


@pytest.mark.slow
def test_the_strategy_pages_complete_example_trains_under_the_strategy_on_two_processes(tmp_path):
    """docs/strategy.md's example, as the page shows it, run as a script: 2 spawned stage processes,
    the validation loss far below chance, and no line about steps (it declares they compute the same).
    No gloo thread outlives a rank's exit handlers: the groups are released while the interpreter is
    whole (a gloo thread left to the interpreter's finalization aborted a rank now and then)."""
    import ast
    import os
    import re
    import subprocess
    import sys

    from conftest import REPO_ROOT

    page = (REPO_ROOT / "docs" / "strategy.md").read_text()
    (block,) = re.findall(r"```python\n(# my_pipeline\.py.*?)```", page, flags=re.S)
    threads_at_exit = (  # registered first in every process (ranks import the script), so it runs last
        "import atexit, os\n"  # one write a line: the three processes' lines do not interleave
        "atexit.register(lambda: os.write(2, ('threads at exit: ' + repr([open(f'/proc/self/task/{t}/comm')"
        ".read().strip() for t in os.listdir('/proc/self/task')]) + '\\n').encode()))\n"
    )
    (tmp_path / "my_pipeline.py").write_text(threads_at_exit + block)
    done = subprocess.run(
        [sys.executable, "my_pipeline.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    loss = float(re.search(r"val/loss ([0-9.]+)", done.stdout).group(1))
    assert loss < 1.0  # ln 64 = 4.16 at chance
    assert "will not run" not in done.stdout + done.stderr
    exits = re.findall(r"threads at exit: (\[.*\])", done.stderr)
    assert len(exits) == 3, done.stderr[-3000:]  # the main process and the two ranks
    assert not [name for line in exits for name in ast.literal_eval(line) if "gloo" in name], exits


def test_clapping_resumes_from_a_checkpoint_to_the_same_losses(corpus, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    opts = dict(
        method="clapping_fc", fwd_compressor="quant(4)", bwd_compressor="quant(8)", p=0.5, placement="v"
    )
    dm = make_dm(corpus, tmp_path / "c")
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3, save_top_k=-1)
    (tmp_path / "a").mkdir()
    whole = fit(
        tmp_path / "a",
        dm,
        make_module(optim={"name": "sgd", "lr": 0.05, "warmup_steps": 0}),
        pipeline(2, **opts),
        steps=6,
        devices=2,
        callbacks=[ckpt],
        enable_checkpointing=True,
    )[0]["losses"]
    first_half = tmp_path / "ckpts" / "epoch=0-step=3.ckpt"
    assert first_half.exists()
    (tmp_path / "b").mkdir()
    out = tmp_path / "b" / "records"
    out.mkdir()
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=pipeline(2, **opts),
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[Recorder(out)],
    )
    trainer.fit(
        make_module(optim={"name": "sgd", "lr": 0.05, "warmup_steps": 0}), dm, ckpt_path=str(first_half)
    )
    resumed = torch.load(out / "rank0.pt")["losses"]
    assert resumed == pytest.approx(whole[3:], rel=1e-6, abs=1e-7)


def _silent_neighbour(rank: int, port: int, out: str) -> None:
    import datetime
    import os

    import torch.distributed as dist

    from repro.pipeline.transport import PipelineTimeout, StageLinks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    links = StageLinks(
        rank, {"fwd": dist.group.WORLD, "bwd": dist.group.WORLD}, torch.device("cpu"), timeout_s=2
    )
    if rank == 1:  # waits for an activation that stage 0 never sends
        start = time.perf_counter()
        try:
            links.recv(64, 0, "fwd", 0, "activation 0").wait()
            message = "no error"
        except PipelineTimeout as exc:
            message = str(exc)
        Path(out).write_text(f"{time.perf_counter() - start:.2f}\n{message}")
    else:  # stay alive (and silent) until the neighbour has given up
        deadline = time.perf_counter() + 30
        while not Path(out).exists() and time.perf_counter() < deadline:
            time.sleep(0.1)


def test_a_receive_whose_sender_never_sends_fails_after_the_timeout_naming_the_stage(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "timeout.txt"
    mp.start_processes(
        _silent_neighbour,
        args=(29000 + random.Random().randrange(2000), str(out)),
        nprocs=2,
        start_method="fork",
    )
    seconds, message = out.read_text().split("\n", 1)
    assert 1.5 < float(seconds) < 10
    assert "stage 1: no activation 0 from stage 0 within 2 s" in message


class TinyStages:
    """The stage adapter of TinyModule: a plain torch MLP cut into input layer, hidden layers, output."""

    def __init__(self, module: TinyModule) -> None:
        self.module = module

    def parts(self) -> StageParts:
        return StageParts(first=self.module.inp, layers=list(self.module.hidden), last=self.module.out)

    def input(self, batch):
        return batch["x"]

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch["y"])

    def weight(self, batch) -> int:
        return int(batch["x"].shape[0])


class TinyModule(L.LightningModule):
    """Not a GPT: a LightningModule that offers its own stage adapter (the documented protocol)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(4, 8)
        self.hidden = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(3)
        )
        self.out = torch.nn.Linear(8, 1)

    def pipeline_stages(self) -> TinyStages:
        return TinyStages(self)

    def training_step(self, batch, batch_idx):
        x = self.inp(batch["x"])
        for layer in self.hidden:
            x = layer(x)
        return torch.nn.functional.mse_loss(self.out(x), batch["y"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def tiny_data() -> list[dict]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g)
    return [{"x": x[i], "y": x[i, :1] * 2 - x[i, 1:2]} for i in range(32)]


def test_any_module_with_a_stage_adapter_trains_through_the_pipeline_as_in_one_process(tmp_path):
    loader = lambda: DataLoader(
        tiny_data(), batch_size=8, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(0)
    )
    out = tmp_path / "records"
    out.mkdir()
    losses = {}
    for name, strategy, devices in (("one", "auto", 1), ("pipe", pipeline(2), 2)):
        trainer = L.Trainer(
            accelerator="cpu",
            devices=devices,
            strategy=strategy,
            max_steps=5,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            callbacks=[Recorder(out)],
        )
        trainer.fit(TinyModule(), train_dataloaders=loader())
        losses[name] = torch.load(out / "rank0.pt")["losses"]
    assert losses["pipe"] == pytest.approx(losses["one"], rel=1e-5)
    assert losses["one"][-1] < losses["one"][0]
