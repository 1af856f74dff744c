"""Facts about the corpus, the document-level split, the tokenizers and the packed blocks."""

from __future__ import annotations

import pytest
import torch

from repro.data import TextDataModule, load_documents, split_documents
from repro.data.corpus import strip_play_markdown


def test_shakespeare_split_is_deterministic_and_disjoint(data_cache):
    docs = load_documents("shakespeare", data_cache)
    assert len(docs) >= 30 and all(len(d.text) > 50_000 for d in docs)  # whole plays
    first = split_documents(docs, val_fraction=0.1, seed=0)
    again = split_documents(list(reversed(docs)), val_fraction=0.1, seed=0)
    assert [d.name for d in first.validation] == [d.name for d in again.validation]
    train, val = {d.name for d in first.train}, {d.name for d in first.validation}
    assert train.isdisjoint(val) and train | val == {d.name for d in docs}
    assert len(val) == 4  # ceil(0.1 * 38)
    other = split_documents(docs, val_fraction=0.1, seed=1)
    assert {d.name for d in other.validation} != val  # the seed picks which plays are held out


def test_named_validation_documents_are_held_out(data_cache):
    docs = load_documents("shakespeare", data_cache)
    split = split_documents(docs, val_documents=["hamlet", "macbeth"])
    assert [d.name for d in split.validation] == ["hamlet", "macbeth"]
    assert "hamlet" not in {d.name for d in split.train}


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
    val_text = dm.tokenizer.decode(dm.val_set[0]["input_ids"].tolist())
    held = " ".join(d.text for d in dm.split.validation)
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
    path = smoke_datamodule._tokenizer_path
    assert path.exists() and path.parent.parent == data_cache
    mtime = path.stat().st_mtime_ns
    dm = TextDataModule(vocab_size=512, block_size=64, cache_dir=str(data_cache))
    assert dm.vocab_size == smoke_datamodule.vocab_size == 512
    assert dm._tokenizer_path == path and path.stat().st_mtime_ns == mtime  # loaded, not retrained
    sample = "To be, or not to be"
    assert dm.tokenizer.encode_batch([sample]) == smoke_datamodule.tokenizer.encode_batch([sample])
    assert dm.tokenizer.decode(dm.tokenizer.encode_batch([sample])[0]) == sample


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
    assert [d.name for d in dm.split.validation] == ["delta.txt"]
    assert dm.vocab_size == 2 + len(
        set("".join(f"{w} {i} " for i, w in enumerate(["alpha", "beta", "gamma"])))
    )
    # characters never seen in training ('d', '3') become <unk>; the others round-trip
    ids = dm.val_set[0]["input_ids"].tolist()
    assert dm.tokenizer.unk_id in ids
    assert dm.tokenizer.decode(ids) == ("delta 3 " * 4).replace("d", "").replace("3", "")


def test_local_hf_dataset_directory(tmp_path):
    import datasets

    rows = {"text": [f"story number {i}. " * 100 for i in range(6)], "name": [f"story{i}" for i in range(6)]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    dm = TextDataModule(
        corpus="hf_dataset",
        hf_dataset_dir=str(tmp_path / "ds"),
        tokenizer="char",
        val_fraction=0.34,
        block_size=16,
        batch_size=2,
        cache_dir=str(tmp_path / "cache"),
    )
    dm.setup()
    names = [d.name for d in dm.split.validation + dm.split.test]
    assert len(names) == 3 and set(names) <= set(rows["name"]) and dm.split.test
    assert set(names).isdisjoint(d.name for d in dm.split.train)


def test_the_test_split_is_carved_from_the_held_out_documents_and_leaves_training_as_it_was(data_cache):
    docs = load_documents("shakespeare", data_cache)
    without = split_documents(docs, val_fraction=0.1, seed=0)
    with_test = split_documents(docs, val_fraction=0.1, seed=0, test_fraction=0.5)
    assert [d.name for d in with_test.train] == [d.name for d in without.train]  # training data unchanged
    val, test = {d.name for d in with_test.validation}, {d.name for d in with_test.test}
    assert len(val) == len(test) == 2 and not val & test
    assert val | test == {d.name for d in without.validation}
    named = split_documents(docs, val_documents=["hamlet", "macbeth"], test_documents=["macbeth"])
    assert [d.name for d in named.validation] == ["hamlet"] and [d.name for d in named.test] == ["macbeth"]
    with pytest.raises(
        ValueError, match=r"data.test_documents: \['othello'\] are not held out from training"
    ):
        split_documents(docs, val_documents=["hamlet", "macbeth"], test_documents=["othello"])


def test_repro_test_evaluates_the_test_split_not_the_validation_one(smoke_datamodule):
    dm = smoke_datamodule
    assert dm.split.test and len(dm.test_set) > 0
    assert not torch.equal(
        next(iter(dm.test_dataloader()))["input_ids"], next(iter(dm.val_dataloader()))["input_ids"]
    )
