"""GGUF files in (repro gguf; model.pretrained naming a .gguf): a tiny Llama written as GGUF by the
gguf package's writer, tied and untied, is read by the suite with that Llama's own logits and its
tokenizer, and round-trips through the Hugging Face folder; bad input is one line."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("gguf")
from gguf_files import write_llama_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from repro.data.tokenizer import FileTokenizer
from repro.lit.gguf_command import main as repro_gguf
from repro.models import gguf_folder
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
        path = write_llama_gguf(model, root / "tokenizer.json", root / f"tiny-{tied}.gguf", tokenizer.eos_id)
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
    assert repro_gguf([str(path), "--out", str(tmp_path / "hf")]) == 0
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
        assert repro_gguf(list(argv)) == 2
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
