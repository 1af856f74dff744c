"""What a pipeline run needs of its config, checked by the strategy before any of its processes
starts: a layer per stage, a batch that splits into the micro-batches, the stages the processes
give, and (under torchrun or srun) as many processes as the launcher started. The CLI finds this
through the strategy class (``ClappingStrategy.check_config``), never by its name; each problem is
one line naming the field."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..options import PipelineOptions


def check_external_launch(processes: int, devices: int, nodes: int, env=None) -> None:
    """Under torchrun or srun, the processes it started must be the run's devices x num_nodes."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env and "WORLD_SIZE" in env:
        launcher, world = "torchrun", int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_WORLD_SIZE", world))
    elif "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        launcher, world = "srun", int(env["SLURM_NTASKS"])
        local = int(env.get("SLURM_NTASKS_PER_NODE", "0").split("(")[0] or 0) or max(
            1, world // int(env.get("SLURM_NNODES", "1"))
        )
    else:
        return
    if world != processes:
        size = "WORLD_SIZE" if launcher == "torchrun" else "SLURM_NTASKS"
        raise ValueError(
            f"{launcher} started {size}={world} processes ({local} per node), but trainer.devices={devices} x "
            f"trainer.num_nodes={nodes} = {processes}; pass --trainer.devices={local} "
            f"--trainer.num_nodes={max(1, world // max(local, 1))}"
        )


def check_pipeline_config(
    config: Mapping[str, Any], options: Mapping[str, Any], model_layers: tuple[int | None, str] = (None, "")
) -> None:
    """Check a run's config (``trainer``, ``model``, ``data``) for this strategy with ``options``
    (its init_args and a registered name's) and ``model_layers`` (the layers the config's module
    builds and the field that sets them: the module says, by its ``config_layers``); a ValueError
    names the field."""
    trainer = config.get("trainer") or {}
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes") or 1
    devices = int(devices) if isinstance(devices, str) and devices.isdigit() else devices
    if not isinstance(devices, int):
        return
    processes = devices * nodes
    check_external_launch(processes, devices, nodes)
    micro = options.get("micro_batches") or PipelineOptions().micro_batches
    batch = (config.get("data") or {}).get("batch_size")
    if isinstance(batch, int) and isinstance(micro, int) and batch % micro:
        raise ValueError(
            f"data.batch_size={batch} does not split into trainer.strategy micro_batches={micro} equal "
            f"micro-batches; choose a batch size divisible by {micro} (or other micro_batches)"
        )
    stages = options.get("stages")
    if isinstance(stages, int) and stages != processes:
        raise ValueError(
            f"trainer.strategy stages={stages}, but trainer.devices={devices} x trainer.num_nodes={nodes} gives "
            f"{processes} processes; the pipeline needs one process per stage: set trainer.devices={stages} "
            f"(or leave stages unset)"
        )
    if options.get("placement") == "v" and processes < 2:
        raise ValueError(
            f"trainer.strategy placement='v' runs the first part on the last stage, but trainer.devices={devices} x "
            f"trainer.num_nodes={nodes} gives one stage; use at least 2 devices (or placement='linear')"
        )
    n_layer, what = model_layers
    if isinstance(n_layer, int) and processes > n_layer:
        raise ValueError(
            f"trainer.devices={devices}: the pipeline has one stage per process, but {what}={n_layer}; "
            f"use at most {n_layer} devices (or a deeper model)"
        )
