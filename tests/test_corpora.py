"""Prepared corpora: llm.c shards read and written exactly, the tokens are the tokenizer's own,
the split is deterministic and by documents, a killed prepare resumes to the same shards, bad
shards and manifests fail in one line, and training from shards resumes bitwise."""

from __future__ import annotations

import gzip
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from repro.data.prepare import PrepareSettings, hashed_split, prepare
from repro.data.prepared import MANIFEST, PreparedCorpus
from repro.data.shards import HEADER_BYTES, ShardError, open_shard, read_header
from repro.data.sources import Source
from repro.data.tokenizer import FileTokenizer, load_tokenizer_file

from conftest import MODELS

WORDS = "the king a queen of castle sword night day love war and to my lord".split()


def _docs(n: int, seed: int = 0, words: tuple[int, int] = (20, 120)) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) for _ in range(n)]


def _jsonl(path: Path, texts: list[str], gz: bool = False) -> Path:
    lines = "".join(json.dumps({"text": t, "id": f"doc{i}"}) + "\n" for i, t in enumerate(texts))
    if gz:
        path.write_bytes(gzip.compress(lines.encode()))
    else:
        path.write_text(lines)
    return path


def _settings(source, out, name_column: str | None = None, **kw) -> PrepareSettings:
    kw.setdefault("progress", False)
    return PrepareSettings(source=Source((str(source),), name_column=name_column), out=str(out), **kw)


def _stream(corpus: PreparedCorpus, split: str) -> np.ndarray:
    pieces = [np.asarray(s) for s in corpus.shards(split)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def test_a_shard_written_by_hand_from_the_published_layout_reads_back_exactly(tmp_path):
    for magic, version, dtype in ((20240520, 1, np.uint16), (20240801, 7, np.uint32)):
        tokens = np.arange(0, 3000, 7).astype(dtype) * (1 if dtype == np.uint16 else 40_000)
        header = np.zeros(256, dtype=np.int32)
        header[0], header[1], header[2] = magic, version, len(tokens)
        path = tmp_path / f"fineweb_train_{magic}.bin"
        with open(path, "wb") as f:  # llm.c's write_datafile, step by step
            f.write(header.tobytes())
            f.write(tokens.tobytes())
        read = read_header(path)
        assert (read.dtype, read.num_tokens) == (np.dtype(dtype), len(tokens))
        shard = open_shard(path)
        assert shard.dtype == np.dtype(dtype) and np.array_equal(shard, tokens)


def test_prepared_tokens_are_the_tokenizers_own_encoding_with_separators_and_pass_the_reader(tmp_path):
    texts = _docs(60)
    source = _jsonl(tmp_path / "docs.jsonl.gz", texts, gz=True)
    # a model's own tokenizer: a BPE saved as tokenizer.json elsewhere, used as it is
    own = FileTokenizer.train_bpe(texts[:20], 300)
    (tmp_path / "model").mkdir()
    own.save(tmp_path / "model" / "tokenizer.json")
    for tokenizer in ("char", str(tmp_path / "model")):
        out = tmp_path / f"out-{Path(tokenizer).name}"
        manifest = prepare(_settings(source, out, tokenizer=tokenizer, shard_tokens=500, name_column=None))
        corpus = PreparedCorpus(out, "full")
        tok = corpus.tokenizer()
        for split in ("train", "validation", "test"):
            names = [i for i in range(len(texts)) if hashed_split(str(i), 0.1, 0.5, 0) == split]
            expected = [x for i in names for x in [*tok.encode_batch([texts[i]])[0], tok.eos_id]]
            assert _stream(corpus, split).tolist() == expected, (tokenizer, split)
            assert manifest.splits[split].documents == len(names)
            held_out = [str(i) for i in names] if split != "train" else []
            assert manifest.splits[split].names == held_out  # the manifest says which documents are held out
            for shard in manifest.splits[split].shards:  # prepare's shards pass the published reader
                assert read_header(out / shard.name).num_tokens == shard.tokens
        assert len(manifest.splits["train"].shards) > 1
    assert load_tokenizer_file(tmp_path / "out-model" / "tokenizer.json").eos_id == own.eos_id


def test_the_split_is_by_documents_and_deterministic_whatever_the_workers(tmp_path):
    texts = _docs(80, seed=1)
    source = _jsonl(tmp_path / "docs.jsonl", texts)
    one = prepare(_settings(source, tmp_path / "a", tokenizer="char", shard_tokens=700, name_column="id"))
    two = prepare(
        _settings(source, tmp_path / "b", tokenizer="char", shard_tokens=700, name_column="id", workers=2)
    )
    assert one.splits == two.splits  # same shards, same checksums
    other = prepare(
        _settings(source, tmp_path / "c", tokenizer="char", shard_tokens=700, name_column="id", split_seed=1)
    )
    assert other.splits["validation"].documents != one.splits["validation"].documents or (
        other.splits["validation"].shards != one.splits["validation"].shards
    )
    held = {f"doc{i}" for i in range(80) if hashed_split(f"doc{i}", 0.1, 0.5, 0) != "train"}
    assert 0 < len(held) < 80
    corpus = PreparedCorpus(tmp_path / "a")
    tok = corpus.tokenizer()
    train_ids = _stream(corpus, "train").tolist()
    for i, text in enumerate(texts):  # each document is whole in exactly its own split
        ids = [*tok.encode_batch([text])[0], tok.eos_id]
        in_train = any(train_ids[j : j + len(ids)] == ids for j in range(len(train_ids) - len(ids) + 1))
        assert in_train == (f"doc{i}" not in held)


def test_file_sources_split_as_the_in_memory_corpora_do(tmp_path, corpus):
    from repro.data import TextDataModule

    out = tmp_path / "files"
    prepare(_settings(corpus / "*.txt", out, tokenizer="char", val_fraction=0.2))
    dm = TextDataModule(
        corpus="text_files",
        text_files=[str(corpus / "*.txt")],
        tokenizer="char",
        val_fraction=0.2,
        block_size=32,
        batch_size=4,
        cache_dir=str(tmp_path / "cache"),
    )
    prepared = TextDataModule(corpus="prepared", prepared_dir=str(out), block_size=32, batch_size=4)
    for split in ("train", "validation", "test"):
        assert np.array_equal(prepared.token_stream(split), dm.token_stream(split))


def test_a_prepare_killed_midway_resumes_to_the_same_shards_without_redoing_finished_ones(tmp_path):
    rng = np.random.default_rng(0)
    base = " ".join(np.array(WORDS)[rng.integers(0, len(WORDS), 200_000)])
    cuts = rng.integers(0, len(base) - 2000, 40_000)
    texts = [base[c : c + 1000] for c in cuts]  # 40 MB of text: a few seconds to prepare
    source = _jsonl(tmp_path / "big.jsonl", texts)
    args = [str(source), "--tokenizer", "char", "--shard_tokens", "400000", "--no_progress"]
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "repro.cli", "data", "prepare", *args, "--out", str(killed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while len(list(killed.glob("train_*.bin"))) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / MANIFEST).exists(), "the prepare finished before it could be killed"
    finished = {p.name: p.stat().st_mtime_ns for p in killed.glob("*_*.bin")}
    assert finished
    resumed = subprocess.run(cmd, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    whole = tmp_path / "whole"
    subprocess.run([*cmd[:-1], str(whole)], check=True, capture_output=True)
    a = json.loads((killed / MANIFEST).read_text())["splits"]
    b = json.loads((whole / MANIFEST).read_text())["splits"]
    assert a == b  # every shard's name, token count and checksum
    kept = {name for name, mtime in finished.items() if (killed / name).stat().st_mtime_ns == mtime}
    assert len(kept) >= 2  # the finished shards were not written again
    assert not list(killed.glob(".*.tmp"))


def test_bad_shards_and_manifests_fail_in_one_line_naming_the_file_and_what_was_expected(tmp_path):
    source = _jsonl(tmp_path / "docs.jsonl", _docs(40))
    out = tmp_path / "p"
    manifest = prepare(_settings(source, out, tokenizer="char", shard_tokens=400))
    shard = out / manifest.splits["train"].shards[0].name
    data = shard.read_bytes()

    def message(**kw) -> str:
        with pytest.raises((ShardError, ValueError, FileNotFoundError)) as err:
            PreparedCorpus(out, **kw)
        text = str(err.value)
        assert "\n" not in text
        return text

    shard.write_bytes(data[:-3])  # truncated
    assert str(shard) in message() and "truncated" in message()
    shard.write_bytes(data[:HEADER_BYTES] + bytes([data[HEADER_BYTES] ^ 1]) + data[HEADER_BYTES + 1 :])
    assert "sha256" in message(verify="full") and str(shard) in message()
    shard.write_bytes(b"\x00" * 8 + data[8:])  # not a shard
    assert "expected magic 20240520" in message()
    shard.write_bytes(data)
    other = FileTokenizer.train_bpe(_docs(10), 280)
    text = message(tokenizer=other)
    assert "another tokenizer" in text and str(out) in text
    doc = json.loads((out / MANIFEST).read_text())
    doc["tokenizer"]["vocab_size"] = 70_000  # a vocabulary the uint16 shards cannot hold
    (out / MANIFEST).write_text(json.dumps(doc))
    assert "70,000 ids" in message() and "uint16" in message()


def test_a_vocabulary_over_65536_is_uint32_and_forcing_uint16_is_refused_writing_nothing(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{w: 70_000 + i for i, w in enumerate(WORDS)}}
    vocab.update({f"pad{i}": 2 + i for i in range(69_998)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    source = _jsonl(tmp_path / "docs.jsonl", _docs(20))
    with pytest.raises(ValueError, match=r"--dtype=uint16: the tokenizer has 70,\d{3} ids, more than uint16"):
        prepare(
            _settings(
                source, tmp_path / "forced", tokenizer=str(tmp_path / "tokenizer.json"), token_dtype="uint16"
            )
        )
    assert not (tmp_path / "forced").exists()
    manifest = prepare(_settings(source, tmp_path / "auto", tokenizer=str(tmp_path / "tokenizer.json")))
    assert manifest.dtype == "uint32"
    stream = _stream(PreparedCorpus(tmp_path / "auto"), "train")
    assert stream.max() >= 70_000 and stream.dtype == np.uint32


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "hf_disk"])
def test_parquet_arrow_and_save_to_disk_sources_give_the_jsonl_shards(tmp_path, fmt):
    import datasets

    texts = _docs(30, seed=2)
    ds = datasets.Dataset.from_dict({"text": texts})
    reference = prepare(_settings(_jsonl(tmp_path / "d.jsonl", texts), tmp_path / "ref", tokenizer="char"))
    if fmt == "parquet":
        ds.to_parquet(str(tmp_path / "d.parquet"))
        source = tmp_path / "d.parquet"
    elif fmt == "arrow":
        import pyarrow as pa

        with pa.ipc.new_file(str(tmp_path / "d.arrow"), ds.data.schema) as writer:
            writer.write_table(ds.data.table)
        source = tmp_path / "d.arrow"
    else:
        ds.save_to_disk(str(tmp_path / "disk"))
        source = tmp_path / "disk"
    manifest = prepare(_settings(source, tmp_path / fmt, tokenizer="char"))
    assert manifest.splits == reference.splits


def test_shards_made_elsewhere_train_given_their_vocabulary(tmp_path):
    from repro.data import TextDataModule

    rng = np.random.default_rng(0)
    for name, n in (
        ("fineweb_train_000001.bin", 5000),
        ("fineweb_train_000002.bin", 3000),
        ("fineweb_val_000000.bin", 2000),
    ):
        tokens = rng.integers(0, 50257, n).astype(np.uint16)
        header = np.zeros(256, dtype=np.int32)
        header[:3] = (20240520, 1, n)
        (tmp_path / name).write_bytes(header.tobytes() + tokens.tobytes())
    dm = TextDataModule(
        corpus="shards", shard_dir=str(tmp_path), vocab_size=50257, block_size=64, batch_size=4
    )
    dm.setup()
    assert dm.model_vocab_size == 50257 and len(dm.train_set) == (8000 - 1) // 64
    joined = np.concatenate(
        [open_shard(tmp_path / "fineweb_train_000001.bin"), open_shard(tmp_path / "fineweb_train_000002.bin")]
    )
    block = 5000 // 64  # this block spans the two shards
    assert dm.train_set[block]["input_ids"].tolist() == joined[block * 64 : block * 64 + 64].tolist()


def test_resume_mid_epoch_from_a_prepared_corpus_is_bitwise(tmp_path, corpus):
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from repro.data import TextDataModule

    from test_pipeline_strategy import fit, make_module

    out = tmp_path / "prep"
    prepare(_settings(corpus / "*.txt", out, tokenizer="char", shard_tokens=3000, val_fraction=0.2))
    assert len(PreparedCorpus(out).manifest.splits["train"].shards) > 2  # blocks span shards

    def dm():
        return TextDataModule(
            corpus="prepared",
            prepared_dir=str(out),
            block_size=32,
            batch_size=8,
            max_train_blocks=20,
            shuffle_seed=3,
        )

    optim = {"lr": 1e-2, "warmup_steps": 2, "schedule": "cosine", "decay_steps": 8}
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3, save_top_k=-1)
    (tmp_path / "a").mkdir()
    whole = fit(
        tmp_path / "a",
        dm(),
        make_module(optim=optim),
        "auto",
        steps=7,
        callbacks=[ckpt],
        enable_checkpointing=True,
    )[0]
    (tmp_path / "b").mkdir()
    L.seed_everything(99, verbose=False)
    resumed = fit(
        tmp_path / "b",
        dm(),
        make_module(optim=optim),
        "auto",
        steps=7,
        ckpt_path=str(tmp_path / "ckpts" / "epoch=1-step=3.ckpt"),
    )[0]
    assert resumed["losses"] == whole["losses"][3:]
    for a, b in zip(resumed["grads"], whole["grads"][3:]):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_hub_source_without_the_network_and_row_files_as_text_files_are_one_line(
    tmp_path, capsys, monkeypatch
):
    from repro.cli import main as repro_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("repro.network.OFFLINE_BY_DEFAULT", False)  # as if the user set HF_HUB_OFFLINE=1
    with pytest.raises(SystemExit) as exit_:
        repro_main(["data", "prepare", "someone/some-dataset", "--out", str(tmp_path / "o"), "--no_progress"])
    assert exit_.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "cannot stream it from the Hugging Face Hub" in err[0]
    assert not (tmp_path / "o").exists()
    from repro.data.small_corpus import expand_text_files

    _jsonl(tmp_path / "rows.jsonl", ["a b c"])
    with pytest.raises(
        ValueError, match=r"is a file of rows, not one text document; prepare it with `repro data prepare"
    ):
        expand_text_files([str(tmp_path / "*.jsonl")])


def test_a_run_that_would_repeat_its_data_past_the_limit_stops_in_one_line(tmp_path):
    from repro.experiments.kit.data_use import check_data_use, data_lines
    from repro.runs.spec import RunSpec

    out = tmp_path / "prep"
    prepare(_settings(_jsonl(tmp_path / "d.jsonl", _docs(200)), out, tokenizer="char"))
    config = tmp_path / "configs" / "model.yaml"
    config.parent.mkdir()
    config.write_text(
        "model:\n  gpt: {n_layer: 2, n_embd: 32, n_head: 2, rope_dims: [8, 8]}\n"
        "data: {corpus: prepared, prepared_dir: ../prep, block_size: 32, batch_size: 8}\n"
    )
    train_tokens = PreparedCorpus(out).tokens("train")
    blocks = (train_tokens - 1) // 32
    steps = blocks // 8 * 2 + 1  # a little over two epochs
    spec = RunSpec.make("r", tmp_path / "runs", config, 0, steps, steps)
    with pytest.raises(ValueError) as err:
        check_data_use([spec], 1.0, "table1 test")
    assert (
        "\n" not in str(err.value)
        and "max_epochs_over_data=1" in str(err.value)
        and "epochs" in str(err.value)
    )
    (use,) = check_data_use([spec], 3.0, "table1 test")
    assert use.tokens_available == blocks * 32 and abs(use.epochs - steps * 8 / blocks) < 1e-9
    assert "epochs each" in data_lines([use], 3.0)[1]


def test_a_corpus_prepared_with_a_custom_end_of_document_token_trains(tmp_path, capsys):
    """'</doc>' is none of the built-in end-of-document names: named by --eos_token, or by a model
    folder's tokenizer_config.json, the prepared folder carries its id and `repro fit` trains on it
    (the folder's own tokenizer copy has no config to find it in)."""
    import yaml
    from tokenizers import ByteLevelBPETokenizer

    from repro.cli import main as repro_main
    from repro.data.tokenizer import EOS_CANDIDATES

    texts = _docs(30)
    source = _jsonl(tmp_path / "docs.jsonl", texts)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        texts, vocab_size=300, min_frequency=2, special_tokens=["</doc>"], show_progress=False
    )
    assert not any(bpe.token_to_id(name) is not None for name in EOS_CANDIDATES)
    (tmp_path / "tok").mkdir()
    bpe.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "model").mkdir()  # a model folder: the token named in its tokenizer_config.json
    bpe.save(str(tmp_path / "model" / "tokenizer.json"))
    (tmp_path / "model" / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"content": "</doc>"}})
    )
    tok_file = str(tmp_path / "tok" / "tokenizer.json")
    config = yaml.safe_load((MODELS / "smoke" / "gpt_mha.yaml").read_text())
    config["trainer"].update(max_steps=2, val_check_interval=2, logger=False, enable_progress_bar=False)
    config["trainer"]["callbacks"] = []
    config["data"] = {"block_size": 16, "batch_size": 4, "max_val_blocks": 2}
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(config))
    for name, how in (("by-flag", ["--tokenizer", tok_file, "--eos_token", "</doc>"]),
                      ("by-folder", ["--tokenizer", str(tmp_path / "model")])):  # fmt: skip
        out = tmp_path / name
        with pytest.raises(SystemExit) as done:
            repro_main(["data", "prepare", str(source), "--out", str(out), "--val_fraction", "0.2", *how])
        assert done.value.code == 0
        assert PreparedCorpus(out).eos_id == bpe.token_to_id("</doc>")
        with pytest.raises(SystemExit) as done:
            repro_main(["fit", "--config", str(tmp_path / "fit.yaml"), "--data.corpus=prepared",
                        f"--data.prepared_dir={out}", f"--trainer.default_root_dir={tmp_path / name}-run"])  # fmt: skip
        assert done.value.code == 0, capsys.readouterr().err
        assert list((tmp_path / f"{name}-run").rglob("final.ckpt"))
    # the token named again must be the manifest's; another one is refused in one line
    with pytest.raises(SystemExit) as done:
        repro_main(["fit", "--config", str(tmp_path / "fit.yaml"), "--data.corpus=prepared",
                    f"--data.prepared_dir={tmp_path / 'by-flag'}", "--data.eos_token=Ġthe"])  # fmt: skip
    assert done.value.code == 2 and "prepared with end-of-document id" in capsys.readouterr().err


def test_a_row_file_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    """Local row files are read by datasets' own builders; what they cannot read is one line that
    names the file (a line that is not JSON, a parquet column it has not)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from repro.data.sources import iter_documents, resolve

    def documents(path: Path, **kw) -> list:
        return [(d.name, d.text) for d in iter_documents(resolve(Source(location=(str(path),), **kw)))]

    (tmp_path / "rows.json").write_text(json.dumps([{"text": "a b", "id": 7}, {"text": "c"}]))
    assert documents(tmp_path / "rows.json") == [("0", "a b"), ("1", "c")]  # a JSON array too
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n')
    with pytest.raises(ValueError, match=r"^source '.*bad.jsonl': cannot read it as jsonl \(.*\)$"):
        documents(bad)
    pq.write_table(pa.table({"text": ["x y"], "url": ["u"]}), tmp_path / "rows.parquet")
    with pytest.raises(ValueError, match=r"no column 'body'; its columns are \['text', 'url'\]$"):
        documents(tmp_path / "rows.parquet", text_column="body")
