"""``repro convert-mla`` on tiny random Llamas the test saves (GQA untied, MHA tied): nothing cut gives
the source's logits; N pairs at full rank give the source with only those pairs rotating
(``model.rotary``); a cut rank changes the logits and caches exactly what ``repro account`` reports;
the converted folder decodes with its cache as it runs whole, trains and exports through the suite;
the DeepseekV3 form loads with transformers' own MLA code and gives the same logits; bad inputs are
one line. Then the real-model RoPE tools on the same kind of model: the pair order, the coverage
profile, budgeted allocations."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from repro.models.hf_causal_lm import HFCausalLM

VOCAB = 320
SOURCES = {
    "gqa-untied": lambda: LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=False,
    ),
    "mha-tied": lambda: LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True,
    ),
    "qwen2-bias": lambda: Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
    ),
}  # fmt: skip
TOLERANCE = 2e-5  # float32 logits of a re-factorized attention


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mla-sources")
    out = {}
    for name, make in SOURCES.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(make())
        for p in model.parameters():  # biases and norms away from their init, so they are tested
            p.data.add_(0.05 * torch.randn_like(p))
        model.save_pretrained(str(root / name))
        (root / name / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
        out[name] = root / name
    return out


def logits(location, ids, rotary=None) -> torch.Tensor:
    model = HFCausalLM(str(location))
    model.materialize()
    model.eval()
    if rotary is not None:
        model.set_rotary(rotary)
    with torch.no_grad():
        return model(ids)[0]


def repro(*argv: str) -> None:
    from repro.cli import main as repro_main

    with pytest.raises(SystemExit) as done:
        repro_main(list(argv))
    assert done.value.code == 0


IDS = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", list(SOURCES))
def test_nothing_cut_is_the_source_and_n_pairs_at_full_rank_is_model_rotary(name, sources, tmp_path):
    src = sources[name]
    want = logits(src, IDS)
    repro("convert-mla", "--pretrained", str(src), "--rotary_pairs", "all", "--latent_rank", "full",
          "--out", str(tmp_path / "all"))  # fmt: skip
    assert (logits(tmp_path / "all", IDS) - want).abs().max() < TOLERANCE
    half = 8
    repro("convert-mla", "--pretrained", str(src), "--rotary_pairs", "3", "--latent_rank", "full",
          "--out", str(tmp_path / "three"))  # fmt: skip
    n_layer = AutoModelForCausalLM.from_pretrained(str(src)).config.num_hidden_layers
    rotary = dict.fromkeys(range(n_layer), 3 / half)
    partial = logits(src, IDS, rotary)
    assert (partial - want).abs().max() > 1e-3  # dropping pairs matters on this model...
    assert (
        logits(tmp_path / "three", IDS) - partial
    ).abs().max() < TOLERANCE  # ...and the conversion is exactly that
    assert (tmp_path / "three" / "tokenizer_config.json").is_file()  # every tokenizer file travels


def test_a_cut_rank_changes_the_logits_and_caches_what_account_reports(sources, tmp_path, capsys):
    src = sources["gqa-untied"]
    (tmp_path / "pairs.json").write_text(json.dumps([2, 0, 4]))  # per layer, as repro allocate's files
    (tmp_path / "ranks.json").write_text(json.dumps({"latent_ranks": [10, "full", 24]}))
    repro("convert-mla", "--pretrained", str(src), "--rotary_pairs", str(tmp_path / "pairs.json"),
          "--latent_rank", str(tmp_path / "ranks.json"), "--out", str(tmp_path / "cut"))  # fmt: skip
    cut = logits(tmp_path / "cut", IDS)
    assert (cut - logits(src, IDS)).abs().max() > 1e-3
    capsys.readouterr()
    repro(
        "account",
        "--pretrained",
        str(tmp_path / "cut"),
        "--context",
        "48",
        "--out",
        str(tmp_path / "acc.json"),
    )
    account = json.loads((tmp_path / "acc.json").read_text())["rows"][0]
    # layer 1: no pairs, full rank = min(64, 2 * 2 * 16) = 64; layers 0 and 2: R + n_kv * 2 N
    assert account["per_layer"]["kv_cache_elements"] == [10 + 2 * 4, 64, 24 + 2 * 8]
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "cut")).eval()
    with torch.no_grad():
        whole = model(IDS, use_cache=True)
        cached = [layer.keys[0, :, 0].numel() + layer.values[0, :, 0].numel() for layer in whole.cache.layers]
        assert cached == account["per_layer"]["kv_cache_elements"]  # what the attention actually stores
        assert (whole.logits - cut).abs().max() < TOLERANCE  # transformers' loader: the suite's logits
        # decoding token by token from the cache gives the whole sequence's logits
        step = model(IDS[:, :40], use_cache=True)
        cache, last = step.cache, []
        for t in range(40, 48):
            out = model(IDS[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            last.append(out.logits[:, -1])
    assert (torch.stack(last, dim=1) - cut[:, 40:]).abs().max() < TOLERANCE


@pytest.mark.parametrize("name", ["gqa-untied", "mha-tied"])
def test_the_deepseek_v3_form_loads_with_transformers_and_gives_the_same_logits(name, sources, tmp_path):
    src = sources[name]
    repro("convert-mla", "--pretrained", str(src), "--rotary_pairs", "3", "--latent_rank", "40",
          "--out", str(tmp_path / "mla"), "--deepseek", str(tmp_path / "ds"))  # fmt: skip
    ours = logits(tmp_path / "mla", IDS)
    deepseek = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ds")).eval()
    assert type(deepseek).__name__ == "DeepseekV3ForCausalLM"
    with torch.no_grad():
        assert (deepseek(IDS).logits - ours).abs().max() < TOLERANCE
    assert (logits(tmp_path / "ds", IDS) - ours).abs().max() < TOLERANCE  # the suite loads it too


def test_bad_conversions_fail_in_one_line_and_write_nothing(sources, tmp_path, capsys):
    from repro.cli import main as repro_main

    src = str(sources["gqa-untied"])
    (tmp_path / "short.json").write_text("[1, 2]")
    short = str(tmp_path / "short.json")
    cases = [
        (["--rotary_pairs", "2", "--latent_rank", "61"],
         "layer 0 has 61; with 2 rotary pairs the layer's rank is at most 56"),
        (["--rotary_pairs", "9", "--latent_rank", "full"], "layer 0 has 9; allowed 0..8 pairs"),
        (["--rotary_pairs", short, "--latent_rank", "8"], "2 entries, but the model has 3 layers"),
        (["--rotary_pairs", "2", "--latent_rank", "8", "--svd", "activations"], "give --calibration"),
        (["--rotary_pairs", short + ":profiled", "--latent_rank", "8"], "names an allocation of a repro allocate"),
    ]  # fmt: skip
    for options, message in cases:
        with pytest.raises(SystemExit) as done:
            repro_main(["convert-mla", "--pretrained", src, *options, "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert done.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "ranks.json").write_text("[8, 8, 16]")
    with pytest.raises(SystemExit):
        repro_main(["convert-mla", "--pretrained", src, "--rotary_pairs", "2", "--latent_rank",
                    str(tmp_path / "ranks.json"), "--deepseek", str(tmp_path / "ds"),
                    "--out", str(tmp_path / "x")])  # fmt: skip
    assert "DeepseekV3 has one latent rank" in capsys.readouterr().err
    gpt2 = tmp_path / "gpt2"
    from transformers import GPT2Config

    AutoModelForCausalLM.from_config(
        GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4)
    ).save_pretrained(str(gpt2))
    with pytest.raises(SystemExit):
        repro_main(["convert-mla", "--pretrained", str(gpt2), "--rotary_pairs", "2", "--latent_rank", "8",
                    "--out", str(tmp_path / "x")])  # fmt: skip
    assert "model_type 'gpt2' cannot be converted (it has no rotary embedding" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.*"))  # nothing written, not even half


def test_the_pair_order_path_equals_the_frequency_path_for_the_frequency_order(sources):
    """Un-rotating the pairs an order leaves out (hooks, per key/value head) is the same forward as
    cutting cos/sin to the highest frequencies when the order is the frequency order; another order
    gives other logits, and the model is as trained once the rotation is reset."""
    model = HFCausalLM(str(sources["gqa-untied"]))
    model.materialize()
    model.eval()
    rotary = {0: 0.25, 1: 0.5, 2: 0.0}
    frequency = [[list(range(8))] * 2] * 3
    reverse = [[list(range(7, -1, -1))] * 2] * 3
    with torch.no_grad():
        base = model(IDS)[0]
        model.set_rotary(rotary)
        by_cos = model(IDS)[0]
        model.set_rotary(rotary, frequency)
        by_hooks = model(IDS)[0]
        model.set_rotary(rotary, reverse)
        other = model(IDS)[0]
        model.set_rotary(None)
        again = model(IDS)[0]
    assert (by_hooks - by_cos).abs().max() < TOLERANCE
    assert (other - by_cos).abs().max() > 1e-3
    assert torch.equal(again, base)


@pytest.fixture(scope="module")
def hf_config(sources, corpus, tmp_path_factory):
    """A repro fit YAML on the GQA source, with a tokenizer of the test corpus beside its weights."""
    import yaml

    from repro.data.tokenizer import FileTokenizer

    root = tmp_path_factory.mktemp("mla-config")
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    FileTokenizer.train_bpe(texts, 300).save(sources["gqa-untied"] / "tokenizer.json")
    config = {
        "model": {"pretrained": str(sources["gqa-untied"]), "optim": {"lr": 0.01, "warmup_steps": 1}},
        "data": {
            "corpus": "text_files", "text_files": [str(corpus / "*.txt")], "block_size": 16, "batch_size": 4,
            "max_val_blocks": 12, "val_fraction": 0.2, "cache_dir": str(root / "cache"),
        },
        "trainer": {"accelerator": "cpu", "logger": False, "enable_progress_bar": False},
    }  # fmt: skip
    (root / "hf.yaml").write_text(yaml.safe_dump(config))
    return root / "hf.yaml"


def test_the_rope_tools_on_a_pretrained_model_pair_order_coverage_profile_and_allocations(
    hf_config, tmp_path
):
    """The pair order ranks each head's pairs by their q.k norms; the coverage-benefit profile is the
    base loss minus each upgrade's, measured again here by hand; repro allocate reads it and repro
    profile allocations tests its allocations paired against uniform, zero-shot and fine-tuned (each
    run trained with its rotation and pair order)."""
    from repro.alloc.pretrained_profile import chunk_losses, pretrained_model_and_data, token_mean
    from repro.alloc.profile import LayerProfile

    cfg = str(hf_config)
    repro("profile", "pair-order", "--config", cfg, "--blocks", "4", "--out", str(tmp_path / "order.json"))
    order = json.loads((tmp_path / "order.json").read_text())
    assert [len(layer) for layer in order["order"]] == [2, 2, 2]
    for layer, scores in zip(order["order"], order["scores"]):
        for pairs, s in zip(layer, scores):
            assert sorted(pairs) == list(range(8)) and s[pairs[0]] == max(s) and s[pairs[-1]] == min(s)

    repro(
        "profile",
        "coverage",
        "--config",
        cfg,
        "--high",
        "1.0",
        "--low",
        "0.25",
        "--out",
        str(tmp_path / "c.json"),
    )
    profile = LayerProfile.load(tmp_path / "c.json")
    assert profile.kind == "coverage_benefit" and profile.meta["finetune"] is None
    model, data = pretrained_model_and_data(cfg)
    batches = list(data.val_dataloader())
    model.eval()

    def loss(rotation):
        model.set_rotary(rotation)
        return token_mean(chunk_losses(model, batches))

    base = loss(dict.fromkeys(range(3), 0.25))
    for layer in range(3):
        upgraded = loss({**dict.fromkeys(range(3), 0.25), layer: 1.0})
        assert profile.values[layer] == pytest.approx(base - upgraded, abs=1e-6)
        low, high = profile.meta["ci95"][layer]
        assert low <= profile.values[layer] <= high or low == high

    repro("allocate", "--config", cfg, "--benefit", str(tmp_path / "c.json"), "--high", "1.0", "--low", "0.25",
          "--budget", "0.5", "--draws", "1", "--out", str(tmp_path / "alloc.json"))  # fmt: skip
    repro("profile", "allocations", "--config", cfg, "--allocation", str(tmp_path / "alloc.json"),
          "--out", str(tmp_path / "zs.json"))  # fmt: skip
    result = json.loads((tmp_path / "zs.json").read_text())
    rows = {r["method"]: r for r in result["rows"]}
    best = max(range(3), key=profile.values.__getitem__)
    assert rows["profiled"]["high_layers"] == [best] and rows["profiled"]["pairs_per_layer"][best] == 8
    assert rows["uniform"]["pairs_per_layer"] == [4, 4, 4] and rows["uniform"]["delta_vs_reference"] is None
    assert rows["all-high"]["increase_over_full_rope"] == pytest.approx(
        0.0, abs=1e-6
    )  # every pair: the model
    assert rows["profiled"]["delta_vs_reference"] == pytest.approx(
        rows["profiled"]["loss"] - rows["uniform"]["loss"], abs=1e-6
    )
    assert (tmp_path / "zs.md").read_text().count("\n| 0.5 |") == len(rows)
    # the same allocations at several contexts on the same text (loss against context length)
    repro("profile", "allocations", "--config", cfg, "--allocation", str(tmp_path / "alloc.json"),
          "--contexts", "8", "32", "--out", str(tmp_path / "ctx.json"))  # fmt: skip
    by_context = json.loads((tmp_path / "ctx.json").read_text())["by_context"]
    assert [c["context"] for c in by_context] == [8, 32] and by_context[0]["chunks"] == by_context[1][
        "chunks"
    ]
    for c in by_context:
        high = next(r for r in c["rows"] if r["method"] == "all-high")
        assert high["vs_full_rope"]["delta"] == pytest.approx(0.0, abs=1e-6)

    repro("allocate", "--config", cfg, "--benefit", str(tmp_path / "c.json"), "--high", "1.0", "--low", "0.25",
          "--budget", "0.5", "--method", "profiled", "uniform", "--out", str(tmp_path / "two.json"))  # fmt: skip
    repro("profile", "allocations", "--config", cfg, "--allocation", str(tmp_path / "two.json"),
          "--finetune_steps", "2", "--pair_order", str(tmp_path / "order.json"),
          "--out", str(tmp_path / "ft.json"))  # fmt: skip
    tuned = json.loads((tmp_path / "ft.json").read_text())
    runs = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "ft").glob("*.json")}
    assert sorted(runs) == ["B0.5-profiled-s0", "B0.5-uniform-s0", "full-RoPE-s0"]
    assert runs["B0.5-uniform-s0"]["overrides"]["model.rotary"] == [0.5] * 3
    assert runs["B0.5-uniform-s0"]["overrides"]["model.rotary_order"] == str(tmp_path / "order.json")
    assert "model.rotary" not in runs["full-RoPE-s0"]["overrides"] and all(
        r["global_step"] == 2 for r in runs.values()
    )
    assert tuned["finetune"]["steps"] == 2 and len(tuned["rows"]) == 2
    assert all(len(r["curves"][0]) >= 1 for r in tuned["rows"])  # the loss against fine-tuning steps


def test_repro_mla_plane_allocates_each_budget_per_layer_and_resumes(hf_config, tmp_path, capsys):
    """Two budgets of the GQA source: every row of a budget caches the same elements (the per-layer
    allocations keep the main split's means), the profiled row gives its high levels to the profiles'
    top layers, the table's differences are the paired losses, the fine-tuned rows (finetune_methods,
    and every row at finetune_every_row) train from their converted folders; a second run trains and
    converts nothing again."""
    import yaml

    long = tmp_path / "hf32.yaml"
    doc = yaml.safe_load(hf_config.read_text())
    doc["data"].update(block_size=32, batch_size=2, max_val_blocks=6)
    long.write_text(yaml.safe_dump(doc))
    settings = {
        "scale": "real", "config": str(hf_config), "finetune_config": str(hf_config), "contexts": [str(long)],
        "budgets": [0.5, 0.25], "splits": [[4, 2], [2]], "calibration_blocks": 4,
        "rows": ["uniform (weights)", "uniform", "uniform (2-norm)", "uniform (split)", "profiled", "inverse"],
        "finetune_methods": ["uniform"], "finetune_every_row": [0.25],
        "finetune_steps": 2, "finetune_eval_every": 1, "finetune_batch_size": 2,
        "out": str(tmp_path / "plane"),
    }  # fmt: skip
    (tmp_path / "plane.yaml").write_text(yaml.safe_dump(settings))
    repro("mla-plane", "--settings", str(tmp_path / "plane.yaml"))
    table = json.loads((tmp_path / "plane" / "mla_plane.json").read_text())
    rows = {r["name"]: r for r in table["rows"]}
    source = rows["source (unconverted)"]
    assert source["kv_elements_per_token"] == 3 * 2 * 2 * 16 and source["budget"] == 1.0
    for budget in (0.5, 0.25):
        these = [r for r in table["rows"] if r["budget"] == budget]
        assert {r["kv_elements_per_token"] for r in these} == {budget * source["kv_elements_per_token"]}
        kinds = {"uniform (weights)", "uniform", "uniform (2-norm)", "profiled", "inverse"}
        assert {r["method"] for r in these} == kinds | ({"uniform (split)"} if budget == 0.5 else set())
        tuned = {r["method"] for r in these if r.get("finetuned_loss")}
        assert tuned == ({"uniform"} if budget == 0.5 else kinds)  # every row where finetune_every_row says
    profiled = rows["B0.5 profiled N4 R16"]
    coverage = table["profiles"]["0.5"]["coverage"]["values"]
    rank = table["profiles"]["0.5"]["rank"]["values"]
    top = max(range(3), key=coverage.__getitem__)
    assert profiled["pairs_per_layer"] == [8 if i == top else 2 for i in range(3)]
    assert profiled["ranks_per_layer"] == [
        32 if i == max(range(3), key=rank.__getitem__) else 8 for i in range(3)
    ]
    uniform = rows["B0.5 uniform N4 R16"]
    versus = profiled["zero_shot_vs_uniform@hf"]
    assert versus["delta"] == pytest.approx(
        profiled["zero_shot_loss@hf"] - uniform["zero_shot_loss@hf"], abs=1e-6
    )
    assert (
        uniform["attention_flops_per_token@hf32"] == 2 * uniform["attention_flops_per_token@hf"]
    )  # linear in T
    assert (
        uniform["finetuned_loss"]
        and uniform["finetuned_vs_source"]["ci95"][0] <= uniform["finetuned_vs_source"]["mean_chunk_delta"]
    )
    assert [step for step, _ in uniform["finetune_curves"][0]] == [1, 2]  # the loss against fine-tuning steps
    run = json.loads(next((tmp_path / "plane" / "runs").glob("uniform-N4-*-s0.json")).read_text())
    assert run["overrides"]["model.pretrained"].startswith(str(tmp_path / "plane" / "models"))
    assert any(r["pareto_zero_shot"] for r in table["rows"])
    assert not any(
        r["pareto_zero_shot"] and r["zero_shot_broken@hf"] for r in table["rows"][1:]
    )  # not ranked
    # make figures draws the plane (bytes, loss, FLOPs, the front; the recovery curves) from this table
    import shutil

    from conftest import figure_script

    (tmp_path / "results" / "mla_plane").mkdir(parents=True)
    shutil.copy(tmp_path / "plane" / "mla_plane.json", tmp_path / "results" / "mla_plane" / "mla_plane.json")
    drawn = figure_script("mla_plane").main(tmp_path / "results", tmp_path / "fig")
    assert [p.name for p in drawn] == ["mla_plane.png", "mla_plane.pdf"]
    stamp = {
        p: p.stat().st_mtime for p in (tmp_path / "plane").rglob("*") if p.suffix in (".ckpt", ".safetensors")
    }
    capsys.readouterr()
    repro("mla-plane", "--settings", str(tmp_path / "plane.yaml"))
    assert "rows converted" in capsys.readouterr().err
    assert stamp == {p: p.stat().st_mtime for p in stamp}  # nothing converted or trained again
    trained = len(list((tmp_path / "plane" / "runs").glob("*-s0.json")))  # the source and the tuned rows
    repro("mla-plane", "--settings", str(tmp_path / "plane.yaml"), "--plan", "--step_time", "0.1")
    assert f"mla-plane fine-tunes: {trained} runs" in capsys.readouterr().out  # --plan counts what runs


def test_a_cache_budget_no_split_can_meet_names_what_can():
    from repro.alloc.mla_allocation import Split, high_count, mla_allocation, split_for

    assert split_for(0.25, 4, 3, 64, 360) == Split(4, 72)  # SmolLM2: 96 of 384 elements, 24 of them rotary
    with pytest.raises(ValueError, match=r"115.2 elements per layer, not a whole number"):
        split_for(0.3, 4, 3, 64, 360)
    with pytest.raises(
        ValueError, match=r"leaves a latent rank of 0, outside 1..360; pairs this budget allows: 0..7"
    ):
        split_for(0.125, 8, 3, 64, 360)
    # per-layer levels keep the split's means: k = L/3 layers at twice, the rest at half
    profile = [0.1 * i for i in range(30)]
    pairs, ranks = mla_allocation("profiled", 30, Split(4, 72), profile, profile[::-1])
    assert high_count(30) == 10 and sum(pairs) == 30 * 4 and sum(ranks) == 30 * 72
    assert pairs[20:] == [8] * 10 and ranks[:10] == [144] * 10


def test_which_rows_are_fine_tuned_and_a_stray_budget_is_one_line(hf_config):
    """``finetune_methods`` at ``finetune_budgets`` (main split only), and every row and split at
    ``finetune_every_row``; a budget there that the plane has not is refused, naming the field."""
    from repro.experiments.mla_plane.settings import MLAPlaneSettings

    common = dict(scale="real", config=str(hf_config), finetune_config=str(hf_config))
    s = MLAPlaneSettings(
        **common, budgets=(0.5, 0.25), splits=((4, 2), (2,)), finetune_methods=("uniform",),
        finetune_budgets=(0.25,), finetune_every_row=(0.5,),
    )  # fmt: skip
    assert s.fine_tunes("inverse", 0.5, True) and s.fine_tunes("uniform (split)", 0.5, False)
    assert s.fine_tunes("uniform", 0.25, True) and not s.fine_tunes("inverse", 0.25, True)
    assert not s.fine_tunes("uniform", 0.25, False)  # another split: only where every row is
    with pytest.raises(ValueError, match=r"^finetune_every_row \[0.125\]: not among budgets \[0.5\]$"):
        MLAPlaneSettings(**common, budgets=(0.5,), splits=((4,),), finetune_every_row=(0.125,))
