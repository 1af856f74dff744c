"""One parser system: jsonargparse's, for every ``repro`` command (:class:`Parser`; a command that
is a typed function: :func:`call`), the model configs of LightningCLI and the experiments' settings
files, so an option is typed as a config's field is (ranges as types such as ``PositiveInt``), and
every error is one line on stderr (``repro <command>: error: ...; see --help``, worded by
``repro.argument_errors``), not a usage block."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import os
import re
import sys
import types
import typing
from typing import Any, Literal, NoReturn

import docstring_parser
import jsonargparse
from jsonargparse.typing import restricted_number_type

from repro.argument_errors import PARSER_KEY, RANGE, RULE, must_be, option_line

PositiveInt = jsonargparse.typing.PositiveInt  # an int > 0
NonNegativeInt = jsonargparse.typing.NonNegativeInt  # an int >= 0
PositiveFloat = jsonargparse.typing.PositiveFloat  # a float > 0
ClosedUnitInterval = jsonargparse.typing.ClosedUnitInterval  # a float in [0, 1]
NonNegativeFloat = jsonargparse.typing.NonNegativeFloat  # a float >= 0
Probability = restricted_number_type("Probability", float, [(">", 0), ("<=", 1)])  # a float in (0, 1]
BelowOne = restricted_number_type("BelowOne", float, [(">=", 0), ("<", 1)])  # a float in [0, 1)


class HelpFormatter(jsonargparse.DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help (each option's type and default), a class type by its name, no second
    default where the help names the default in words, and the description and epilog as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if not (action.help and "default" in action.help and action.option_strings):
            return super()._get_help_string(action)
        default, action.default = action.default, argparse.SUPPRESS
        try:
            return super()._get_help_string(action)
        finally:
            action.default = default

    def _get_type_str(self, action: argparse.Action) -> str | None:
        kind = super()._get_type_str(action)
        if kind is None or kind.startswith("<function"):  # a parsing function says nothing of a type
            return None
        return re.sub(r"<class '(?:\w+\.)*(\w+)'>", r"\1", kind)


def spelled(option: str) -> str:
    """An option as every ``repro`` command spells it, LightningCLI's way: ``--full_steps``, not
    ``--full-steps`` (short options and single words as they are)."""
    return "--" + option[2:].replace("-", "_") if option.startswith("--") else option


class Parser(jsonargparse.ArgumentParser):
    """A command's parser: jsonargparse's, its help by :class:`HelpFormatter`, a usage error one line
    (:func:`option_line`), the parsed values plain numbers (:func:`plain`). Every option is spelled
    as LightningCLI spells ``repro fit``'s (:func:`spelled`); an option typed the old way, with
    dashes, is refused in one line that names the new spelling."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:  # type: ignore[override]
        return super().add_argument(*map(spelled, names), **kwargs)

    def _refuse_old_spellings(self, argv: list[str]) -> None:
        known = set(self._option_string_actions)
        for arg in argv:
            if arg == "--":
                return
            name = arg.split("=", 1)[0]
            if name.startswith("--") and "-" in name[2:] and name not in known and spelled(name) in known:
                self.error(f"{name}: spelled {spelled(name)} now (as repro fit spells its options)")

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        required = re.match(r"the following arguments are required: (.*)$", str(message))
        if required:  # name the options as typed
            names = []
            for dest in (k.strip() for k in required.group(1).split(",")):
                action = next((a for a in self._actions if a.dest == dest), None)
                names.append(action.option_strings[-1] if action and action.option_strings else dest)
            message = f"the following arguments are required: {', '.join(names)}"
        prog = self.prog.replace(" [options]", "")
        invalid = re.match(r"argument (\S+): invalid \w+ value: '(.*)'$", str(message))
        action = invalid and self._option_string_actions.get(invalid.group(1).split("/")[-1])
        if action and callable(action.type):  # argparse's own type call, worded as jsonargparse's
            try:
                action.type(invalid.group(2))
            except (TypeError, ValueError) as exc:
                message = f'Parser key "{action.dest}": Not of type {action.type.__name__}: {exc}'
        self.exit(2, f"{prog}: error: {option_line(str(message))} (see {prog} --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)

    def parse_args(self, *args: Any, **kwargs: Any) -> jsonargparse.Namespace:  # type: ignore[override]
        argv = args[0] if args else kwargs.get("args")
        self._refuse_old_spellings(list(sys.argv[1:] if argv is None else argv))
        namespace = super().parse_args(*args, **kwargs)
        for key, value in list(namespace.items()):
            namespace[key] = plain(value)
        return namespace

    def add_group(self, cls: type) -> None:
        """An option per field of dataclass ``cls`` (a command's parameter of that type), flat:
        ``--field_name``, its type, its attribute docstring as help and its default, with the habits
        of :meth:`_add_habit` (a bool field is a flag, a list one takes one value or several)."""
        hints, docs = typing.get_type_hints(cls), field_docs(cls)
        for f in (f for f in dataclasses.fields(cls) if f.init):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            default = inspect.Parameter.empty if default is dataclasses.MISSING else default
            hint, doc = hints[f.name], docs.get(f.name)
            if not self._add_habit(f.name, hint, default, doc):
                given = {"required": True} if default is inspect.Parameter.empty else {"default": default}
                self.add_argument(f"--{f.name}", dest=f.name, type=hint, help=doc, **given)

    def _add_habit(
        self, name: str, hint: Any, default: Any, doc: str | None, positional: bool = False
    ) -> bool:
        """The habits of a command line that jsonargparse lacks, for option ``name``: a list (or a list
        that may be None) takes one value or several (``--seeds 0 1``), a bool is a bare flag
        (``--plan``; ``--no_<name>`` clears one whose default is true), and a positional one is
        positional. False, and nothing added, where none applies."""
        items = _optional_of(hint) if default is None else hint  # a list that may be None
        listed = typing.get_origin(items) in (list, tuple)
        kind = {"type": typing.get_args(items)[0], "nargs": "+"} if listed else {"type": hint}
        if hint is bool:
            off = default is True
            self.add_argument(f"--no_{name}" if off else f"--{name}", dest=name,
                              action="store_false" if off else "store_true",
                              help=f"turn off: {doc}" if off else doc)  # fmt: skip
        elif positional:
            self.add_argument(name, help=doc, **kind)
        elif listed and default is inspect.Parameter.empty:
            self.add_argument(f"--{name}", dest=name, help=doc, required=True, **kind)
        elif listed:
            default = list(default) if isinstance(default, tuple) else default  # checked in place
            self.add_argument(f"--{name}", dest=name, help=doc, default=default, **kind)
        else:
            return False
        return True

    def add_function(self, fn: typing.Callable) -> None:
        """An option per parameter of ``fn``, jsonargparse's way (``add_function_arguments``: the
        types, ranges and choices as annotated, the defaults, each help from the docstring's
        ``Args:``; one without a default is required, a positional-only one is positional), with the
        habits of a command line it lacks (:meth:`_add_habit`). A dataclass parameter is a group of
        options, its fields' (:meth:`add_group`); :func:`call` builds it from them."""
        hints, docs = typing.get_type_hints(fn), param_docs(fn)
        shims = set()  # the parameters added here; jsonargparse adds the rest
        for name, param in inspect.signature(fn).parameters.items():
            hint = hints[name]
            if dataclasses.is_dataclass(hint):  # a group of options: each field's own, flat
                self.add_group(hint)
            elif not self._add_habit(
                name, hint, param.default, docs.get(name), param.kind is param.POSITIONAL_ONLY
            ):
                continue
            shims.add(name)
        self.add_function_arguments(fn, skip=shims)
        for action in self._actions:  # a help that lives on a settings field (documented_by)
            if action.dest in docs and not action.help and action.dest not in shims:
                action.help = docs[action.dest]


# a command's wrong input (and a shard that waited too long for the others): one line, exit status 2
USAGE_ERRORS = (ValueError, FileNotFoundError, ConnectionError, TimeoutError)
VERBOSE_ENV = "REPRO_VERBOSE"  # set (to 1) by a command's -v: Lightning's own lines are shown


def function_parser(fn: typing.Callable, prog: str, description: str | None = None) -> Parser:
    """The parser of command ``fn``: its parameters (:meth:`Parser.add_function`) and ``-v``."""
    parser = Parser(
        prog=prog,
        description=description or (inspect.getdoc(fn) or "").split("\nArgs:")[0].strip(),
        epilog=getattr(fn, "epilog", None),  # e.g. the fields of a settings file
    )
    parser.add_function(fn)
    parser.add_argument("-v", "--verbose", action="store_true", help="show Lightning's own lines too")
    return parser


def call(fn: typing.Callable, argv: list[str], prog: str, description: str | None = None) -> int:
    """Run command ``fn`` on the command line ``argv``: its parameters are the options
    (:meth:`Parser.add_function`), ``-v`` shows Lightning's own lines, and a wrong input that ``fn``
    raises (:data:`USAGE_ERRORS`) is one line on stderr with exit status 2, as a wrong option is.
    ``fn`` may return its exit status (an int; anything else: 0)."""
    args = function_parser(fn, prog, description).parse_args(argv)
    if args.pop("verbose"):
        os.environ[VERBOSE_ENV] = "1"
    parameters = inspect.signature(fn).parameters
    positional = [n for n, p in parameters.items() if p.kind is p.POSITIONAL_ONLY]
    try:
        for name, hint in typing.get_type_hints(fn).items():
            if name in parameters and dataclasses.is_dataclass(hint):  # its fields were options of their own
                args[name] = hint(**{f.name: args.pop(f.name) for f in dataclasses.fields(hint) if f.init})
        values = [args.pop(n) for n in positional]
        status = fn(*values, **vars(args))
    except USAGE_ERRORS as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return status if isinstance(status, int) else 0


def documented_by(*classes: type) -> typing.Callable:
    """Mark a command function whose parameters fill fields of the dataclasses ``classes``: a
    parameter its ``Args:`` leaves out takes the attribute docstring of the field of its name."""

    def mark(fn: typing.Callable) -> typing.Callable:
        fn.__documented_by__ = classes  # type: ignore[attr-defined]
        return fn

    return mark


def _optional_of(hint: Any) -> Any:
    """``X`` of ``X | None`` (else ``hint``)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def param_docs(fn: typing.Callable) -> dict[str, str]:
    """``{parameter: its help}`` from the ``Args:`` section of ``fn``'s docstring (and from the
    fields of the classes it is :func:`documented_by`)."""
    docs = {}
    for cls in getattr(fn, "__documented_by__", ()):
        docs.update(field_docs(cls))
    parsed = docstring_parser.parse(inspect.getdoc(fn) or "")
    docs.update({p.arg_name: " ".join((p.description or "").split()) for p in parsed.params})
    parameters = inspect.signature(fn).parameters
    return {name: doc for name, doc in docs.items() if name in parameters}


@functools.cache
def _fields_parser(cls: type, skip: tuple[str, ...]) -> jsonargparse.ArgumentParser:
    hints = typing.get_type_hints(cls)
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    for f in dataclasses.fields(cls):
        if f.init and f.name != "path" and f.name not in skip:
            parser.add_argument(f"--{f.name}", type=hints[f.name])
    return parser


def plain(value: Any) -> Any:
    """A range type's value as its plain ``int`` or ``float`` (so a checkpoint or a result holds
    no jsonargparse class), in lists and tuples too."""
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    for base in (int, float):
        if isinstance(value, base) and type(value) not in (base, bool):
            return base(value)
    return value


def check_fields(obj: Any, prefix: str, skip: tuple[str, ...] = ()) -> None:
    """Every field of dataclass ``obj`` against its type, ranges included (``PositiveInt``,
    ``Literal[...]``; a bool is not an int): a ``ValueError`` ``"<prefix><field>=<value>: <what is
    allowed>"`` for the first that does not fit; a value of a range type becomes a plain number.
    Rules across fields stay in ``__post_init__``."""
    values = {
        f.name: getattr(obj, f.name)
        for f in dataclasses.fields(obj)
        if f.init and f.name != "path" and f.name not in skip  # skip: checked where they are read
    }
    for name, value in values.items():
        object.__setattr__(obj, name, plain(value))  # frozen dataclasses too
    try:
        _fields_parser(type(obj), skip).parse_object(values)
    except Exception as exc:  # jsonargparse's ArgumentError (a TypeError for some values)
        text = " ".join(str(exc).split())
        key = PARSER_KEY.search(text)
        if not key or key.group(1) not in values:
            raise ValueError(f"{prefix}{text}") from None
        name = key.group(1)
        hint = typing.get_type_hints(type(obj))[name]
        allowed = [
            a
            for h in (hint, *typing.get_args(hint))
            if typing.get_origin(h) is Literal
            for a in typing.get_args(h)
        ]
        rule = RANGE.search(text) or RULE.search(text)  # RULE: a range type within an Optional
        if isinstance(values[name], tuple):
            values[name] = list(values[name])  # as a settings file writes it
        if allowed:
            reason = f"allowed values are {tuple(allowed)}"
        elif rule:
            reason = must_be(rule.group(rule.re.groups))
        else:
            reason = f"must be of type {getattr(hint, '__name__', None) or str(hint).replace('typing.', '')}"
        raise ValueError(f"{prefix}{name}={values[name]!r}: {reason}") from None


def show_field_docs() -> None:
    """jsonargparse's ``--help`` with each dataclass field's docstring (a model config's fields in
    ``repro fit --help``): turned on for help only, since reading them costs about a second a parse."""
    jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)


def field_docs(cls: type) -> dict[str, str]:
    """``{field: its attribute docstring}`` of dataclass ``cls`` and its bases (docstring_parser
    reads them, as jsonargparse does for ``--help``): a field's documentation is written once."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        if dataclasses.is_dataclass(klass):
            parsed = docstring_parser.parse_from_object(klass)
            docs.update({p.arg_name: " ".join((p.description or "").split()) for p in parsed.params})
    return {f.name: docs[f.name] for f in dataclasses.fields(cls) if f.name in docs}


def fields_help(cls: type) -> str:
    """A ``name: doc (default ...)`` line per field of dataclass ``cls`` (for ``--help`` texts)."""
    docs, lines = field_docs(cls), []
    for f in dataclasses.fields(cls):
        if not f.init or f.name == "path":
            continue
        if f.default is not dataclasses.MISSING:
            default = f" (default {f.default!r})"
        elif f.default_factory is not dataclasses.MISSING:
            default = f" (default {f.default_factory()!r})"
        else:
            default = " (required)"
        lines.append(f"  {f.name}: {docs.get(f.name, '')}{default}")
    return "\n".join(lines)
