"""A training job's MLflow run, the same under every launcher (`convs2s.train.launch.fit` on Ray
Train, `convs2s.train.local.fit_local` without it): opened before the loop, closed after it.

    uri, run_id = open_train_run(job, run_dir, files, {"num_workers": 2, "use_gpu": False})
    ...                                   # the loop; rank 0 logs metrics into run_id
    close_train_run(uri, run_id, final, run_dir)    # or fail_train_run(uri, run_id, err)

Opening finds or creates the run keyed by its run folder (`tracking.run_key`: the same run name +
storage path logs into the same run), or takes the one a workflow's run tree made
(`TrainJob.run_id`); tags it with the code version; checks a fine-tuning start point once
(`init_from`); logs the params and the config artifacts (`train_job.json` with the tracking URI
redacted, the text pipeline's files). Closing tags why training stopped, logs `best/` and ends
the run. MLflow is imported by `convs2s.tracking.runs` when these are called, never at import.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from convs2s.io.checkpoint import BEST_DIR, META_FILE
from convs2s.tracking.runs import (
    code_version,
    describe_run,
    end_run,
    find_or_create_run,
    log_artifacts,
    resolve_tracking_uri,
    run_key,
    set_tags,
    stopped_status,
)
from convs2s.tracking.redact import redact_uri
from convs2s.train.data import TrainFiles
from convs2s.train.job import TrainJob
from convs2s.train.resume import initial_weights


def open_train_run(job: TrainJob, run_dir, files: TrainFiles, launcher: dict,
                   tags: dict | None = None) -> tuple[str, str | None]:
    """(tracking URI, run id) of the job's run, described: `launcher` adds the launcher's own
    params (`job.<key>`), `tags` its own tags. The run id is None where tracking is down."""
    uri = resolve_tracking_uri(job.tracking_uri)
    if job.init_from:  # a checkpoint that does not fit fails here, not on every worker restart,
        initial_weights(job)  # and before a run is made or reopened (it was left RUNNING)
    version = code_version()
    run_tags = {"convs2s.code_version": version, **(tags or {}), **job.tags}
    if job.run_id is not None:  # made by the caller (a workflow's run tree)
        run_id = job.run_id
        set_tags(uri, run_id, run_tags)
    else:  # keyed by its run folder, as every run of the project (tracking.run_key)
        run_id = find_or_create_run(uri, job.experiment_name, run_key=run_key(run_dir),
                                    run_name=job.run_name, parent_run_id=job.parent_run_id,
                                    tags=run_tags)
    if job.init_from:
        set_tags(uri, run_id, {"convs2s.init_from": job.init_from})
    job_params = {**launcher, "vocab_size": job.vocab_size, "code_version": version,
                  "train_batches": files.total,
                  **({"tgt_vocab_size": job.tgt_vocab_size} if job.tgt_vocab_size else {}),
                  **({"init_from": job.init_from} if job.init_from else {})}
    describe_run(uri, run_id, {"model": job.model.to_dict(), "train": job.train.to_dict(),
                               "data": job.data_manifest, "job": job_params},
                 list(job.datasets))
    _log_configs(uri, run_id, job)
    return uri, run_id


def close_train_run(uri: str, run_id: str | None, final: dict, run_dir) -> bool:
    """Tag why training stopped, log `best/` as an artifact, end the run; whether `best/` is
    there (complete: its meta.json is written last)."""
    if final.get("stop_reason"):  # why it stopped: a tag to filter runs by in MLflow
        set_tags(uri, run_id, {"convs2s.stop_reason": final["stop_reason"]})
    best = run_dir / BEST_DIR
    has_best = (best / META_FILE).is_file()
    if has_best:
        log_artifacts(uri, run_id, str(best), "best_checkpoint")
    end_run(uri, run_id, "FINISHED")
    return has_best


def fail_train_run(uri: str, run_id: str | None, err: BaseException) -> None:
    end_run(uri, run_id, stopped_status(err))


def _log_configs(uri: str, run_id: str | None, job: TrainJob) -> None:
    if run_id is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"model": job.model.to_dict(), "train": job.train.to_dict(),
               "job": {k: redact_uri(v) if k == "tracking_uri" else v
                       for k, v in vars(job).items() if k not in ("model", "train")}}
        Path(tmp, "train_job.json").write_text(json.dumps(cfg, indent=2, default=str))
        log_artifacts(uri, run_id, str(Path(tmp, "train_job.json")), "config")
    for path in dict.fromkeys([job.spm_model, *job.text_files]):  # the text pipeline
        if path:
            log_artifacts(uri, run_id, path, "config")
