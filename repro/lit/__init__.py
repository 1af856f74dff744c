"""Lightning wrappers around the plain-torch models."""

from .callbacks import FinalCheckpoint, TokenThroughput
from .gpt_module import GPTLightningModule, OptimConfig, lr_multiplier

__all__ = ["GPTLightningModule", "OptimConfig", "TokenThroughput", "FinalCheckpoint", "lr_multiplier"]
