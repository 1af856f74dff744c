"""Data benchmark: ``repro data prepare`` against the tokenizer's own batch encoding, the shard
loader against what a GPU step consumes, and the prepare's peak memory on a corpus of gigabytes.

- prepare throughput: tokens/s of a prepare with every core (worker processes), next to the
  tokenizer's own ``encode_batch`` on the same text on one thread, times the workers (goal: at
  least 0.8 of it per core used). The tokenizer (byte-level BPE) is trained once beforehand, so
  both sides only encode.
- loader throughput: tokens/s of the DataLoader (one process, memory-mapped shards, the suite's
  sampler) at the paper shape (batch 32 x 1024), next to what a ``paper_mha`` step consumes on one
  H200 (``gpu_tokens_per_s``; goal: at least 20 times that).
- prepare memory: the peak memory of a prepare (all its processes together, as proportional set
  size: a page its forked workers share counted once) of a generated JSON-lines corpus of
  ``data_rss_corpus_mb`` (goal: under 1 GiB, whatever the size; the sum of resident sizes beside).
The generated corpora and shards live in a temporary folder removed afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .measure import row
from .settings import BenchSettings

ENCODE_SCRIPT = """
import os, sys, time, json
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from repro.data.tokenizer import load_tokenizer_file
tok = load_tokenizer_file(sys.argv[1])
texts = [json.loads(line)["text"] for line in open(sys.argv[2])]
start = time.perf_counter()
n = sum(len(x) + 1 for x in tok.encode_batch(texts))
print(n / (time.perf_counter() - start))
"""


def generate_jsonl(path: Path, megabytes: float, seed: int = 0) -> int:
    """A JSON-lines corpus of about ``megabytes`` of English-like text: documents of about 5 kB
    cut at random places from a pool of Zipf-distributed words of a fixed random vocabulary;
    returns its size in bytes."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkqjxz"))
    vocab = np.array(["".join(rng.choice(letters, rng.integers(1, 9))) for _ in range(20_000)])
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    pool = " ".join(vocab[rng.choice(len(vocab), 2_000_000, p=weights / weights.sum())])
    target, written = int(megabytes * 1e6), 0
    with open(path, "w") as f:
        while written < target:
            starts = rng.integers(0, len(pool) - 6000, 2000)
            chunk = "".join(json.dumps({"text": pool[s : s + 5000]}) + "\n" for s in starts)
            f.write(chunk)
            written += len(chunk)
    return path.stat().st_size


def _prepare_cmd(source: Path, out: Path, tokenizer: str, workers: int) -> list[str]:
    return [
        sys.executable, "-m", "repro.cli", "data", "prepare", str(source), "--out", str(out),
        "--tokenizer", tokenizer, "--workers", str(workers), "--no_progress", "--val_fraction", "0.01",
    ]  # fmt: skip


def _tree_memory(pid: int) -> tuple[int, int]:
    """(resident bytes, proportional bytes) of a process and all its descendants (from /proc). The
    proportional set size (PSS) divides a page shared by n processes by n, so it sums to the memory
    the tree holds; resident sizes count each forked worker's shared pages again."""
    rss = pss = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    key, value = line.split()[:2] if line[:4] in ("Rss:", "Pss:") else ("", "0")
                    rss += int(value) * 1024 if key == "Rss:" else 0
                    pss += int(value) * 1024 if key == "Pss:" else 0
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return rss, pss


def run_measuring_memory(cmd: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak resident bytes, peak proportional bytes) of a command's process tree,
    sampled every 50 ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_rss = peak_pss = 0
    while proc.poll() is None:
        rss, pss = _tree_memory(proc.pid)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.05)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:6])} failed: {proc.stderr.read().decode()[-500:]}")
    return time.perf_counter() - start, peak_rss, peak_pss


def _prepared_tokens(folder: Path) -> int:
    manifest = json.loads((folder / "manifest.json").read_text())
    return sum(s["tokens"] for s in manifest["splits"].values())


def bench_data(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    from repro.data.tokenizer import FileTokenizer

    workers = s.data_workers or os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="repro-bench-data-") as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.jsonl"
        size = generate_jsonl(corpus, s.data_corpus_mb)
        with open(corpus) as f:
            sample = [json.loads(line)["text"] for _, line in zip(range(400), f)]
        FileTokenizer.train_bpe(sample, s.data_vocab_size).save(tmp / "tokenizer.json")
        progress(
            f"data: prepare {size / 1e6:.0f} MB with {workers} workers against encode_batch on one thread"
        )
        prepare_rates, encode_rates, ratios = [], [], []
        for rep in range(s.data_repeats):
            out = tmp / f"prepared-{rep}"
            seconds, _, _ = run_measuring_memory(
                _prepare_cmd(corpus, out, str(tmp / "tokenizer.json"), workers)
            )
            prepare_rates.append(_prepared_tokens(out) / seconds)
            encode = subprocess.run(
                [sys.executable, "-c", ENCODE_SCRIPT, str(tmp / "tokenizer.json"), str(corpus)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            encode_rates.append(float(encode.stdout.strip()))
            ratios.append(prepare_rates[-1] / (encode_rates[-1] * workers))
        rows.append(row("data", "tokenizer encode_batch, one thread", "throughput", "tokens/s", encode_rates))
        rows.append(
            row(
                "data",
                f"repro data prepare, {workers} workers (whole command: start-up, reading, writing)",
                "throughput",
                "tokens/s",
                prepare_rates,
                reference="tokenizer encode_batch, one thread",
                ratios=ratios,
                ratio_meaning="prepare tokens/s over (encode_batch tokens/s on one thread x workers): "
                "the share of each core's encoding speed the whole prepare keeps",
                goal=0.8,
                extra={"workers": workers, "corpus_bytes": size},
            )
        )
        rows.append(bench_loader(s, tmp / "prepared-0", progress))
        progress(f"data: peak memory of a prepare of a {s.data_rss_corpus_mb / 1e3:.1f} GB corpus")
        big = tmp / "big.jsonl"
        big_size = generate_jsonl(big, s.data_rss_corpus_mb, seed=1)
        seconds, peak_rss, peak = run_measuring_memory(_prepare_cmd(big, tmp / "big", "char", workers))
        rows.append(
            row(
                "data",
                f"repro data prepare of {big_size / 1e9:.2f} GB (char, {workers} workers): peak PSS",
                "peak process memory",
                "bytes",
                [peak],
                reference="1 GiB",
                ratios=[peak / 2**30],
                ratio_meaning="peak PSS of all the prepare's processes (shared pages counted once) over 1 GiB "
                "(goal: at most 1, whatever the corpus size)",
                goal=1.0,
                goal_kind="max",
                extra={
                    "corpus_bytes": big_size,
                    "seconds": seconds,
                    "tokens": _prepared_tokens(tmp / "big"),
                    "peak_rss_sum": peak_rss,  # each forked worker's shared pages counted again
                },
            )
        )
    return rows


def bench_loader(s: BenchSettings, folder: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    import torch

    from repro.data import TextDataModule

    progress("data: the shard loader at batch 32 x 1024 on one core")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dm = TextDataModule(corpus="prepared", prepared_dir=str(folder), block_size=1024, batch_size=32)
        dm.setup()
        rates, ratios = [], []
        for _ in range(s.data_repeats):
            loader = dm.train_dataloader()
            taken, tokens, start = 0, 0, time.perf_counter()
            while taken < s.data_loader_batches:
                for batch in loader:
                    taken += 1
                    tokens += int(batch["input_ids"].numel())
                    if taken >= s.data_loader_batches:
                        break
            rate = tokens / (time.perf_counter() - start)
            rates.append(rate)
            ratios.append(rate / s.gpu_tokens_per_s)
    finally:
        torch.set_num_threads(threads)
    return row(
        "data",
        "shard loader (memmap, sampler, collate), batch 32 x 1024, one core",
        "throughput",
        "tokens/s",
        rates,
        reference=f"paper_mha step on one H200 ({s.gpu_tokens_per_s:,.0f} tokens/s)",
        ratios=ratios,
        ratio_meaning="loader tokens/s over the tokens/s a compiled paper_mha step consumes on one H200 "
        "(measured in an earlier session: gpu_tokens_per_s)",
        goal=20.0,
    )
