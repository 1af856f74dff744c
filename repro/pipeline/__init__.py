"""Pipeline-parallel training with compressed messages (Clapping), as a library: compressors and
bit packing, the communication methods (codecs with their buffers and memory model), the
transport between stages, the micro-batch schedules, the stage runner, and how a model is cut
into stages. The Lightning strategy built on it is ``repro.pipeline.lightning``."""

from .codecs import METHODS, ChannelCodec, MessageContext
from .compressors import build_compressor
from .runner import NonFiniteError
from .stage_parts import StageAdapter, StageParts, stage_adapter_for
from .transport import PipelineTimeout

__all__ = [
    "METHODS",
    "ChannelCodec",
    "MessageContext",
    "NonFiniteError",
    "PipelineTimeout",
    "StageAdapter",
    "StageParts",
    "build_compressor",
    "stage_adapter_for",
]
