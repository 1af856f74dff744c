"""`make reproduce-clapping` at smoke scale end to end: every row, the byte counts each method
must send (exactly, from the compressors' payload sizes), the memory claim, resume, figures."""

from __future__ import annotations

import sys

import pytest

from repro.experiments.clapping.plan import plan_rows
from repro.experiments.clapping.run import run_clapping
from repro.experiments.clapping.settings import load_clapping_settings
from repro.pipeline.compressors import build_compressor

from conftest import EXPERIMENTS, MODELS, REPO_ROOT

SMOKE = EXPERIMENTS / "clapping" / "smoke.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, data_cache):
    out = tmp_path_factory.mktemp("clapping") / "clapping"
    settings = load_clapping_settings(SMOKE)
    report = run_clapping(settings, out, quiet=True, cache_dir=str(data_cache))
    return settings, report, out


def _row(report, method, compressor, p):
    return next(
        r for r in report["rows"] if (r["method"], r["compressor"], r["p"]) == (method, compressor, p)
    )


def test_every_planned_row_is_in_the_table(smoke):
    settings, report, out = smoke
    planned = {(r.method, r.compressor, r.p) for r in plan_rows(settings)}
    assert {(r["method"], r["compressor"], r["p"]) for r in report["rows"]} == planned
    assert {"none", "none_lazy", "direct", "ef21", "aqsgd", "clapping_fc", "clapping_fu"} == {
        m for m, _, _ in planned
    }
    for name in ("clapping_table.md", "clapping_table.csv", "clapping_table.json"):
        assert (out / name).is_file()
    md_rows = [line for line in (out / "clapping_table.md").read_text().splitlines() if line.startswith("| ")]
    assert len(md_rows) == len(planned) + 1
    assert all(r["val_loss"] == r["val_loss"] and 0 < r["val_loss"] < 10 for r in report["rows"])  # finite


def test_bytes_sent_are_the_compressors_payloads(smoke):
    settings, report, _ = smoke
    shape = (4, 64, 64)  # micro-batch (16 / 4) x block x d_model
    raw = 4 * 64 * 64 * 4
    steps = settings.steps
    assert _row(report, "none", "identity", 1.0)["compression_ratio"] == 1.0
    assert _row(report, "none_lazy", "identity", settings.lazy_p)["compression_ratio"] == 1.0
    for comp in settings.compressors:
        c = build_compressor(comp).payload_nbytes(shape, __import__("torch").float32) / raw
        for method in ("direct", "ef21"):  # every message compressed
            assert _row(report, method, comp, 1.0)["compression_ratio"] == pytest.approx(c, rel=1e-12)
        for p in settings.clapping_p:
            assert _row(report, "clapping_fc", comp, p)["compression_ratio"] == pytest.approx(c, rel=1e-12)
            fu_runs = [
                r
                for r in report["runs"]
                if (r["method"], r["compressor"], r["p"]) == ("clapping_fu", comp, p)
            ]
            for run in fu_runs:  # exact messages on fresh steps, compressed ones on reuse steps
                fresh = run["fresh_batches"]
                assert run["bytes_total"] / run["raw_bytes_total"] == pytest.approx(
                    (fresh + (steps - fresh) * c) / steps
                )
                assert c < run["bytes_total"] / run["raw_bytes_total"] < 1
        # AQ-SGD: forward exact during the warm-up epoch (N / batch steps), then compressed; backward direct
        warm = settings.warmup_epochs * (64 // 16)
        expected = ((warm + (steps - warm) * c) + steps * c) / (2 * steps)
        assert _row(report, "aqsgd", comp, 1.0)["compression_ratio"] == pytest.approx(expected, rel=1e-12)


def test_aqsgd_memory_grows_with_n_and_clappings_does_not(smoke):
    _, report, _ = smoke
    aq = sorted((p for p in report["memory"] if p["method"] == "aqsgd"), key=lambda p: p["N"])
    cl = sorted((p for p in report["memory"] if p["method"] == "clapping_fc"), key=lambda p: p["N"])
    assert len(aq) >= 4 and all(p["measured_bytes"] == p["analytical_bytes"] for p in aq + cl)
    assert all(b["measured_bytes"] > a["measured_bytes"] for a, b in zip(aq, aq[1:]))
    assert len({p["measured_bytes"] for p in cl}) == 1
    # in the runs themselves: AQ-SGD's middle ranks hold its rows, Clapping's only the slot buffers
    aq_run = _row(report, "aqsgd", "quant(4)", 1.0)["buffer_bytes_max_rank"]
    fc_run = _row(report, "clapping_fc", "quant(4)", 0.5)["buffer_bytes_max_rank"]
    assert aq_run == 2 * 64 * 64 * 64 * 4 and fc_run == 4 * 4 * (4 * 64 * 64 * 4)


def test_a_second_call_trains_nothing_and_writes_the_same_table(smoke, data_cache):
    settings, report, out = smoke
    before = (out / "clapping_table.md").read_text()
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    again = run_clapping(settings, out, quiet=True, cache_dir=str(data_cache))
    assert again["trained_runs"] == 0 and again["total_runs"] == report["total_runs"]
    assert (out / "clapping_table.md").read_text().split("commit")[0] == before.split("commit")[0]
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == mtimes


def test_each_clapping_figure_is_drawn_from_the_smoke_results(smoke, tmp_path):
    _, _, out = smoke
    sys.path.insert(0, str(REPO_ROOT / "figures"))
    import importlib

    for name in ("clapping_curves", "clapping_memory", "clapping_p", "clapping_time"):
        files = importlib.import_module(name).main(out.parent, tmp_path / "figs")
        assert [f.suffix for f in files] == [".png", ".pdf"] and all(f.stat().st_size > 1000 for f in files)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("methods: [none, zip]", "methods="),
        ("clapping_p: [0.0]", "p=0.0"),
        ("compressors: [identity]", "does not compress"),
        ("compressors: ['quant(9)']", "2..8"),
        ("stages: 1", "at least 2 stages"),
        ("steps: 0", "steps=0"),
        ("colour: red", "unknown fields"),
    ],
)
def test_bad_clapping_settings_fail_with_the_field(override, fragment, tmp_path):
    key = override.split(":")[0]
    text = SMOKE.read_text().replace("../../models/", f"{MODELS}/")
    lines = [line for line in text.splitlines() if not line.startswith(f"{key}:")]
    path = tmp_path / "bad.yaml"
    path.write_text("\n".join(lines + [override]) + "\n")
    with pytest.raises(
        ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        load_clapping_settings(path)


def test_the_table_records_what_reruns_each_row(smoke):
    """Commit, settings, model config and seeds, and per run its method, compressor, p and seed."""
    settings, report, out = smoke
    assert report["git_commit"] and report["settings"] and report["model_config"] and report["seeds"] == [0]
    assert all({"method", "compressor", "p", "seed", "fingerprint"} <= set(run) for run in report["runs"])
