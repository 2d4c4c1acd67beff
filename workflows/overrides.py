"""`--set section.field=value`: any setting of a preset changed on the command line.

    --set model.dropout=0.3 --set train.lr=0.5 --set data.vocab_size=16000
    --set model.encoder_layers='[[512, 3], [512, 3]]' --set search.beam=10

Sections are the parts of a `WorkflowConfig`: `model` (`convs2s.config.ModelConfig`), `train`
(`TrainConfig`), `search` (`SearchConfig`), `data` (`preprocessing.config.PreprocessConfig`),
`ensemble` (`EnsembleConfig`) and `workflow` (the config's own fields: `num_workers`,
`use_gpu`, `cpus_per_worker`, ...). A value is read as YAML (numbers, true / false, null,
lists) and must fit the field's current type; strings need no quotes. Overrides change the
preset before anything else (`workflows.run_spec.resolve`), `data.*` after `--data` chose the
source; the run-level flags (`--max-updates`, `--num-workers`, ...) apply on top. The result is
the run's settings: MLflow params, `--dry-run`, and the comparison when a run name is reused.

An unknown section or field, or a value of the wrong type, is one `SpecError` naming the
field, the closest valid names and the expected type (exit 2, before Ray starts).
"""

from __future__ import annotations

import dataclasses
import difflib

import yaml

from workflows.errors import SpecError

SECTIONS = ("model", "train", "search", "data", "ensemble", "workflow")
# Fields a flag or the workflow's structure owns: --set would be silently overridden there.
OWNED = {"data.root": "--storage-path", "data.source": "--data",
         "workflow.preprocess": "the data.* section", "workflow.model": "the model.* section",
         "workflow.train": "the train.* section", "workflow.search": "the search.* section",
         "workflow.ensemble": "the ensemble.* section", "workflow.name": "--experiment",
         "workflow.data": "--data"}


@dataclasses.dataclass(frozen=True)
class Override:
    section: str
    field: str
    value: object
    text: str  # as given: "train.lr=0.5"


def parse(items: list[str] | tuple[str, ...]) -> list[Override]:
    """`section.field=value` strings -> Overrides (sections checked; fields in `apply`)."""
    out = []
    for text in items:
        key, eq, raw = text.partition("=")
        section, dot, name = key.strip().partition(".")
        if not eq or not dot or not name:
            raise SpecError(f"--set {text!r}: write section.field=value (e.g. train.lr=0.5)")
        if section not in SECTIONS:
            raise SpecError(f"--set {text}: no section {section!r}{_closest(section, SECTIONS)}; "
                            f"sections: {', '.join(SECTIONS)}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw  # a plain string that YAML cannot read (e.g. "a: b: c")
        out.append(Override(section, name, value, text))
    return out


def _closest(name: str, names) -> str:
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


def _coerce(o: Override, field: dataclasses.Field, current):
    """The value in the field's type; a SpecError naming the type otherwise."""
    v, want = o.value, str(field.type)
    kind = _kind(want, current)

    def bad():
        return SpecError(f"--set {o.text}: {o.section}.{o.field} takes {want}, not {v!r}")

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
    if kind == "str":
        return o.text.partition("=")[2].strip()  # as typed: "1e-4" stays a string here
    if kind == "dict" and not isinstance(v, dict):
        raise bad()
    if kind == "seq":
        if not isinstance(v, list):
            raise bad()
        return tuple(tuple(x) if isinstance(x, list) else x for x in v)
    return v


def _apply_to(obj, overrides: list[Override], section: str):
    if not overrides:
        return obj
    fields = {f.name: f for f in dataclasses.fields(obj)}
    changes = {}
    for o in overrides:
        if f"{section}.{o.field}" in OWNED:
            raise SpecError(f"--set {o.text}: {section}.{o.field} is set by "
                            f"{OWNED[f'{section}.{o.field}']}")
        if o.field not in fields:
            raise SpecError(f"--set {o.text}: {type(obj).__name__} has no field {o.field!r}"
                            f"{_closest(o.field, fields)}")
        changes[o.field] = _coerce(o, fields[o.field], getattr(obj, o.field))
    try:
        return dataclasses.replace(obj, **changes)
    except (ValueError, TypeError) as err:
        given = " ".join(f"--set {o.text}" for o in overrides)
        raise SpecError(f"{given}: {err}") from None


def apply(cfg, overrides: list[Override]):
    """The preset `cfg` (a WorkflowConfig) with every section but `data` overridden."""
    by = {s: [o for o in overrides if o.section == s] for s in SECTIONS}
    for o in by["data"]:  # checked now, applied once --data chose the source (`apply_data`)
        _apply_to(cfg.preprocess, [o], "data")
    cfg = _apply_to(cfg, by["workflow"], "workflow")
    return cfg.replace(model=_apply_to(cfg.model, by["model"], "model"),
                       train=_apply_to(cfg.train, by["train"], "train"),
                       search=_apply_to(cfg.search, by["search"], "search"),
                       ensemble=_apply_to(cfg.ensemble, by["ensemble"], "ensemble"))


def apply_data(pre, overrides: list[Override]):
    """The preprocessing settings the run's data source resolved to, with `data.*` applied."""
    return _apply_to(pre, [o for o in overrides if o.section == "data"], "data")
