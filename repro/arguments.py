"""One parser system: jsonargparse's, for every ``repro`` command (:class:`Parser`), the model
configs of LightningCLI and the experiments' settings files, so an option is typed as a config's
field is (ranges as types such as ``PositiveInt``), and every error is one line on stderr
(``repro <command>: error: ...; see --help``), not a usage block.

This module is also the one place that knows jsonargparse's error wording (a nested
``Parser key "..."``, ``Given value:``, a union's alternatives, a range's restriction): the command
line's (:func:`option_line`), the LightningCLI configs of ``repro fit`` and the run engine
(:func:`one_line`) and the settings files (:func:`settings_one_line`). A jsonargparse release that
words its errors anew is fixed here."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from typing import Any, NoReturn

import jsonargparse
from jsonargparse.typing import restricted_number_type

PositiveInt = jsonargparse.typing.PositiveInt  # an int > 0
NonNegativeInt = jsonargparse.typing.NonNegativeInt  # an int >= 0
PositiveFloat = jsonargparse.typing.PositiveFloat  # a float > 0
ClosedUnitInterval = jsonargparse.typing.ClosedUnitInterval  # a float in [0, 1]
OpenUnitInterval = jsonargparse.typing.OpenUnitInterval  # a float in (0, 1)
Probability = restricted_number_type("Probability", float, [(">", 0), ("<=", 1)])  # a float in (0, 1]


PARSER_KEY = re.compile(r'Parser key "([^"]+)"')  # the key an error is about (nested keys: outermost first)


RESTRICTED = re.compile(
    r'Parser key "(\w+)"(?: element (\d+))?: Not of type (\w+): (.*?) does not conform to restriction (.+)$'
)  # a value outside a range type (PositiveInt, ...)
NOT_OF_TYPE = re.compile(r'Parser key "(\w+)"(?: element (\d+))?: Not of type (\w+): (.+)$')


def option_line(message: str) -> str:
    """A command-line parse error naming the option as typed (``--steps 0: must be > 0``), the
    value, and what is allowed; argparse's own errors (a missing option, a bad choice) as they are."""
    text = " ".join(message.split())
    ranged, typed = RESTRICTED.match(text), NOT_OF_TYPE.match(text)
    if not (ranged or typed):
        return text
    name, element = (ranged or typed).group(1, 2)
    option = f"--{name.replace('_', '-')}" + (f" (item {element})" if element else "")
    if ranged:
        value, rule = ranged.group(4, 5)
        return f"{option} {value}: must be " + re.sub(r"v([<>]=?)", r"\1 ", rule)
    return f"{option}: not a {typed.group(3)}: {typed.group(4)}"


def one_line(exc: Exception) -> str:
    """An error of jsonargparse or of a class it built, as one line: the (nested) key, the value
    given and the first reason (a union's ``Expected a NoneType`` alternative is not a reason)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    keys = PARSER_KEY.findall(" ".join(lines))
    key = ".".join(k for i, k in enumerate(keys) if i == 0 or not k.startswith(keys[0])) if keys else None
    inner = max((i for i, line in enumerate(lines) if line.startswith("Parser key")), default=0)
    given = next(
        (line.split(":", 1)[1].strip() for line in lines[inner:] if line.startswith("Given value:")), None
    )
    skip = (
        "Parser key",
        "Given value",
        "Subtypes",
        "Errors:",
        "Does not validate",
        "- Expected a <class 'NoneType'>",
        "- Problem with given class_path",
        "Problem with given class_path",
    )
    reasons = [line.lstrip("- ") for line in lines[inner:] if not line.startswith(skip)]
    reasons = reasons or [line.lstrip("- ") for line in lines if not line.startswith(skip)]
    specific = [r for r in reasons if not r.startswith("Expected a <class")]  # the alternatives of a union
    reason = (specific or reasons or lines)[0]
    reason = re.sub(r"Expected a <class '(\w+)'>", r"expected \1", reason)
    missing = re.search(
        r"Not of type Path_\w+: (Directory|File|Path) does not exist: '([^']*)'", " ".join(lines)
    )
    if missing:  # a path (relative to the config file that names it) that is not there
        kind = {"Directory": "folder", "File": "file"}.get(missing.group(1), "file or folder")
        hint = "; make it with `repro data prepare SOURCE --out DIR`" if key == "data.prepared_dir" else ""
        return f"{key}: no such {kind} {os.path.normpath(missing.group(2))!r}{hint}"
    if key and not reason.startswith(key):
        return f"{key}={given}: {reason}" if given and len(keys) > 1 else f"{key}: {reason}"
    return reason


def settings_one_line(exc: Exception, cls: type) -> str:
    """jsonargparse's message as one line naming the field, the value and what is allowed."""
    text = re.sub(r"\s+", " ", " ".join(line.strip() for line in str(exc).splitlines() if line.strip()))
    allowed = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "path"]
    unknown = re.findall(r"Option '([^']+)' is not accepted", text) or re.findall(
        r"[Uu]nrecognized arguments?: (\S+)", text
    )
    if unknown:
        return f"unknown fields {unknown}; allowed {allowed}"
    key = PARSER_KEY.search(text)
    field = key.group(1) if key else "settings"
    literal = re.search(r"Expected a typing\.Literal\[(.*?)\]\. Got value: (.*)$", text)
    if literal:
        return f"{field}={literal.group(2).strip()!r}: allowed {literal.group(1)}"
    missing = re.search(r"File does not exist: '([^']*)'", text)
    if missing:
        return f"{field}: no such file {missing.group(1)!r}"
    typed = re.search(r"Expected a <class '(\w+)'>\. Got value: (.*?)(?: Given value type.*)?$", text)
    if typed:
        return f"{field}: {typed.group(2).strip()!r} is not a valid {typed.group(1)}"
    return text.replace('Parser key "', "field '").replace('":', "':")


class HelpFormatter(jsonargparse.DefaultHelpFormatter):
    """jsonargparse's help (each option's type and default), a class type by its name, and no second
    default where the help names the default in words."""

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
        return kind and re.sub(r"<class '(?:\w+\.)*(\w+)'>", r"\1", kind)


class Parser(jsonargparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        invalid = re.match(r"argument (\S+): invalid \w+ value: '(.*)'$", str(message))
        action = invalid and parser._option_string_actions.get(invalid.group(1).split("/")[-1])
        if action and callable(action.type):  # argparse's own type call (in a mutually exclusive group)
            try:
                action.type(invalid.group(2))
            except (TypeError, ValueError) as exc:
                message = f'Parser key "{action.dest}": Not of type {action.type.__name__}: {exc}'
        self.exit(2, f"{prog}: error: {option_line(str(message))} (see {prog} --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)

    def subcommands(self, dest: str) -> Any:
        """jsonargparse's subcommands, each a :class:`Parser` (``add(name, help=...)`` makes one)."""
        group = self.add_subcommands(dest=dest, required=True)

        def add(name: str, **kwargs: Any) -> Parser:
            sub = Parser(prog=f"{self.prog} {name}", description=kwargs.get("description"))
            group.add_subcommand(name, sub, help=kwargs.get("help"))
            return sub

        return add


def flat(namespace: jsonargparse.Namespace, *dests: str) -> argparse.Namespace:
    """The options of the chosen subcommands (each ``dest`` naming the choice one level down) beside
    the top level's, in one plain namespace: ``args.out``, not ``args.profile["phase-off"].out``."""
    node = namespace
    values = {k: v for k, v in vars(node).items() if not isinstance(v, jsonargparse.Namespace)}
    for dest in dests:
        if dest not in node:  # a subcommand without subcommands of its own
            break
        node = node[node[dest]]
        values.update({k: v for k, v in vars(node).items() if not isinstance(v, jsonargparse.Namespace)})
    return argparse.Namespace(**values)
