"""The suite never touches the network unless a hub source or a hub model asks for it: on import,
HF datasets and the hub are set offline (so they fail fast instead of trying). A user who set
those variables keeps their values; ``allow_hub`` lifts the suite's own default for this process."""

from __future__ import annotations

import os

OFFLINE_BY_DEFAULT = "HF_HUB_OFFLINE" not in os.environ
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def allow_hub() -> None:
    """Let this process reach the Hugging Face Hub (unless the user set it offline)."""
    if not OFFLINE_BY_DEFAULT:
        return
    import huggingface_hub.constants as hub

    hub.HF_HUB_OFFLINE = False
    try:
        import datasets

        datasets.config.HF_HUB_OFFLINE = False
        datasets.config.HF_DATASETS_OFFLINE = False
    except ImportError:
        pass
