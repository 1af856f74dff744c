"""GGUF files in and out: a tiny Llama written as GGUF by the suite's writer (``gguf_export``, through
the gguf package, as llama.cpp's converter lays a Llama out), tied and untied, is read by the suite
(repro gguf; model.pretrained naming a .gguf) with that Llama's own logits and its tokenizer, and
round-trips through the Hugging Face folder; a fine-tune's checkpoint goes out as GGUF (repro export
--gguf: f32 equal, f16 and q8_0 within their rounding, the chat template kept); bad input is one
line."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("gguf")
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from repro.cli import run as repro
from repro.data.tokenizer import FileTokenizer
from repro.models import gguf_folder
from repro.models.gguf_export import write_gguf
from repro.models.hf_causal_lm import HFCausalLM, HFModelError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, corpus):
    """A byte-level BPE of the test corpus and a tiny GQA Llama of its vocabulary, tied and untied,
    each written as GGUF (fp32)."""
    root = tmp_path_factory.mktemp("gguf")
    tokenizer = FileTokenizer.train_bpe([p.read_text() for p in sorted(corpus.glob("*.txt"))], 300)
    tokenizer.save(root / "tokenizer.json")
    out = {}
    for tied in (True, False):
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied,
        )  # fmt: skip
        model = LlamaForCausalLM(config).eval()
        model.save_pretrained(str(root / f"hf-{tied}"))
        tokenizer.save(root / f"hf-{tied}" / "tokenizer.json")
        path = write_gguf(root / f"hf-{tied}", root / f"tiny-{tied}.gguf")
        out[tied] = (model, path)
    return tokenizer, out


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_gguf_file_is_read_with_the_models_own_logits_and_round_trips(
    tied, tiny, tmp_path, monkeypatch, capsys
):
    tokenizer, files = tiny
    model, path = files[tied]
    ids = torch.randint(0, tokenizer.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits

    # repro gguf: an ordinary folder, read by from_pretrained with the same logits and tokenizer
    assert repro(["gguf", str(path), "--out", str(tmp_path / "hf")]) == 0
    folder = tmp_path / "hf"
    loaded = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    assert loaded.config.tie_word_embeddings is tied
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)
    text = "the king and the queen of the castle"
    assert (
        AutoTokenizer.from_pretrained(str(folder)).encode(text, add_special_tokens=False)
        == (tokenizer.encode_batch([text])[0])
    )
    source = json.loads((folder / gguf_folder.SOURCE_FILE).read_text())
    assert source["tensor_types"] == {"F32": 20 if tied else 21} and source["quantized"] == []

    # model.pretrained naming the .gguf: written once under .cache/repro/gguf, read by the suite's model
    monkeypatch.chdir(tmp_path)
    ours = HFCausalLM(str(path))
    ours.materialize()
    ours.eval()
    with torch.no_grad():
        logits, _ = ours(ids)
    assert torch.allclose(logits, expected, atol=1e-6)
    assert HFCausalLM(str(path)).folder == ours.folder  # the second time reads the cached folder
    assert "[gguf] writing" in capsys.readouterr().out

    # and the suite's export of it is again an ordinary folder with those logits
    out = ours.save_pretrained(tmp_path / "exported")
    with torch.no_grad():
        assert torch.allclose(
            AutoModelForCausalLM.from_pretrained(str(out)).eval()(ids).logits, expected, atol=1e-6
        )


def test_gguf_bad_input_is_one_line(tmp_path, capsys, monkeypatch, tiny):
    def error(*argv: str) -> str:
        assert repro(["gguf", *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf file")
    assert "not a GGUF file" in error(str(junk), "--out", str(tmp_path / "o"))
    assert "no such file, folder or installed package holding a .gguf" in error(
        "no-such-package", "--out", str(tmp_path / "o")
    )
    with pytest.raises(HFModelError, match="not a GGUF file"):
        HFCausalLM(str(junk))
    real = tiny[1][True][1]
    real_find_spec = gguf_folder.importlib.util.find_spec
    monkeypatch.setattr(
        gguf_folder.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a),
    )
    assert "pip install 'repro[gguf]'" in error(str(real), "--out", str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind, tolerance", [("f32", 0.0), ("f16", 2e-3), ("q8_0", 3e-2)])
def test_a_fine_tune_goes_out_as_gguf_and_reads_back_with_its_logits(kind, tolerance, tiny, tmp_path, capsys):
    """repro export --ckpt --gguf of a fine-tune's weights (changed from the source's), read back by repro
    gguf: the same logits in f32 (the same floats), within the rounding of f16 and q8_0; the tokenizer's
    ids and the chat template of the source folder travel; an architecture llama.cpp's Llama is not
    fails in one line before anything is written."""
    from gguf import GGUFReader

    from repro.lit.checkpoints import HF_PREFIX

    tokenizer, files = tiny
    source = files[False][1].parent / "hf-False"
    (source / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ messages }}", "eos_token": "<|endoftext|>"})
    )
    model = LlamaForCausalLM.from_pretrained(str(source)).eval()
    with torch.no_grad():
        for p in model.parameters():  # the fine-tune: other weights than the source's
            p.add_(0.01 * torch.randn_like(p))
    ckpt = tmp_path / "tuned.ckpt"
    torch.save({"hyper_parameters": {"pretrained": str(source)},
                "state_dict": {HF_PREFIX + k: v for k, v in model.state_dict().items()}}, ckpt)  # fmt: skip
    out = tmp_path / f"tuned-{kind}.gguf"
    assert repro(["export", "--ckpt", str(ckpt), "--gguf", str(out), "--gguf_type", kind]) == 0
    fields = GGUFReader(str(out)).fields
    assert fields["tokenizer.chat_template"].contents() == "{{ messages }}"
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    assert repro(["gguf", str(out), "--out", str(tmp_path / "back")]) == 0
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    ids = torch.randint(0, tokenizer.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, got = model(ids).logits, back(ids).logits
    worst = float((got - want).abs().max() / want.abs().max())
    assert torch.equal(got, want) if kind == "f32" else worst < tolerance, (kind, worst)
    text = "the king and the queen of the castle"
    assert (
        AutoTokenizer.from_pretrained(str(tmp_path / "back")).encode(text, add_special_tokens=False)
        == (tokenizer.encode_batch([text])[0])
    )
    if kind == "f32":  # not a llama.cpp Llama: refused before anything is written
        qwen = tmp_path / "qwen"
        from transformers import Qwen2Config

        AutoModelForCausalLM.from_config(Qwen2Config(vocab_size=320, hidden_size=32, intermediate_size=64,
            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)).save_pretrained(str(qwen))  # fmt: skip
        torch.save({"hyper_parameters": {"pretrained": str(qwen)}, "state_dict": {HF_PREFIX + "x": torch.zeros(1)}},
                   tmp_path / "q.ckpt")  # fmt: skip
        capsys.readouterr()
        assert repro(["export", "--ckpt", str(tmp_path / "q.ckpt"), "--gguf", str(tmp_path / "q.gguf")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "model_type 'qwen2' is not exported" in err[0], err
        assert not (tmp_path / "q.gguf").exists()


def test_compare_runs_llama_cpp_or_says_how_to_get_it(tiny, tmp_path, capsys, monkeypatch):
    """repro gguf FILE --compare DIR: llama.cpp's logits of a file written from a folder against
    transformers' of that folder (where llama-cpp-python is installed: equal to float precision in f32);
    without it, one line naming the package."""
    import importlib.util

    _, files = tiny
    path = files[False][1]
    folder = path.parent / "hf-False"
    if importlib.util.find_spec("llama_cpp") is not None:
        assert repro(["gguf", str(path), "--compare", str(folder), "--text", "the king and the queen"]) == 0
        line = capsys.readouterr().out.strip().splitlines()[-1]
        diff = float(line.split("max |logit difference| ")[1].split()[0])
        assert diff < 1e-3 and "top-1 agreement 1.000" in line, line
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a)
    )
    assert repro(["gguf", str(path), "--compare", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install llama-cpp-python" in err[0], err
