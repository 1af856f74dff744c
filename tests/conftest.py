"""Shared fixtures: one on-disk cache for tokenizers and token streams per test session."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "paper_configs"
MODELS = CONFIGS / "models"  # model configs per scale
EXPERIMENTS = CONFIGS / "experiments"  # experiment settings per scale


def figure_script(name: str):
    """The module of ``figures/<name>.py`` (the figure scripts import their siblings by name)."""
    import importlib
    import sys

    sys.path.insert(0, str(REPO_ROOT / "figures"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO_ROOT / "figures"))


@pytest.fixture(autouse=True)
def _few_threads():
    # The machine has 2 cores; keep each test on them without oversubscription.
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """Cache directory shared by every test that builds the Shakespeare datamodule."""
    return tmp_path_factory.mktemp("repro-cache")


@pytest.fixture(scope="session")
def smoke_datamodule(data_cache):
    from repro.data import TextDataModule

    dm = TextDataModule(
        vocab_size=512, block_size=64, batch_size=8, max_val_blocks=16, cache_dir=str(data_cache)
    )
    dm.setup()
    return dm


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A small local corpus (a few thousand characters per document)."""
    root = tmp_path_factory.mktemp("pipe-corpus")
    rng = random.Random(0)
    words = "the king a queen of castle sword night day love war and to my lord".split()
    for d in range(12):
        (root / f"doc{d}.txt").write_text(" ".join(rng.choice(words) for _ in range(700)) + "\n")
    return root
