"""`make reproduce-table1` at smoke scale end to end: rows, budgets, files, resume, figures."""

from __future__ import annotations

import csv
import importlib
import json
import math
import signal
import sys
from pathlib import Path

import pytest

from repro.cli import run as repro_run
from repro.experiments.table1.plan import ROW_METHODS, make_plan
from repro.experiments.table1.rows import Table1Row
from repro.experiments.table1.settings import Table1Settings, load_table1_settings

from conftest import EXPERIMENTS, MODELS, REPO_ROOT

SMOKE = EXPERIMENTS / "table1" / "smoke.yaml"
FIGURES = REPO_ROOT / "figures"
ARCHS = ("mha", "mla")


@pytest.fixture(scope="module")
def smoke_table(tmp_path_factory):
    """One smoke reproduction (the tokenizer cache goes to a temporary working folder)."""
    work = tmp_path_factory.mktemp("table1")
    out = work / "results" / "table1"
    mp = pytest.MonkeyPatch()
    mp.chdir(work)
    try:
        assert repro_run(["table1", "--settings", str(SMOKE), "--out", str(out)]) == 0
    finally:
        mp.undo()
    doc = json.loads((out / "table1.json").read_text())
    return {"work": work, "out": out, "doc": doc}


@pytest.mark.slow
def test_every_method_row_is_present_for_both_architectures(smoke_table):
    doc = smoke_table["doc"]
    assert [r["method"].split(" (")[0] for r in doc["rows"]] == list(ROW_METHODS)
    for row in doc["rows"]:
        for arch in ARCHS:
            assert math.isfinite(row[f"{arch}_loss_mean"]), (row["method"], arch)
            assert row[f"{arch}_runs"] >= len(doc["seeds"])
    assert doc["scale"] == "smoke" and doc["git_commit"] and doc["created"]
    for arch in ARCHS:
        runs = doc["architectures"][arch]["runs"]
        assert runs and all(math.isfinite(r["final_loss"]) for r in runs.values())
    # the file's flat records are the typed rows, field for field (and the csv's columns are theirs)
    for record in doc["rows"]:
        row = Table1Row.from_record(record, list(doc["architectures"]))
        assert row.record() == record and list(row.record()) == list(record)
    header = (smoke_table["out"] / "table1.csv").read_text().splitlines()[0].split(",")
    assert header == ["scale", "git_commit", *doc["rows"][0]]


@pytest.mark.slow
def test_budget_matched_rows_spend_the_same_total_rotary_width(smoke_table):
    doc = smoke_table["doc"]
    for arch in ARCHS:
        totals = {}
        for row in doc["rows"]:
            widths = [[int(w) for w in draw.split()] for draw in row[f"{arch}_widths"].split("; ")]
            totals[row["method"].split(" (")[0]] = {sum(w) for w in widths}
        matched = set().union(*(totals[m] for m in ROW_METHODS if m not in ("all-high", "all-low", "nope")))
        assert len(matched) == 1, (arch, totals)
        (budget,) = matched
        assert min(totals["all-high"]) > budget > max(totals["all-low"]) > max(totals["nope"]) == 0
        # the reference points are not at the budget, and the table marks them
        refs = [r for r in doc["rows"] if not r["budget_matched"]]
        assert [r["method"] for r in refs] == ["all-high", "all-low", "nope"]
    md = (smoke_table["out"] / "table1.md").read_text()
    assert "| all-high † |" in md and "not budget-matched" in md


@pytest.mark.slow
def test_md_csv_and_json_agree(smoke_table):
    doc, out = smoke_table["doc"], smoke_table["out"]
    with open(out / "table1.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == [r["method"] for r in doc["rows"]]
    md = (out / "table1.md").read_text()
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + len(doc["rows"])
    assert len({ln.count("|") for ln in table}) == 1, "every md row has as many cells as the header"
    for csv_row, json_row in zip(rows, doc["rows"]):
        assert csv_row["scale"] == "smoke" and csv_row["git_commit"] == doc["git_commit"]
        for arch in ARCHS:
            assert float(csv_row[f"{arch}_loss_mean"]) == json_row[f"{arch}_loss_mean"]
            assert f"{json_row[f'{arch}_loss_mean']:.4f}" in md
        assert int(csv_row["mla_kv_elements_per_token"]) == json_row["mla_kv_elements_per_token"]
    # the MLA cache grows with the rotary width: all-high > budget > all-low > nope
    kv = {r["method"]: r["mla_kv_elements_per_token"] for r in doc["rows"]}
    assert kv["all-high"] > kv["uniform"] == kv["profiled"] > kv["all-low"] > kv["nope"]


@pytest.mark.slow
def test_a_second_call_reuses_every_run(smoke_table, monkeypatch):
    out = smoke_table["out"]
    monkeypatch.chdir(smoke_table["work"])
    results = sorted(out.rglob("runs/*.json")) + sorted(out.rglob("profile_*/*.json"))
    before = {p: p.stat().st_mtime_ns for p in results}
    assert repro_run(["table1", "--settings", str(SMOKE), "--out", str(out)]) == 0
    doc = json.loads((out / "table1.json").read_text())
    assert doc["runs_trained"] == 0 and doc["runs_reused"] > 0
    assert {p: p.stat().st_mtime_ns for p in results} == before
    assert doc["rows"] == smoke_table["doc"]["rows"]


@pytest.mark.slow
def test_a_reproduction_killed_midway_is_finished_by_two_shards_with_the_same_table(smoke_table):
    """SIGKILL to the whole process group (workers included) once a few runs are done, then
    `repro table1 --shard 0/2` and `--shard 1/2` at once in the same results folder (a preempted job
    rerun as an array job): they reuse the finished runs, each trains its half of the rest of stage
    1, waits for the other's, trains its half of stage 2, and the last to finish writes a table whose
    runs are those of the uninterrupted one-process run (each shard with 2 single-thread workers, as
    that run). The MHA half alone (architectures: [mha]), so that the test trains half the runs."""
    import subprocess

    from test_interrupted_orchestrators import _cli, interrupt

    work = smoke_table["work"]
    out = work / "results" / "killed"
    settings = work / "smoke_mha.yaml"
    text = SMOKE.read_text().replace("../../models/", f"{SMOKE.parent.parent.parent / 'models'}/")
    settings.write_text(text + "architectures: [mha]\n")
    args = ["table1", "--settings", str(settings), "--out", str(out)]
    code = interrupt(
        args, work, lambda: len(list(out.rglob("runs/*.json"))) >= 8, signal.SIGKILL
    )  # of 12 in stage 1
    assert code != 0
    assert not (out / "table1.json").exists()
    kept = len(list(out.rglob("runs/*.json")))
    procs = [
        subprocess.Popen(
            _cli([*args, "--shard", f"{i}/2"]),
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert sum("writes the table" in log for log in logs) <= 1  # one of them may finish first
    trained = [int(log.split("stage 2 of 2: ")[1].split(" runs")[0]) for log in logs]
    assert min(trained) > 0  # both shards trained rows
    doc = json.loads((out / "table1.json").read_text())
    assert doc["runs_reused"] >= kept >= 8
    assert set(doc["architectures"]) == {"mha"}

    def losses(d):
        return {
            name: (r["widths"], r["seed"], r["final_loss"])
            for name, r in d["architectures"]["mha"]["runs"].items()
        }

    assert losses(doc) == losses(smoke_table["doc"])
    assert [r["mha_loss_mean"] for r in doc["rows"]] == [
        r["mha_loss_mean"] for r in smoke_table["doc"]["rows"]
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["table1_curves", "table1_deltas", "rope_profiles", "quality_storage_compute", "calibration"]
)
def test_each_figure_script_draws_from_the_smoke_results(smoke_table, name, tmp_path):
    sys.path.insert(0, str(FIGURES))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.remove(str(FIGURES))
    written = module.main(smoke_table["work"] / "results", tmp_path)
    assert sorted(p.name for p in written) == [f"{name}.pdf", f"{name}.png"]
    for p in written:
        assert p.is_file() and p.stat().st_size > 1000


def test_figures_without_results_are_skipped_with_a_message(tmp_path, capsys):
    sys.path.insert(0, str(FIGURES))
    try:
        make_all = importlib.import_module("make_all")
    finally:
        sys.path.remove(str(FIGURES))
    assert make_all.main(["--results", str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.count("[figures] skip") == len(make_all.FIGURES) == 13
    assert out.count("make reproduce-table1") == 5 and out.count("make reproduce-clapping") == 4
    assert out.count("repro profile phase-off --config paper_configs/models/real/smollm2.yaml") == 1
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- bad settings
def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "settings.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "extra, message",
    [
        ("scale: huge\n", "scale='huge'"),
        ("seeds: []\n", "seeds=[]"),
        ("seeds: [0, 0]\n", "seeds repeat"),
        ("workers: 0\n", "workers=0"),
        ("profile_fraction: 1.5\n", "profile_fraction=1.5"),
        ("profile_lr_schedule: sometimes\n", "profile_lr_schedule='sometimes'"),
        ("sweep_methods: [random-k]\n", "sweep_methods=['random-k']"),
        ("interaction_top: 1\n", "interaction_top=1"),
        ("colour: blue\n", "unknown fields ['colour']"),
    ],
)
def test_bad_settings_fail_early_naming_the_field(tmp_path, extra, message):
    base = SMOKE.read_text()
    lines = [ln for ln in base.splitlines() if not ln.startswith(extra.split(":")[0] + ":")]
    path = _write(tmp_path, "\n".join(lines).replace("../../models/", f"{MODELS}/") + "\n" + extra)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_table1_settings(path)


def test_cli_reports_a_missing_config_and_writes_nothing(tmp_path, capsys):
    path = _write(
        tmp_path,
        "scale: smoke\ntarget: {mha: nowhere.yaml, mla: nowhere.yaml}\n"
        "source: {mha: nowhere.yaml, mla: nowhere.yaml}\n",
    )
    assert repro_run(["table1", "--settings", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "nowhere.yaml" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_source_deeper_than_target_is_rejected(tmp_path, capsys):
    s = load_table1_settings(SMOKE)
    swapped = Table1Settings(**{**s.to_dict(), "target": s.source, "source": s.target})
    with pytest.raises(ValueError, match="must be shallower"):
        make_plan(swapped, "mha", tmp_path)


SETTINGS_FILES = sorted(SMOKE.parent.glob("*.yaml"))


@pytest.mark.parametrize("path", SETTINGS_FILES, ids=lambda p: p.name)
def test_every_shipped_settings_file_plans_both_halves(path, tmp_path):
    """The smoke, cpu and paper settings load, and their families pass every check of make_plan
    (one family per architecture, shallower source, feasible budget, steps a multiple of eval_every)."""
    from repro.alloc.budget import num_high_layers

    settings = load_table1_settings(path)
    for arch in settings.architectures:
        plan = make_plan(settings, arch, tmp_path)
        assert plan.steps % plan.eval_every == 0
        assert num_high_layers(plan.shape.n_layer, plan.levels) == plan.shape.n_layer // 3


def test_a_step_time_no_gpu_could_run_at_is_flagged_in_the_plan():
    """--step_time is one step of the reference model: the plan says the TFLOP/s it implies, and warns
    when that is above any GPU's peak (a step time of a smaller scale's model, say)."""
    from repro.experiments.kit.compute_plan import PlannedRun, plan_lines

    runs = [PlannedRun(name="r", stage=1, steps=100, tokens=10**6, flops=1e17, gpus=1)]
    fair = plan_lines("plan", runs, 1.0, "ref.yaml", reference_flops=1e14)  # 100 TFLOP/s
    assert any("100 TFLOP/s" in line for line in fair) and not any("WARNING" in line for line in fair)
    (warning,) = [line for line in plan_lines("plan", runs, 0.01, "ref.yaml", 1e14) if "WARNING" in line]
    assert "one step of ref.yaml" in warning  # 10,000 TFLOP/s


def test_the_shipped_settings_files_are_found():
    shipped = {"smoke", "cpu-quick", "cpu", "gpu", "gpu_check", "paper", "paper_gpu_check"}
    assert {p.stem for p in SETTINGS_FILES} == shipped


def test_a_gpu_scale_on_a_machine_without_a_gpu_fails_before_any_run(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert repro_run(["table1", "--scale", "paper", "--out", str(tmp_path / "out")]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_table_records_what_reruns_each_row(smoke_table):
    """Commit, settings, seeds, and per run its config, widths and seed (the rerun recipe)."""
    doc = smoke_table["doc"]
    assert doc["git_commit"] and doc["settings"]["scale"] == "smoke" and doc["seeds"] == [0]
    for arch in ARCHS:
        a = doc["architectures"][arch]
        assert Path(REPO_ROOT / a["target_config"]).is_file() or Path(a["target_config"]).is_file()
        assert a["runs"] and all({"widths", "seed", "result"} <= set(run) for run in a["runs"].values())


def test_a_resolved_mark_that_the_float_spread_of_uniform_can_flip_is_named():
    """With each float-spread variant's uniform losses in place of the table's, a row whose mark
    rests on a hair's breadth flips; one well clear of the noise holds."""
    from types import SimpleNamespace

    from repro.experiments.table1.plan import ROW_METHODS
    from repro.experiments.table1.report import comparisons, marks_under_float_spread

    seeds = (0, 1, 2, 3)
    base = [2.0, 2.1, 1.9, 2.05]
    offsets = dict.fromkeys(ROW_METHODS, 0.0)
    offsets.update({"all-low": 0.3, "last-k": 0.02})  # all-low far above uniform; last-k just above
    noise = {"all-low": [0.001, -0.002, 0.0, 0.001], "last-k": [0.0003, -0.0002, 0.0001, 0.0]}
    allocations, losses = [], {}
    for i, m in enumerate(ROW_METHODS):
        allocations.append(SimpleNamespace(method=m, widths=(i,)))
        for j, s in enumerate(seeds):
            losses[(i,), s] = base[j] + offsets[m] + noise.get(m, [0.0] * 4)[j] + 0.005 * (m != "uniform")
    o = SimpleNamespace(
        allocations=allocations,
        run=lambda widths, seed: SimpleNamespace(final_val_loss=losses[tuple(widths), seed]),
    )
    table = comparisons(o, seeds)
    assert table["all-low"].resolved and table["last-k"].resolved
    shifted = [base[j] + (0.02 if j % 2 else -0.02) for j in range(4)]  # the reference moved by float noise
    spread = {"avx2 kernels": {"seeds": list(seeds), "variant_loss": shifted}}
    marks = marks_under_float_spread(o, seeds, table, spread)
    assert marks["all-low"] == {"table": True, "avx2 kernels": True}
    assert marks["last-k"] == {"table": True, "avx2 kernels": False}
