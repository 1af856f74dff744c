"""Measured step times of the grid's rows on real shaped links (``link_steps`` > 0, or
``repro clapping --link_steps N``): every distinct (method, compressors, p) of the table trains for
a few steps with its K ranks in K network namespaces joined by veth links shaped to
``bandwidth_mbps`` (``repro bench --sections link``, run as a command), next to ``none`` on the same
links and the Amdahl bound from ``none``'s measured split into compute (the same run on unshaped
links) and link time. The workload is the bench's synthetic one at the model config's shape (its
layers, width, heads, vocabulary, block and batch, with the grid's K and micro-batches; a
pretrained model's as a GPT of its shape, head tied or not as the model): a step's time does not
depend on the token values. AQ-SGD is timed after its exact warm-up epoch (the
bench's link runs start compressed), so its row is its steady state. Needs root (CAP_NET_ADMIN).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from repro.experiments.kit.links import check_links_possible
from repro.files import read_json
from repro.runs.model_config import ModelConfig, load_model_config

from .plan import ClappingRow
from .settings import ClappingSettings, split_compressor
from .table_rows import TableRow


def run_label(row: ClappingRow) -> str:
    """The bench's label of a row's run (``NetworkRun.label``: method, F/B compressors, p, tied sum)."""
    tied = "" if row.tied == "identity" else f", tied sum {row.tied}"
    if row.strategy_method == "none":
        return ("none" if row.p == 1.0 else f"none p={row.p:g}") + tied
    fwd, bwd = split_compressor(row.compressor)
    comp = fwd if fwd == bwd else f"{fwd}/{bwd}"
    return f"{row.method} {comp}" + (f" p={row.p:g}" if row.p != 1.0 else "") + tied


def row_label(bench_label: str, settings: ClappingSettings) -> str:
    """A bench run's label as its table row's (:func:`run_label`): the head untied and the placement
    are the whole grid's, not a row's."""
    return bench_label.replace(f", placement {settings.placement}", "").replace(", untied", "")


def link_shape(config: ModelConfig) -> tuple[dict[str, int], bool]:
    """The bench GPT's layers, width, heads and vocabulary, and whether its head is untied: the model
    config's GPT, or a pretrained model's own (timed as a GPT of that shape: the same messages between
    stages; the compute of its attention and MLP as a GPT's, e.g. +12 % for SmolLM2's grouped keys)."""
    if not config.is_pretrained:
        gpt = config.gpt_config(int(config.data.get("vocab_size") or 256))
        return {
            "n_layer": gpt.n_layer,
            "n_embd": gpt.n_embd,
            "n_head": gpt.n_head,
            "vocab_size": gpt.vocab_size,
        }, False
    from repro.models.hf_folder import model_folder, num_layers, read_config

    hf = read_config(model_folder(config.pretrained))
    shape = {
        "n_layer": num_layers(hf),
        "n_embd": config.hidden_size,
        "n_head": int(getattr(hf, "num_attention_heads", None) or hf.n_head),
        "vocab_size": int(hf.vocab_size),
    }
    untied = config.value("model.tie_embeddings") == "untied" or not getattr(hf, "tie_word_embeddings", False)
    return shape, untied


def bench_settings(settings: ClappingSettings, rows: list[ClappingRow]) -> dict[str, Any]:
    """The ``repro bench`` settings that time these rows on links at the grid's shape."""
    config = load_model_config(settings.model)
    shape, untied = link_shape(config)
    head = {"untied": True} if untied else {}
    if settings.placement != "linear":  # every row at the grid's placement
        head["placement"] = settings.placement
    runs, seen = [{"method": "none", **head}], {"none"}
    for row in rows:
        label = run_label(row)
        if label in seen:
            continue
        seen.add(label)
        fwd, bwd = split_compressor(row.compressor)
        runs.append(
            {"method": row.strategy_method, "fwd_compressor": fwd, "bwd_compressor": bwd, "p": row.p}
            | ({} if row.tied == "identity" else {"tied_compressor": row.tied})
            | head
        )
    k = settings.stages
    return {
        "preset": "quick",
        "sections": ["link"],
        **shape,
        "block_size": config.block_size,
        "batch_size": config.batch_size,
        "micro_batches": settings.micro_batches,
        "stages": [k],
        "seq_stages": k,
        "seq_lengths": [config.block_size],
        "network_stages": k,
        "network_runs": runs,
        "link_stages": [k],
        "link_runs": runs,
        "link_micro_batches": settings.micro_batches,
        "link_schedule": settings.schedule,
        "network_repeats": settings.link_repeats,
        "link_rates_mbit": [float(settings.bandwidth_mbps)],
        "pipe_warmup_steps": settings.link_warmup_steps,
        "link_timed_steps": settings.link_steps,
    }


def measure_link_times(
    settings: ClappingSettings, rows: list[ClappingRow], out: Path, note=print
) -> dict[str, dict[str, Any]]:
    """{bench run label: measured step time, speed-up over none, its Amdahl bound, ...}; the bench's
    results are kept in ``out/link`` and reused when its settings are the same."""
    check_links_possible()
    folder = out / "link"
    folder.mkdir(parents=True, exist_ok=True)
    wanted = bench_settings(settings, rows)
    path = folder / "settings.yaml"
    result = folder / "bench.json"
    if not (result.is_file() and path.is_file() and yaml.safe_load(path.read_text()) == wanted):
        path.write_text(yaml.safe_dump(wanted, sort_keys=False))
        result.unlink(missing_ok=True)
        note(
            f"link: {len(wanted['network_runs'])} runs on veth links shaped to {settings.bandwidth_mbps:g} "
            f"Mbit/s, K={settings.stages} namespaces, {settings.link_steps} timed steps each"
        )
        cmd = [
            sys.executable,
            "-m",
            "repro.cli",
            "bench",
            "--settings",
            str(path),
            "--out",
            str(folder),
            "--quiet",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(
                f"link times: `repro bench` failed: {(done.stderr.strip().splitlines() or [''])[-1]}"
            )
    bench = read_json(result, "link bench results")
    times = {}
    for r in bench["rows"]:
        if r["section"] != "link":
            continue
        times[row_label(r["name"].split(" @ ")[0], settings)] = {
            "step_s": r["median"],
            "speedup": r["ratio"] if r["reference"] else 1.0,
            "speedup_bound": r["speedup_bound_amdahl"],
            "speedup_ci": [r["ratio_ci_low"], r["ratio_ci_high"]]
            if r.get("ratio_ci_low") is not None
            else None,
            "fraction_of_limit": r.get("fraction_of_limit"),
            "compression_ratio": r["compression_ratio"],
            "achieved_mbit": r["achieved_mbit"],
            "rate_mbit": r["rate_mbit"],
            "compute_s_per_step": r["compute_s_per_step"],
        }
    return times


def with_link_times(rows: list[TableRow], times: dict[str, dict[str, Any]] | None) -> list[TableRow]:
    """The table rows, each with its run's measured link figures (None where not measured)."""
    times = times or {}
    return [
        replace(
            r,
            link=times.get(run_label(ClappingRow(r.regime, r.method, r.compressor, r.p, r.tied_compressor))),
        )
        for r in rows
    ]
