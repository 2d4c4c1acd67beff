"""Typed changes to frozen settings dataclasses from the command line (`--set field=value`):
the value read as YAML (numbers, true / false, null, lists), checked against the field's type,
the dataclass rebuilt (so its own checks run). Used by `python -m preprocessing --set` and the
workflows' `--set section.field=value` (workflows/overrides.py); a settings module of any
package may be changed this way. Errors are one line naming the closest valid names and the
expected type (`SettingError`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re

import yaml


class SettingError(ValueError):
    """A `--set` that names no field or gives a value its field cannot take."""


@dataclasses.dataclass(frozen=True)
class Change:
    section: str
    field: str
    value: object
    text: str  # as given: "train.lr=0.5"


# YAML 1.1 (PyYAML) reads 1e-4 as text: its floats need a dot (1.0e-4); the paper's 10^-4
_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def read_value(raw: str):
    """A value as YAML reads it, with 1e-4 a float as in YAML 1.2 (PyYAML's 1.1 reads it as
    text); text YAML cannot read stays text."""
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw
    if isinstance(value, str) and _EXPONENT.match(raw.strip()):  # (quoted: text, as typed)
        return float(value)
    return value


def closest(name: str, names) -> str:
    near = difflib.get_close_matches(name, list(names), n=3, cutoff=0.5)
    return f" (did you mean {' or '.join(near)}?)" if near else ""


def _kind(annotation: str, current) -> str:
    """bool | int | float | str | dict | seq | any: what a field holds, from its annotation
    (the current value's type where the annotation says nothing plain)."""
    a = annotation.replace(" ", "")
    for kind, starts in (("bool", ("bool",)), ("int", ("int",)), ("float", ("float",)),
                         ("str", ("str", "Literal[")), ("dict", ("dict",)),
                         ("seq", ("tuple", "list", "Layers"))):
        if a.startswith(starts):
            return kind
    for kind, types in (("bool", bool), ("int", int), ("float", float), ("str", str),
                        ("dict", dict), ("seq", (list, tuple))):
        if isinstance(current, types):
            return kind
    return "any"


def _coerce(o: Change, field: dataclasses.Field, current):
    """The value in the field's type; a SettingError naming the type otherwise."""
    v, want = o.value, str(field.type)
    kind = _kind(want, current)

    def bad():
        return SettingError(f"--set {o.text}: {o.section}.{o.field} takes {want}, not {v!r}")

    if v is None:
        if current is None or "None" in want:
            return None
        raise bad()
    if kind == "bool" and not isinstance(v, bool):
        raise bad()
    if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
        raise bad()
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad()
        return float(v)
    if kind == "str":  # YAML's string (quotes removed), else the text as typed ("1e-4")
        return v if isinstance(v, str) else o.text.partition("=")[2].strip()
    if kind == "dict" and not isinstance(v, dict):
        raise bad()
    if kind == "seq":
        if not isinstance(v, list):
            raise bad()
        return tuple(tuple(x) if isinstance(x, list) else x for x in v)
    return v


def apply_changes(obj, overrides: list[Change], section: str, owned: dict[str, str]):
    """`obj` (a frozen settings dataclass) with `overrides` of its fields; `owned` maps
    "section.field" to the flag that sets it instead (refused here)."""
    if not overrides:
        return obj
    fields = {f.name: f for f in dataclasses.fields(obj)}
    changes = {}
    for o in overrides:
        if f"{section}.{o.field}" in owned:
            raise SettingError(f"--set {o.text}: {section}.{o.field} is set by "
                               f"{owned[f'{section}.{o.field}']}")
        if o.field not in fields:
            raise SettingError(f"--set {o.text}: {type(obj).__name__} has no field {o.field!r}"
                               f"{closest(o.field, fields)}")
        changes[o.field] = _coerce(o, fields[o.field], getattr(obj, o.field))
    try:
        return dataclasses.replace(obj, **changes)
    except (ValueError, TypeError) as err:
        given = " ".join(f"--set {o.text}" for o in overrides)
        raise SettingError(f"{given}: {err}") from None
