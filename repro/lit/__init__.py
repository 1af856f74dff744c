"""Lightning wrappers around the plain-torch models: the LightningModule, its callbacks, the
checkpoint checks and the LightningCLI of the suite."""

from .callbacks import FinalCheckpoint, TokenThroughput
from .gpt_module import GPTLightningModule, OptimConfig, lr_multiplier

__all__ = ["FinalCheckpoint", "GPTLightningModule", "OptimConfig", "TokenThroughput", "lr_multiplier"]
