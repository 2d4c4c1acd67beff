"""Typed changes to frozen settings dataclasses from the command line (`--set field=value`):
the value read as YAML (numbers, true / false, null, lists), checked against the field's type,
the dataclass rebuilt (so its own checks run). Used by `python -m preprocessing --set` and the
workflows' `--set section.field=value` (workflows/overrides.py); a settings module of any
package may be changed this way. Errors are one line naming the closest valid names and the
expected type (`SettingError`). A settings file (a workflow's `--config`) and a saved config
(`convs2s.config.Settings.from_dict`) go through the same checks (`check_fields`), read with the
same YAML (`load_yaml`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re

import yaml


class SettingError(ValueError):
    """A `--set` that names no field or gives a value its field cannot take. Its message
    quotes the value as given, a URI's credentials hidden (`storage.redact`)."""

    def __init__(self, message: str):
        from storage.redact import redact_text

        super().__init__(redact_text(message))


@dataclasses.dataclass(frozen=True)
class Change:
    section: str
    field: str
    value: object
    text: str  # as given: "train.lr=0.5"
    origin: str = "--set"  # where it was given, the head of its error lines


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's numbers: 1e-4 is a float (1.1 wants 1.0e-4 and
    reads 1e-4 as text), 1:30 is text (1.1 reads base 60: 90), 010 is ten (1.1: octal 8).
    true / false / yes / no / on / off stay booleans, as in every YAML file users write."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9][0-9_]*|0x[0-9a-fA-F]+|0o[0-7]+)$"),
    list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*\.[0-9_]*)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def env_seconds(name: str, default: float) -> float:
    """Seconds from the environment variable `name` (`default` where unset or empty); a
    SettingError naming the variable where it is no number >= 0 ("1m" was a ValueError's
    traceback from deep inside a command)."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise SettingError(f"{name}={raw!r}: give a number of seconds >= 0 (default "
                           f"{default:g}), or unset it")
    return value


def _int(loader, node):  # 0o17 is YAML 1.2's octal; PyYAML's constructor knows 0x and 017
    text = loader.construct_scalar(node)
    return int(text.replace("_", ""), 0) if text.startswith(("0o", "0x")) else \
        int(text.replace("_", ""))


_Loader.add_constructor("tag:yaml.org,2002:int", _int)


def _mapping(loader, node, deep=False):
    """A mapping whose keys are each given once: PyYAML keeps the last of a repeated key, so a
    config file's second `max_len:` replaced the first without a word."""
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys are overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: PyYAML's own error says so
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"{key!r} is given twice (lines {first.line + 1} and "
                f"{key_node.start_mark.line + 1}): keep one", key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor("tag:yaml.org,2002:map", _mapping)


def yaml_error(err: yaml.YAMLError) -> str:
    """A YAML error in one line, with its place: `line L, column C: problem` (PyYAML's first
    line, "while scanning ...", names neither)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or not problem:
        return str(err).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def load_yaml(text: str):
    """A YAML document, numbers as YAML 1.2 reads them (`_Loader`)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def read_value(raw: str):
    """A value as YAML reads it (1e-4 a float, 1:30 text: `_Loader`); text YAML cannot read
    stays text."""
    try:
        return load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


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


_PLAIN = {"str": str, "int": int}


def typed(name: str, field: dataclasses.Field, value, current, raw: str | None = None):
    """`value` in the type of `field` (annotation `field.type`; `current`, its value now,
    where the annotation is not plain), or a SettingError "NAME takes TYPE, not VALUE". `raw`:
    the text as typed on a command line, which a text field takes where YAML read another
    type (a language `no`, YAML 1.1's false); None in a file, where such a value is refused.
    A text field that can be off ("" or None: a torch.compile backend, a file) takes false /
    off / no / null as off."""
    v, want = value, str(field.type)
    kind = _kind(want, current)

    def bad(why: str = ""):
        if field.name == "max_time" and isinstance(v, str) and not why:  # (20m, 1.5h)
            why = ": seconds (a duration with its unit is the --max-time flag's: --max-time 20m)"
        return SettingError(f"{name} takes {want}, not {v!r}{why}")

    if v is None:  # (a required field, no default: never None, whatever its value now)
        if "None" in want:
            return None
        if field.default == "":  # a text field that is off when empty
            return ""
        raise bad()
    if kind == "bool" and not isinstance(v, bool):
        raise bad()
    if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
        raise bad()
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad()
        try:
            return float(v)
        except OverflowError:  # (an int of more than 308 digits)
            raise bad(": too large for a float") from None
    if kind == "str" and not isinstance(v, str):
        off = None if "None" in want else "" if field.default == "" else False
        if v is False and off is not False:  # false / off / no: the field's off value
            return off
        if off is not False and isinstance(v, bool):
            raise bad(": give a name, or false for none")
        if raw is None or isinstance(v, (dict, list)):
            raise bad(" (quote a text that YAML reads otherwise)" if isinstance(v, bool)
                      else "")
        return raw  # YAML's number or boolean, as the text typed ("1e-4", "no")
    if kind == "dict":
        if not isinstance(v, dict):
            raise bad(" (a mapping: {key: value, ...})" if isinstance(v, str) else "")
        # dict[str, int] and the like: the keys' and values' types too
        m = re.fullmatch(r"dict\[(\w+),(\w+)\]", want.replace(" ", ""))
        if m and m[1] in _PLAIN and m[2] in _PLAIN:
            k, t = _PLAIN[m[1]], _PLAIN[m[2]]
            if not all(type(x) is k and type(y) is t for x, y in v.items()):
                # (a value YAML reads as another type, or one with a comma that YAML cut
                # into two keys: `{train: a.en,b.fr}`)
                raise bad(f" (quote a {m[2]} that YAML reads otherwise, or that holds a "
                          "comma: {key: \"a.en,b.fr\"})" if m[2] == "str" else "")
    if kind == "seq":
        if not isinstance(v, (list, tuple)):
            raise bad()
        return tuple(tuple(x) if isinstance(x, list) else x for x in v)
    return v


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def check_fields(cls, d: dict, where: str = "") -> dict:
    """`d` (a settings dict read from a file) with every value in its field's type, by the
    rules of `--set` (`typed`, no command-line text to fall back on); a SettingError naming
    `where` + the field (and the closest names of an unknown one) otherwise."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for k, v in d.items():
        if k not in fields:
            raise SettingError(f"{where}{k}: no such setting{closest(str(k), fields)}")
        out[k] = typed(f"{where}{k}", fields[k], v, _default(fields[k]))
    return out


def _coerce(o: Change, field: dataclasses.Field, current):
    """The value in the field's type; a SettingError naming the type otherwise."""
    try:
        return typed(f"{o.section}.{o.field}", field, o.value, current,
                     o.text.partition("=")[2].strip())
    except SettingError as err:
        raise SettingError(f"{o.origin} {o.text}: {err}") from None


def apply_changes(obj, overrides: list[Change], section: str, owned: dict[str, str],
                  also: dict | None = None, also_given: list[Change] = ()):
    """`obj` (a frozen settings dataclass) with `overrides` of its fields; `owned` maps
    "section.field" to the flag that sets it instead (refused here). `also`: fields replaced
    in the same step (a nested section already changed by `also_given`), so that the object
    is checked once with every change (not with each side's old values)."""
    if not overrides and not also:
        return obj
    fields = {f.name: f for f in dataclasses.fields(obj)}
    changes = {}
    for o in overrides:
        if f"{section}.{o.field}" in owned:
            raise SettingError(f"{o.origin} {o.text}: {section}.{o.field} is set by "
                               f"{owned[f'{section}.{o.field}']}")
        if o.field not in fields:
            raise SettingError(f"{o.origin} {o.text}: {type(obj).__name__} has no field "
                               f"{o.field!r}{closest(o.field, fields)}")
        changes[o.field] = _coerce(o, fields[o.field], getattr(obj, o.field))
    try:
        return dataclasses.replace(obj, **{**(also or {}), **changes})
    except (ValueError, TypeError) as err:
        given = " ".join(f"{o.origin} {o.text}" for o in [*also_given, *overrides])
        raise SettingError(f"{given}: {err}" if given else str(err)) from None
