"""Pipeline-parallel training with compressed messages (Clapping): the Lightning strategy, the
micro-batch schedules, the compressors and the communication methods."""

from .compressors import build_compressor
from .methods import METHODS, ChannelCodec, MessageContext
from .p2p import PipelineTimeout
from .runner import NonFiniteError
from .stage_protocol import PipelineStageModule, StageParts
from .strategy import ClappingStrategy


def register() -> None:
    """Make ``strategy="clapping"`` (and ``clapping_spawn``, ``clapping_fork``) known to Lightning."""
    from lightning.pytorch.strategies import StrategyRegistry

    ClappingStrategy.register_strategies(StrategyRegistry)


register()

__all__ = [
    "METHODS",
    "ChannelCodec",
    "ClappingStrategy",
    "MessageContext",
    "NonFiniteError",
    "PipelineTimeout",
    "PipelineStageModule",
    "StageParts",
    "build_compressor",
    "register",
]
