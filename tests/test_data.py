"""Facts about the corpus, the document-level split, the tokenizers and the packed blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repro.data import TextDataModule
from repro.data.prepare import split_names
from repro.data.sources import Source, iter_documents, resolve, strip_play_markdown


def _plays() -> dict[str, str]:
    return {d.name: d.text for d in iter_documents(resolve(Source(("shakespeare",))))}


def test_shakespeare_split_is_deterministic_and_disjoint():
    names = list(_plays())
    assert len(names) >= 30 and all(len(t) > 50_000 for t in _plays().values())  # whole plays
    first = split_names(names, val_fraction=0.1, seed=0)
    again = split_names(list(reversed(names)), val_fraction=0.1, seed=0)
    assert first["validation"] == again["validation"]
    train, val = set(first["train"]), set(first["validation"])
    assert train.isdisjoint(val) and train | val == set(names)
    assert len(val) == 4  # ceil(0.1 * 38)
    other = split_names(names, val_fraction=0.1, seed=1)
    assert set(other["validation"]) != val  # the seed picks which plays are held out


def test_named_validation_documents_are_held_out():
    split = split_names(list(_plays()), val_documents=["hamlet", "macbeth"])
    assert split["validation"] == ["hamlet", "macbeth"]
    assert "hamlet" not in split["train"]


def test_play_markdown_is_stripped():
    text = "# Macbeth\n\n## ACT I\n\n_Thunder. Enter Witches_\n\n**First Witch**  \nWhen shall we three meet again  \n"
    assert (
        strip_play_markdown(text)
        == "Macbeth\n\nACT I\n\nThunder. Enter Witches\n\nFirst Witch\nWhen shall we three meet again\n"
    )


def test_datamodule_blocks_are_shifted_next_token_pairs(smoke_datamodule):
    dm = smoke_datamodule
    item = dm.train_set[3]
    stream = dm.token_stream("train")
    start = 3 * dm.block_size
    assert torch.equal(item["input_ids"], torch.from_numpy(stream[start : start + 64].astype("int64")))
    assert torch.equal(item["targets"], torch.from_numpy(stream[start + 1 : start + 65].astype("int64")))
    assert int(item["sample_id"]) == 3
    assert len(dm.train_set) == (len(stream) - 1) // 64
    assert len(dm.val_set) == 16  # max_val_blocks
    # validation text comes only from held-out plays
    val_text = dm.text_tokenizer.decode(dm.val_set[0]["input_ids"].tolist())
    held = " ".join(_plays()[name] for name in dm.manifest.splits["validation"].names)
    assert val_text[5:60] in held


def test_training_order_is_seeded(smoke_datamodule):
    def first_ids(seed: int) -> list[int]:
        smoke_datamodule.shuffle_seed = seed
        return next(iter(smoke_datamodule.train_dataloader()))["sample_id"].tolist()

    try:
        assert first_ids(0) == first_ids(0)
        assert first_ids(0) != first_ids(1)
    finally:
        smoke_datamodule.shuffle_seed = 0


def test_tokenizer_is_cached_on_disk(smoke_datamodule, data_cache):
    folder = smoke_datamodule._corpus.folder
    path = folder / smoke_datamodule.manifest.tokenizer["file"]
    assert path.exists() and folder.parent.parent == data_cache
    mtime = path.stat().st_mtime_ns
    dm = TextDataModule(vocab_size=512, block_size=64, cache_dir=str(data_cache))
    assert dm.model_vocab_size == smoke_datamodule.model_vocab_size == 512
    assert dm._corpus.folder == folder and path.stat().st_mtime_ns == mtime  # loaded, not retrained
    sample = "To be, or not to be"
    assert dm.text_tokenizer.encode_batch([sample]) == smoke_datamodule.text_tokenizer.encode_batch([sample])
    assert dm.text_tokenizer.decode(dm.text_tokenizer.encode_batch([sample])[0]) == sample


def test_user_text_files_and_char_tokenizer(tmp_path):
    for i, word in enumerate(["alpha", "beta", "gamma", "delta"]):
        (tmp_path / f"{word}.txt").write_text((f"{word} {i} " * 200).strip())
    dm = TextDataModule(
        corpus="text_files",
        text_files=[str(tmp_path / "*.txt")],
        tokenizer="char",
        val_documents=["delta.txt"],
        block_size=32,
        batch_size=4,
        cache_dir=str(tmp_path / "cache"),
    )
    dm.setup()
    assert dm.manifest.splits["validation"].names == ["delta.txt"]
    assert dm.model_vocab_size == 2 + len(
        set("".join(f"{w} {i} " for i, w in enumerate(["alpha", "beta", "gamma"])))
    )
    # characters never seen in training ('d', '3') become <unk>; the others round-trip
    ids = dm.val_set[0]["input_ids"].tolist()
    assert dm.text_tokenizer.unk_id in ids
    assert dm.text_tokenizer.decode(ids) == ("delta 3 " * 4).replace("d", "").replace("3", "")


def test_local_hf_dataset_directory_is_prepared_as_repro_data_prepare_prepares_it(tmp_path):
    import datasets

    from repro.data.prepare import PrepareSettings, hashed_split, prepare

    rows = {
        "text": [f"story number {i}. " * 100 for i in range(12)],
        "name": [f"story{i}" for i in range(12)],
    }
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    dm = TextDataModule(
        corpus="hf_dataset",
        hf_dataset_dir=str(tmp_path / "ds"),
        tokenizer="char",
        val_fraction=0.4,
        block_size=16,
        batch_size=2,
        cache_dir=str(tmp_path / "cache"),
    )
    dm.setup()
    held = {s: dm.manifest.splits[s].names for s in ("validation", "test")}
    # each row goes where the seeded hash of its name (the name column) sends it
    assert held == {s: [n for n in rows["name"] if hashed_split(n, 0.4, 0.5, 0) == s] for s in held}
    assert (
        held["validation"]
        and held["test"]
        and dm.manifest.splits["train"].documents == 12 - sum(map(len, held.values()))
    )
    source = Source((str(tmp_path / "ds"),), "hf_disk", name_column="name")
    by_prepare = PrepareSettings(
        source, str(tmp_path / "p"), tokenizer="char", val_fraction=0.4, progress=False
    )
    prepare(by_prepare)  # the same shards as `repro data prepare` writes for these settings
    theirs = TextDataModule(corpus="prepared", prepared_dir=str(tmp_path / "p"), block_size=16, batch_size=2)
    for split in ("train", "validation", "test"):
        assert np.array_equal(theirs.token_stream(split), dm.token_stream(split))


def test_the_test_split_is_carved_from_the_held_out_documents_and_leaves_training_as_it_was():
    names = list(_plays())
    without = split_names(names, val_fraction=0.1, seed=0)
    with_test = split_names(names, val_fraction=0.1, seed=0, test_fraction=0.5)
    assert with_test["train"] == without["train"]  # training data unchanged
    val, test = set(with_test["validation"]), set(with_test["test"])
    assert len(val) == len(test) == 2 and not val & test
    assert val | test == set(without["validation"])
    named = split_names(names, val_documents=["hamlet", "macbeth"], test_documents=["macbeth"])
    assert named["validation"] == ["hamlet"] and named["test"] == ["macbeth"]
    with pytest.raises(
        ValueError, match=r"data.test_documents: \['othello'\] are not held out from training"
    ):
        split_names(names, val_documents=["hamlet", "macbeth"], test_documents=["othello"])


def test_repro_test_evaluates_the_test_split_not_the_validation_one(smoke_datamodule):
    dm = smoke_datamodule
    assert dm.manifest.splits["test"].names and len(dm.test_set) > 0
    assert not torch.equal(
        next(iter(dm.test_dataloader()))["input_ids"], next(iter(dm.val_dataloader()))["input_ids"]
    )


def test_a_fine_tuning_subset_is_what_repro_data_prepare_writes_and_its_tokenizer_never_saw_it(
    corpus, tmp_path
):
    from repro.cli import main as repro_main

    held_back = ["doc1.txt", "doc4.txt"]
    common = dict(corpus="text_files", text_files=[str(corpus / "*.txt")], val_documents=["doc0.txt"])
    dms = {
        subset: TextDataModule(
            **common,
            finetune_documents=held_back,
            train_subset=subset,
            block_size=16,
            batch_size=2,
            cache_dir=str(tmp_path / "cache"),
        )  # fmt: skip
        for subset in ("pretrain", "finetune")
    }
    others = [str(f) for f in sorted(corpus.glob("*.txt")) if f.name not in held_back]
    without = TextDataModule(
        **{**common, "text_files": others}, block_size=16, cache_dir=str(tmp_path / "cache")
    )
    for dm in dms.values():  # the tokenizer learnt the corpus as if the held-back documents were not there
        assert dm.text_tokenizer.to_bytes() == without.text_tokenizer.to_bytes()
    assert dms["finetune"].manifest.splits["train"].documents == 2
    assert dms["pretrain"].manifest.splits["train"].documents == 12 - 1 - 2
    with pytest.raises(SystemExit) as done:
        repro_main(["data", "prepare", str(corpus / "*.txt"), "--out", str(tmp_path / "p"), "--vocab_size", "2048",
                    "--val_documents", "doc0.txt", "--finetune_documents", *held_back, "--train_subset", "finetune",
                    "--no_progress"])  # fmt: skip
    assert done.value.code in (0, None)
    theirs = TextDataModule(corpus="prepared", prepared_dir=str(tmp_path / "p"), block_size=16, batch_size=2)
    for split in ("train", "validation", "test"):
        assert np.array_equal(theirs.token_stream(split), dms["finetune"].token_stream(split))
