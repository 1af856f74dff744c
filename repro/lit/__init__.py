"""Lightning wrappers around the plain-torch models."""

from .callbacks import TokenThroughput
from .gpt_module import GPTLightningModule, OptimConfig, lr_multiplier

__all__ = ["GPTLightningModule", "OptimConfig", "TokenThroughput", "lr_multiplier"]
