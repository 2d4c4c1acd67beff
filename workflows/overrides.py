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

from convs2s.config import keep_explicit_dropout
from preprocessing.settings import Change as Override
from preprocessing.settings import SettingError, apply_changes, closest, read_value
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
        raise SpecError(str(err)) from None


def apply(cfg, overrides: list[Override]):
    """The preset `cfg` (a WorkflowConfig) with every section but `data` overridden."""
    by = {s: [o for o in overrides if o.section == s] for s in SECTIONS}
    for o in by["data"]:  # checked now, applied once --data chose the source (`apply_data`)
        _apply_to(cfg.preprocess, [o], "data")
    cfg = _apply_to(cfg, by["workflow"], "workflow")
    model = _apply_to(cfg.model, by["model"], "model")
    train = _apply_to(cfg.train, by["train"], "train")
    if not any(o.field == "dropout_by_passes" for o in by["train"]):
        # --set model.dropout=...: that dropout throughout, not the passes table's choice
        train = keep_explicit_dropout(train, cfg.model.dropout, model.dropout)
    return cfg.replace(model=model, train=train,
                       search=_apply_to(cfg.search, by["search"], "search"),
                       ensemble=_apply_to(cfg.ensemble, by["ensemble"], "ensemble"))


def apply_data(pre, overrides: list[Override]):
    """The preprocessing settings the run's data source resolved to, with `data.*` applied."""
    return _apply_to(pre, [o for o in overrides if o.section == "data"], "data")
