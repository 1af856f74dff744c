"""Read scalar series back from TensorBoard event files (for tests, figures and reports)."""

from __future__ import annotations

from pathlib import Path


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars under ``log_dir`` (one run's folder, or a folder above its ``version_<n>``):
    ``{tag: [(step, value), ...]}`` sorted by step. Event files in several subfolders are merged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = Path(log_dir)
    folders = sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")})
    if not folders:
        raise FileNotFoundError(f"no TensorBoard event file under {str(log_dir)!r}")
    out: dict[str, list[tuple[int, float]]] = {}
    for folder in folders:
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, float(e.value)) for e in acc.Scalars(tag))
    return {tag: sorted(values) for tag, values in out.items()}
