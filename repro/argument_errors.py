"""jsonargparse's error messages as one line each: the one place that knows their wording (a nested
``Parser key "..."``, ``Given value:``, a union's alternatives, a range's restriction): the command
line's (:func:`option_line`), the LightningCLI configs of ``repro fit`` and the run engine
(:func:`one_line`) and the settings files (:func:`settings_one_line`). A jsonargparse release that
words its errors anew is fixed here."""

from __future__ import annotations

import dataclasses
import os
import re

PARSER_KEY = re.compile(r'Parser key "([^"]+)"')  # the key an error is about (nested keys: outermost first)
RANGE = re.compile(r"Not of type \w+: (.*?) does not conform to restriction (v[^-]*?)(?: - |$)")
RULE = re.compile(r"does not conform to restriction (v[^-]*?)(?: - |$)")  # a range type's rule
CHOICES = re.compile(r"Expected a typing\.Literal\[(.*?)\]")  # a Literal's choices


def option_line(message: str) -> str:
    """A command-line parse error naming the option as typed (``--steps 0: must be > 0``), the
    value, and what is allowed; argparse's own errors (a missing option, a bad choice) as they are."""
    text = " ".join(message.split())
    key = re.match(r'Parser key "(\w+)"(?: element (\d+))?: (.*)$', text)
    if not key:
        return text
    name, element, rest = key.groups()
    option = f"--{name}" + (f" (item {element})" if element else "")
    given = re.search(r"(?:Given|Got) value: (.*)$", rest) or RANGE.search(rest)  # union, choice; range
    rule, choices, kind = (
        RULE.search(rest),
        CHOICES.search(rest),
        re.search(r"Not of type (\w+): (.*)$", rest),
    )
    if rule or choices:
        return f"{option} {given.group(1)}: " + (
            must_be(rule.group(1)) if rule else f"allowed {choices.group(1)}"
        )
    if kind and given:
        return f"{option} {given.group(1)}: not a {kind.group(1)}"
    return f"{option}: not a {kind.group(1)}: {kind.group(2)}" if kind else text


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
    literal = re.search(r"Expected a typing\.Literal\[(.*?)\]\. Got value: (.*)$", reason)
    if key and literal:  # a choice as a type
        return f"{key}={literal.group(2).strip()!r}: allowed values are ({literal.group(1)})"
    ranged = RANGE.search(reason)
    if key and ranged:  # a range as a type
        return f"{key}={ranged.group(1)}: {must_be(ranged.group(2))}"
    if key and not reason.startswith(key):
        return f"{key}={given}: {reason}" if given and len(keys) > 1 else f"{key}: {reason}"
    return reason


def must_be(rule: str) -> str:
    """A range type's restriction (``v>0 and v<=1``) as words (``must be > 0 and <= 1``)."""
    return "must be " + re.sub(r"v([<>]=?)", r"\1 ", rule.strip())


def settings_one_line(exc: Exception, cls: type) -> str:
    """jsonargparse's message as one line naming the field, the value and what is allowed."""
    text = re.sub(r"\s+", " ", " ".join(line.strip() for line in str(exc).splitlines() if line.strip()))
    allowed = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "path"]
    unknown = re.findall(r"Option '([^']+)' is not accepted", text) or re.findall(
        r"[Uu]nrecognized arguments?: (\S+)", text
    )
    if unknown:
        return f"unknown fields {unknown}; allowed {allowed}"
    field = ".".join(PARSER_KEY.findall(text)) or "settings"  # nested: link_runs.engine
    literal = re.search(r"Expected a typing\.Literal\[(.*?)\]\. Got value: (.*)$", text)
    if literal:
        return f"{field}={literal.group(2).strip()!r}: allowed {literal.group(1)}"
    ranged = RANGE.search(text)
    if ranged:
        return f"{field}={ranged.group(1)}: {must_be(ranged.group(2))}"
    missing = re.search(r"File does not exist: '([^']*)'", text)
    if missing:
        return f"{field}: no such file {missing.group(1)!r}"
    typed = re.search(r"Expected a <class '(\w+)'>\. Got value: (.*?)(?: Given value type.*)?$", text)
    if typed:
        return f"{field}: {typed.group(2).strip()!r} is not a valid {typed.group(1)}"
    return text.replace('Parser key "', "field '").replace('":', "':")
