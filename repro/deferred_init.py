"""A model built on the meta device whose seed-built weights are drawn later, part by part
(plain torch).

Building records every in-place initialisation the constructors run (``uniform_``, ``normal_``,
``fill_``, ``zero_``), the tensor it wrote and the CPU random state before the first; the global
random state then advances exactly as a real build would have advanced it (each draw is made
into a scratch tensor and dropped), so what the process draws next is unchanged. ``materialize``
replays the records from the saved state: a kept parameter gets the very values the real build
gives it, bit for bit, and a parameter not kept costs one scratch tensor at a time and stays on
meta. A pipeline stage thereby holds only its own parts of a model that was never whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# in-place ops a constructor may run on a new tensor; the random ones draw from the CPU generator
REPLAYED = {"aten::uniform_": True, "aten::normal_": True, "aten::fill_": False, "aten::zero_": False}

_deferring: list[bool] = []


@contextmanager
def deferred_init() -> Iterator[None]:
    """Models that support it (:meth:`repro.models.gpt.GPT.build`) are built deferred inside."""
    _deferring.append(True)
    try:
        yield
    finally:
        _deferring.pop()


def deferring() -> bool:
    return bool(_deferring)


@dataclass(frozen=True)
class InitStep:
    op: str  # the aten op, e.g. 'aten.uniform_.default'
    shape: tuple[int, ...]
    dtype: torch.dtype
    args: tuple  # the op's arguments after the tensor (scalars)
    names: tuple[str, ...]  # the parameters this tensor became; () = a tensor the model dropped
    random: bool  # draws from the CPU generator


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[str, torch.Tensor, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        first = schema.arguments[0] if schema.arguments else None
        writes = first is not None and first.alias_info is not None and first.alias_info.is_write
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        if writes or seeded:
            if schema.name not in REPLAYED or kwargs.get("generator") is not None or not writes:
                raise NotImplementedError(
                    f"deferred init: the model's constructor runs {func} "
                    f"(replayable: in-place {sorted(REPLAYED)} on the default generator)"
                )
            if args[0]._base is not None:
                raise NotImplementedError(f"deferred init: {func} writes a view of a parameter")
            self.steps.append((str(func), args[0], tuple(args[1:])))
        return func(*args, **kwargs)


class InitTrace:
    """The initialisation of a model built on meta: the random state before it and its steps."""

    def __init__(self, rng_state: torch.Tensor, steps: list[InitStep]) -> None:
        self.rng_state, self.steps = rng_state, steps

    @classmethod
    def build(cls, make: Callable[[], nn.Module]) -> tuple[nn.Module, InitTrace]:
        """``make()`` on the meta device, recorded; the global random state advanced as by a real build."""
        state = torch.get_rng_state()
        recorder = _Recorder()
        with torch.device("meta"), recorder:
            module = make()
        if next(module.buffers(), None) is not None:
            raise NotImplementedError("deferred init: the model has buffers, which are not replayed")
        names: dict[int, list[str]] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        steps = [
            InitStep(op, tuple(t.shape), t.dtype, args, tuple(names.get(id(t), ())), REPLAYED[_schema(op)])
            for op, t, args in recorder.steps
        ]
        trace = cls(state, steps)
        trace._run(lambda name: False)  # draw and drop: the generator ends where a real build leaves it
        return module, trace

    def _run(self, keep: Callable[[str], bool]) -> dict[tuple[str, ...], torch.Tensor]:
        values: dict[tuple[str, ...], torch.Tensor] = {}
        for step in self.steps:
            if step.names and any(keep(n) for n in step.names):
                target = values.get(step.names)
                if target is None:
                    target = values[step.names] = torch.empty(step.shape, dtype=step.dtype)
            elif step.random:
                target = torch.empty(step.shape, dtype=step.dtype)  # drawn to keep the stream, then dropped
            else:
                continue
            _resolve(step.op)(target, *step.args)
        return values

    def materialize(self, module: nn.Module, keep: Callable[[str], bool]) -> None:
        """Give the parameters ``keep`` names (and any parameter tied to one) their values; the
        others stay on meta. The global random state is left as it was."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.rng_state)
            values = self._run(keep)
        assign_parameters(module, values)
        left = [n for n, p in module.named_parameters(remove_duplicate=False) if p.is_meta and keep(n)]
        if left:
            raise NotImplementedError(f"deferred init: no recorded initialisation wrote {left}")


def assign_parameters(module: nn.Module, values: dict[tuple[str, ...], torch.Tensor]) -> None:
    """Each tensor becomes one parameter under all its names (tied names share it, as in a real build)."""
    for names, value in values.items():
        parameter = nn.Parameter(value)
        for name in names:
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, leaf, parameter)


def tied_groups(module: nn.Module, wanted: Callable[[str], bool]) -> list[tuple[str, ...]]:
    """The parameters ``wanted`` names, each as the tuple of all its names (tied names together)."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [tuple(group) for group in names.values() if any(wanted(n) for n in group)]


def parameter_names(module: nn.Module, parts: Iterable[nn.Module]) -> set[str]:
    """The names in ``module`` of the parameters of ``parts`` (submodules of it)."""
    ids = {id(p) for part in parts for p in part.parameters()}
    return {name for name, p in module.named_parameters(remove_duplicate=False) if id(p) in ids}


def _schema(op: str) -> str:
    namespace, name = op.split(".")[:2]
    return f"{namespace}::{name}"


def _resolve(op: str):
    namespace, name, overload = op.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)
