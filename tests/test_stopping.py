"""Runs stopped by a signal resume exactly. SIGINT (Ctrl-C) and SIGTERM (a scheduler's time limit)
in `repro fit` stop at the end of the step under way, write a checkpoint, and exit 130 / 143 with
one line naming the step and the command that resumes; that command continues the uninterrupted
run bit for bit. Under SLURM the requeue signal writes Lightning's hpc checkpoint, calls
`scontrol requeue` (a stand-in here) and the requeued start resumes from it."""

from __future__ import annotations

import shlex
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from stop_helpers import LossLog, SignalAt, read_losses
from test_resume_determinism import small_dm

from repro.fit_command import main as fit_main
from repro.lit import FinalCheckpoint
from repro.stop import STOP

from conftest import MODELS
from test_pipeline_strategy import make_module

STEPS = 12


def _callbacks(*specs: str) -> list[str]:
    return [f"--trainer.callbacks+={spec}" for spec in specs]


def _fit(work: Path, cache: Path, extra: list[str]) -> int:
    args = [
        "fit",
        "--config",
        str(MODELS / "smoke" / "gpt_mha.yaml"),
        f"--trainer.max_steps={STEPS}",
        f"--data.cache_dir={cache}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.limit_val_batches=1",
        *_callbacks(
            f'{{"class_path": "stop_helpers.LossLog", "init_args": {{"path": "{work / "losses.jsonl"}"}}}}'
        ),
        *extra,
    ]
    return fit_main(args)


def _weights(work: Path) -> dict[str, torch.Tensor]:
    (path,) = work.glob("logs/smoke/version_*/checkpoints/final.ckpt")
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_cache):
    work = tmp_path_factory.mktemp("whole")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        assert _fit(work, data_cache, []) == 0
    return read_losses(work / "losses.jsonl"), _weights(work)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_repro_fit_at_a_step_boundary_and_the_resume_is_the_uninterrupted_run(
    signum, uninterrupted, tmp_path, data_cache, capsys, monkeypatch
):
    losses, weights = uninterrupted
    monkeypatch.chdir(tmp_path)
    signal_at = (
        f'{{"class_path": "stop_helpers.SignalAt", "init_args": {{"step": 5, "signum": {int(signum)}}}}}'
    )
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs as a background job
    code = _fit(tmp_path, data_cache, _callbacks(signal_at))
    assert code == 128 + signum
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("repro fit:")]
    assert len(err) == 1 and f"stopped by {signal.Signals(signum).name} after step 6; resume with: " in err[0]
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are put back
    (ckpt,) = tmp_path.glob("logs/smoke/version_0/checkpoints/interrupted.ckpt")
    assert not list(tmp_path.glob("logs/smoke/version_0/checkpoints/final.ckpt"))
    assert torch.load(ckpt, weights_only=False)["global_step"] == 6  # not a periodic checkpoint's step
    stopped = read_losses(tmp_path / "losses.jsonl")
    assert stopped == {s: v for s, v in losses.items() if s <= 6}
    resume = shlex.split(err[0].split("resume with: ", 1)[1])
    assert resume[:2] == ["repro", "fit"] and resume[-1] == f"--ckpt_path={ckpt.relative_to(tmp_path)}"
    (tmp_path / "losses.jsonl").unlink()
    assert fit_main(resume[1:]) == 0
    resumed = read_losses(tmp_path / "losses.jsonl")
    assert resumed == {s: v for s, v in losses.items() if s > 6}  # every later step, bitwise
    (final,) = tmp_path.glob(
        "logs/smoke/version_0/checkpoints/final.ckpt"
    )  # logged on into the run it resumes
    assert [p.name for p in tmp_path.glob("logs/smoke/*")] == ["version_0"]
    state = torch.load(final, map_location="cpu", weights_only=False)["state_dict"]
    assert state.keys() == weights.keys() and all(torch.equal(state[k], weights[k]) for k in state)


def _trainer(root: Path, *callbacks, steps: int = 7) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        default_root_dir=str(root),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=list(callbacks),
    )


OPTIM = {"lr": 1e-2, "warmup_steps": 2, "schedule": "cosine", "decay_steps": 8}


def test_under_slurm_the_requeue_signal_saves_requeues_and_the_next_start_resumes(
    corpus, tmp_path, monkeypatch
):
    whole_log = tmp_path / "whole.jsonl"
    L.seed_everything(0, verbose=False)
    _trainer(tmp_path / "whole", LossLog(str(whole_log))).fit(
        make_module(optim=OPTIM), small_dm(corpus, tmp_path / "c")
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    slurm = dict(
        SLURM_NTASKS="1", SLURM_JOB_NAME="train", SLURM_JOB_ID="4242", SLURM_NODELIST="localhost",
        SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
    )  # fmt: skip
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    root, log = tmp_path / "job", tmp_path / "job.jsonl"
    L.seed_everything(0, verbose=False)
    first = _trainer(root, FinalCheckpoint(), SignalAt(3, signal.SIGUSR1), LossLog(str(log)))
    first.fit(make_module(optim=OPTIM), small_dm(corpus, tmp_path / "c"))
    assert STOP.stopped is not None and STOP.stopped.signum == signal.SIGUSR1 and STOP.stopped.step == 4
    assert calls.read_text().split() == ["requeue", "4242"]
    assert [p.name for p in root.glob("hpc_ckpt_*.ckpt")] == ["hpc_ckpt_1.ckpt"]
    assert not list(root.rglob("final.ckpt")) and first.global_step == 4
    L.seed_everything(99, verbose=False)  # the requeued start: same command, no --ckpt_path
    _trainer(root, FinalCheckpoint(), LossLog(str(log))).fit(
        make_module(optim=OPTIM), small_dm(corpus, tmp_path / "c")
    )
    assert read_losses(log) == read_losses(whole_log)  # steps 1..4 from the first start, 5..7 resumed
    assert list(root.rglob("final.ckpt"))


class RaiseAt(L.Callback):
    """A KeyboardInterrupt raised as step ``step`` starts (what a second Ctrl-C is): the batch was
    fetched but not trained."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def test_the_checkpoint_of_an_interrupted_step_resumes_at_that_step_not_one_later(corpus, tmp_path):
    whole_log, cut_log = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    L.seed_everything(0, verbose=False)
    _trainer(tmp_path / "whole", LossLog(str(whole_log))).fit(
        make_module(optim=OPTIM), small_dm(corpus, tmp_path / "c")
    )
    L.seed_everything(0, verbose=False)
    final = FinalCheckpoint()
    with pytest.raises(SystemExit):  # Lightning ends a KeyboardInterrupt with exit(1)
        _trainer(tmp_path / "cut", final, RaiseAt(3), LossLog(str(cut_log))).fit(
            make_module(optim=OPTIM), small_dm(corpus, tmp_path / "c")
        )
    ckpt = torch.load(final.path, weights_only=False)
    progress = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert ckpt["global_step"] == 3 and progress["ready"] == progress["processed"] + 1  # fetched, not trained
    L.seed_everything(99, verbose=False)
    _trainer(tmp_path / "cut", LossLog(str(cut_log))).fit(
        make_module(optim=OPTIM), small_dm(corpus, tmp_path / "c"), ckpt_path=final.path
    )
    assert read_losses(cut_log) == read_losses(whole_log)  # batch 3 trained after the resume, bitwise
