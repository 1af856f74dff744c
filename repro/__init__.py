"""repro: reproducibility suite for layer-wise RoPE allocation and Clapping."""

__version__ = "0.1.0"
