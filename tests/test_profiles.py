"""Profilers: phase-off facts, a resumable coverage-benefit profile, the CLI chain, bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.alloc.budget import default_levels
from repro.alloc.coverage_profile import CoverageProfileSettings, coverage_benefit_profile, pair_benefits
from repro.alloc.phase_off_profile import phase_off_values
from repro.alloc.profile import LayerProfile
from repro.cli import main as repro_main
from repro.lit.checkpoints import load_checked_model
from repro.models import GPTConfig
from repro.models.gpt import GPT
from repro.runs.model_config import load_model_config

from conftest import MODELS


def batches(vocab: int, n: int = 3, T: int = 32) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (2, T + 1), generator=g)
        out.append({"input_ids": ids[:, :-1], "targets": ids[:, 1:]})
    return out


def test_phase_off_profile_of_a_nope_model_is_exactly_zero():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=3, n_embd=32, n_head=2, rope_dims=[0, 0, 0]))
    result = phase_off_values(model, batches(50), per_head=True)
    assert result["values"] == [0.0, 0.0, 0.0]
    assert result["per_head"] == [[0.0, 0.0]] * 3
    assert result["tokens"] == 3 * 2 * 32


def test_phase_off_profile_sees_only_rotated_layers():
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=50, block_size=32, n_layer=3, n_embd=32, n_head=2, rope_dims=[16, 0, 16], init_std=0.2
        )
    )
    values = phase_off_values(model, batches(50))["values"]
    assert values[1] == 0.0  # a NoPE layer has no phase to turn off
    assert values[0] != 0.0 and values[2] != 0.0


@pytest.fixture(scope="module")
def smoke_run_config():
    return load_model_config(MODELS / "smoke" / "gpt_mha.yaml")


def test_coverage_profile_end_to_end_and_resumable(smoke_run_config, data_cache, tmp_path, capsys):
    cfg = smoke_run_config
    cache = str(data_cache)
    settings = CoverageProfileSettings(steps=8, seeds=(0, 1), eval_every=4, last_n=2)
    levels = default_levels(cfg.shape_config())
    profile = coverage_benefit_profile(cfg, levels, settings, tmp_path / "runs", cache_dir=cache)
    run_files = sorted((tmp_path / "runs").glob("*.json"))
    assert [f.stem for f in run_files] == sorted(
        f"high-{s}-s{seed}" for seed in (0, 1) for s in ("none", "0", "1", "2")
    )
    runs = {f.stem: json.loads(f.read_text()) for f in run_files}
    assert all(r["global_step"] == 8 and [s for s, _ in r["val_curve"]] == [4, 8] for r in runs.values())
    widths = {name: r["overrides"]["model.gpt.rope_dims"] for name, r in runs.items()}
    assert widths["high-none-s0"] == [4, 4, 4] and widths["high-1-s0"] == [4, 16, 4]
    loss = {name: sum(v for _, v in r["val_curve"]) / 2 for name, r in runs.items()}
    for seed in ("0", "1"):
        expected = [loss[f"high-none-s{seed}"] - loss[f"high-{layer}-s{seed}"] for layer in range(3)]
        assert profile.per_seed[seed] == pytest.approx(expected)
    assert profile.values == pytest.approx(
        [(a + b) / 2 for a, b in zip(profile.per_seed["0"], profile.per_seed["1"])]
    )
    assert profile.std is not None and profile.meta["runs"] == 8
    # each seed is its own init and data order
    assert runs["high-none-s0"]["val_curve"] != runs["high-none-s1"]["val_curve"]

    mtimes = {f.name: f.stat().st_mtime_ns for f in run_files}
    capsys.readouterr()
    again = coverage_benefit_profile(cfg, levels, settings, tmp_path / "runs", cache_dir=cache)
    err = capsys.readouterr().err
    assert err.count("reused") == 8 and "trained in" not in err  # a second call does no training
    assert {f.name: f.stat().st_mtime_ns for f in sorted((tmp_path / "runs").glob("*.json"))} == mtimes
    assert again.values == profile.values

    # interaction runs reuse the profile's base runs and train only the pair runs
    assert profile.meta["runs_dir"] == str(tmp_path / "runs")
    pairs = pair_benefits(cfg, profile, [(0, 2)], Path(profile.meta["runs_dir"]), cache_dir=cache)
    err = capsys.readouterr().err
    assert "high-none-s0: reused" in err and "high-none-s1: reused" in err
    assert "high-0_2-s0: trained" in err and "high-0_2-s1: trained" in err
    pair_loss = {
        s: sum(v for _, v in json.loads((tmp_path / "runs" / f"high-0_2-s{s}.json").read_text())["val_curve"])
        / 2
        for s in ("0", "1")
    }
    expected = sum(loss[f"high-none-s{s}"] - pair_loss[s] for s in ("0", "1")) / 2
    assert pairs[(0, 2)] == pytest.approx(expected)


@pytest.mark.parametrize("config", ["gpt_mha.yaml", "gpt_mla.yaml"])
def test_grouped_profile_runs_fewer_runs(config, data_cache, tmp_path):
    cfg = load_model_config(MODELS / "smoke" / config)
    settings = CoverageProfileSettings(steps=4, seeds=(0,), eval_every=2, last_n=1, group_size=2)
    profile = coverage_benefit_profile(
        cfg, default_levels(cfg.shape_config()), settings, tmp_path, cache_dir=str(data_cache)
    )
    assert profile.meta["runs"] == 3  # base + ceil(3 / 2) groups
    assert profile.values[0] == profile.values[1]  # the group's benefit spread evenly over its layers
    widths = {
        f.stem: json.loads(f.read_text())["overrides"][f"model.gpt.{cfg.width_field}"]
        for f in tmp_path.glob("*.json")
    }
    assert widths == {"high-none-s0": [4, 4, 4], "high-0_1-s0": [16, 16, 4], "high-2-s0": [4, 4, 16]}
    assert profile.model["attention"] == cfg.shape_config().attention


def test_checkpoint_that_does_not_match_the_config_is_rejected(tmp_path):
    from repro.lit import GPTLightningModule

    gpt = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_embd=32, n_head=2)
    module = GPTLightningModule(gpt)
    ckpt = {"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict()}
    torch.save(ckpt, tmp_path / "m.ckpt")
    other = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_embd=32, n_head=4)
    with pytest.raises(
        ValueError, match=r"does not match the config's model \(n_head: checkpoint 2 vs config 4\)"
    ):
        load_checked_model(tmp_path / "m.ckpt", other)
    model, _ = load_checked_model(tmp_path / "m.ckpt", gpt)
    assert torch.equal(model.wte.weight, module.model.wte.weight)
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="bad.ckpt': not a readable checkpoint"):
        load_checked_model(tmp_path / "bad.ckpt", gpt)


def repro(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "repro"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "repro.cli"]
    return subprocess.run(cmd + args, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_cli_chain_profile_allocate_transfer_account_fit(tmp_path, data_cache, capsys, monkeypatch):
    """From the CLI alone: profile the smoke model both ways, transfer to the 6-layer member,
    allocate with every method, account, analyze, and train an allocated config."""
    smoke, target = str(MODELS / "smoke" / "gpt_mha.yaml"), str(MODELS / "smoke" / "gpt_mha_6_layers.yaml")
    # point the configs' data cache at the session cache (tokenizer trained once)
    for name, src in (("smoke.yaml", smoke), ("smoke_target.yaml", target)):
        text = (
            Path(src)
            .read_text()
            .replace("  shuffle_seed: 0\n", f"  shuffle_seed: 0\n  cache_dir: {data_cache}\n")
        )
        (tmp_path / name).write_text(text)
    smoke, target = str(tmp_path / "smoke.yaml"), str(tmp_path / "smoke_target.yaml")

    steps = [
        [
            "profile",
            "coverage",
            "--config",
            smoke,
            "--steps",
            "6",
            "--eval_every",
            "3",
            "--last_n",
            "2",
            "--seeds",
            "0",
            "--out",
            "cov.json",
        ],
        ["profile", "phase-off", "--config", smoke, "--ref_steps", "6", "--out", "po.json"],
        ["transfer", "--profile", "cov.json", "--config", target, "--out", "tr.json"],
        [
            "allocate",
            "--config",
            target,
            "--transferred",
            "tr.json",
            "--out",
            "alloc.json",
            "--write_configs",
            "cfgs",
        ],
        ["account", "--config", target, "--allocation", "alloc.json", "--out", "acc.json"],
        ["analyze", "--benefit", "cov.json", "--phase_off", "po.json", "--out", "an.json"],
    ]
    monkeypatch.chdir(tmp_path)
    for args in steps:  # in this process (repro.cli.main with the command line); the fit below is the script
        with pytest.raises(SystemExit) as ended:
            repro_main(args)
        assert ended.value.code == 0, (args, capsys.readouterr().err[-3000:])
    cov, po, tr = (LayerProfile.load(tmp_path / f) for f in ("cov.json", "po.json", "tr.json"))
    assert (cov.kind, po.kind, tr.kind) == ("coverage_benefit", "phase_off", "transferred")
    assert cov.n_layer == po.n_layer == 3 and tr.n_layer == 6
    assert po.meta["eval_tokens"] > 0 and po.model["rope_dims"] == [16, 16, 16]  # the all-high reference
    assert tr.values[0] == pytest.approx(cov.values[0]) and tr.values[-1] == pytest.approx(cov.values[-1])
    allocs = json.loads((tmp_path / "alloc.json").read_text())["allocations"]
    methods = {a["method"] for a in allocs}
    assert {
        "transferred",
        "uniform",
        "first-k",
        "last-k",
        "spaced-k",
        "random-k",
        "all-high",
        "all-low",
        "nope",
    } <= methods
    assert all(
        sum(a["widths"]) == 6 * 8 for a in allocs if a["budget_matched"]
    )  # mean coverage 0.5 of 16 dims
    acc = json.loads((tmp_path / "acc.json").read_text())["rows"]
    assert {r["method"]: r["total"]["rope_flops"] for r in acc}["nope"] == 0
    analysis = json.loads((tmp_path / "an.json").read_text())
    assert -1.0 <= analysis["phase_off_vs_benefit_spearman"] <= 1.0

    transferred = next(a for a in allocs if a["method"] == "transferred")
    fit = repro(
        [
            "fit",
            "--config",
            "cfgs/smoke_target-transferred.yaml",
            "--trainer.max_steps=4",
            "--trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = torch.load(
        tmp_path / "logs/smoke_target-transferred/version_0/checkpoints/final.ckpt", weights_only=False
    )
    assert ckpt["hyper_parameters"]["gpt"]["rope_dims"] == transferred["widths"]


@pytest.mark.parametrize(
    "args,message",
    [
        (
            [
                "allocate",
                "--config",
                "{smoke_target}",
                "--method",
                "profiled",
                "--benefit",
                "{three_layer}",
                "--out",
                "a.json",
            ],
            "profile has 3 layers but the model has 6",
        ),
        (["allocate", "--config", "{smoke}", "--budget", "1.5", "--out", "a.json"], r"outside [low, high]"),
        (
            ["allocate", "--config", "{smoke}", "--high", "0.25", "--low", "0.5", "--out", "a.json"],
            "must be greater than low",
        ),
        (
            [
                "allocate",
                "--config",
                "{smoke}",
                "--method",
                "profiled",
                "--benefit",
                "{nan}",
                "--out",
                "a.json",
            ],
            "not finite",
        ),
        (
            [
                "allocate",
                "--config",
                "{smoke}",
                "--method",
                "profiled",
                "--benefit",
                "{empty}",
                "--out",
                "a.json",
            ],
            "no layers",
        ),
        (
            ["profile", "phase-off", "--config", "{smoke}", "--ckpt_path", "{missing}", "--out", "p.json"],
            "no such file",
        ),
    ],
)
def test_cli_bad_input(args, message, tmp_path, capsys, monkeypatch):
    LayerProfile("coverage_benefit", [0.1, 0.2, 0.3]).save(tmp_path / "three.json")
    (tmp_path / "nan.json").write_text('{"kind": "coverage_benefit", "values": [0.1, NaN, 0.2]}')
    (tmp_path / "empty.json").write_text('{"kind": "coverage_benefit", "values": []}')
    subs = {
        "smoke": str(MODELS / "smoke" / "gpt_mha.yaml"),
        "smoke_target": str(MODELS / "smoke" / "gpt_mha_6_layers.yaml"),
        "three_layer": str(tmp_path / "three.json"),
        "nan": str(tmp_path / "nan.json"),
        "empty": str(tmp_path / "empty.json"),
        "missing": str(tmp_path / "missing.ckpt"),
    }
    monkeypatch.chdir(tmp_path)  # in this process: the command line is parsed as the script's would be
    with pytest.raises(SystemExit) as ended:
        repro_main([a.format(**subs) for a in args])
    assert ended.value.code == 2
    assert message in capsys.readouterr().err
    assert not any((tmp_path / f).exists() for f in ("a.json", "t.json", "p.json"))


def test_parallel_workers_give_the_same_profile_as_one_process(
    smoke_run_config, data_cache, tmp_path, monkeypatch
):
    """Runs in 2 spawned single-thread workers: the same result files, bit for bit, as one process with 1 thread."""
    cfg = smoke_run_config
    settings = CoverageProfileSettings(steps=4, seeds=(0,), eval_every=2, last_n=1)
    levels = default_levels(cfg.shape_config())
    cache = str(data_cache)
    with monkeypatch.context() as m:  # a one-core machine: the single worker gets one thread
        m.setattr("os.cpu_count", lambda: 1)
        serial = coverage_benefit_profile(cfg, levels, settings, tmp_path / "serial", cache_dir=cache)
    with monkeypatch.context() as m:  # a two-core machine: two workers of one thread each
        m.setattr("os.cpu_count", lambda: 2)
        parallel = coverage_benefit_profile(
            cfg, levels, settings, tmp_path / "parallel", cache_dir=cache, workers=2
        )
    assert parallel.values == serial.values
    for f in (tmp_path / "serial").glob("*.json"):
        a, b = json.loads(f.read_text()), json.loads((tmp_path / "parallel" / f.name).read_text())
        assert a["val_curve"] == b["val_curve"] and a["threads"] == b["threads"] == 1
    assert parallel.meta["workers"] == 2
