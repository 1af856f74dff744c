"""Tiny GGUF files for the tests, written with the gguf package's own writer the way llama.cpp's
convert_hf_to_gguf.py writes a Llama (its tensor names, its q/k row order, a byte-level BPE)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (rotary pairs interleaved), the inverse of what readers undo."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model, tokenizer_json: Path, path: Path, eos_id: int) -> Path:
    import gguf

    c = model.config
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    tok = json.loads(Path(tokenizer_json).read_text())
    vocab = tok["model"]["vocab"] | {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    tokens = sorted(vocab, key=vocab.get)
    assert len(tokens) == c.vocab_size and [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(
        [gguf.TokenType.CONTROL if i == eos_id else gguf.TokenType.NORMAL for i in range(len(tokens))]
    )
    w.add_token_merges(merges)
    w.add_bos_token_id(eos_id)
    w.add_eos_token_id(eos_id)

    names = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    w.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        for hf, g in names.items():
            t = state[f"model.layers.{i}.{hf}.weight"]
            if g == "attn_q":
                t = permute(t, c.num_attention_heads)
            elif g == "attn_k":
                t = permute(t, c.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{g}.weight", np.ascontiguousarray(t))
    w.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not c.tie_word_embeddings:
        w.add_tensor("output.weight", state["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
