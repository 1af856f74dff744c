"""Prepared corpora: token shards, a tokenizer and a manifest (``repro data prepare|info|verify``).

    repro data prepare shakespeare --out data/plays --tokenizer bpe --vocab_size 8192
    repro data prepare 'corpus/*.jsonl.gz' --out data/mine --tokenizer path/to/model   # a model's tokenizer
    repro data prepare HuggingFaceFW/fineweb-edu --hub_config sample-10BT --out data/fineweb-edu \\
        --val_fraction 0.0005 --workers 16                                              # needs the network
    repro data info data/plays
    repro data verify data/plays

Each is a typed function (``repro.arguments.call``); a parameter that fills a field of
``PrepareSettings`` or ``Source`` takes that field's default and its documentation.
"""

from __future__ import annotations

from typing import Literal

from repro.arguments import BelowOne, NonNegativeInt, PositiveFloat, PositiveInt, documented_by

from .prepare import DTYPES, TRAIN_SUBSETS, PrepareSettings
from .prepare import prepare as prepare_corpus
from .prepared import MANIFEST, PreparedCorpus
from .sources import FORMATS, Source

_S, _P = Source, PrepareSettings  # the defaults below are theirs


@documented_by(PrepareSettings, Source)
def prepare(
    source: list[str],
    /,
    out: str,
    format: Literal[FORMATS] = _S.format,
    text_column: str = _S.text_column,
    name_column: str | None = _S.name_column,
    hub_config: str | None = _S.hub_config,
    hub_split: str = _S.hub_split,
    source_splits: str = "",
    tokenizer: str = _P.tokenizer,
    vocab_size: PositiveInt = _P.vocab_size,
    tokenizer_sample_mb: PositiveFloat = _P.tokenizer_sample_bytes / 1e6,
    eos_token: str | None = _P.eos_token,
    val_fraction: BelowOne = _P.val_fraction,
    test_fraction: BelowOne = _P.test_fraction,
    split_seed: NonNegativeInt = _P.split_seed,
    max_documents: PositiveInt | None = _P.max_documents,
    shard_tokens: PositiveInt = _P.shard_tokens,
    workers: PositiveInt = _P.workers,
    dtype: Literal[DTYPES] = _P.token_dtype,
    progress: bool = _P.progress,
    val_documents: tuple[str, ...] = _P.val_documents,
    test_documents: tuple[str, ...] = _P.test_documents,
    finetune_documents: tuple[str, ...] = _P.finetune_documents,
    train_subset: Literal[TRAIN_SUBSETS] = _P.train_subset,
) -> None:
    """A source -> train / validation / test token shards, a tokenizer and a manifest.

    Args:
        source: 'shakespeare', files / globs / a folder, or a hub dataset id
        source_splits: take the source's own splits: e.g. train=train,validation=validation,test=test
        tokenizer_sample_mb: a trained tokenizer learns from this much text
        dtype: auto (by vocabulary size), uint16 or uint32
        val_documents: file sources: the documents held out
        test_documents: file sources: held-out ones that test
        finetune_documents: file sources: training documents the tokenizer never learns from
    """
    settings = PrepareSettings(
        source=Source(tuple(source), format, text_column, name_column, hub_config, hub_split),
        out=out, tokenizer=tokenizer, vocab_size=vocab_size, tokenizer_sample_bytes=int(tokenizer_sample_mb * 1e6),
        eos_token=eos_token, val_fraction=val_fraction, test_fraction=test_fraction, split_seed=split_seed,
        val_documents=tuple(val_documents), test_documents=tuple(test_documents),
        finetune_documents=tuple(finetune_documents), train_subset=train_subset,
        source_splits=_source_splits(source_splits), max_documents=max_documents, shard_tokens=shard_tokens,
        token_dtype=dtype, workers=workers, progress=progress,
    )  # fmt: skip
    prepare_corpus(settings)
    print(summary(PreparedCorpus(out, "header", what="--out")))


def info(folder: str, /) -> None:
    """What a prepared folder holds.

    Args:
        folder: a folder made by repro data prepare
    """
    print(summary(PreparedCorpus(folder, "header", what="folder")))


def verify(folder: str, /) -> None:
    """Check every shard's checksum.

    Args:
        folder: a folder made by repro data prepare
    """
    print(summary(PreparedCorpus(folder, "full", what="folder")))
    print(f"every shard matches its checksum in {MANIFEST}")


def _source_splits(text: str) -> dict[str, str]:
    """``train=train,validation=valid`` -> ``{'train': 'train', 'validation': 'valid'}``."""
    out = {}
    for part in filter(None, text.split(",")):
        ours, _, theirs = part.partition("=")
        out[ours.strip()] = (theirs or ours).strip()
    return out


def summary(corpus: PreparedCorpus) -> str:
    m = corpus.manifest
    tok = m.tokenizer
    lines = [
        f"{corpus.folder}: {m.source.get('format')} source, tokenizer {tok['kind']} "
        f"(vocabulary {tok['vocab_size']:,}, eos {tok['eos_id']}), {m.dtype} shards, split by {m.split.get('rule')}"
    ]
    for name, rec in m.splits.items():
        lines.append(
            f"  {name:<10} {rec.documents:>10,} documents {rec.tokens:>15,} tokens {len(rec.shards):>5} shards"
        )
    return "\n".join(lines)
