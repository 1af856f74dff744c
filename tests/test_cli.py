"""The `repro` command: fit from a shipped config writes TensorBoard logs and a checkpoint that
`repro validate` reloads; bad configs fail before anything is built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from repro.cli import main as repro_main
from repro.lit.tensorboard_scalars import read_scalars

from conftest import MODELS


def repro_command() -> list[str]:
    script = Path(sys.executable).parent / "repro"
    return [str(script)] if script.exists() else [sys.executable, "-m", "repro.cli"]


def run_repro(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(repro_command() + args, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def validate_in_process(args: list[str], cwd: Path) -> None:
    """`repro validate` through repro.cli.main in this process (the fit before it ran the script)."""
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with pytest.raises(SystemExit) as ended:
            repro_main(args)
    finally:
        os.chdir(previous)
    assert ended.value.code == 0, args


@pytest.mark.slow
@pytest.mark.parametrize("config", ["gpt_mha.yaml", "gpt_mla.yaml"])
def test_fit_then_validate_from_a_config(config, tmp_path, data_cache):
    common = [
        "--config",
        str(MODELS / "smoke" / config),
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        f"--data.cache_dir={data_cache}",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=5",
    ]
    fit = run_repro(["fit", *common, "--trainer.max_steps=20", "--trainer.val_check_interval=10"], tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    name = yaml.safe_load((MODELS / "smoke" / config).read_text())["trainer"]["logger"]["init_args"]["name"]
    run_dir = tmp_path / "logs" / name / "version_0"
    scalars = read_scalars(run_dir)
    assert [step for step, _ in scalars["train/loss"]] == [4, 9, 14, 19]
    assert [step for step, _ in scalars["val/loss"]] == [9, 19]  # logged at global steps 10 and 20 (0-based)
    val_loss_at_end = scalars["val/loss"][-1][1]
    ckpt = torch.load(run_dir / "checkpoints" / "final.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 20

    validate_in_process(
        ["validate", *common, f"--ckpt_path={run_dir / 'checkpoints' / 'final.ckpt'}"], tmp_path
    )
    reval = read_scalars(tmp_path / "logs" / name / "version_1")["val/loss"][0][1]
    assert reval == pytest.approx(val_loss_at_end, rel=1e-5)  # the checkpoint is the trained model
    assert (
        tmp_path / "logs" / name / "version_1" / "config.yaml"
    ).is_file()  # the run's config, in its folder
    # without a logger there is no run folder: nothing is written where the command runs
    (tmp_path / "config.yaml").write_text("# the user's own file\n")
    validate_in_process(["validate", *common[:2], *common[3:], "--trainer.logger=false"], tmp_path)
    assert (tmp_path / "config.yaml").read_text() == "# the user's own file\n"


def test_print_config_shows_per_layer_rope_widths(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        repro_main(["fit", "--config", str(MODELS / "smoke" / "gpt_mha.yaml"), "--print_config"])
    out = capsys.readouterr()
    assert ended.value.code in (0, None), out.err[-2000:]
    printed = yaml.safe_load(out.out)
    assert printed["model"]["gpt"]["rope_dims"] == [16, 4, 4]
    assert printed["data"]["block_size"] == 64
    assert printed["trainer"]["precision"] is None  # chosen at run time: 32-true on CPU, bf16-mixed on GPU


@pytest.mark.parametrize(
    "override,message",
    [
        ("--model.gpt.rope_dims=[3,4,4]", "rope_dims[0]=3: must be an even integer in 0..16"),
        ("--model.gpt.rope_dims=[16,16]", "rope_dims has 2 entries but n_layer=3"),
        ("--model.gpt.n_head=3", "n_head=3: must divide n_embd=64"),
        ("--model.gpt.rope_convention=yarn", "yarn"),
    ],
)
def test_bad_model_config_fails_before_anything_is_built(override, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # in this process (the script's own run is tested above)
    with pytest.raises(SystemExit) as ended:
        repro_main(
            [
                "fit",
                "--config",
                str(MODELS / "smoke" / "gpt_mha.yaml"),
                override,
                f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
                f"--data.cache_dir={tmp_path / 'cache'}",
            ]
        )
    assert ended.value.code != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "logs").exists() and not (tmp_path / "cache").exists()


def test_default_precision_follows_the_accelerator():
    from repro.lit.precision import default_precision

    assert default_precision("cpu") == "32-true"
    if not torch.cuda.is_available():
        assert default_precision("auto") == "32-true"


def test_a_gpu_without_bf16_gets_fp32_which_the_pipeline_strategy_accepts(monkeypatch):
    from repro.lit.precision import default_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert default_precision("gpu") == "32-true"  # not 16-mixed, which ClappingStrategy refuses
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert default_precision("gpu") == "bf16-mixed"


def test_unknown_command_lists_every_command(tmp_path):
    out = run_repro(["nonsense"], tmp_path)
    assert out.returncode == 2
    assert "unknown command 'nonsense'" in out.stderr
    for command in ("fit", "validate", "profile", "allocate", "transfer", "account", "analyze"):
        assert command in out.stderr


@pytest.mark.slow
def test_pipeline_fit_from_the_cli_then_single_process_validate_of_its_checkpoint(tmp_path, data_cache):
    """`repro fit` with the clapping strategy (4 stages, fork launcher under pytest) logs the
    pipeline statistics; its checkpoint is the full model, validated by one process. The strategy
    is given by its registered name with options on the command line (the documented spelling)."""
    common = [
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        f"--data.cache_dir={data_cache}",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=2",
    ]
    fit = run_repro(
        [
            "fit",
            "--config",
            str(MODELS / "smoke" / "pipeline.yaml"),
            *common,
            "--trainer.strategy=clapping_fork",  # the name replaces the file's class and its options
            "--trainer.strategy.init_args.method=clapping_fc",
            "--trainer.strategy.fwd_compressor=quant(4)",
            "--trainer.strategy.init_args.bwd_compressor=quant(8)",
            "--trainer.strategy.init_args.micro_batches=4",
            "--trainer.max_steps=6",
            "--trainer.val_check_interval=6",
        ],
        tmp_path,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    run_dir = tmp_path / "logs" / "smoke_pipeline" / "version_0"
    scalars = read_scalars(run_dir)
    for key in (
        "train/loss",
        "val/loss",
        "pipe/bytes_total",
        "pipe/compression_ratio",
        "pipe/rel_error/b0_fwd",
        "pipe/buffer_bytes/rank3",
        "pipe/fresh_batches",
        "pipe/net_time_s",
        "pipe/wall_s",
    ):
        assert key in scalars, key
    # the pipe/* scalars are written by the strategy itself, at the steps Lightning writes train/loss
    assert [s for s, _ in scalars["pipe/bytes_total"]] == [s for s, _ in scalars["train/loss"]]
    assert len(scalars["train/loss"]) == 3  # steps 2, 4, 6 of 6 (log_every_n_steps=2)
    ratio = scalars["pipe/compression_ratio"][-1][1]
    # quant(4) forward, quant(8) backward: about 1/8 and 1/4 of fp32 plus scales. Those messages are
    # cheaper than the tied embedding's exact gradient sum, so placement auto (the default) runs the
    # embedding on the last stage beside its head ('v'), says so, and sends no tied sum at all
    assert "[clapping] placement auto: v (" in fit.stderr + fit.stdout
    assert not [k for k in scalars if k.startswith("pipe/bytes_total/tied")]
    assert 0.1 < ratio < 0.3
    val_loss = scalars["val/loss"][-1][1]
    validate_in_process(
        [
            "validate",
            "--config",
            str(MODELS / "smoke" / "pipeline.yaml"),
            *common,
            "--trainer.strategy=auto",
            "--trainer.devices=1",
            f"--ckpt_path={run_dir / 'checkpoints' / 'final.ckpt'}",
        ],
        tmp_path,
    )
    reval = read_scalars(tmp_path / "logs" / "smoke_pipeline" / "version_1")["val/loss"][0][1]
    assert reval == pytest.approx(val_loss, rel=1e-4)


def test_a_busy_machine_is_named_in_one_line_with_the_variable_to_set(monkeypatch):
    """torch's threads on cores that other work keeps busy: one line naming the load and what to set;
    nothing when the cores are free or OMP_NUM_THREADS chose."""
    from repro.cores import busy_machine_line

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    line = busy_machine_line(2, cores=2, load=1.6)
    assert "load 1.6 on 2 cores" in line and "OMP_NUM_THREADS=1" in line and "\n" not in line
    assert busy_machine_line(2, cores=2, load=1.0) is None  # this process's own start-up, say
    assert busy_machine_line(1, cores=2, load=1.0) is None  # one thread, one idle core
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert busy_machine_line(2, cores=2, load=1.9) is None
