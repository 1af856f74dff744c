"""Lightning wrappers around the plain-torch models."""
import repro.pipeline  # noqa: F401  (registers strategy="clapping" with Lightning)

from .callbacks import FinalCheckpoint, TokenThroughput
from .gpt_module import GPTLightningModule, OptimConfig, lr_multiplier

__all__ = ["GPTLightningModule", "OptimConfig", "TokenThroughput", "FinalCheckpoint", "lr_multiplier"]
