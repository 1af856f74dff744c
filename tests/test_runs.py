"""The run engine: one fingerprint, a model config trains the same way under ``repro fit`` and
under an experiment, the experiment owns the schedule, settings paths are relative to the
settings file, an old path fails in one line, and where runs go."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal

import pytest
import torch

from repro.cli import main as repro_main
from repro.experiments.table1.settings import load_table1_settings
from repro.runs import RunSpec
from repro.runs.build import train_run
from repro.runs.model_config import load_model_config
from repro.runs.placement import Slot, pipeline_slots, single_run_slots
from repro.runs.pool import SlotPool
from repro.runs.store import load_finished

from conftest import EXPERIMENTS, MODELS

TABLE1_MODEL = MODELS / "smoke" / "table1_target_mha.yaml"


def spec(tmp_path, **changes) -> RunSpec:
    values = dict(
        name="run",
        folder=tmp_path,
        config=TABLE1_MODEL,
        seed=3,
        steps=6,
        eval_every=3,
        overrides={"model.gpt.rope_dims": [16, 4, 4, 4, 4, 16]},
    )
    values.update(changes)
    return RunSpec.make(**values)


def test_the_fingerprint_changes_with_what_changes_the_numbers_and_only_that(tmp_path):
    base = spec(tmp_path).fingerprint()
    assert spec(tmp_path).fingerprint() == base
    assert (
        spec(tmp_path, name="other", folder=tmp_path / "x").fingerprint() == base
    )  # where it goes does not count
    for changed in (
        dict(seed=4),
        dict(steps=9),
        dict(eval_every=2),
        dict(overrides={"model.gpt.rope_dims": [4] * 6}),
        dict(stages=2, pipeline={"method": "none"}),
    ):
        assert spec(tmp_path, **changed).fingerprint() != base, changed
    # an edit of the file that moves the numbers changes it; one that moves only the logs does not
    copy = tmp_path / "model.yaml"
    text = TABLE1_MODEL.read_text()
    copy.write_text(text.replace("save_dir: logs", "save_dir: elsewhere"))
    assert spec(tmp_path, config=copy).fingerprint() == base
    copy.write_text(text.replace("lr: 0.003", "lr: 0.004"))
    assert spec(tmp_path, config=copy).fingerprint() != base


def test_a_model_config_trains_the_same_under_repro_fit_and_under_the_engine(
    tmp_path, data_cache, monkeypatch
):
    """Same file, same seed and steps: the same weights, bit for bit, whichever way it is trained."""
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    torch.set_num_threads(1)
    engine = spec(tmp_path / "engine", save_checkpoint=True)
    result = train_run(engine, single_run_slots("cpu", 1)[0], str(data_cache))
    with pytest.raises(SystemExit) as done:
        repro_main(
            [
                "fit",
                "--config",
                str(TABLE1_MODEL),
                "--seed_everything=3",
                "--data.shuffle_seed=3",
                "--trainer.max_steps=6",
                "--trainer.val_check_interval=3",
                "--trainer.check_val_every_n_epoch=null",
                "--model.gpt.rope_dims=[16,4,4,4,4,16]",
                f"--data.cache_dir={data_cache}",
                f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
                "--trainer.enable_progress_bar=false",
                "--trainer.callbacks+=repro.lit.FinalCheckpoint",
            ]
        )
    assert done.value.code == 0
    fitted = torch.load(next((tmp_path / "logs").rglob("final.ckpt")), weights_only=False)["state_dict"]
    engine_weights = torch.load(result.checkpoint, weights_only=False)["state_dict"]
    assert fitted.keys() == engine_weights.keys()
    assert all(torch.equal(fitted[k], engine_weights[k]) for k in fitted)
    assert result.global_step == 6 and [s for s, _ in result.val_curve] == [3, 6]


def test_a_finished_run_is_reused_and_a_changed_one_is_not(tmp_path, data_cache):
    first = spec(tmp_path)
    result = train_run(first, Slot("cpu", (), 1), str(data_cache))
    assert load_finished(first) == result
    stored = json.loads((tmp_path / "run.json").read_text())
    assert stored["provenance"]["machine"]["cpu_capability"] and stored["provenance"]["git_commit"]
    assert load_finished(spec(tmp_path, steps=3)) is None  # same name, other run: trained again
    (tmp_path / "run.json").write_text("{not json")
    assert load_finished(first) is None  # a damaged result is trained again


def test_a_stop_signal_after_the_last_step_keeps_the_run_and_stops_the_experiment(
    tmp_path, data_cache, monkeypatch
):
    """A stop signal that reaches a pipeline's launcher after its ranks' last step boundary (or
    before its ranks exist) stops no step: the finished run is kept, and the experiment still stops
    after it (it once went on to the next run as if nothing had come)."""
    from repro.lightning_compat import FullModelLauncher

    original = FullModelLauncher.update_main_process_results

    def signal_then_update(self, trainer, extra):
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher's stop handler records it; no rank is left
        original(self, trainer, extra)

    monkeypatch.setattr(FullModelLauncher, "update_main_process_results", signal_then_update)
    late = spec(tmp_path, stages=2, pipeline={"method": "none"})
    with pytest.raises(KeyboardInterrupt, match="finished as SIGTERM arrived; its result is kept"):
        train_run(late, Slot("cpu", (), 1), str(data_cache), "gloo")
    kept = load_finished(late)
    assert kept is not None and kept.global_step == 6


def test_a_pipeline_run_whose_stages_draw_their_own_weights_is_the_run_of_a_model_built_whole(
    tmp_path, data_cache, monkeypatch
):
    """The engine builds a pipeline run's GPT on meta and each rank draws only its stage's seed-built
    weights: the losses and final weights are bitwise those of the same run with the model built
    whole in the launching process (as it was before)."""
    from repro.deferred_init import deferring
    from repro.models.gpt import GPT

    built = GPT.build.__func__
    on_meta: list[bool] = []

    def recording_build(cls, config):
        model = built(cls, config)
        on_meta.append(not model.is_materialized)
        return model

    monkeypatch.setattr(GPT, "build", classmethod(recording_build))
    deferred = train_run(
        spec(tmp_path / "deferred", stages=2, pipeline={"method": "none"}, save_checkpoint=True),
        Slot("cpu", (), 1),
        str(data_cache),
        "gloo",
    )
    monkeypatch.setattr("repro.lit.cli.deferred_init", contextlib.nullcontext)  # the model built whole
    whole = train_run(
        spec(tmp_path / "whole", stages=2, pipeline={"method": "none"}, save_checkpoint=True),
        Slot("cpu", (), 1),
        str(data_cache),
        "gloo",
    )
    assert on_meta == [True, False] and not deferring()  # the launching process never drew the weights
    assert deferred.val_curve == whole.val_curve
    a, b = (torch.load(r.checkpoint, weights_only=False)["state_dict"] for r in (deferred, whole))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_experiment_owns_the_schedule_of_its_model_files(tmp_path):
    text = TABLE1_MODEL.read_text()
    assert load_model_config(TABLE1_MODEL).check_trainable_by_experiment("target") is None
    own = tmp_path / "own.yaml"
    own.write_text(
        text.replace("trainer:\n", "trainer:\n  max_steps: 40\n").replace(
            "data:\n", "data:\n  shuffle_seed: 2\n"
        )
    )
    with pytest.raises(
        ValueError, match=r"sets trainer.max_steps=40, data.shuffle_seed=2, which the experiment's"
    ):
        load_model_config(own).check_trainable_by_experiment("target")


def test_settings_paths_are_relative_to_the_settings_file_not_the_working_folder(tmp_path, monkeypatch):
    """The bug of the earlier layout: table1/cpu.yaml loaded from inside paper_configs/ took another
    family. Wherever the command runs, the settings name the same files."""
    seen = []
    for cwd in (tmp_path, EXPERIMENTS / "table1", MODELS / "cpu"):
        monkeypatch.chdir(cwd)
        s = load_table1_settings(EXPERIMENTS / "table1" / "cpu.yaml")
        seen.append((s.target["mha"], s.source["mla"]))
    assert len(set(seen)) == 1
    assert seen[0][0] == str(MODELS / "cpu" / "table1_target_mha.yaml")
    # a copy of the settings elsewhere finds the models next to it, or says which file is missing
    copy = tmp_path / "copy" / "cpu.yaml"
    copy.parent.mkdir()
    shutil.copy(EXPERIMENTS / "table1" / "cpu.yaml", copy)
    with pytest.raises(ValueError, match=r"target: no such file '.*models/cpu/table1_target_mha.yaml'"):
        load_table1_settings(copy)


@pytest.mark.parametrize(
    "args, new",
    [
        (["fit", "--config", "paper_configs/smoke.yaml"], "paper_configs/models/smoke/gpt_mha.yaml"),
        (
            ["fit", "--config", "paper_configs/smoke_pipeline.yaml"],
            "paper_configs/models/smoke/pipeline.yaml",
        ),
        (
            ["table1", "--settings", "paper_configs/table1/cpu.yaml"],
            "paper_configs/experiments/table1/cpu.yaml",
        ),
        (
            ["clapping", "--settings", "paper_configs/clapping/smoke.yaml"],
            "paper_configs/experiments/clapping/smoke.yaml",
        ),
        (
            ["bench", "--settings", "paper_configs/bench/quick.yaml"],
            "paper_configs/experiments/bench/quick.yaml",
        ),
    ],
)
def test_a_config_path_of_the_earlier_layout_fails_in_one_line(args, new, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        repro_main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such file" in err and "moved" not in err
    assert list(tmp_path.iterdir()) == []


def test_slots_share_the_cores_and_the_gpus():
    assert single_run_slots("cpu", 2, cores=2) == [Slot("cpu", (), 1)] * 2
    assert single_run_slots("cpu", 1, cores=16) == [Slot("cpu", (), 16)]
    gpu = single_run_slots("gpu", 1, runs_per_gpu=3, cores=16, gpus=2)
    assert [s.devices for s in gpu] == [(0,), (1,), (0,), (1,), (0,), (1,)] and all(
        s.threads == 2 for s in gpu
    )
    assert pipeline_slots("gpu", 4, cores=16, gpus=8) == (
        [Slot("gpu", (0, 1, 2, 3), 2), Slot("gpu", (4, 5, 6, 7), 2)],
        "nccl",
    )  # two 4-stage runs side by side on an 8-GPU node, one stage per GPU
    assert pipeline_slots("gpu", 4, cores=16, gpus=2) == ([Slot("gpu", (0, 1, 0, 1), 4)], "gloo")
    assert pipeline_slots("cpu", 4, cores=2) == ([Slot("cpu", (), 1)], "gloo")
    with pytest.raises(ValueError, match="workers=0"):
        single_run_slots("cpu", 0)


@pytest.mark.parametrize(
    "gpus, runs_per_gpu, stages", [(1, 1, 1), (3, 2, 1), (8, 4, 1), (8, 1, 4), (6, 1, 4)]
)
def test_placement_gives_every_run_a_device_within_its_limits_and_a_failed_run_frees_it(
    gpus, runs_per_gpu, stages
):
    """Simulated node: 20 runs through the slot pool, every fourth run failing. No GPU ever holds
    more runs than runs_per_gpu (or more stages than one per GPU with NCCL), every run gets a
    device, and the slot of a failed run is used again."""
    import random

    if stages == 1:
        slots = single_run_slots("gpu", 1, runs_per_gpu=runs_per_gpu, cores=16, gpus=gpus)
        limit = runs_per_gpu
    else:
        slots, backend = pipeline_slots("gpu", stages, cores=16, gpus=gpus)
        limit = 1
        assert backend == "nccl" and all(len(set(s.devices)) == stages for s in slots)
    assert {d for s in slots for d in s.devices} == set(range(gpus)) or stages > 1
    pool, rng = SlotPool(slots), random.Random(0)
    todo, running, placed, failed_slots = list(range(20)), {}, {}, set()
    while todo or running:
        while todo and pool.free:
            run = todo.pop(0)
            running[run] = pool.acquire()
            placed[run] = slots[running[run]].devices
            load: dict[int, int] = {}
            for index in running.values():
                for device in set(slots[index].devices):
                    load[device] = load.get(device, 0) + 1
            assert max(load.values()) <= limit
        run = rng.choice(sorted(running))
        if run % 4 == 3:
            failed_slots.add(running[run])
        pool.release(running.pop(run))
    assert sorted(placed) == list(range(20)) and all(placed.values())
    assert failed_slots and len(pool.free) == len(slots)
    with pytest.raises(ValueError, match="released twice"):
        pool.release(pool.free[0])


def test_stages_sharing_a_gpu_name_it_once_to_lightning_and_once_per_stage_to_the_strategy(
    tmp_path, monkeypatch
):
    """Lightning refuses a GPU named twice in ``devices`` ('Device ID's (GPU) must be unique': the
    first GPU run of a pipeline failed so); the strategy's parallel_devices give each stage its own.
    GPU ranks are spawned: a forked one failed with 'Cannot re-initialize CUDA in forked subprocess'."""
    from repro.runs.build import RunRecorder, _trainer_kwargs

    pipe = spec(tmp_path, pipeline={"micro_batches": 2}, stages=4)
    kwargs = _trainer_kwargs(pipe, Slot("gpu", (0, 1, 0, 1), 4), RunRecorder(pipe), "gloo")
    assert kwargs["devices"] == [0, 1]
    assert kwargs["strategy"].parallel_devices == [torch.device("cuda", i) for i in (0, 1, 0, 1)]
    assert kwargs["strategy"].num_processes == 4
    assert kwargs["strategy"].options.start_method == "spawn"  # CUDA cannot be re-initialized in a fork
    # Lightning's own connector on a simulated two-GPU machine: it takes these, and refuses a GPU twice
    import lightning as L
    import lightning.fabric.accelerators.cuda as fabric_cuda

    monkeypatch.setattr(fabric_cuda, "num_cuda_devices", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    trainer = L.Trainer(**kwargs)
    assert trainer.num_devices == 4 and trainer.strategy.root_device.type == "cuda"
    with pytest.raises(Exception, match="must be unique"):
        L.Trainer(**{**_trainer_kwargs(pipe, Slot("gpu", (0, 1, 0, 1), 4), RunRecorder(pipe), "gloo"),
                     "devices": [0, 1, 0, 1]})  # fmt: skip
    cpu = _trainer_kwargs(pipe, Slot("cpu", (), 1), RunRecorder(pipe), "gloo")
    assert cpu["devices"] == 4 and cpu["strategy"].parallel_devices is None
    assert cpu["strategy"].options.start_method == "fork"
