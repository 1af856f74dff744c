"""The Lightning integration of the pipeline library: ``ClappingStrategy`` (strategy.py), its step
statistics (step_report.py) and checkpoints (checkpoint.py); Lightning's private API is touched in
``repro/lightning_compat.py`` alone."""

from collections.abc import Callable

from lightning.pytorch.strategies import StrategyRegistry

from .strategy import ClappingStrategy

# the registered names of the strategy, and the start method each stands for
NAMES = {"clapping": "popen", "clapping_spawn": "spawn", "clapping_fork": "fork"}
CLASS_PATH = f"{ClappingStrategy.__module__.rsplit('.', 1)[0]}.{ClappingStrategy.__name__}"
OPTION = "--trainer.strategy"


def register_strategies() -> None:
    """Make ``strategy="clapping"`` (and ``clapping_spawn``, ``clapping_fork``) known to Lightning."""
    for name, start in NAMES.items():
        if name not in StrategyRegistry:
            StrategyRegistry.register(
                name,
                ClappingStrategy,
                description=f"Clapping pipeline-parallel strategy (start_method '{start}')",
                start_method=start,
            )


def named_strategy_options(argv: list[str], config_strategy: Callable[[str], object]) -> list[str]:
    """The command line with a registered name that is followed by strategy options
    (``--trainer.strategy=clapping --trainer.strategy.init_args.method=clapping_fc``) spelt as the
    class with the name's start method, which is what jsonargparse gives options to.
    ``config_strategy(path)`` is a config file's ``trainer.strategy`` (None when it sets none)."""
    out: list[str] = []
    current: object = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        value = None
        if arg in ("--config", "-c") and i + 1 < len(argv):
            value = config_strategy(argv[i + 1])
        elif arg.startswith("--config="):
            value = config_strategy(arg.split("=", 1)[1])
        elif arg == OPTION and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(OPTION + "="):
            value = arg.split("=", 1)[1]
        if value is not None:
            current = value
        named = isinstance(current, str) and current in NAMES
        if named and arg.startswith(OPTION + ".") and not arg.startswith(OPTION + ".help"):
            out += [f"{OPTION}={CLASS_PATH}", f"{OPTION}.init_args.start_method={NAMES[current]}"]
            current = CLASS_PATH
        out.append(arg)
        i += 1
    return out


__all__ = ["ClappingStrategy", "named_strategy_options", "register_strategies"]
