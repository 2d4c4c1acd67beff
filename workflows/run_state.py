"""A workflow run's folder and resume state: what every stage needs (the run tree: where to
track, the parent run, the run directory) and what an earlier invocation of the same run
finished.

`<storage>/<run name>/workflow.json` records each finished training run (with the digest of
its settings and data), each logged model (with the stamp of its weights) and each scored
(job, test set) pair (with the stamp of the weights it scored and its child run). It is
rewritten atomically, so a crash never leaves half a file; new weights make every score and
model of the run stale.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from storage import location, move_tree, write_whole
from workflows.errors import SpecError
from workflows.run_tree import RunTree


def digest(obj) -> str:
    """A short, stable digest of JSON-able settings (what makes a training run the same)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_workflow_json(path) -> dict:
    """A run's workflow.json, or a SpecError naming it where it is not a JSON object (damaged:
    cut short by a disk that filled, edited by hand)."""
    text = path.read_text()
    try:
        state = json.loads(text)
    except ValueError as err:
        state = err
    if not isinstance(state, dict):
        why = f"not readable JSON ({state})" if isinstance(state, ValueError) else \
            "not a JSON object"
        raise SpecError(f"{path}: {why}; restore it from a copy, or give another --run-name "
                        "(the run's checkpoints and data stay where they are)")
    return state


@dataclass
class StageContext:
    """What every stage needs: the run tree (where to track, the parent run, the run folder)
    and the run's resume state (workflow.json)."""

    tree: RunTree
    skipped: list[str] = field(default_factory=list)
    # The run folder's lease held by the command (storage.lease.LeaseRef): its training
    # workers check it before each checkpoint (TrainJob.lease), the driver before each record
    # (`save_state`); None: none held
    lease: object = None

    @property
    def run_dir(self) -> Path:  # <storage>/<run name>
        return self.tree.run_dir

    def state(self) -> dict:
        """{"train": {name: {key, result}}, "models": {job: {stamp, model_id}},
        "eval": {"<job>/<test set>": {stamp, run_id, metrics, hyp_path}}}"""
        try:
            state = read_workflow_json(self.run_dir / "workflow.json")
        except FileNotFoundError:
            state = {}
        for part in ("train", "models", "eval"):
            state.setdefault(part, {})
        return state

    def save_state(self, state: dict) -> None:
        # the old file or the new, never a part, and flushed to the disk before its rename (an
        # unflushed rename read as an empty workflow.json after a power loss, and the run was
        # refused until the file was mended by hand); an object: one PUT. Only while the
        # command holds the run's lease: one whose renewals went unanswered past its ttl
        # (storage down, the driver stalled) may have been taken over, and wrote on
        if self.lease is not None:
            self.lease.check("recording the run's state in workflow.json")
        write_whole(self.run_dir / "workflow.json",
                    json.dumps(state, indent=1, default=str).encode())


# --- reusing a run name -----------------------------------------------------------------------

BUDGETS = ("max_epochs", "max_updates", "max_time")  # may grow on a rerun: training continues


def result_settings(spec, named_revision: bool = False) -> dict[str, str]:
    """What decides a workflow run's results (flattened, as strings): its data (all but the
    evaluation-only test splits and the output root), the task kind, model, optimization
    (budgets aside), search and ensemble. A rerun under the same name must keep them.
    `named_revision`: a hub dataset's revision name too, as recorded before 2026-12-07 (a
    sweep trial's key of then)."""
    from convs2s.tracking.runs import flatten_params
    from workflows.run_spec import BPE_SETTINGS, preprocess_params

    data = preprocess_params(spec.data)
    data["splits"] = {s: data["splits"][s] for s in ("train", "valid")}
    if spec.init_from:  # the checkpoint's vocabulary encodes the data: no BPE is learned (a
        # run that set these before they were refused with --init-from resumes without them)
        for k in BPE_SETTINGS:
            data.pop(k, None)
    if spec.data.source == "hub" and not named_revision:
        # The commit it resolves to is the run's input identity (`input_identity`): a branch
        # name and the commit it stood at are the same data, and another commit is refused
        # there, saying which (a run whose branch moved goes on pinned to the commit)
        data.pop("hub_revision", None)
    train = {k: v for k, v in spec.train.to_dict().items() if k not in BUDGETS}
    # The update's size: workers (each a GPU with --use-gpu) x micro-batches x tokens.
    update = {"workers": spec.num_workers, "gpus": spec.use_gpu}
    return flatten_params({"task_kind": spec.task_kind, "data": data, "update": update,
                           "model": spec.model.to_dict(), "train": train,
                           "search": spec.search.to_dict(),
                           "ensemble": {"runs": spec.ensemble.runs,
                                        "average_last": spec.ensemble.average_last},
                           **({"init_from": spec.init_from} if spec.init_from else {})})


def input_identity(spec) -> dict[str, str]:
    """The identity of every input the trained weights depend on: the training and validation
    data (a hub commit, or each file's path, size and modification time, as the preprocessing
    source resolves them) and the checkpoint fine-tuning starts from. Recorded with the run; a
    rerun whose inputs changed under the same run name is refused (`reuse_problem`). Test sets
    are not here: evaluation re-scores when their text changes (workflows/steps.py)."""
    from convs2s.io.staging import weights_stamp
    from preprocessing.sources import resolve_split

    out = {}
    for split in ("train", "valid"):
        if split in spec.data.splits:
            fingerprint = resolve_split(spec.data, split).fingerprint
            out[f"data.{split}"] = digest(fingerprint)
            if fingerprint.get("commit"):  # a hub dataset's commit, as it is: named when it moves
                out[f"data.{split}{HUB_COMMIT}"] = fingerprint["commit"]
    if spec.init_from:
        out["init_from"] = digest(weights_stamp([spec.init_from]))
    return out


HUB_COMMIT = ".hub_commit"  # input_identity's key of a hub split's commit: data.<split>.hub_commit


def _inputs_changed(spec, recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The inputs whose identity differs from the recorded one's; a hub dataset whose revision
    now resolves to another commit names the commit the run trained on, which it can go on
    from (`--set data.hub_revision=<commit>`)."""
    out = []
    for k in sorted(set(recorded) & set(now)):
        if k.endswith(HUB_COMMIT) or recorded[k] == now[k]:
            continue
        was, commit = recorded.get(k + HUB_COMMIT), now.get(k + HUB_COMMIT)
        if was and commit and was != commit:
            out.append(f"{k}: hub dataset {spec.data.hub_repo} at revision "
                       f"{spec.data.hub_revision!r} is commit {commit[:12]} now, the run trained "
                       f"on commit {was[:12]} (--set data.hub_revision={was} goes on with it)")
        else:
            out.append(f"{k}: its files changed since the run trained on them")
    return out


def budgets(spec) -> dict[str, float]:
    return {k: getattr(spec.train, k) for k in BUDGETS}


# Settings recorded only where set (run_spec.preprocess_params): absent, they are this value
# (none, which is also how the code before them behaved)
ABSENT_MEANS = {"data.token_map": "{}"}


# Settings of how a run trains, not of what it trains: logging, checkpoints, and how the same
# step is computed (compiled or eager, the convolution's kernels, padded shapes, CUDA graphs,
# DDP's buckets: the same numbers to float32 rounding). A rerun may change them: more frequent
# checkpoints, fewer kept as storage fills, a faster step on the same run. And how many
# sentences a search batch takes: an evaluation that ran out of memory after days of training
# goes on with smaller batches (they were refused, leaving a new run name or --restart, which
# train again). Scores made before stand; with a shortlist or int8 weights a sentence's
# translation may depend on its batch, and the change is in the parent's convs2s.changed tag.
# Preprocessing's encoder tasks and how its rows meet make the same data folder (its
# `_NOT_OUTPUT`): a cluster with more CPUs, or files after Ray's exchange ran out of memory.
HOW_NOT_WHAT = tuple(f"train.{k}" for k in (
    "log_interval", "checkpoint_interval", "keep_last", "compile", "fuse", "conv",
    "static_shapes", "cuda_graphs", "ddp_bucket_mb")) + ("search.max_sentences",
                                                          "search.max_tokens",
                                                          "data.encode_tasks", "data.exchange")


def train_names(runs: int) -> list[str]:
    """The training runs' names (folders, MLflow child runs): `train`, or `train_1` ... for an
    ensemble's members."""
    return ["train"] if runs == 1 else [f"train_{k + 1}" for k in range(runs)]


def _update_size(settings: dict[str, str]) -> dict[str, str]:
    """`settings` with the update's size as micro-batches per update over all workers
    (update.workers x train.update_freq; each micro-batch one batch of data.max_tokens), not its
    two factors, and without HOW_NOT_WHAT: a run continued on fewer GPUs that accumulates more
    micro-batches (the trainer resumes its epoch on another number of ranks) trains the same
    updates."""
    out = {k: v for k, v in settings.items() if k not in HOW_NOT_WHAT}
    try:  # (a record edited by hand to no numbers: its two settings compared as they are)
        micro = int(out["update.workers"]) * int(out.get("train.update_freq", "1"))
    except (KeyError, ValueError):
        return out
    del out["update.workers"]
    out.pop("train.update_freq", None)
    return {**out, "update.micro_batches": str(micro)}


def changed_settings(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """'key: old -> new' for every setting both sides name and that differs (the update's size
    as its micro-batches, how-not-what settings aside: `_update_size`). A key only one side
    names is a field added (with the earlier behaviour as its default) or retired by a newer
    version of the code, not a change of the run; except one recorded only where set
    (ABSENT_MEANS: a token_map given to a run that had none is a change)."""
    before = {**ABSENT_MEANS, **_update_size(before)}
    after = {**ABSENT_MEANS, **_update_size(after)}
    return [f"{k}: {_shown(before[k])} -> {_shown(after[k])}"
            for k in sorted(set(before) & set(after)) if not _same(before[k], after[k])]


def _same(before: str, after: str) -> bool:
    """Whether two recorded values of a setting are the same value. A long value recorded
    before 2026-12-07 was cut at MLflow's length with no digest: it matches a value cut now
    (`param_value`) whose start it shares (what followed the cut is not known)."""
    if before == after:
        return True
    from convs2s.tracking.runs import CUT_MARK, PARAM_CHARS

    cut = after.rfind(CUT_MARK)
    return len(before) == PARAM_CHARS and cut > 0 and CUT_MARK not in before \
        and before[:cut] == after[:cut]


def _shown(value: str, chars: int = 200) -> str:
    return value if len(value) <= chars else value[:chars] + "..."


def _store(uri: str) -> str:
    """A tracking URI as a run's record keeps it: without a password, which may change."""
    from storage.redact import redact_uri

    return redact_uri(uri).rstrip("/")


def _made_elsewhere(spec, state: dict) -> str | None:
    """The folder a run's record says its training was made in, where that is another folder
    holding the same run (its workflow.json records the same MLflow training run): `cp -r
    runs/r1 other/r1`, a bucket sync, whose record names the original's checkpoints and MLflow
    runs. None for a run in its own folder, one moved (the original gone, or only the empty
    folders a bucket move leaves), or renamed with a new run under its old name."""
    import os

    here = location(spec.run_dir)
    for name, done in (state.get("train") or {}).items():
        result = (done.get("result") or {}) if isinstance(done, dict) else {}
        made, run_id = result.get("run_dir"), result.get("run_id")
        if not isinstance(made, str):
            continue
        try:
            made = location(made).parent
            if str(made) == str(here):
                continue
            if isinstance(made, Path) and isinstance(here, Path) and made.is_dir() \
                    and here.is_dir() and os.path.samefile(made, here):  # (through a link)
                continue
            theirs = read_workflow_json(made / "workflow.json")
        except Exception:  # noqa: BLE001 - gone, unreadable, a store this host cannot reach
            continue
        held = ((theirs.get("train") or {}).get(name) or {}).get("result") or {}
        if isinstance(held, dict) and held.get("run_dir") == result.get("run_dir") \
                and held.get("run_id") == run_id:
            return str(made)
    return None


def reuse_problem(spec, sweep: bool = False, trial: bool = False) -> str | None:
    """Why `spec` cannot run under its run name, or None: the run folder holds a run started
    with other settings (training would resume its weights under the new settings). Checked
    before anything starts; `--restart` starts the run's training over instead (not for a
    sweep's `trial`: the sweep refuses --restart, and a new sweep --run-name is the fix). A
    folder that holds no workflow run of this project is refused too (`foreign_problem`;
    `sweep`: `spec` is a sweep's base, whose folder is the sweep's)."""
    if problem := foreign_problem(spec, sweep):
        return problem
    path = spec.run_dir / "workflow.json"
    if spec.restart or not path.is_file():
        return None
    state = read_workflow_json(path)
    if (tracked := state.get("experiment")) not in (None, spec.experiment):
        # (its stages finished under the other experiment would be skipped, their runs left
        # there: the new experiment would show a run without its training and scores; a
        # sweep's trials too, their finished ones counted in the new sweep run's summary)
        return (f"run {spec.run_name!r} in {spec.run_dir} is tracked in MLflow experiment "
                f"{tracked!r}, where its runs are: give --experiment {tracked} to go on with "
                "it, or another --run-name")
    if (store := state.get("tracking")) not in (None, _store(spec.tracking_uri)):
        # (its finished stages would be skipped, their runs in the other store: the rerun's
        # parent there had no training run and no registered model, and every score was
        # made again; the default store is mlflow.db in the folder a command starts in)
        return (f"run {spec.run_name!r} in {spec.run_dir} is tracked at {store}, where its "
                f"runs are: give --tracking-uri {store}"
                + (" with your password for ***" if "***" in store else "")
                + " (or set MLFLOW_TRACKING_URI) to go on with it, or another --run-name (the "
                "same store at another address, e.g. localhost for 127.0.0.1 or a new host "
                "name: write the address as \"tracking\" in the run's workflow.json)")
    if made := _made_elsewhere(spec, state):
        return (f"run folder {spec.run_dir} is a copy of {made} (its workflow.json records "
                "that folder's training, and that folder is there): the copy would score that "
                "folder's weights and take over its MLflow runs. Go on with the run in "
                f"{made}; or, to go on here instead, move that run away first")
    recorded = state.get("settings")
    if recorded is None:  # a folder from before settings were recorded: nothing to compare
        return None
    current = result_settings(spec)
    # a setting the run never reads (momentum under Adam) is no change of it: a run recorded
    # with one, refused now, goes on once the setting is left out
    from convs2s.config import reads

    unread = {f"train.{k}" for k in spec.train.to_dict() if not reads(spec.train, k)}
    changed = changed_settings({k: v for k, v in recorded.items() if k not in unread},
                               {k: v for k, v in current.items() if k not in unread})
    # --init-from on one side only is a change of the run (not a field a version added).
    if ("init_from" in recorded) != ("init_from" in current):
        changed.append(f"init_from (--init-from): {recorded.get('init_from', '(none)')} -> "
                       f"{current.get('init_from', '(none)')}")
    changed += _lowered(spec, state)
    recorded_inputs = state.get("inputs") or {}
    if recorded_inputs:
        changed += _inputs_changed(spec, recorded_inputs, input_identity(spec))
    if not changed:
        return None
    shown = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6
                                      else "")
    # The batches' budget alone: the run goes on with its own (a preset may choose the budget
    # by the machine, float32 CPUs taking smaller batches: a rerun from another host differs)
    budget = [c for c in changed if c.startswith("data.max_tokens: ")]
    if len(changed) == 1 and budget and not trial:
        was = budget[0].removeprefix("data.max_tokens: ").split(" -> ")[0]
        shown += f"; --set data.max_tokens={was} resumes it with its own batches"
    if trial:
        return (f"its run was started with other settings ({shown}): give the sweep a new "
                "--run-name for these settings; a larger --max-epochs / --max-updates / "
                "--max-time alone continues its trials, a smaller one is refused")
    if all(c.startswith("search.") for c in changed):  # the same training, other scoring
        shown += ("; to score its trained checkpoints with other search settings, without "
                  "training again: python -m workflows.evaluation --run-dir "
                  + " ".join(str(spec.run_dir / r) for r in train_names(spec.ensemble.runs))
                  + " --test NAME SRC REF LANG --set lenpen=... (README, Changing settings)")
    return (f"run {spec.run_name!r} in {spec.storage} was started with other settings "
            f"({shown}): give a new --run-name for these settings, or add --restart to "
            "train this run over (its earlier training and scores are kept aside in its "
            "folder, and its MLflow runs say so); a larger --max-epochs / --max-updates / "
            "--max-time alone continues a run, a smaller one is refused")


def foreign_problem(spec, sweep: bool = False) -> str | None:
    """Why the folder of `spec`'s run name is not a workflow run's to use, or None. A workflow
    run writes workflow.json before any stage (`record_settings`), so a folder with training,
    weights or evaluation folders but no workflow.json is someone else's: training there
    would resume or prune its checkpoints, and --restart would move them aside. A sweep's
    folder (Ray Tune's tune/, its summary) holds trials, not a run: refused unless `sweep`
    (the sweep's own base spec, resuming it)."""
    run_dir = spec.run_dir
    if (run_dir / "workflow.json").is_file():
        return None
    if not sweep and ((run_dir / "tune").is_dir() or (run_dir / "summary.json").is_file()):
        return (f"{run_dir} holds a sweep named {spec.run_name!r}, not a workflow run: give "
                "the run another --run-name")
    if found := _outputs(run_dir):
        return (f"{run_dir} holds {', '.join(p.name + '/' for p in found)} but no workflow "
                "run of this project (no workflow.json): nothing there is moved or written; "
                "choose another --run-name")
    return None


def _shrunk(before: dict, after: dict) -> list[str]:
    """Budgets the new run lowers: the run may have trained past them. 0 is no limit (a run
    of --max-updates alone has max_epochs 0), so a limit where there was none is smaller too;
    a budget only one side records (an older workflow.json) is not compared."""
    def limit(value) -> float:
        return float(value) if value else math.inf

    return [f"{k}: {before[k] or 'no limit'} -> {after[k] or 'no limit'} (smaller)"
            for k in BUDGETS if k in before and k in after
            and limit(after[k]) < limit(before[k])]


def trained(run_dir) -> dict[str, int]:
    """{training folder: update of its newest whole checkpoint} of a run (train, train_1, ...;
    none yet: 0), read from the checkpoints' meta.json files."""
    from convs2s.io.checkpoint import list_checkpoints

    out = {}
    for folder in sorted(p for p in location(run_dir).iterdir() if p.is_dir()
                         and (p.name == "train" or p.name.startswith("train_"))) \
            if location(run_dir).is_dir() else ():
        out[folder.name] = max((i.update for i in list_checkpoints(folder)), default=0)
    return out


def _lowered(spec, state: dict) -> list[str]:
    """The budgets `spec` lowers (`_shrunk`) below the run's recorded ones; or, where those
    were raised and nothing has trained since (a --max-epochs 1000 meant as 100, stopped
    before an update was checkpointed), below the ones before: the raise, not yet spent, can
    be taken back (it was refused for good, a sweep's trials with it, which cannot
    --restart)."""
    lowered = _shrunk(state.get("budgets") or {}, budgets(spec))
    before = state.get("budgets_before")
    if lowered and isinstance(before, dict) and isinstance(before.get("budgets"), dict) \
            and before.get("trained") == trained(spec.run_dir):
        return _shrunk(before["budgets"], budgets(spec))
    return lowered


def record_settings(ctx: StageContext, spec) -> None:
    """Before any stage: with `--restart`, set the run's earlier training and scores aside,
    and its parent MLflow run with them (`RunTree.start_over`: the run's parent is a new run
    from then); then record the settings (what a later rerun must keep) and the budgets in
    workflow.json, and on the parent MLflow run a continuation (larger budgets) or a restart
    as tags."""
    from convs2s.tracking.runs import set_tags

    # (refused before the run started, `reuse_problem`; again here, before anything moves)
    if problem := foreign_problem(spec):
        raise SpecError(problem)
    state = ctx.state()
    settings, new_budgets = result_settings(spec), budgets(spec)
    tags = {}
    # a --restart interrupted while it set the earlier work aside: finished first, into the
    # folder it began (the rest of the earlier work must not be taken for this run's)
    restarting = state.get("restarting")
    changed = changed_settings(state.get("settings") or {}, settings)
    if restarting or spec.restart and (state["train"] or state["eval"]
                                       or _outputs(ctx.run_dir)):
        aside = set_aside(ctx, "; ".join(changed) or "--restart", restarting)
        # the parent run too: its params keep the earlier settings (MLflow keeps a param's
        # first value); the restarted run is a new parent with the new ones
        ctx.tree.start_over(cut_tag(f"restarted: {'; '.join(changed) or '--restart'}; the "
                                    f"earlier training and scores are in {aside}"))
        # The changes cut as convs2s.replaced's are: MLflow takes 8,000 characters a tag, and
        # cuts (or refuses) a longer one at its end, where the earlier work's folder is named
        tags["convs2s.restarted"] = (f"{time.strftime('%Y-%m-%d %H:%M:%S')}: trained over "
                                     f"({cut_tag('; '.join(changed)) or 'same settings'}); the "
                                     f"earlier training and scores are in {aside}")
        from workflows.lineage import mark_replaced

        mark_replaced(ctx.tree.uri, [m["model_id"] for m in state.get("models", {}).values()
                                     if m.get("model_id")], tags["convs2s.restarted"])
        state = {"train": {}, "eval": {}, "models": {}}
    elif spec.restart and changed:
        # Nothing trained yet (its preprocessing failed or was stopped): nothing to move, but
        # the parent run and its preprocess run hold the earlier settings as params (MLflow
        # keeps a param's first value): set apart, and a new parent described afresh
        why = f"restarted: {'; '.join(changed)}; nothing had been trained"
        ctx.tree.start_over(cut_tag(why))
        tags["convs2s.restarted"] = (f"{time.strftime('%Y-%m-%d %H:%M:%S')}: started over "
                                     f"({cut_tag('; '.join(changed))}); nothing had been "
                                     "trained")
    else:
        if state.get("budgets") and state["budgets"] != new_budgets:
            tags["convs2s.continued"] = ", ".join(
                f"{k} {state['budgets'].get(k)} -> {v}" for k, v in new_budgets.items()
                if state["budgets"].get(k) != v)
        # How it trains, changed on a rerun (the parent's params keep the first values)
        was = state.get("settings") or {}
        how = [f"{k}: {was[k]} -> {settings[k]}" for k in
               (*HOW_NOT_WHAT, "update.workers", "train.update_freq")
               if k in was and k in settings and was[k] != settings[k]]
        # What it is scored on (evaluation splits are not results' settings: a rerun may
        # score other or more test sets), but the parent's headline score and params name
        # the sets of its first call: a change is said
        tests = {k: str(v) for k, v in spec.test_sets.items()}
        if state.get("test_sets") not in (None, tests):
            how.append(f"test_sets: {_sets(state['test_sets'])} -> {_sets(tests)}")
        if how:
            tags["convs2s.changed"] = cut_tag(f"{time.strftime('%Y-%m-%d %H:%M:%S')}: "
                                              + "; ".join(how))
    # A hub run recorded before 2026-12-07 named its revision (main, refs/convert/parquet),
    # and its data folder is keyed by that name: kept for preprocessing to find the folder
    # when the run goes on pinned to the commit (`run_pipeline(revision_names=)`)
    before = state.get("settings") or {}
    if "data.hub_revision" in before and "data.hub_revision" not in settings:
        state.setdefault("data_keyed_by", before["data.hub_revision"])
    if state.get("budgets") not in (None, new_budgets):  # what trained under them: `_lowered`
        state["budgets_before"] = {"budgets": state["budgets"], "trained": trained(spec.run_dir)}
    state["settings"], state["budgets"] = settings, new_budgets
    state["experiment"], state["tracking"] = spec.experiment, _store(spec.tracking_uri)
    state["test_sets"] = {k: str(v) for k, v in spec.test_sets.items()}
    state["inputs"] = input_identity(spec)
    ctx.save_state(state)
    if tags:
        set_tags(ctx.tree.uri, ctx.tree.parent, tags)


def _sets(test_sets: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(test_sets.items())) or "none"


TAG_TEXT = 5000  # of MLflow's 8,000 characters a tag: the rest is the tag's own words


def cut_tag(text: str, limit: int = TAG_TEXT) -> str:
    """`text` as a tag's part: at most `limit` characters, a cut one ending in '...'."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _outputs(run_dir: Path) -> list[Path]:
    """The folders a restart sets aside: training runs, staged weights, evaluation outputs."""
    return sorted(p for p in run_dir.glob("*") if p.is_dir() and (
        p.name in ("eval", "weights") or p.name == "train" or p.name.startswith("train_")))


def set_aside(ctx: StageContext, why: str, into: str | None = None) -> Path:
    """Move the run's training, weights and evaluation folders to `<run>/replaced-<time>/` and
    re-key their MLflow runs to where their outputs went (named "... (replaced)"), so the new
    training starts from nothing and its runs are new ones. Returns the folder. The folder is
    recorded in workflow.json (`restarting`) before anything moves: in a bucket a move is a
    copy of every object, then their deletion, and an interrupted one is finished by the next
    command (`into`: the folder it began)."""
    if into:
        aside = ctx.run_dir / into
    else:
        aside = ctx.run_dir / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        if aside.exists():  # two restarts in one second: in a bucket the second would
            # overwrite the first's objects (a folder there is no object, so mkdir does not fail)
            aside = ctx.run_dir / f"{aside.name}-{uuid.uuid4().hex[:6]}"
        ctx.save_state({**ctx.state(), "restarting": aside.name})
    aside.mkdir(parents=True, exist_ok=True)
    for p in _outputs(ctx.run_dir):
        move_tree(p, aside / p.name)  # in a bucket: copied by the server, then deleted
    if ctx.tree.parent is not None:
        _rekey_runs(ctx.tree, aside, why)
    return aside


def _rekey_runs(tree: RunTree, aside: Path, why: str) -> None:
    from convs2s.tracking.runs import (RUN_KEY_TAG, bounded_http, mlflow_client, run_key,
                                       run_key_tags, warn_unreachable)

    try:
        with bounded_http():
            client = mlflow_client(tree.uri)
            exp = client.get_run(tree.parent).info.experiment_id
            runs = client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = "
                                                           f"'{tree.parent}'", max_results=1000)
            root = run_key(tree.run_dir)
            for r in runs:
                key = r.data.tags.get(RUN_KEY_TAG, "")
                rel = key[len(root) + 1:] if key.startswith(root + "/") else ""
                if rel.split("/")[0] in ("eval",) or rel == "train" or rel.startswith("train_"):
                    for tag, value in run_key_tags(run_key(aside / rel)).items():
                        client.set_tag(r.info.run_id, tag, value)  # (the digest too)
                    client.set_tag(r.info.run_id, "mlflow.runName",
                                   f"{r.info.run_name} (replaced)")
                    client.set_tag(r.info.run_id, "convs2s.replaced", cut_tag(why))
                    if r.info.status == "RUNNING":  # (left so by a crash: nothing ends it now)
                        client.set_terminated(r.info.run_id, "KILLED")
    except Exception as err:  # noqa: BLE001 - the folders moved; the runs keep their names
        warn_unreachable(tree.uri, "re-keying the replaced runs", err)
