"""Every MLflow run of a workflow run is made, found and described here: the run tree.

    experiment <--experiment, default the workflow's name>
      [<sweep run name>]              a sweep (workflows/sweep.py, `RunTree.open` of its folder):
                                      its trials' parents are its children (`within`)
      <run name>                      parent (`RunTree.open`): the resolved RunSpec as params,
                                      the data as inputs, the headline scores as metrics
        preprocess                    `child`: the preprocessing settings and counts
        train (train_2, ...)          `child`, its id handed to convs2s.train.launch.fit
                                      (`TrainJob.run_id`): model / train / data params, the data
                                      as inputs, training metrics, checkpoints
        eval/<job>/<test set>         `child`, the ids handed to workflows.evaluation.evaluate_all
                                      (`run_ids`): the job, the test set (an input, with the
                                      scored logged model), scores

A run's key (tag `convs2s.run_key`, `convs2s.tracking.runs.run_key`) is the absolute path of what
it describes: the run folder `<storage>/<run name>` for the parent, `<run folder>/preprocess`,
`<run folder>/train`, `<run folder>/eval/<job>/<test set>`, the sweep's folder for a sweep. The
same `--run-name` and `--storage-path` find the same runs again (resume), and the runs of two
workflow runs never mix. Every run is described by `convs2s.tracking.runs.describe_run`
(params and inputs, once). The tracking URI is the spec's, resolved once
(`workflows.run_spec.resolve`). Used without a workflow, `fit` and `evaluate_all` find or make
their runs by the same keys.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from pathlib import Path

from convs2s.tracking.runs import describe_run, find_or_create_run, run_key
from storage import location
from workflows.errors import SpecError


@dataclass
class RunTree:
    uri: str
    experiment: str
    run_dir: Path  # <storage>/<run name>
    parent: str | None  # the parent run's id; None when tracking is unreachable
    # How `open` found the parent (its name, tags, the run it is a child of: `start_over`
    # makes the next one alike) and its status then (None: made by `open`)
    run_name: str = ""
    tags: dict | None = None
    within: str | None = None
    earlier_status: str | None = None

    @classmethod
    def open(cls, uri: str, experiment: str, run_dir: Path, run_name: str,
             tags: dict | None = None, within: str | None = None,
             restarting: bool = False) -> "RunTree":
        """The tree of the workflow run at `run_dir`, its parent run found or created (itself
        a child of run `within`: a sweep's trial under the sweep's run). `restarting` (a
        --restart): the parent's status before it is reopened is kept for `start_over` (one
        lookup more, made only then)."""
        from convs2s.tracking.runs import deleted_experiment, find_run

        if problem := deleted_experiment(uri, experiment):
            raise SpecError(problem)
        earlier = find_run(uri, experiment, run_key(run_dir)) if restarting else None
        parent = find_or_create_run(uri, experiment, run_key=run_key(run_dir),
                                    run_name=run_name, parent_run_id=within, tags=tags)
        return cls(uri, experiment, location(run_dir), parent, run_name, tags, within,
                   earlier[1] if earlier else None)

    def start_over(self, why: str) -> None:
        """A restart (`workflows.run_state.record_settings`): the parent run and its
        preprocess child are set apart as they are (named "... (superseded)", keyed apart,
        the parent's earlier status back): their params describe the earlier settings, and
        MLflow keeps a param's first value, so the new training's scores beside them would
        read as the old settings'. A new parent is made, the run's from now. (The train and
        eval children were re-keyed to the folder their outputs were moved to, `set_aside`.)"""
        from convs2s.tracking.runs import end_run, find_run, supersede_run

        if self.parent is None:
            return
        key = run_key(self.path("preprocess"))
        if found := find_run(self.uri, self.experiment, key):
            supersede_run(self.uri, found[0], key, "preprocess", why, status=found[1])
        supersede_run(self.uri, self.parent, run_key(self.run_dir), self.run_name, why)
        ended = self.earlier_status  # (a run its crash left RUNNING: killed)
        end_run(self.uri, self.parent, ended if ended in ("FINISHED", "FAILED") else "KILLED")
        self.parent = find_or_create_run(self.uri, self.experiment,
                                         run_key=run_key(self.run_dir), run_name=self.run_name,
                                         parent_run_id=self.within, tags=self.tags)
        self.earlier_status = None

    def child(self, name: str, stage: str, tags: dict | None = None) -> str | None:
        """The child run `name` (a path under the run folder, e.g. "preprocess")."""
        return find_or_create_run(self.uri, self.experiment, run_key=run_key(self.path(name)),
                                  run_name=name, parent_run_id=self.parent,
                                  tags={"convs2s.stage": stage, **(tags or {})})

    def adopt(self, run_id: str | None) -> None:
        """Make the recorded run of a stage that is skipped (finished earlier) a child of
        this tree's parent: a parent made anew (the earlier one deleted in the UI) had only
        the stages that ran again under it, the skipped ones left under the deleted one."""
        from convs2s.tracking.runs import PARENT_TAG, set_tags

        if run_id and self.parent:
            set_tags(self.uri, run_id, {PARENT_TAG: self.parent})

    def supersede(self, run_id: str, name: str, why: str) -> None:
        """Set child `name`'s run `run_id` apart before its outputs are made again for other
        inputs (`why`): it keeps its params, scores and artifacts, is named "<name>
        (superseded)" and keyed apart, so the next `child(name)` is a new run, described
        afresh. (A restart's `set_aside` does this for every run of a tree.)"""
        from convs2s.tracking.runs import supersede_run

        supersede_run(self.uri, run_id, run_key(self.path(name)), name, why)

    def path(self, name: str) -> Path:
        """Where the outputs of child `name` live (and what keys its run)."""
        return self.run_dir / name

    def describe(self, run_id: str | None, params: dict | None = None, datasets=(),
                 model_ids=()) -> None:
        describe_run(self.uri, run_id, params, datasets, model_ids)

    def end_open(self, status: str, under: Path | None = None, also: tuple[str, ...] = (),
                 since: float = 0.0) -> list[str]:
        """End as `status` (KILLED, FAILED) every run of the tree still RUNNING whose key is
        `under` (default: the tree's folder) or below it, and those ended with a status in
        `also` at `since` (a time.time()) or later; the ids ended. For runs whose process was
        stopped before it could end them: a sweep's trials that Ray Tune stopped or that
        crashed (their workflow's own `end_run` never ran, or ran on an error the stop itself
        caused: `also=("FAILED",)` since the trials started)."""
        from convs2s.tracking.runs import (RUN_KEY_TAG, bounded_http, end_run, mlflow_client,
                                           warn_unreachable)

        root = run_key(under if under is not None else self.run_dir)
        ended: list[str] = []
        if self.parent is None:  # tracking unreachable: nothing was recorded
            return ended
        # the keys that start with `root`, up to its first quote or backslash (a filter string
        # has no escapes; LIKE's `_` matches any character, and `root` is also the start of
        # `root2`: the exact test is below)
        like = re.split(r"['\"\\\\]", root)[0]
        try:
            with bounded_http():
                client = mlflow_client(self.uri)
                exp = client.get_run(self.parent).info.experiment_id
                found = []
                for current in ("RUNNING", *also):
                    token = None
                    while True:  # every page first: ending runs would shift the pages' offsets
                        page = client.search_runs(
                            [exp], filter_string=f"attributes.status = '{current}' and "
                                                 f"tags.`{RUN_KEY_TAG}` LIKE '{like}%'",
                            max_results=1000, page_token=token)
                        found += [r.info.run_id for r in page
                                  if ((key := r.data.tags.get(RUN_KEY_TAG, "")) == root
                                      or key.startswith(root + "/"))
                                  and (current == "RUNNING"
                                       or (r.info.end_time or 0) >= since * 1e3)]
                        token = page.token
                        if not token:
                            break
                if under is None:  # the tree's own run, whatever its status now
                    found.append(self.parent)
                for run_id in dict.fromkeys(found):
                    client.set_terminated(run_id, status=status)
                    ended.append(run_id)
                return ended
        except Exception as err:  # noqa: BLE001 - the runs stay RUNNING; the outputs are kept
            warn_unreachable(self.uri, "ending the runs left open", err)
            if under is None and self.parent not in ended:  # at least the tree's own run
                end_run(self.uri, self.parent, status)
            return ended
