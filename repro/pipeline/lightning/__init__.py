"""The Lightning integration of the pipeline library: ``ClappingStrategy`` (strategy.py), its step
statistics (step_report.py), checkpoints (checkpoint.py), and the one module that touches
Lightning's private API (compat.py)."""

from lightning.pytorch.strategies import StrategyRegistry

from .strategy import ClappingStrategy


def register_strategies() -> None:
    """Make ``strategy="clapping"`` (and ``clapping_spawn``, ``clapping_fork``) known to Lightning."""
    ClappingStrategy.register_strategies(StrategyRegistry)


__all__ = ["ClappingStrategy", "register_strategies"]
