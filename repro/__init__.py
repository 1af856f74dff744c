"""repro: reproducibility suite for layer-wise RoPE allocation and Clapping.

Layers, each importing only those below it: ``models``, ``data`` and ``pipeline`` (plain torch);
``lit`` and ``pipeline.lightning`` (Lightning); ``runs`` (the engine every training run goes
through); ``alloc`` (RoPE allocation science); ``experiments``; ``cli``.
"""

__version__ = "0.1.0"
