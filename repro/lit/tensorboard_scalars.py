"""Read scalar series back from TensorBoard event files (for tests, figures and reports)."""

from __future__ import annotations

from pathlib import Path


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars under ``log_dir`` (one run's folder): ``{tag: [(step, value), ...]}`` sorted by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = Path(log_dir)
    if not any(log_dir.rglob("events.out.tfevents.*")):
        raise FileNotFoundError(f"no TensorBoard event file under {str(log_dir)!r}")
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: sorted((e.step, float(e.value)) for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}
