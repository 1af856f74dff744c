"""repro: reproducibility suite for layer-wise RoPE allocation and Clapping.

Importing ``repro`` registers the pipeline strategy under the name ``clapping`` with Lightning.
"""

__version__ = "0.1.0"


def _register_strategy() -> None:
    try:
        import lightning  # noqa: F401
    except ImportError:  # the plain-torch parts work without Lightning
        return
    import repro.pipeline  # noqa: F401  (registers "clapping")


_register_strategy()
