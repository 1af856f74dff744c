"""Where a result came from: the commit of the code, the machine (processor, the kernel path
torch takes on it, threads, versions) and the time. Every result file and table records it, so
a number can be traced to what made it and compared only where that is meaningful (bitwise on
the same machine type and thread count, statistically elsewhere)."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import torch

from repro.paths import REPO_ROOT


@cache
def git_commit() -> str:
    """The checked-out commit of the repository this package runs from ('+dirty' with local
    changes to tracked files; 'unknown' outside a git checkout)."""
    try:
        run = dict(capture_output=True, text=True, check=True, cwd=REPO_ROOT)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], **run).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **run).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def display_path(path: str | os.PathLike) -> str:
    """A path relative to the repository when it lies inside it (so tables read the same on every clone)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def machine(threads: int | None = None) -> dict[str, Any]:
    """The facts of this machine that can move a run's floats."""
    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernel path torch takes (AVX2, AVX512...)
        "torch_threads": threads if threads is not None else torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def provenance(threads: int | None = None) -> dict[str, Any]:
    return {"git_commit": git_commit(), "created": now(), "machine": machine(threads)}


def provenance_header() -> dict:
    """What every report starts with: the commit, when, and on what machine."""
    return {"git_commit": git_commit(), "created": now(), "machine": machine()}
