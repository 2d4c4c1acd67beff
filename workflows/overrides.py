"""`--set section.field=value`: any setting of a preset changed on the command line.

    --set model.dropout=0.3 --set train.lr=0.5 --set data.vocab_size=16000
    --set model.encoder_layers='[[512, 3], [512, 3]]' --set search.beam=10

Sections are the parts of a `WorkflowConfig`: `model` (`convs2s.config.ModelConfig`), `train`
(`TrainConfig`), `search` (`SearchConfig`), `data` (`preprocessing.config.PreprocessConfig`),
`ensemble` (`EnsembleConfig`) and `workflow` (the config's own fields: `num_workers`,
`use_gpu`, `cpus_per_worker`, ...). A value is read as YAML (numbers, true / false, null,
lists) and must fit the field's current type; strings need no quotes. Overrides change the
preset before anything else (`workflows.run_spec.resolve`), `data.*` after `--data` chose the
source; the run-level flags (`--max-updates`, `--num-workers`, ...) apply on top (`--src`,
`--tgt`, `--split`: as data.* changes after the --set ones, checked with them once). The result
is the run's settings: MLflow params, `--dry-run`, and the comparison when a run name is
reused.

An unknown section or field, or a value of the wrong type, is one `SpecError` naming the
field, the closest valid names and the expected type (exit 2, before Ray starts).

A `--config` file's settings that differ from the preset it names, or that it lists under
`explicit:`, apply as --set changes too (`file_settings`), so that a value in the file counts
as set on purpose exactly as its --set did.
"""

from __future__ import annotations

import dataclasses

from storage.settings import Change as Override
from storage.settings import SettingError, apply_changes, closest, read_value
from workflows.errors import SpecError

SECTIONS = ("model", "train", "search", "data", "ensemble", "workflow")
# Fields a flag or the workflow's structure owns: --set would be silently overridden there.
OWNED = {"data.root": "--storage-path", "data.source": "--data",
         "workflow.preprocess": "the data.* section", "workflow.model": "the model.* section",
         "workflow.train": "the train.* section", "workflow.search": "the search.* section",
         "workflow.ensemble": "the ensemble.* section", "workflow.name": "--experiment",
         "workflow.data": "--data"}


def parse(items: list[str] | tuple[str, ...]) -> list[Override]:
    """`section.field=value` strings -> Overrides (sections checked; fields in `apply`)."""
    out = []
    for text in items:
        key, eq, raw = text.partition("=")
        section, dot, name = key.strip().partition(".")
        if not eq or not dot or not name:
            raise SpecError(f"--set {text!r}: write section.field=value (e.g. train.lr=0.5)")
        if section not in SECTIONS:
            raise SpecError(f"--set {text}: no section {section!r}{closest(section, SECTIONS)}; "
                            f"sections: {', '.join(SECTIONS)}")
        out.append(Override(section, name, read_value(raw), text))
    return out


def _apply_to(obj, overrides: list[Override], section: str):
    try:
        return apply_changes(obj, overrides, section, OWNED)
    except SettingError as err:
        raise SpecError(str(err) + _elsewhere(overrides, obj, err)) from None


def _elsewhere(overrides: list[Override], obj, err: SettingError) -> str:
    """Where a field `obj`'s section lacks is a setting of another section (train.dropout is
    model.dropout, train.max_tokens data.max_tokens, train.lenpen search.lenpen): said after
    `err`, the refusal of that very field, whose suggestions are the section's own names."""
    from convs2s.config import ModelConfig, SearchConfig, TrainConfig
    from preprocessing.config import PreprocessConfig
    from workflows.workflow_config import EnsembleConfig, WorkflowConfig

    mine = {f.name for f in dataclasses.fields(obj)}
    where = {"model": ModelConfig, "train": TrainConfig, "search": SearchConfig,
             "data": PreprocessConfig, "ensemble": EnsembleConfig, "workflow": WorkflowConfig}
    for o in overrides:
        if o.field in mine or not str(err).startswith(f"{o.origin} {o.text}: ") \
                or "has no field" not in str(err):
            continue
        found = [f"{name}.{o.field}" for name, cls in where.items()
                 if o.field in {f.name for f in dataclasses.fields(cls)}
                 and f"{name}.{o.field}" not in OWNED]
        if found:
            return f"; {o.field} is a setting of {' / '.join(found)}"
        if o.field in ("batch_size", "batch_tokens", "max_batch_tokens"):  # (other tools')
            return ("; batches are cut by padded tokens, data.max_tokens, each worker's (and "
                    "at most data.max_sentences sentences)")
        return ""
    return ""


def apply(cfg, overrides: list[Override]):
    """The preset `cfg` (a WorkflowConfig) with every section overridden; `data.*` is applied
    again once --data chose the source (`apply_data`)."""
    by = {s: [o for o in overrides if o.section == s] for s in SECTIONS}
    # data.*: checked now, all together (data.src_lang=fr with data.tgt_lang=en swaps the
    # sides, where one alone names one language twice) and with the workflow's own checks (a
    # valid split, every test split); applied once --data chose the source (`apply_data`)
    # The workflow.* changes are checked with them: one check of both
    # (update_sentences with data.max_sentences; test_sets with data.splits), not each with
    # the other's preset values
    pre = _apply_to(cfg.preprocess, by["data"], "data")
    try:
        cfg = apply_changes(cfg, by["workflow"], "workflow", OWNED,
                            also={"preprocess": pre} if by["data"] else None,
                            also_given=by["data"])
    except SettingError as err:
        raise SpecError(str(err) + _elsewhere(by["workflow"], cfg, err)) from None
    model = _apply_to(cfg.model, by["model"], "model")
    train = _apply_to(cfg.train, by["train"], "train")
    from convs2s.config import unused_setting

    for o in by["train"]:  # (a setting the run's optimizer or lr schedule never reads)
        if why := unused_setting(train, o.field):
            raise SpecError(f"{o.origin} {o.text}: {why}")
    if any(o.field == "dropout" for o in by["model"]) \
            and not any(o.field == "dropout_by_passes" for o in by["train"]):
        # --set model.dropout=...: that dropout throughout, even the preset's own value, not
        # the passes table's choice (set both to keep a table)
        train = train.replace(dropout_by_passes=())
    search = _apply_to(cfg.search, by["search"], "search")
    ensemble = _apply_to(cfg.ensemble, by["ensemble"], "ensemble")
    try:  # (the workflow's checks across sections: average_last within keep_last)
        return cfg.replace(model=model, train=train, search=search, ensemble=ensemble)
    except ValueError as err:
        raise SpecError(str(err)) from None


def apply_data(pre, overrides: list[Override]):
    """The preprocessing settings the run's data source resolved to, with `data.*` applied."""
    return _apply_to(pre, [o for o in overrides if o.section == "data"], "data")


# A --config file's sections (WorkflowConfig.to_dict) and the --set section of each.
FILE_SECTIONS = {"preprocess": "data", "model": "model", "train": "train", "search": "search",
                 "ensemble": "ensemble"}


def file_settings(cfg, base, explicit, origin: str) -> list[Override]:
    """The settings of a `--config` file (`cfg`, a WorkflowConfig) that count as set on
    purpose, as --set changes of the preset the file was written from (`base`): every one
    whose value differs from that preset's, and every one the file lists under `explicit`
    (the paths of a --set of the preset's own value: `preprocess.max_tokens`, `num_workers`).
    So a file written by `--dry-run --format yaml` resolves to the same run as the preset
    with its --set did: its data settings are kept on the demo corpus, its update_freq and
    max_tokens over the preset's update plan and float32 CPU batches, its dropout over the
    passes table. `origin` heads the error lines ("--config FILE:")."""
    if not isinstance(explicit, list) or not all(isinstance(p, str) for p in explicit):
        raise SpecError(f"{origin} explicit: give a list of setting paths "
                        "(e.g. [preprocess.max_tokens, train.lr])")
    fields = {f"{name}.{f.name}" if name else f.name: (name, f.name)
              for name in ("", *FILE_SECTIONS)
              for f in dataclasses.fields(getattr(cfg, name) if name else cfg)
              if name or f.name not in FILE_SECTIONS}
    for path in explicit:
        if path not in fields:
            raise SpecError(f"{origin} explicit: {path}: no such setting"
                            f"{closest(path, fields)}")
    out = []
    for path, (name, field) in fields.items():
        value = getattr(getattr(cfg, name) if name else cfg, field)
        if path not in explicit and value == getattr(getattr(base, name) if name else base,
                                                     field):
            continue
        section = FILE_SECTIONS.get(name, "workflow")
        key = f"{section}.{field}"
        if key in ("workflow.name", "workflow.data"):  # the file's own, as a preset's
            continue
        if key in OWNED:
            raise SpecError(f"{origin} {path}: set by {OWNED[key]}, not in the file (leave "
                            "the preset's value)")
        out.append(Override(section, field, value, f"{path}={value!r}", origin))
    return out
