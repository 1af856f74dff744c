"""Bad input across the suite, table-driven: every command, given a wrong type, an out-of-range
value, inconsistent lengths, a missing or empty file, a corrupt or truncated checkpoint, a
checkpoint or profile of another model, or non-UTF-8 text, fails early (exit code 2 or a
ValueError) with a message naming the field or the file, and leaves no output behind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from repro.cli import main as repro_main

from conftest import EXPERIMENTS, MODELS

SMOKE = (MODELS / "smoke" / "gpt_mha.yaml").read_text()


def _files(root: Path, cache: Path) -> dict[str, str]:
    """The bad (and good) inputs the cases refer to, as {name: path}."""
    files: dict[str, str] = {}

    def put(name: str, data: bytes | str) -> None:
        path = root / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        files[name.replace(".", "_")] = str(path)

    cached = SMOKE.replace("  shuffle_seed: 0\n", f"  shuffle_seed: 0\n  cache_dir: {cache}\n")
    put("good.yaml", cached)
    put("rope_len.yaml", cached.replace("rope_dims: [16, 4, 4]", "rope_dims: [16, 4]"))
    put("rope_odd.yaml", cached.replace("rope_dims: [16, 4, 4]", "rope_dims: [16, 5, 4]"))
    put("heads_type.yaml", cached.replace("n_head: 4", "n_head: four"))
    put("lr_negative.yaml", cached.replace("lr: 0.003", "lr: -0.003"))
    put("steps_type.yaml", cached.replace("max_steps: 50", "max_steps: fifty"))
    put("unknown_key.yaml", cached.replace("  batch_size: 16\n", "  batch_size: 16\n  batchsize: 16\n"))
    put("not_yaml.yaml", "model: [unclosed\n  gpt: {\n")
    put("empty.yaml", "")
    put("utf8_bad.txt", b"to be or not \xff\xfe to be\n" * 50)
    put("empty.txt", "")
    non_utf8 = cached.replace(
        "  corpus: shakespeare\n", f"  corpus: text_files\n  text_files: [{root / 'utf8_bad.txt'}]\n"
    )
    put("non_utf8.yaml", non_utf8.replace("tokenizer: bpe", "tokenizer: char"))
    empty_corpus = cached.replace(
        "  corpus: shakespeare\n", f"  corpus: text_files\n  text_files: [{root / 'empty.txt'}]\n"
    )
    put("empty_corpus.yaml", empty_corpus.replace("tokenizer: bpe", "tokenizer: char"))
    put(
        "bad_strategy.yaml",
        cached.replace(
            "  devices: 1\n",
            "  devices: 2\n  strategy:\n    class_path: repro.pipeline.lightning.ClappingStrategy\n"
            "    init_args:\n      method: ef22\n",
        ),
    )
    put(
        "stages_devices.yaml",
        cached.replace(
            "  devices: 1\n",
            "  devices: 3\n  strategy:\n    class_path: repro.pipeline.lightning.ClappingStrategy\n"
            "    init_args:\n      stages: 2\n",
        ),
    )
    gpt = dict(n_layer=3, n_embd=64, n_head=2, rope_dims=[16, 4, 4], vocab_size=512, block_size=64)
    torch.save({"hyper_parameters": {"gpt": gpt}, "state_dict": {}}, root / "other_model.ckpt")
    files["other_model_ckpt"] = str(root / "other_model.ckpt")
    whole = (root / "other_model.ckpt").read_bytes()
    put("truncated.ckpt", whole[: len(whole) // 2])
    put("garbage.ckpt", b"this is not a checkpoint" * 10)
    put("empty.ckpt", b"")
    put("three_layers.json", json.dumps({"kind": "coverage_benefit", "values": [0.1, 0.2, 0.3]}))
    put("nan.json", '{"kind": "coverage_benefit", "values": [0.1, NaN, 0.2]}')
    put("not_json.json", "{values: [0.1")
    put("not_object.json", "[0.1, 0.2, 0.3]")
    shipped = lambda exp: (
        (EXPERIMENTS / exp / "smoke.yaml").read_text().replace("../../models/", f"{MODELS}/")
    )
    put("bad_table1.yaml", shipped("table1") + "profile_seedz: [0]\n")
    put("bad_clapping.yaml", shipped("clapping").replace("[0.5]", "[1.5]"))
    put("bad_bench.yaml", "preset: quick\nrepeats: -1\n")
    files["missing"] = str(root / "missing.yaml")
    files["smoke_target"] = str(MODELS / "smoke" / "gpt_mha_6_layers.yaml")
    files["paper_mha"] = str(MODELS / "paper" / "gpt_mha.yaml")
    paper = (MODELS / "paper" / "gpt_mha.yaml").read_text()
    put(
        "paper_plays.yaml",
        re.sub(r"  corpus: prepared.*\n  prepared_dir: .*\n", "  corpus: shakespeare\n", paper),
    )
    return files


# (case id, command line, regex the error must contain)
CASES = [
    ("fit: missing config file", "fit --config {missing}", r"missing\.yaml"),
    ("fit: config is not YAML", "fit --config {not_yaml_yaml}", r"not_yaml\.yaml"),
    ("fit: empty config", "fit --config {empty_yaml}", r"model\.gpt|gpt"),
    ("fit: rope_dims length", "fit --config {rope_len_yaml}", r"rope_dims has 2 entries but n_layer=3"),
    ("fit: odd rope width", "fit --config {rope_odd_yaml}", r"rope_dims\[1\]=5: must be an even integer"),
    ("fit: wrong type", "fit --config {heads_type_yaml}", r"n_head"),
    ("fit: negative lr", "fit --config {lr_negative_yaml}", r"optim\.lr=-0\.003: must be > 0"),
    ("fit: trainer wrong type", "fit --config {steps_type_yaml}", r"max_steps"),
    ("fit: unknown key", "fit --config {unknown_key_yaml}", r"batchsize"),
    ("fit: non-UTF-8 corpus", "fit --config {non_utf8_yaml}", r"utf8_bad\.txt.*UTF-8|UTF-8.*utf8_bad\.txt"),
    ("fit: empty corpus file", "fit --config {empty_corpus_yaml}", r"empty\.txt"),
    ("fit: bad strategy option", "fit --config {bad_strategy_yaml}", r"method='ef22': allowed values"),
    (
        "validate: missing checkpoint",
        "validate --config {good_yaml} --ckpt_path={missing}",
        r"ckpt_path=.*missing\.yaml.*no such file",
    ),
    (
        "validate: garbage checkpoint",
        "validate --config {good_yaml} --ckpt_path={garbage_ckpt}",
        r"garbage\.ckpt.*not a readable checkpoint",
    ),
    (
        "validate: truncated checkpoint",
        "validate --config {good_yaml} --ckpt_path={truncated_ckpt}",
        r"truncated\.ckpt.*not a readable checkpoint",
    ),
    (
        "validate: empty checkpoint",
        "validate --config {good_yaml} --ckpt_path={empty_ckpt}",
        r"empty\.ckpt.*not a readable checkpoint",
    ),
    (
        "validate: checkpoint of another model",
        "validate --config {good_yaml} --ckpt_path={other_model_ckpt}",
        r"does not match the config's model \(n_head: checkpoint 2 vs config 4\)",
    ),
    (
        "profile: checkpoint of another model",
        "profile phase-off --config {good_yaml} --ckpt_path {other_model_ckpt} --out {out}",
        r"does not match the config's model",
    ),
    (
        "profile: corrupt checkpoint",
        "profile phase-off --config {good_yaml} --ckpt_path {garbage_ckpt} --out {out}",
        r"garbage\.ckpt': not a readable checkpoint",
    ),
    (
        "profile: zero steps",
        "profile coverage --config {good_yaml} --steps 0 --out {out}",
        r"--steps 0: must be > 0",
    ),
    (
        "allocate: profile of another model",
        "allocate --config {smoke_target} --method profiled --benefit {three_layers_json} --out {out}",
        r"profile has 3 layers but the model has 6",
    ),
    (
        "allocate: non-finite profile",
        "allocate --config {good_yaml} --method profiled --benefit {nan_json} --out {out}",
        r"not finite",
    ),
    (
        "allocate: profile is not JSON",
        "allocate --config {good_yaml} --method profiled --benefit {not_json_json} --out {out}",
        r"not_json\.json",
    ),
    (
        "allocate: profile is not an object",
        "allocate --config {good_yaml} --method profiled --benefit {not_object_json} --out {out}",
        r"not_object\.json",
    ),
    (
        "allocate: missing profile",
        "allocate --config {good_yaml} --method profiled --benefit {missing} --out {out}",
        r"missing\.yaml",
    ),
    (
        "allocate: budget out of range",
        "allocate --config {good_yaml} --budget 1.5 --out {out}",
        r"outside \[low, high\]",
    ),
    (
        "transfer: no target layers",
        "transfer --profile {three_layers_json} --target_layers 0 --out {out}",
        r"--target_layers 0: must be > 0",
    ),
    (
        "table1: unknown settings field",
        "table1 --settings {bad_table1_yaml} --out {outdir}",
        r"profile_seedz",
    ),
    ("table1: missing settings", "table1 --settings {missing} --out {outdir}", r"missing\.yaml"),
    (
        "clapping: p out of range",
        "clapping --settings {bad_clapping_yaml} --out {outdir}",
        r"clapping_p|1\.5",
    ),
    ("clapping: unknown scale", "clapping --scale huge --out {outdir}", r"huge"),
    (
        "fit: batch size 0 on the command line",
        "fit --config {good_yaml} --data.batch_size=0",
        r"batch_size=0",
    ),
    ("fit: negative lr on the command line", "fit --config {good_yaml} --model.optim.lr=-1", r"optim\.lr=-1"),
    ("fit: key typo", "fit --config {good_yaml} --trainer.max_stepz=3", r"max_stepz"),
    ("fit: bad compile value", "fit --config {good_yaml} --model.compile=3", r"compile"),
    (
        "fit: bad nonfinite check",
        "fit --config {good_yaml} --model.nonfinite_check=never",
        r"nonfinite_check",
    ),
    ("fit: bad fused value", "fit --config {good_yaml} --model.optim.fused=maybe", r"fused"),
    (
        "fit: a GPU config on this CPU machine",
        "fit --config {paper_plays_yaml}",
        r"accelerator='gpu'.*no CUDA GPU|no CUDA GPU",
    ),
    (
        "fit: a prepared corpus that is not there",
        "fit --config {paper_mha}",
        r"data\.prepared_dir: no such folder '/.*fineweb-edu-bpe8192'; make it with `repro data prepare",
    ),
    (
        "fit: more stages than layers",
        "fit --config {good_yaml} --trainer.strategy=clapping --trainer.devices=4",
        r"trainer.devices=4: .*model.gpt.n_layer=3",
    ),
    ("predict is not a command", "predict --config {good_yaml}", r"unknown command 'predict'"),
    ("fit: no config", "fit --trainer.max_steps=3", r"no --config: give a model config, e\.g\. --config"),
    ("fit: a prefix of an option", "fit --config {good_yaml} --trainer.max_step=20", r"max_step"),
    (
        "fit: a batch that does not split into micro-batches",
        "fit --config {good_yaml} --trainer.strategy=clapping --trainer.devices=3 --data.batch_size=10",
        r"data\.batch_size=10 does not split into trainer\.strategy micro_batches=4",
    ),
    (
        "fit: pipeline stages against devices",
        "fit --config {stages_devices_yaml}",
        r"stages=2, but trainer\.devices=3 x trainer\.num_nodes=1 gives 3 processes",
    ),
    ("data prepare: missing source", "data prepare {missing} --out {outdir}", r"missing\.yaml.*no such file"),
    ("data info: not a prepared folder", "data info {outdir}", r"no such folder"),
    (
        "table1: bad shard",
        "table1 --settings {bad_table1_yaml} --shard 2/2 --out {outdir}",
        r"profile_seedz|i/N",
    ),
    ("table1: shard syntax", "table1 --scale smoke --shard two --out {outdir}", r"--shard 'two': give i/N"),
    (
        "table1: rows before profiles",
        "table1 --scale smoke --stage rows --out {outdir}",
        r"--stage rows needs every stage-1 run",
    ),
    ("table1: a gpu scale on this CPU machine", "table1 --scale gpu --out {outdir}", r"no CUDA GPU"),
    (
        "clapping: a paper scale on this CPU machine",
        "clapping --scale paper --out {outdir}",
        r"--accelerator cpu",
    ),
    (
        "table1: --scale and --settings",
        "table1 --scale smoke --settings {bad_table1_yaml}",
        r"give --scale or --settings, not both",
    ),
    (
        "clapping: --scale and --settings",
        "clapping --scale smoke --settings {bad_clapping_yaml}",
        r"give --scale or --settings, not both",
    ),
    (
        "bench: bad settings",
        "bench --settings {bad_bench_yaml} --out {outdir}",
        r"repeats=-1: must be > 0",
    ),
]


@pytest.mark.parametrize("case, command, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_early_naming_it_and_writes_nothing(
    case, command, message, tmp_path, data_cache, capsys, monkeypatch
):
    work = tmp_path / "work"
    work.mkdir()
    files = _files(work, data_cache)
    monkeypatch.chdir(work)
    before = set(work.rglob("*"))
    args = command.format(**files, out=str(work / "out.json"), outdir=str(work / "outdir")).split()
    with pytest.raises((SystemExit, ValueError, FileNotFoundError)) as info:
        repro_main(args)
    if isinstance(info.value, SystemExit):
        assert info.value.code not in (0, None), case
        text = capsys.readouterr().err
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1, f"{case}: {len(lines)} lines of stderr: {text[-2000:]}"
    else:
        text = str(info.value)
    assert __import__("re").search(message, text, __import__("re").S), f"{case}: {text[-2000:]}"
    created = set(work.rglob("*")) - before
    # nothing but caches (the tokenizer) may appear: no results, logs or checkpoints
    assert not [p for p in created if ".cache" not in p.parts], f"{case}: wrote {sorted(created)}"


def test_there_are_at_least_25_cases():
    assert len(CASES) >= 25
