"""A Llama-family Hugging Face folder (a fine-tune written by ``repro export``) as a GGUF file that
llama.cpp (and Ollama) runs: llama.cpp's tensor names and order, its interleaved q/k row layout, its
metadata keys, and the tokenizer with its pre-tokenizer type and chat template, as llama.cpp's own
``convert_hf_to_gguf.py`` writes a Llama. The inverse of ``gguf_folder`` (``repro gguf``), which reads
such a file back with the same weights.

The tokenizer: when the folder came from a GGUF file (``gguf_source.json``), every ``tokenizer.*``
field of that file is copied as it was (what llama.cpp read before, read again). Otherwise it is
written from ``tokenizer.json`` (a byte-level BPE: tokens by id, their types, the merges, the special
ids from the config files, the chat template) with the pre-tokenizer type named by ``pre`` or, for
GPT-2's own pre-tokenizer, found from it; any other needs ``pre`` (llama.cpp's name for it).

Types: ``f32`` (every tensor as stored), ``f16`` (matrices in half precision, norms in f32, as
llama.cpp's converter writes ``--outtype f16``), ``q8_0`` (matrices quantized by the gguf package).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .hf_folder import HFModelError, TensorFiles, model_folder, read_config

EXPORTABLE = ("llama", "mistral")  # llama.cpp's LLAMA architecture, no biases
TYPES = ("f32", "f16", "q8_0")
LAYER_TENSORS = {  # Hugging Face name in a layer -> llama.cpp's
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k rows: each head's rotary pairs interleaved (i, i + d/2 -> 2i, 2i + 1), the order
    its rotation reads; readers undo it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_exportable(config, gguf_type: str) -> None:
    if config.model_type not in EXPORTABLE:
        raise HFModelError(
            f"--gguf: model_type {config.model_type!r} is not exported (llama.cpp's Llama architecture: "
            f"{', '.join(EXPORTABLE)})"
        )
    if gguf_type not in TYPES:
        raise HFModelError(f"--gguf_type={gguf_type!r}: allowed {', '.join(TYPES)}")
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default":
        raise HFModelError(f"--gguf: rope_type {rope!r} is not exported (default rotary embedding only)")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise HFModelError("--gguf: a model with attention or MLP biases is not a llama.cpp Llama")
    if getattr(config, "sliding_window", None):
        raise HFModelError(f"--gguf: sliding_window={config.sliding_window} is not exported")


def _tensor(array: np.ndarray, gguf_type: str, name: str):
    """The array as the file stores it: norms (1-D) in f32 always, matrices in the chosen type."""
    import gguf

    array = np.ascontiguousarray(array.astype(np.float32))
    if array.ndim == 1 or gguf_type == "f32":
        return array, None
    if gguf_type == "f16":
        return array.astype(np.float16), None
    try:
        return gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    except gguf.quants.QuantError as exc:  # a width that is not a multiple of the block
        raise HFModelError(f"--gguf_type q8_0: tensor {name} of shape {array.shape}: {exc}") from None


def _copy_tokenizer_from(source_gguf: Path, writer) -> None:
    """Every ``tokenizer.*`` field of the GGUF file the folder came from, as it was."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(source_gguf))
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        value = field.contents()
        if kind == GGUFValueType.ARRAY:
            writer.add_array(key, value)
        elif kind == GGUFValueType.STRING:
            writer.add_string(key, value)
        elif kind == GGUFValueType.BOOL:
            writer.add_bool(key, bool(value))
        elif kind == GGUFValueType.UINT32:
            writer.add_uint32(key, int(value))
        elif kind == GGUFValueType.INT32:
            writer.add_int32(key, int(value))
        elif kind == GGUFValueType.FLOAT32:
            writer.add_float32(key, float(value))
        else:
            raise HFModelError(
                f"--gguf: the source file's {key} has a type ({kind.name}) this writer does not copy"
            )


def _gpt2_pre_tokenizer(tok: dict) -> bool:
    """Is the pre-tokenizer GPT-2's own (one ByteLevel with its regex)?"""
    pre = tok.get("pre_tokenizer") or {}
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True)


def _write_tokenizer(folder: Path, config, writer, pre: str | None) -> None:
    """A byte-level BPE tokenizer.json (with its config files) as llama.cpp's tokenizer fields."""
    import gguf

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise HFModelError(f"--gguf: {str(folder)!r} has no tokenizer.json")
    tok = json.loads(path.read_text())
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise HFModelError(
            f"--gguf: the tokenizer is {model.get('type')!r}; only a byte-level BPE is exported"
        )
    if pre is None:
        if not _gpt2_pre_tokenizer(tok):
            raise HFModelError(
                "--gguf: the tokenizer's pre-tokenizer is not GPT-2's; give llama.cpp's name for it with --gguf_pre "
                "(e.g. llama-bpe, qwen2, smollm)"
            )
        pre = "gpt-2"
    added = {t["content"]: t for t in tok.get("added_tokens", [])}
    vocab = dict(model["vocab"]) | {c: t["id"] for c, t in added.items()}
    size = max(int(config.vocab_size), max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i] = text
        special = added.get(text, {}).get("special")
        types[i] = (
            gguf.TokenType.CONTROL
            if special
            else gguf.TokenType.USER_DEFINED
            if text in added
            else gguf.TokenType.NORMAL
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    tok_config = (
        json.loads((folder / "tokenizer_config.json").read_text())
        if (folder / "tokenizer_config.json").is_file()
        else {}
    )

    def token_id(name: str) -> int | None:
        value = tok_config.get(name)
        text = value.get("content") if isinstance(value, dict) else value
        return vocab.get(text) if text is not None else None

    ids = {
        "bos": token_id("bos_token")
        if token_id("bos_token") is not None
        else getattr(config, "bos_token_id", None),
        "eos": token_id("eos_token")
        if token_id("eos_token") is not None
        else getattr(config, "eos_token_id", None),
        "unk": token_id("unk_token"),
        "pad": token_id("pad_token")
        if token_id("pad_token") is not None
        else getattr(config, "pad_token_id", None),
    }
    for name, value in ids.items():
        if isinstance(value, list):
            value = value[0]
        if value is not None:
            getattr(writer, {"bos": "add_bos_token_id", "eos": "add_eos_token_id", "unk": "add_unk_token_id",
                             "pad": "add_pad_token_id"}[name])(int(value))  # fmt: skip
    if "add_bos_token" in tok_config:
        writer.add_add_bos_token(bool(tok_config["add_bos_token"]))
    template = tok_config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)


def origin_gguf(folder: str | os.PathLike) -> Path | None:
    """The GGUF file a folder was written from (``repro gguf``'s record), when it is still there."""
    source = Path(folder) / "gguf_source.json"
    if not source.is_file():
        return None
    path = Path(json.loads(source.read_text())["gguf"])
    return path if path.is_file() else None


def write_gguf(
    folder: str | os.PathLike,
    out: str | os.PathLike,
    gguf_type: str = "f32",
    pre: str | None = None,
    tokenizer_gguf: str | os.PathLike | None = None,
) -> Path:
    """Write the Llama-family model in ``folder`` as the GGUF file ``out`` (atomically: a temporary file
    beside it, renamed into place); its tokenizer fields copied from ``tokenizer_gguf`` (or the GGUF
    the folder came from) when there is one and ``pre`` is not given."""
    import gguf

    folder = model_folder(folder)
    config = read_config(folder)
    check_exportable(config, gguf_type)
    files = TensorFiles(folder)
    n_head, n_kv = (
        int(config.num_attention_heads),
        int(config.num_key_value_heads or config.num_attention_heads),
    )
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // n_head)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(handle)
    try:
        writer = gguf.GGUFWriter(tmp, "llama")
        writer.add_name(getattr(config, "_name_or_path", None) or folder.name)
        writer.add_context_length(int(config.max_position_embeddings))
        writer.add_embedding_length(int(config.hidden_size))
        writer.add_block_count(int(config.num_hidden_layers))
        writer.add_feed_forward_length(int(config.intermediate_size))
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_kv)
        writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
        writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
        writer.add_rope_dimension_count(head_dim)
        if head_dim != config.hidden_size // n_head:
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
        writer.add_vocab_size(int(config.vocab_size))
        writer.add_file_type(
            {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[gguf_type]
        )  # fmt: skip
        if gguf_type == "q8_0":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        origin = Path(tokenizer_gguf) if tokenizer_gguf is not None else origin_gguf(folder)
        if origin is not None and pre is None:
            _copy_tokenizer_from(origin, writer)
        else:
            _write_tokenizer(folder, config, writer, pre)

        def add(name: str, array: np.ndarray) -> None:
            data, raw = _tensor(array, gguf_type, name)
            if raw is None:
                writer.add_tensor(name, data)
            else:
                writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw)

        def read(name: str) -> np.ndarray:
            return files.get(name).float().numpy()

        add("token_embd.weight", read("model.embed_tokens.weight"))
        for i in range(int(config.num_hidden_layers)):
            for hf, name in LAYER_TENSORS.items():
                w = read(f"model.layers.{i}.{hf}.weight")
                if name == "attn_q":
                    w = permute(w, n_head)
                elif name == "attn_k":
                    w = permute(w, n_kv)
                add(f"blk.{i}.{name}.weight", w)
        add("output_norm.weight", read("model.norm.weight"))
        if not config.tie_word_embeddings and "lm_head.weight" in files:
            add("output.weight", read("lm_head.weight"))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's file is private; the result is an ordinary file
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
