"""``repro mla-plane``: a pretrained model converted to latent attention at several KV-cache budgets,
each budget's cache allocated per layer by the profiles against MHA2MLA's uniform conversion, on
the quality-storage-compute plane (settings: ``settings.py``; rows: ``rows.py``; table: ``report.py``).

Stages, each kept on disk under ``out`` and reused when the command runs again (interrupt and rerun
to resume):
  1. calibration: the attention inputs' moments and the q.k 2-norm pair order (``calibration/``);
  2. profiles (``profiles/``): the coverage-benefit profile of the source at each budget's main split
     (levels N/2 and 2N pairs) and the rank-benefit profile of its uniform conversion (R/2 and 2R);
  3. every row converted (``models/<key>/``) and evaluated zero-shot on the test chunks of ``config``
     and of each ``contexts`` config (``zero_shot/``);
  4. the ``finetune_methods`` rows and the unconverted model fine-tuned (``runs/``, the run engine)
     and evaluated on ``config``'s test chunks (``finetuned/``);
  5. the table ``mla_plane.{json,md,csv}`` (``report.py``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Literal

import torch

from repro.alloc.budget import BudgetLevels
from repro.alloc.calibration import attention_input_moments, calibration_batches, pair_order
from repro.alloc.latent_profile import rank_benefit_profile
from repro.alloc.mla_allocation import Split, level_split, split_for
from repro.alloc.pretrained_accounting import account_pretrained
from repro.alloc.pretrained_coverage import pretrained_coverage_profile
from repro.alloc.pretrained_profile import chunk_losses, pretrained_model_and_data
from repro.alloc.pretrained_rotations import finetune_overrides
from repro.alloc.profile import LayerProfile
from repro.experiments.kit.compute_plan import planned_runs, print_plan
from repro.experiments.kit.scale_args import settings_file
from repro.files import read_json, write_json_atomic
from repro.models.hf_folder import model_folder, read_config
from repro.models.hf_rotary import read_pair_order
from repro.models.mla_conversion import convert_to_mla, full_rank, plan_widths
from repro.models.mla_llama import head_dim_of
from repro.runs import Progress, RunSpec, train_all
from repro.runs.model_config import load_model_config
from repro.runs.pool import count_progress

from .report import write_report
from .rows import SOURCE, Row, budget_rows
from .settings import SCALES, MLAPlaneSettings, load_mla_settings, settings_path


def note(message: str) -> None:
    print(f"[mla-plane] {message}", file=sys.stderr, flush=True)


class Plane:
    """One run of the experiment: its settings, its source model's shape, its folders."""

    def __init__(self, settings: MLAPlaneSettings) -> None:
        self.settings = settings
        self.out = Path(settings.out)
        config = load_model_config(settings.config)
        if not config.is_pretrained:
            raise ValueError(f"mla-plane config {settings.config!r}: names no model.pretrained")
        self.source = str(model_folder(config.pretrained))
        self.hf = read_config(Path(self.source))
        self.n_layer = int(self.hf.num_hidden_layers)
        self.n_kv = int(self.hf.num_key_value_heads)
        self.head_dim = head_dim_of(self.hf)
        self.contexts = [settings.config, *settings.contexts]
        self.splits = {
            b: [split_for(b, n, self.n_kv, self.head_dim, full_rank(self.hf, n)) for n in pairs]
            for b, pairs in zip(settings.budgets, settings.splits)
        }

    def fine_tunes(self, row: Row) -> bool:
        """Whether the settings fine-tune this row (its kind, budget and split)."""
        return self.settings.fine_tunes(row.kind, row.budget, row.split == self.splits[row.budget][0])

    # ------------------------------------------------------------------ 1. calibration
    @property
    def calibration(self) -> str:
        return f"{self.settings.config}:{self.settings.calibration_blocks}"

    def moments(self) -> list[torch.Tensor] | None:
        kinds = {"uniform", "uniform (2-norm)", "uniform (split)", "profiled", "profiled-rotary", "profiled-rank",
                 "inverse", "random-k"}  # fmt: skip
        if self.settings.svd != "activations" or not kinds & set(self.settings.rows):
            return None
        path = self.out / "calibration" / "moments.pt"
        if not path.is_file():
            note(
                f"calibration: attention inputs on {self.settings.calibration_blocks} blocks of training text"
            )
            model, batches = calibration_batches(self.settings.config, self.settings.calibration_blocks)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(attention_input_moments(model, batches), path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
        return torch.load(path)

    def pair_order_file(self) -> Path:
        path = self.out / "calibration" / "pair_order.json"
        if not path.is_file():
            note("calibration: the q.k 2-norm order of the rotary pairs")
            model, batches = calibration_batches(self.settings.config, self.settings.calibration_blocks)
            write_json_atomic(path, {"kind": "rotary_pair_order", **pair_order(model, batches)})
        return path

    # ------------------------------------------------------------------ 2. profiles
    def coverage_profile(self, split: Split) -> LayerProfile:
        path = self.out / "profiles" / f"coverage-N{split.pairs}.json"
        if not path.is_file():
            (low, high), _ = level_split(split)
            half = self.head_dim // 2
            levels = BudgetLevels(
                high=high / half, low=low / half, budget=split.pairs / half, unit="coverage"
            )
            note(f"coverage-benefit profile: every layer {low} pairs, one at {high}")
            profile = pretrained_coverage_profile(
                self.settings.config, levels, progress=count_progress("coverage", "evaluations")
            )
            profile.save(path)
        return LayerProfile.load(path)

    def rank_profile(self, budget: float, split: Split, moments) -> LayerProfile:
        path = self.out / "profiles" / f"rank-b{budget:g}.json"
        if not path.is_file():
            _, (low, high) = level_split(split)
            row = Row(budget, "rank profile", split, self.settings.svd, "frequency",
                      (split.pairs,) * self.n_layer, (high,) * self.n_layer)  # fmt: skip
            folder = self.convert(row, moments)
            note(f"rank-benefit profile at budget {budget:g}: every layer rank {low}, one at {high}")
            profile = rank_benefit_profile(
                self.settings.config, folder, low, high, progress=count_progress("rank", "evaluations")
            )
            profile.save(path)
        return LayerProfile.load(path)

    # ------------------------------------------------------------------ 3. rows
    def convert(self, row: Row, moments) -> Path:
        folder = self.out / "models" / row.key(self.source, self.calibration)
        if (folder / "config.json").is_file():
            return folder
        order = None
        if row.order == "2-norm":
            order = read_pair_order(str(self.pair_order_file()), self.n_layer, self.n_kv, self.head_dim // 2)
        widths = plan_widths(self.hf, list(row.pairs), list(row.ranks), order)
        record = {"source": self.source, "row": row.name, "svd": row.svd, "pair_order": row.order}
        convert_to_mla(self.source, folder, widths, moments if row.svd == "activations" else None, record)
        return folder

    def zero_shot(self, key: str, location: str, context: str) -> list[list[float]]:
        """Per-chunk (loss, tokens) of a model on a context config's test chunks (cached)."""
        path = self.out / "zero_shot" / f"{key}@{Path(context).stem}.json"
        if not path.is_file():
            model, data = pretrained_model_and_data(context, pretrained=location)
            model.eval()
            chunks = chunk_losses(model, list(data.test_dataloader()))
            write_json_atomic(path, {"model": location, "context": int(data.block_size), "chunks": chunks})
        return read_json(path, "zero-shot losses")["chunks"]

    # ------------------------------------------------------------------ 4. fine-tunes
    def finetune_specs(self, folders: dict[str, str]) -> dict[tuple[str, int], RunSpec]:
        s = self.settings
        overrides = finetune_overrides(s.finetune_steps, s.finetune_lr, s.finetune_batch_size)
        out = {}
        for name, folder in folders.items():
            for seed in s.seeds:
                slug = "source" if name == SOURCE else Path(folder).name
                out[(name, seed)] = RunSpec.make(
                    f"{slug}-s{seed}", self.out / "runs", s.finetune_config, seed, s.finetune_steps,
                    s.finetune_eval_every, {**overrides, "model.pretrained": folder}, save_checkpoint=True,
                    weights_only=True, label=f"{name}, seed {seed}",
                )  # fmt: skip
        return out

    def finetuned(self, specs: dict[tuple[str, int], RunSpec]) -> dict[str, dict[str, Any]]:
        progress = Progress("mla fine-tune", len(specs), sum(s.steps for s in specs.values()), 1)
        results = train_all(list(specs.values()), "cpu", 1, None, progress)
        out: dict[str, dict[str, Any]] = {}
        for (name, _seed), spec in specs.items():
            result = results[spec.key]
            path = self.out / "finetuned" / f"{spec.name}.json"
            if (
                not path.is_file()
                or read_json(path, "fine-tuned losses").get("fingerprint") != result.fingerprint
            ):
                folder = spec.override_dict()["model.pretrained"]
                model, data = pretrained_model_and_data(self.settings.config, None, result.checkpoint, folder)
                model.eval()
                chunks = chunk_losses(model, list(data.test_dataloader()))
                write_json_atomic(path, {"fingerprint": result.fingerprint, "chunks": chunks})
            entry = out.setdefault(name, {"per_seed": [], "curves": []})
            entry["per_seed"].append(read_json(path, "fine-tuned losses")["chunks"])
            entry["curves"].append([[int(s), float(v)] for s, v in result.val_curve])
        for entry in out.values():
            seeds = entry["per_seed"]
            entry["chunks"] = [
                [sum(c[i][0] for c in seeds) / len(seeds), seeds[0][i][1]] for i in range(len(seeds[0]))
            ]
        return out


def all_rows(plane: Plane, moments) -> tuple[list[Row], dict[str, Any]]:
    """Every budget's rows, measuring the profiles they need first."""
    rows, profiles = [], {}
    needs = {"profiled", "profiled-rotary", "profiled-rank", "inverse"} & set(plane.settings.rows)
    for budget, splits in plane.splits.items():
        main = splits[0]
        coverage = rank = None
        if needs:
            coverage = plane.coverage_profile(main)
            rank = plane.rank_profile(budget, main, moments)
            profiles[f"{budget:g}"] = {"coverage": coverage.to_dict(), "rank": rank.to_dict()}
        rows += budget_rows(
            plane.settings, budget, splits, plane.n_layer,
            None if coverage is None else coverage.values, None if rank is None else rank.values,
        )  # fmt: skip
    return rows, profiles


def run(
    settings: MLAPlaneSettings, plan: bool = False, accelerator: str = "cpu", step_time=None
) -> dict | None:
    plane = Plane(settings)
    started = time.perf_counter()
    if plan:  # the fine-tunes are the cost; the conversions and evaluations are minutes
        flat = [0.0] * plane.n_layer  # the rows' names and count need no profile
        rows = [
            r
            for b, ss in plane.splits.items()
            for r in budget_rows(settings, b, ss, plane.n_layer, flat, flat)
        ]
        folders = {SOURCE: plane.source} | {
            r.name: f"{settings.out}/models/<{r.name}>" for r in rows if plane.fine_tunes(r)
        }
        runs = planned_runs(list(plane.finetune_specs(folders).values()), 1)
        print_plan("mla-plane fine-tunes", runs, settings.finetune_config, accelerator, step_time)
        return None
    moments = plane.moments()
    rows, profiles = all_rows(plane, moments)
    note(f"{len(rows)} rows at {len(settings.budgets)} budgets; converting and evaluating zero-shot")
    report = count_progress("rows", "rows converted and evaluated")
    folders: dict[str, str] = {}
    zero_shot: dict[str, dict[str, Any]] = {
        SOURCE: {Path(c).stem: plane.zero_shot("source", plane.source, c) for c in plane.contexts}
    }
    for i, row in enumerate(rows):
        folder = plane.convert(row, moments)
        folders[row.name] = str(folder)
        zero_shot[row.name] = {
            Path(c).stem: plane.zero_shot(folder.name, str(folder), c) for c in plane.contexts
        }
        report(i + 1, len(rows))
    tuned_names = [r.name for r in rows if plane.fine_tunes(r)]
    specs = plane.finetune_specs({SOURCE: plane.source} | {n: folders[n] for n in tuned_names})
    finetuned = plane.finetuned(specs) if specs else {}
    accounts = {
        name: {Path(c).stem: account_pretrained(loc, load_model_config(c).block_size) for c in plane.contexts}
        for name, loc in ({SOURCE: plane.source} | folders).items()
    }
    return write_report(plane, rows, zero_shot, finetuned, accounts, profiles, time.perf_counter() - started)


def mla_plane(
    scale: Literal[SCALES] | None = None,
    settings: Path | None = None,
    plan: bool = False,
    accelerator: str = "cpu",
    step_time: float | None = None,
    out: Path | None = None,
) -> int:
    """A pretrained model converted to MLA at KV budgets: profiled widths against MHA2MLA's uniform.

    Args:
        scale: which shipped settings: paper_configs/experiments/mla_plane/<scale>.yaml (default real)
        settings: a settings YAML instead of a shipped scale (not with --scale)
        plan: print the fine-tunes' runs, tokens and GPU-hours and exit
        accelerator: --plan: the device a step is measured on (cpu, gpu)
        step_time: --plan: one GPU's seconds per fine-tune step
        out: the results folder (default: the settings')
    """
    path = settings_file(scale, settings, settings_path, default="real")
    try:
        run(load_mla_settings(path, out=None if out is None else str(out)), plan, accelerator, step_time)
    except KeyboardInterrupt:
        print(
            f"repro mla-plane: interrupted; run the same command again to resume from {path}", file=sys.stderr
        )
        return 130
    return 0
