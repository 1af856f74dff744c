"""The one engine for training runs: a run spec (config, overrides, seed, steps) and its
fingerprint (spec.py), the result store (store.py: atomic, reused by fingerprint, with
provenance.py's commit, machine and time), where runs go (placement.py), training many runs with
progress (pool.py, build.py), the model config files (model_config.py) and shards (shards.py)
(Ctrl-C between runs: ``repro.stop``). Profiles, Table 1, Clapping and the bench train through it; what
the experiments share beyond it (settings files, command flags, plans, step timing) is
``repro.experiments.kit``."""

from .placement import Slot, check_accelerator
from .pool import Progress, train_all
from .spec import RunSpec
from .store import RunResult

__all__ = ["Progress", "RunResult", "RunSpec", "Slot", "check_accelerator", "train_all"]
