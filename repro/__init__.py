"""repro: reproducibility suite for layer-wise RoPE allocation and Clapping.

``import repro.pipeline`` (also done by ``repro.lit`` and the ``repro`` command) registers the
pipeline strategy with Lightning as ``strategy="clapping"``. ``import repro`` alone imports no
torch, so the accounting tools work without it.
"""

__version__ = "0.1.0"
