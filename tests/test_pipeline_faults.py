"""Faults in pipeline training: non-finite messages and losses (raise naming step, boundary and
direction, or skip the step), a rank killed with SIGKILL, the main process dying, and exact
resume for every method (fork launcher, gloo)."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from test_pipeline_strategy import Recorder, fit, make_dm, make_module, pipeline

INF = float("inf")


def _hook_at_step(module, step: int, make_bad):
    """A forward hook that replaces the output at one training step."""

    def hook(mod, inputs, output):
        trainer = module._trainer
        if trainer is not None and trainer.training and trainer.global_step == step:
            return make_bad(output)
        return output

    return hook


def _inject(module, where: str, step: int) -> None:
    blocks = module.model.blocks
    if where == "fwd":  # block 1 lives on stage 1 of 4: its output is the message to stage 2
        blocks[1].register_forward_hook(_hook_at_step(module, step, lambda y: y * INF))
    elif where == "bwd":  # the gradient stage 2 sends back to stage 1

        def grad_hook(mod, grad_input, grad_output):
            trainer = module._trainer
            if trainer.global_step == step:
                return (grad_input[0] * INF,)

        blocks[2].register_full_backward_hook(grad_hook)
    elif where == "loss":  # the head's logits (last stage)
        module.model.lm_head.register_forward_hook(_hook_at_step(module, step, lambda y: y * float("nan")))
    elif where == "overflow":  # finite activations that fp16 cannot hold: the compressed message is inf
        blocks[0].register_forward_hook(_hook_at_step(module, step, lambda y: y * 1e6))


@pytest.mark.parametrize(
    "where, options, expected",
    [
        ("fwd", {}, "the fwd message (activations) of boundary 1, stage 1 -> 2"),
        ("bwd", {}, "the bwd message (gradients) of boundary 1, stage 2 -> 1"),
        ("loss", {}, "the loss (stage 3)"),
        (
            "overflow",
            {"method": "direct", "fwd_compressor": "fp16", "bwd_compressor": "fp16"},
            "the fwd message (activations) of boundary 0, stage 0 -> 1",
        ),
    ],
)
def test_a_nonfinite_message_or_loss_stops_training_naming_step_boundary_direction(
    where, options, expected, corpus, tmp_path
):
    module = make_module()
    _inject(module, where, step=2)
    start = time.perf_counter()
    with pytest.raises(Exception) as info:
        fit(
            tmp_path,
            make_dm(corpus, tmp_path / "c"),
            module,
            pipeline(4, timeout_s=30, **options),
            steps=5,
            devices=4,
        )
    message = str(info.value)
    assert "non-finite values (NaN or inf) at training step 2" in message, message
    assert expected in message, message
    assert time.perf_counter() - start < 60


class ParamDigests(L.Callback):
    def __init__(self, out: Path) -> None:
        self.out, self.digests = out, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        h = hashlib.sha256()
        for p in pl_module.parameters():
            if p.numel():
                h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
        self.digests.append(h.hexdigest())

    def on_train_end(self, trainer, pl_module) -> None:
        torch.save(self.digests, self.out / f"params{trainer.global_rank}.pt")


@pytest.mark.parametrize("method", ["clapping_fc", "aqsgd"])
def test_skip_mode_drops_the_step_and_restores_the_buffers(method, corpus, tmp_path):
    module = make_module(n_layer=2)
    module.model.blocks[0].register_forward_hook(_hook_at_step(module, 2, lambda y: y * float("nan")))
    records = fit(
        tmp_path,
        make_dm(corpus, tmp_path / "c"),
        module,
        pipeline(
            2,
            method=method,
            fwd_compressor="quant(4)",
            bwd_compressor="quant(8)",
            p=0.5,
            warmup_epochs=0,
            nonfinite="skip",
        ),
        steps=5,
        devices=2,
        callbacks=[ParamDigests(tmp_path / "records")],
    )
    for rank, rec in enumerate(records):
        assert rec["totals"]["skipped_steps"] == 1
        assert rec["metrics"]["pipe/skipped_steps"] == 1
        losses = rec["losses"]
        assert not torch.isfinite(torch.tensor(losses[2])) and all(
            torch.isfinite(torch.tensor(losses[i])) for i in (0, 1, 3, 4)
        )
        params = torch.load(tmp_path / "records" / f"params{rank}.pt")
        assert params[2] == params[1] and params[3] != params[2]  # step 2 changed no parameter; step 3 did
        assert rec["digests"][2] == rec["digests"][1]  # the codec buffers are as before step 2
    # both ends of the channel still hold the same buffers at every step
    fwd0 = [d["b0_fwd_send"] for d in records[0]["digests"]]
    fwd1 = [d["b0_fwd_recv"] for d in records[1]["digests"]]
    assert fwd0 == fwd1


class KillRank(L.Callback):
    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and batch_idx == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def test_a_rank_killed_with_sigkill_ends_every_rank_naming_it(corpus, tmp_path):
    strategy = pipeline(4, timeout_s=30)
    start = time.perf_counter()
    with pytest.raises(Exception, match=r"rank 2 \(pid \d+\) was killed by signal SIGKILL"):
        fit(
            tmp_path,
            make_dm(corpus, tmp_path / "c"),
            make_module(),
            strategy,
            steps=10,
            devices=4,
            callbacks=[KillRank(2, 2)],
        )
    assert time.perf_counter() - start < 60
    procs = strategy.launcher.procs
    assert len(procs) == 4
    assert all(not p.is_alive() for p in procs)  # no rank is left behind
    assert all(p.exitcode != 0 for p in procs)


def _die_before_a_collective(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from repro.pipeline.transport import PipelineTimeout, stage_collectives

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.barrier()
    if rank == 1:
        os._exit(0)  # gone without a word, as a stage process killed between two steps
    try:
        with stage_collectives(0, "training step 3"):
            dist.all_reduce(torch.zeros(2))
    except PipelineTimeout as exc:
        Path(out).write_text(str(exc))


def test_a_stage_that_dies_before_a_collective_is_named_by_the_stage_left_waiting(tmp_path):
    """The survivor of a real gloo all-reduce whose peer has exited gets one line naming its stage,
    the step and the death, not gloo's many-line read error (what torchrun prints per rank); an
    error that is no broken connection passes through unchanged."""
    import torch.multiprocessing as mp
    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    from repro.pipeline.transport import stage_collectives

    out = tmp_path / "message.txt"
    mp.start_processes(
        _die_before_a_collective, args=(find_free_network_port(), str(out)), nprocs=2, start_method="fork"
    )
    message = out.read_text()
    assert message.startswith(
        "stage 0: the connection closed during training step 3: a stage process has died"
    )
    assert "\n" not in message
    with pytest.raises(RuntimeError, match="^a shape mismatch$"), stage_collectives(0, "training step 3"):
        raise RuntimeError("a shape mismatch")


def test_a_process_group_that_does_not_form_ends_in_one_line(tmp_path, data_cache):
    """One of two srun tasks alone (its peer never comes): after timeout_s the rank ends with one line
    naming the rendezvous address and GLOO_SOCKET_IFNAME, and no traceback (teardown leaves the model,
    still on the meta device, alone)."""
    import subprocess
    import sys

    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    from conftest import MODELS, REPO_ROOT

    port = find_free_network_port()
    slurm = dict(
        SLURM_NTASKS="2", SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="1", SLURM_PROCID="0", SLURM_LOCALID="0",
        SLURM_NODEID="0", SLURM_JOB_ID="778", SLURM_JOB_NAME="pipeline", SLURM_NODELIST="127.0.0.1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
    )  # fmt: skip
    cmd = [
        sys.executable, "-m", "repro.cli", "fit", "--config", str(MODELS / "smoke" / "pipeline.yaml"),
        "--trainer.devices=1", "--trainer.num_nodes=2", "--trainer.strategy.init_args.timeout_s=2",
        f"--data.cache_dir={data_cache}", f"--trainer.default_root_dir={tmp_path}",
    ]  # fmt: skip
    done = subprocess.run(
        cmd,
        cwd=tmp_path,
        env={**os.environ, **slurm, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    lines = [line for line in out.splitlines() if "did not form their process group" in line]
    assert len(lines) == 1 and lines[0].startswith("repro fit: error: rank 0: "), out[-3000:]
    assert f"127.0.0.1:{port}" in lines[0] and "GLOO_SOCKET_IFNAME" in lines[0]
    assert "Traceback" not in out and "meta tensor" not in out, out[-3000:]


def _grandchild(out: str) -> None:
    from repro.pipeline.watchdog import exit_when_parent_dies

    exit_when_parent_dies("rank 1", poll_s=0.2)
    Path(out + ".pid").write_text(str(os.getpid()))
    time.sleep(60)


def _parent(out: str) -> None:
    import multiprocessing as mp

    child = mp.get_context("fork").Process(target=_grandchild, args=(out,))
    child.start()
    deadline = time.time() + 20
    while not Path(out + ".pid").exists() and time.time() < deadline:
        time.sleep(0.05)
    os._exit(0)  # the parent dies without cleaning up (as a SIGKILLed rank 0 would)


def test_a_rank_exits_when_its_parent_dies(tmp_path):
    import multiprocessing as mp

    out = str(tmp_path / "grandchild")
    parent = mp.get_context("fork").Process(target=_parent, args=(out,))
    parent.start()
    parent.join(30)
    pid = int(Path(out + ".pid").read_text())
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        # a reparented exited child can linger as a zombie of init; /proc says so
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                break
        except OSError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the child outlived its parent by 10 s")


# ---------------------------------------------------------------------- exact resume
RESUME_CASES = {
    "none": dict(method="none"),
    "none_lazy": dict(method="none", p=0.5),
    # the tied sums compressed too: their error feedback is in the checkpoint
    "direct": dict(
        method="direct", fwd_compressor="quant(4)", bwd_compressor="topk(0.2)", tied_compressor="quant(4)"
    ),
    "ef21": dict(method="ef21", fwd_compressor="randk(0.3)", bwd_compressor="quant(8)"),
    "aqsgd": dict(
        method="aqsgd",
        fwd_compressor="quant(4)",
        bwd_compressor="quant(8)",
        p=0.5,
        warmup_epochs=0,
        aqsgd_checkpoint_buffers=True,
    ),
    "clapping_fc": dict(method="clapping_fc", fwd_compressor="quant(4)", bwd_compressor="quant(8)", p=0.5),
    "clapping_fu": dict(
        method="clapping_fu", fwd_compressor="topk(0.1)", bwd_compressor="quant(2,stochastic)", p=0.5
    ),
}


# cases resumed from the checkpoint a stop signal wrote (the others from a periodic one): Ctrl-C
# reaches the launching process, which forwards it; SIGTERM reaches one rank, and every rank stops
SIGNAL_CASES = {
    "none": dict(signum=signal.SIGINT, rank=0, to_parent=True),
    "clapping_fc": dict(signum=signal.SIGTERM, rank=1),
    "aqsgd": dict(signum=signal.SIGTERM, rank=0),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_every_method_resumes_bitwise(case, corpus, tmp_path):
    """Stopped at step 3 (a periodic checkpoint) or by a signal during step 4 (then at the end of
    step 5, every rank together), and resumed from that checkpoint: the same losses, bit for bit,
    at every later step, and the same buffers on both ends (AQ-SGD with its rows in the checkpoint)."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from stop_helpers import SignalAt

    from repro.lit import FinalCheckpoint
    from repro.stop import STOP

    opts = RESUME_CASES[case]
    optim = {"name": "adamw", "lr": 1e-2, "warmup_steps": 2, "schedule": "cosine", "decay_steps": 8}
    dm = make_dm(corpus, tmp_path / "c")
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3, save_top_k=-1)
    (tmp_path / "a").mkdir()
    L.seed_everything(5, verbose=False)  # the same initial weights in the interrupted run below
    whole = fit(
        tmp_path / "a",
        dm,
        make_module(n_layer=2, optim=optim),
        pipeline(2, **opts),
        steps=7,
        devices=2,
        callbacks=[ckpt],
        enable_checkpointing=True,
        gradient_clip_val=0.5,
    )
    resume_from, done = tmp_path / "ckpts" / "epoch=0-step=3.ckpt", 3
    if case in SIGNAL_CASES:
        (tmp_path / "cut").mkdir()
        L.seed_everything(5, verbose=False)
        fit(
            tmp_path / "cut",
            dm,
            make_module(n_layer=2, optim=optim),
            pipeline(2, **opts),
            steps=7,
            devices=2,
            callbacks=[FinalCheckpoint(), SignalAt(4, **SIGNAL_CASES[case])],
            gradient_clip_val=0.5,
            default_root_dir=str(tmp_path / "cut"),
        )
        assert STOP.stopped is not None and STOP.stopped.step == 5
        assert STOP.stopped.signum == (signal.SIGTERM if case == "none" else SIGNAL_CASES[case]["signum"])
        resume_from, done = Path(STOP.stopped.path), 5
        assert resume_from.name == "interrupted.ckpt" and not list((tmp_path / "cut").rglob("final.ckpt"))
    (tmp_path / "b").mkdir()
    out = tmp_path / "b" / "records"
    out.mkdir()
    L.seed_everything(123, verbose=False)  # a different seed: nothing may depend on it after a resume
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=pipeline(2, **opts),
        max_steps=7,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        gradient_clip_val=0.5,
        callbacks=[Recorder(out)],
    )
    trainer.fit(make_module(n_layer=2, optim=optim), dm, ckpt_path=str(resume_from))
    for rank in range(2):
        resumed = torch.load(out / f"rank{rank}.pt")
        assert resumed["losses"] == whole[rank]["losses"][done:]  # bitwise
        assert resumed["digests"] == whole[rank]["digests"][done:]
