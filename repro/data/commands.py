"""``repro data prepare|info|verify``: make a prepared corpus, say what one holds, check its checksums.

    repro data prepare shakespeare --out data/plays --tokenizer bpe --vocab_size 8192
    repro data prepare 'corpus/*.jsonl.gz' --out data/mine --tokenizer path/to/model   # a model's tokenizer
    repro data prepare HuggingFaceFW/fineweb-edu --hub_config sample-10BT --out data/fineweb-edu \\
        --val_fraction 0.0005 --workers 16                                              # needs the network
    repro data info data/plays
    repro data verify data/plays
"""

from __future__ import annotations

import sys

from repro.arguments import Parser, PositiveFloat, flat

from .prepared import MANIFEST, PreparedCorpus
from .shards import ShardError
from .sources import Source
from .writing import PrepareConflict

USAGE_ERRORS = (ValueError, FileNotFoundError, ConnectionError, PrepareConflict, ShardError)


def _source_splits(text: str | dict[str, str]) -> dict[str, str]:
    if isinstance(text, dict):  # jsonargparse checks a parsed value again
        return text
    out = {}
    for part in filter(None, text.split(",")):
        ours, _, theirs = part.partition("=")
        out[ours.strip()] = (theirs or ours).strip()
    return out


def parser() -> Parser:
    from .prepare import PrepareSettings  # the options are its fields and Source's (help, types, defaults)

    p = Parser(prog="repro data", description="Prepared corpora: token shards, a tokenizer and a manifest.")
    sub = p.subcommands("action")
    prep = sub("prepare", help="a source -> train / validation / test token shards")
    prep.add_argument(
        "source", nargs="+", help="'shakespeare', files / globs / a folder, or a hub dataset id"
    )
    prep.add_fields(PrepareSettings, "out")
    prep.add_fields(Source, "format", "text_column", "name_column", "hub_config", "hub_split")
    prep.add_argument(
        "--source_splits",
        type=_source_splits,
        default="",
        help="take the source's own splits: e.g. train=train,validation=validation,test=test",
    )
    prep.add_fields(PrepareSettings, "tokenizer", "vocab_size")
    prep.add_argument(
        "--tokenizer_sample_mb",
        type=PositiveFloat,
        default=200.0,
        help="a trained tokenizer learns from this much text",
    )
    prep.add_fields(
        PrepareSettings, "eos_token", "val_fraction", "test_fraction", "split_seed", "max_documents", "shard_tokens",
        "workers", dtype="token_dtype", no_progress="progress",
    )  # fmt: skip
    prep.add_argument("--val_documents", nargs="*", default=[], help="file sources: the documents held out")
    prep.add_argument("--test_documents", nargs="*", default=[], help="file sources: held-out ones that test")
    for name, what in (("info", "what a prepared folder holds"), ("verify", "check every shard's checksum")):
        action = sub(name, help=what)
        action.add_argument("folder", help="a folder made by repro data prepare")
    for action in p.subparsers.values():  # as on every command (nothing here is Lightning's to show)
        action.add_argument("-v", "--verbose", action="store_true", help="show Lightning's own lines too")
    return p


def main(argv: list[str]) -> int:
    args = flat(parser().parse_args(argv), "action")
    try:
        if args.action == "prepare":
            return _prepare(args)
        corpus = PreparedCorpus(args.folder, "full" if args.action == "verify" else "header", what="folder")
    except USAGE_ERRORS as exc:
        print(f"repro data {args.action}: error: {exc}", file=sys.stderr)
        return 2
    print(summary(corpus))
    if args.action == "verify":
        print(f"every shard matches its checksum in {MANIFEST}")
    return 0


def _prepare(args) -> int:
    from .prepare import PrepareSettings, prepare

    try:
        fields = ("out", "tokenizer", "vocab_size", "eos_token", "val_fraction", "test_fraction", "split_seed",
                  "source_splits", "max_documents", "shard_tokens", "token_dtype", "workers", "progress")  # fmt: skip
        settings = PrepareSettings(
            source=Source(
                tuple(args.source),
                args.format,
                args.text_column,
                args.name_column,
                args.hub_config,
                args.hub_split,
            ),
            tokenizer_sample_bytes=int(args.tokenizer_sample_mb * 1e6),
            val_documents=tuple(args.val_documents),
            test_documents=tuple(args.test_documents),
            **{name: getattr(args, name) for name in fields},
        )
        prepare(settings)
        corpus = PreparedCorpus(args.out, "header", what="--out")
    except USAGE_ERRORS as exc:
        print(f"repro data prepare: error: {exc}", file=sys.stderr)
        return 2
    print(summary(corpus))
    return 0


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
