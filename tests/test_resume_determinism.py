"""Single-process runs: a resume from a mid-epoch checkpoint is bitwise the uninterrupted run,
the same seed gives the same run, and a non-finite loss stops (or skips) a step."""

from __future__ import annotations

import hashlib

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from repro.data import TextDataModule
from repro.data.sampler import LazyBatchSampler, epoch_order

from test_pipeline_strategy import fit, make_module, pipeline


def small_dm(corpus, cache, blocks: int = 20) -> TextDataModule:
    """20 training blocks in batches of 8: 2 batches per epoch, so 7 steps cross 3 epochs."""
    return TextDataModule(
        corpus="text_files",
        text_files=[str(corpus / "*.txt")],
        tokenizer="char",
        block_size=32,
        batch_size=8,
        max_val_blocks=16,
        val_fraction=0.2,
        cache_dir=str(cache),
        max_train_blocks=blocks,
        shuffle_seed=3,
    )


OPTIM = {"lr": 1e-2, "warmup_steps": 2, "schedule": "cosine", "decay_steps": 8}


def test_single_process_resume_mid_epoch_is_bitwise(corpus, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    dm = small_dm(corpus, tmp_path / "c")
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3, save_top_k=-1)
    (tmp_path / "a").mkdir()
    L.seed_everything(0, verbose=False)
    whole = fit(
        tmp_path / "a",
        dm,
        make_module(optim=OPTIM),
        "auto",
        steps=7,
        callbacks=[ckpt],
        enable_checkpointing=True,
        gradient_clip_val=0.5,
    )[0]
    resume_from = tmp_path / "ckpts" / "epoch=1-step=3.ckpt"  # epoch 1, after its first batch
    assert resume_from.exists()
    (tmp_path / "b").mkdir()
    L.seed_everything(99, verbose=False)  # nothing after a resume may depend on the global seed
    resumed = fit(
        tmp_path / "b",
        dm,
        make_module(optim=OPTIM),
        "auto",
        steps=7,
        gradient_clip_val=0.5,
        ckpt_path=str(resume_from),
    )[0]
    assert resumed["losses"] == whole["losses"][3:]
    assert [g.keys() for g in resumed["grads"]] == [g.keys() for g in whole["grads"][3:]]
    for a, b in zip(resumed["grads"], whole["grads"][3:]):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_sampler_at_p_1_is_the_shuffled_dataloader_resumable_at_any_step():
    for n, bs, seed in ((37, 4, 0), (40, 8, 5), (9, 3, 11)):
        ref_loader = DataLoader(
            list(range(n)),
            batch_size=bs,
            shuffle=True,
            drop_last=True,
            generator=torch.Generator().manual_seed(seed),
        )

        def lightning_epoch(loader):  # Lightning takes len(loader) batches per epoch, then a new iterator
            it = iter(loader)
            return [next(it).tolist() for _ in range(len(loader))]

        ref = [lightning_epoch(ref_loader) for _ in range(3)]
        ours = LazyBatchSampler(n, bs, 1.0, seed)
        assert [list(ours) for _ in range(3)] == ref
        per_epoch = n // bs
        assert list(LazyBatchSampler(n, bs, 1.0, seed, start_step=2 * per_epoch + 1)) == ref[2][1:]
        assert sorted(epoch_order(n, seed, 4).tolist()) == list(range(n))


def test_the_same_seed_gives_the_same_run(corpus, tmp_path):
    runs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        L.seed_everything(7, verbose=False)
        runs.append(
            fit(tmp_path / name, small_dm(corpus, tmp_path / "c"), make_module(optim=OPTIM), "auto", steps=4)[
                0
            ]
        )
    assert runs[0]["losses"] == runs[1]["losses"]
    (tmp_path / "c2").mkdir()
    L.seed_everything(8, verbose=False)
    other = fit(tmp_path / "c2", small_dm(corpus, tmp_path / "c"), make_module(optim=OPTIM), "auto", steps=4)[
        0
    ]
    assert other["losses"] != runs[0]["losses"]  # the seed does matter (the test can fail)


def test_the_same_seed_gives_the_same_pipeline_run(corpus, tmp_path):
    opts = dict(
        method="clapping_fu", fwd_compressor="quant(2,stochastic)", bwd_compressor="randk(0.2)", p=0.5
    )
    runs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        L.seed_everything(7, verbose=False)
        runs.append(
            fit(
                tmp_path / name,
                small_dm(corpus, tmp_path / "c", blocks=64),
                make_module(n_layer=2, optim=OPTIM),
                pipeline(2, **opts),
                steps=5,
                devices=2,
            )
        )
    for rank in range(2):
        assert runs[0][rank]["losses"] == runs[1][rank]["losses"]
        assert runs[0][rank]["digests"] == runs[1][rank]["digests"]


def _digest(module) -> str:
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class NanLossAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step, self.params = step, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and batch_idx == self.step:
            batch["targets"][:] = -100  # every token ignored: the mean loss is 0/0 = NaN
        self.params.append(_digest(pl_module))


@pytest.mark.parametrize("check", ["every_step", "deferred"])
@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_a_nonfinite_loss_stops_or_skips_the_step(mode, check, corpus, tmp_path):
    """every_step reads the loss on the host each step; deferred (the CUDA default) leaves the step
    to the fused optimizer's found_inf and reads device counters at log steps and at the end."""
    from repro.lit import GPTLightningModule
    from repro.models import GPTConfig

    cfg = GPTConfig(n_layer=2, n_embd=32, n_head=2, rope_dims=[8, 8], vocab_size=64, block_size=32)
    optim = {**OPTIM, "fused": check == "deferred"}
    module = GPTLightningModule(cfg, optim, nonfinite=mode, nonfinite_check=check)
    guard = NanLossAt(2)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[guard],
    )
    if mode == "raise":
        expected = r"non-finite training loss \(nan\) at training step 2"
        if check == "deferred":  # found at the end (log_every_n_steps=50): step 2 changed nothing
            expected = r"non-finite training loss at training step 2 \(1 such step"
        with pytest.raises(FloatingPointError, match=expected):
            trainer.fit(module, small_dm(corpus, tmp_path / "c", blocks=64))
        if check == "deferred":
            assert guard.params[3] == guard.params[2] and guard.params[2] != guard.params[1]
        return
    trainer.fit(module, small_dm(corpus, tmp_path / "c", blocks=64))
    assert module.skipped_steps == 1
    # batch 2's step changed nothing; the others did (params[i] is taken before batch i)
    assert guard.params[3] == guard.params[2] and guard.params[2] != guard.params[1]
    assert all(torch.isfinite(p).all() for p in module.parameters())


class BatchIds(L.Callback):
    def __init__(self) -> None:
        self.ids = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.ids.append(batch["sample_id"].tolist())


def test_lightning_sees_the_batches_the_plain_shuffled_loader_gave(corpus, tmp_path, monkeypatch):
    """The resumable sampler did not change the data order of any run (Table 1 included)."""
    seen = []
    for old in (False, True):
        dm = small_dm(corpus, tmp_path / "c")
        if old:
            monkeypatch.setattr(
                TextDataModule,
                "train_dataloader",
                lambda self: DataLoader(
                    self.train_set,
                    batch_size=self.batch_size,
                    shuffle=True,
                    drop_last=True,
                    generator=torch.Generator().manual_seed(self.shuffle_seed),
                ),
            )
        ids = BatchIds()
        trainer = L.Trainer(
            accelerator="cpu",
            max_steps=7,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            callbacks=[ids],
        )
        trainer.fit(make_module(optim=OPTIM), dm)
        seen.append(ids.ids)
    assert seen[0] == seen[1] and len(seen[0]) == 7
    assert seen[0][0] != seen[0][2]  # epochs are reshuffled
