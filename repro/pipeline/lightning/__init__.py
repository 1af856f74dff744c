"""The Lightning integration of the pipeline library: ``ClappingStrategy`` (strategy.py), its step
statistics (step_report.py), checkpoints (checkpoint.py), and the one module that touches
Lightning's private API (compat.py)."""

from lightning.pytorch.strategies import StrategyRegistry

from .strategy import ClappingStrategy


def register_strategies() -> None:
    """Make ``strategy="clapping"`` (and ``clapping_spawn``, ``clapping_fork``) known to Lightning."""
    for name, start in (("clapping", "popen"), ("clapping_spawn", "spawn"), ("clapping_fork", "fork")):
        if name not in StrategyRegistry:
            StrategyRegistry.register(
                name,
                ClappingStrategy,
                description=f"Clapping pipeline-parallel strategy (start_method '{start}')",
                start_method=start,
            )


__all__ = ["ClappingStrategy", "register_strategies"]
