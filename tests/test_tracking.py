"""Tests of convs2s.tracking.runs on a real MLflow sqlite store and on a dead tracking server
(a closed loopback port): run lookup by key, params, no duplicate steps after a restart,
local metrics.jsonl, bounded time and one warning when the server is unreachable.

Run: .venv/bin/python -m pytest tests/test_tracking.py -q
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time

import pytest
from conftest import mlflow_store
from mlflow.tracking import MlflowClient

from convs2s.tracking.run_logger import RunLogger, read_local_metrics
from convs2s.tracking.runs import (
    RUN_KEY_TAG,
    end_run,
    find_or_create_run,
    flatten_params,
    log_params,
    resolve_tracking_uri,
)


@pytest.fixture
def sqlite_uri(tmp_path):
    return mlflow_store(tmp_path)


@pytest.fixture
def dead_uri():
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_resolve_tracking_uri_is_absolute(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_tracking_uri(None) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert resolve_tracking_uri("sqlite:///sub/m.db") == f"sqlite:///{tmp_path / 'sub/m.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert resolve_tracking_uri(None) == "http://tracking:5000"
    with pytest.raises(ValueError, match="plain path"):
        resolve_tracking_uri("mlruns")
    # not a URI, so no user information to find, yet a password all the same: never shown
    for typo in ("alice:s3cret@mlflow.example:5000", "http:/alice:s3cret@mlflow.example:5000"):
        with pytest.raises(ValueError) as refused:
            resolve_tracking_uri(typo)
        assert "s3cret" not in str(refused.value) and "***@mlflow.example:5000" in \
            str(refused.value), refused.value


def test_same_run_key_finds_the_same_run_and_parent_is_tagged(sqlite_uri):
    client = MlflowClient(sqlite_uri)
    parent = client.create_run(client.create_experiment("wf")).info.run_id
    a = find_or_create_run(sqlite_uri, "exp", run_key="/runs/a", run_name="a",
                           parent_run_id=parent, tags={"extra": 1})
    end_run(sqlite_uri, a, "FAILED")
    again = find_or_create_run(sqlite_uri, "exp", run_key="/runs/a", run_name="a")
    other = find_or_create_run(sqlite_uri, "exp", run_key="/runs/b", run_name="b")
    assert a == again != other
    run = client.get_run(a)
    assert run.info.status == "RUNNING"  # reopened for the resumed job
    # ... and says so: from which end, with which code (a KILLED run resumed looked as if it
    # had run through)
    assert re.fullmatch(r"\S+ \S+: FAILED -> RUNNING \(code .+\)",
                        run.data.tags["convs2s.reopened"])
    end_run(sqlite_uri, a, "KILLED")
    find_or_create_run(sqlite_uri, "exp", run_key="/runs/a", run_name="a")
    history = client.get_run(a).data.tags["convs2s.reopened"].split("; ")
    assert [h.split(": ")[1].split(" (")[0] for h in history] == ["FAILED -> RUNNING",
                                                                   "KILLED -> RUNNING"]
    find_or_create_run(sqlite_uri, "exp", run_key="/runs/a", run_name="a")  # running: no line
    assert len(client.get_run(a).data.tags["convs2s.reopened"].split("; ")) == 2
    assert run.data.tags[RUN_KEY_TAG] == "/runs/a"
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["extra"] == "1"
    assert client.get_experiment(run.info.experiment_id).artifact_location.startswith("file:///")


@pytest.mark.parametrize("key", ["/runs/o'brien/run", "/runs/back\\slash/run",
                                 '/runs/q"uote/run', "/runs/b\\'o\"th/run"])
def test_a_run_key_with_quotes_or_backslashes_finds_its_run_again(sqlite_uri, key):
    """MLflow's filter strings have no escapes: a key is quoted with the quote it lacks, and a
    key with both is found by its digest; a resumed job reopens its run, not a new one."""
    first = find_or_create_run(sqlite_uri, "exp", run_key=key, run_name="r")
    assert first is not None
    assert find_or_create_run(sqlite_uri, "exp", run_key=key, run_name="r") == first
    assert find_or_create_run(sqlite_uri, "exp", run_key=key + "2", run_name="r") != first


def test_a_run_re_keyed_by_its_tags_is_found_by_its_new_key_only(sqlite_uri):
    """Re-keying a run (a replaced run moved aside, workflows.run_state) sets every tag that
    keys it: by the old key a new run starts, by the new key the moved one is found, also
    for a key found by its digest (both quotes)."""
    from convs2s.tracking.runs import run_key_tags

    old, new = "/runs/b'o\"th/train", "/runs/b'o\"th/replaced-1/train"
    moved = find_or_create_run(sqlite_uri, "exp", run_key=old, run_name="r")
    client = MlflowClient(sqlite_uri)
    for tag, value in run_key_tags(new).items():
        client.set_tag(moved, tag, value)
    assert find_or_create_run(sqlite_uri, "exp", run_key=new, run_name="r") == moved
    assert find_or_create_run(sqlite_uri, "exp", run_key=old, run_name="r") != moved


def test_params_flatten_and_keep_their_first_value(sqlite_uri, caplog):
    run = find_or_create_run(sqlite_uri, "exp", run_key="k", run_name="r")
    params = flatten_params({"model": {"embed_dim": 32, "layers": [[32, 3]]}, "seed": 1})
    assert params == {"model.embed_dim": "32", "model.layers": "[[32, 3]]", "seed": "1"}
    log_params(sqlite_uri, run, params)
    with caplog.at_level(logging.WARNING, logger="convs2s.tracking.runs"):
        log_params(sqlite_uri, run, {**params, "seed": "2", "new": "x"})
    got = MlflowClient(sqlite_uri).get_run(run).data.params
    assert got["seed"] == "1" and got["new"] == "x"
    assert "different values for params ['seed']" in caplog.text


def test_a_run_is_gone_only_when_the_store_says_so_not_when_it_does_not_answer(sqlite_uri,
                                                                              dead_uri):
    """`run_has_metrics`: True for a run with metrics, False for one deleted or never made,
    None where the store does not answer (a server down is no sign that the run is gone: a
    rerun kept its finished scores only while the tree had no parent; a server that answered
    at the start and not later had them made again)."""
    from convs2s.tracking.runs import log_final_metrics, run_has_metrics

    run_id = find_or_create_run(sqlite_uri, "exp", "key-a", "eval/best/test")
    log_final_metrics(sqlite_uri, run_id, {"bleu": 30.0})
    assert run_has_metrics(sqlite_uri, run_id) is True
    assert run_has_metrics(sqlite_uri, "0123456789abcdef0123456789abcdef") is False
    assert run_has_metrics(sqlite_uri, None) is False
    MlflowClient(sqlite_uri).delete_run(run_id)
    assert run_has_metrics(sqlite_uri, run_id) is False
    assert run_has_metrics(dead_uri, run_id) is None


def test_restarted_logger_skips_steps_already_logged(sqlite_uri, tmp_path):
    run = find_or_create_run(sqlite_uri, "exp", run_key="k", run_name="r")
    local = tmp_path / "metrics.jsonl"
    first = RunLogger(sqlite_uri, run, local)
    for step in (10, 20, 30):
        first.log_metrics({"train/loss": 5.0 - step / 10}, step)
    first.close()
    # A worker restarted from the checkpoint at step 15 logs 20 and 30 again, then goes on.
    second = RunLogger(sqlite_uri, run, local)
    for step in (20, 30, 40):
        second.log_metrics({"train/loss": 1.0, "valid/ppl": 9.0}, step)
    second.close()
    hist = MlflowClient(sqlite_uri).get_metric_history(run, "train/loss")
    assert sorted(m.step for m in hist) == [10, 20, 30, 40]
    assert {m.step: m.value for m in hist}[20] == 3.0  # the first value is kept
    assert sorted(m.step for m in MlflowClient(sqlite_uri).get_metric_history(run, "valid/ppl")) \
        == [20, 30, 40]  # a new key starts fresh
    records = read_local_metrics(local)
    seen = [(k, r["step"]) for r in records for k in r["metrics"]]
    assert len(seen) == len(set(seen)) == 7


def test_metrics_a_process_recorded_while_the_server_was_away_are_sent_by_the_next(
        sqlite_uri, tmp_path):
    """A worker that logged during an outage and ended before the server answered again (its
    run killed, the node lost) left those steps in metrics.jsonl only: the resumed run's
    logger sent its own steps and never the file's, a gap in the curve for good. Its first
    act is to send what the file has and the run lacks, each step once, the file's values."""
    run = find_or_create_run(sqlite_uri, "exp", run_key="k", run_name="r")
    local = tmp_path / "metrics.jsonl"
    first = RunLogger(sqlite_uri, run, local)
    first.log_metrics({"train/loss": 9.0}, 1)
    first.close()
    away = RunLogger(None, None, local)  # (the server away for this whole process)
    for step in range(2, 11):
        away.log_metrics({"train/loss": 10.0 - step, "valid/ppl": 50.0 - step}, step)
    away.close()
    resumed = RunLogger(sqlite_uri, run, local)  # resumed from a checkpoint at step 8
    for step in (9, 10, 11, 12):
        resumed.log_metrics({"train/loss": 0.5}, step)
    resumed.close()
    client = MlflowClient(sqlite_uri)
    hist = {m.step: m.value for m in client.get_metric_history(run, "train/loss")}
    assert sorted(hist) == list(range(1, 13)) and len(
        client.get_metric_history(run, "train/loss")) == 12
    assert hist[9] == 1.0 and hist[11] == 0.5  # the file's values, then the new steps
    assert sorted(m.step for m in client.get_metric_history(run, "valid/ppl")) == \
        list(range(2, 11))


def test_a_line_torn_by_a_crash_costs_no_later_record(tmp_path):
    """A worker killed mid-write leaves half a line; the restarted logger's first record is
    not glued onto it (both would be skipped as one bad line)."""
    local = tmp_path / "metrics.jsonl"
    first = RunLogger(None, None, local)
    first.log_metrics({"train/loss": 3.0}, 10)
    first.close()
    with local.open("a") as f:
        f.write('{"step": 20, "time": 1.0, "metr')  # the crash
    second = RunLogger(None, None, local)
    for step in (20, 30):
        second.log_metrics({"train/loss": 2.0}, step)
    second.close()
    assert [r["step"] for r in read_local_metrics(local)] == [10, 20, 30]


def test_dead_server_costs_seconds_warns_once_and_keeps_metrics_locally(dead_uri, tmp_path,
                                                                        caplog, monkeypatch):
    from convs2s.tracking import runs as tracking

    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_TIMEOUT",
                                            "MLFLOW_HTTP_REQUEST_MAX_RETRIES")}
    monkeypatch.setattr(tracking, "_WARNED", set())  # a fresh process
    with caplog.at_level(logging.WARNING, logger="convs2s.tracking.runs"):
        t0 = time.monotonic()
        assert find_or_create_run(dead_uri, "exp", run_key="k", run_name="r") is None
        assert find_or_create_run(dead_uri, "exp", run_key="k2", run_name="r2") is None
        assert time.monotonic() - t0 < 40
        # Driver-side bounds are temporary: the caller's environment is left as it was.
        assert {k: os.environ.get(k) for k in saved} == saved
        # One warning per process, however many calls fail.
        said = [r.getMessage() for r in caplog.records if r.name == "convs2s.tracking.runs"]
        assert len(said) == 1 and f"MLflow tracking at {dead_uri} is unavailable" in said[0]
        caplog.clear()
        monkeypatch.setattr(tracking, "_WARNED", set())  # the training worker's process
        # A run id from before the server went away: the worker-side logger.
        logger = RunLogger(dead_uri, "0123456789abcdef", tmp_path / "metrics.jsonl")
        t0 = time.monotonic()
        for step in range(1, 201):
            logger.log_metrics({"train/loss": 1.0 / step, "train/lr": 0.25}, step)
        assert time.monotonic() - t0 < 2.0  # logging never waits for the server
        logger.close(timeout=30)
        assert time.monotonic() - t0 < 30
    warnings = [r for r in caplog.records if "while logging metrics" in r.getMessage()]
    assert len(warnings) == 1 and dead_uri in warnings[0].getMessage()
    assert not logger.remote_ok
    records = read_local_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 201))
    assert records[-1]["metrics"]["train/loss"] == pytest.approx(1 / 200)


def test_a_server_that_answers_but_refuses_the_runs_metrics_is_asked_less_and_less_often(
        sqlite_uri, tmp_path, caplog, monkeypatch):
    """The run deleted in the UI (or the permission to write it lost): the server answers the
    probe and refuses the metrics. Each probe was taken for a recovery, so the logger sent
    everything again every retry_s for the rest of training, warning each time; now a send
    refused after a probe backs off further, and the outage is said once."""
    from convs2s.tracking import runs as tracking

    monkeypatch.setattr(tracking, "_WARNED", set())
    run = find_or_create_run(sqlite_uri, "exp", run_key="k", run_name="r")
    logger = RunLogger(sqlite_uri, run, tmp_path / "metrics.jsonl", retry_s=0.1)
    MlflowClient(sqlite_uri).delete_run(run)
    delays = set()
    with caplog.at_level(logging.WARNING, logger="convs2s.tracking.runs"):
        deadline = time.monotonic() + 20
        step = 0
        while logger._retry_delay < 0.8:  # (0.1, 0.2, 0.4, 0.8: three probes answered)
            step += 1
            logger.log_metrics({"train/loss": 1.0}, step)
            delays.add(logger._retry_delay)
            assert time.monotonic() < deadline, sorted(delays)
            time.sleep(0.02)
        logger.close(timeout=5)
    said = [r.getMessage() for r in caplog.records if r.name == "convs2s.tracking.runs"]
    assert len(said) == 1, said


def test_a_request_mlflow_refuses_is_said_as_such_and_a_later_outage_still_warns(sqlite_uri,
                                                                                   caplog,
                                                                                   monkeypatch):
    """MLflow refuses a whole batch holding one name it does not take (INVALID_PARAMETER_VALUE):
    the server answered, so the warning quotes its reason, naming the key, and does not call
    the server unavailable; an outage later is still warned about, not only logged at debug."""
    from convs2s.tracking import runs as tracking
    from convs2s.tracking.runs import log_final_metrics, warn_unreachable

    monkeypatch.setattr(tracking, "_WARNED", set())  # a fresh process
    monkeypatch.setattr(tracking, "_REJECTED", set(), raising=False)
    run_id = find_or_create_run(sqlite_uri, "exp", run_key="k", run_name="r")
    with caplog.at_level(logging.WARNING, logger="convs2s.tracking.runs"):
        for _ in range(2):  # the same refusal: said once
            log_final_metrics(sqlite_uri, run_id, {"bleu": 30.0, "eval/best/wmt19+20/bleu": 30.0})
        said = [r.getMessage() for r in caplog.records if r.name == "convs2s.tracking.runs"]
        assert len(said) == 1, said
        assert "refused a request while logging final metrics" in said[0]
        assert '"eval/best/wmt19+20/bleu"' in said[0] and "unavailable" not in said[0]
        assert MlflowClient(sqlite_uri).get_run(run_id).data.metrics == {}  # the whole batch
        log_final_metrics(sqlite_uri, run_id, {"bleu": 30.0})  # the server takes the next one
        assert MlflowClient(sqlite_uri).get_run(run_id).data.metrics == {"bleu": 30.0}
        caplog.clear()
        warn_unreachable(sqlite_uri, "logging metrics", ConnectionError("connection refused"))
    outage = [r for r in caplog.records if r.name == "convs2s.tracking.runs"]
    assert len(outage) == 1 and outage[0].levelno == logging.WARNING
    assert "is unavailable (ConnectionError while logging metrics)" in outage[0].getMessage()


def test_experiments_are_marked_as_model_training(sqlite_uri):
    """MLflow 3's UI opens an unmarked experiment on its GenAI overview; ours open on runs. An
    experiment made without the mark gets it; a kind someone chose is kept."""
    from convs2s.tracking.runs import EXPERIMENT_KIND_TAG, MODEL_TRAINING, get_or_create_experiment

    client = MlflowClient(sqlite_uri)
    new = get_or_create_experiment(sqlite_uri, "new")
    assert client.get_experiment(new).tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING
    old = client.create_experiment("old")
    assert get_or_create_experiment(sqlite_uri, "old") == old
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    get_or_create_experiment(sqlite_uri, "chosen")
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_dataset_inputs_and_model_linked_metrics(sqlite_uri):
    from convs2s.tracking.runs import DatasetRecord, log_final_metrics, log_inputs

    client = MlflowClient(sqlite_uri)
    run_id = find_or_create_run(sqlite_uri, "exp", run_key="/runs/d", run_name="d")
    exp_id = client.get_run(run_id).info.experiment_id
    model = client.create_logged_model(exp_id, name="m", source_run_id=run_id)
    test = DatasetRecord("newstest2014", "abc123", "/data/text", {"sentences": 3003},
                            "evaluation")
    log_inputs(sqlite_uri, run_id, [test], [model.model_id])
    log_final_metrics(sqlite_uri, run_id, {"bleu": 40.5, "skipped": None},
                      model_id=model.model_id, dataset=test)
    run = client.get_run(run_id)
    (inp,) = run.inputs.dataset_inputs
    assert (inp.dataset.name, inp.dataset.digest) == ("newstest2014", "abc123")
    assert inp.tags[0].value == "evaluation" and '"sentences": 3003' in inp.dataset.profile
    assert [m.model_id for m in run.inputs.model_inputs] == [model.model_id]
    assert run.data.metrics == {"bleu": 40.5}
    (metric,) = client.get_logged_model(model.model_id).metrics
    assert (metric.key, metric.value, metric.dataset_name, metric.dataset_digest) == \
        ("bleu", 40.5, "newstest2014", "abc123")


def test_a_served_model_that_does_not_resolve_never_shows_the_servers_password(monkeypatch,
                                                                               tmp_path):
    """MLflow's own error quotes the server's URI, password and all; the serving command's
    messages pass every `scheme://user:password@` through redaction, for a URI given on the
    command line or taken from $MLFLOW_TRACKING_URI alike."""
    from convs2s.serving.logged_model import fetch_logged_model, resolve_model_uri
    from convs2s.tracking.redact import redact_text

    assert redact_text("GET http://al:p@w@h:9/api and https://tok@h/x, sqlite:////m.db") == \
        "GET http://al:***@h:9/api and https://***@h/x, sqlite:////m.db"
    uri = "http://alice:S3CRET@127.0.0.1:9"  # nothing listens on port 9
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.setenv("CONVS2S_CACHE", str(tmp_path))
    with pytest.raises(ValueError) as given:
        resolve_model_uri("models:/m@champion", uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ValueError) as from_env:
        fetch_logged_model("models:/m/1", None)
    for err in (given.value, from_env.value):
        assert "S3CRET" not in str(err) and "alice:***@127.0.0.1:9" in str(err), str(err)


def test_credentials_in_a_tracking_uri_are_never_shown(caplog, capsys, tmp_path):
    """A server URI with `user:password@` (or a bare token) keeps them out of every line the
    project prints or logs: warnings, the dry run, the summary's links and commands."""
    import logging

    from convs2s.tracking import runs
    from convs2s.tracking.redact import redact_text, redact_uri
    from workflows import wmt14_en_fr
    from workflows.orchestrate import MlflowLinks

    assert redact_uri("http://bob:S3CRET@mlflow:5000") == "http://bob:***@mlflow:5000"
    assert redact_uri("https://S3CRET@host/path") == "https://***@host/path"
    assert redact_uri("sqlite:////tmp/m.db") == "sqlite:////tmp/m.db"
    # no URI, yet a password all the same (a typo); a path with an @ in it is left as it is
    assert redact_uri("bob:S3CRET@mlflow:5000") == "***@mlflow:5000"
    assert redact_uri("http:/bob:S3CRET@mlflow:5000") == "http:/***@mlflow:5000"
    assert redact_uri("/data/bob@lab/mlflow.db") == "/data/bob@lab/mlflow.db"
    assert redact_uri("http://bob:p@ss@mlflow:5000/x@y") == "http://bob:***@mlflow:5000/x@y"
    # slashes after the scheme's "//": the authority was empty, the password shown whole
    assert redact_uri("http:///bob:S3CRET@mlflow:5000") == "http:///bob:***@mlflow:5000"
    assert redact_uri("postgresql:///db:S3CRET@host/mlflow") == "postgresql:///db:***@host/mlflow"
    assert redact_uri("file:///data/bob@lab/mlflow.db") == "file:///data/bob@lab/mlflow.db"
    assert redact_uri("sqlite:////runs@v2/mlflow.db") == "sqlite:////runs@v2/mlflow.db"
    assert redact_uri("file:///a@b/c") == "file:///a@b/c"  # (a path after the empty authority)
    # an "@" and a "/", "?" or "#" in one password: what came after the first "@" was taken
    # for a host and shown ("ss/word")
    for cut in "/?#":
        assert redact_uri(f"http://alice:p@ss{cut}word@mlflow:5000") == \
            "http://alice:***@mlflow:5000"
    # ... and both: a "/" then a "?" before the "@" that ends it ("ss/w" was shown)
    assert redact_uri("https://u:p@ss/w?rd@host:5000") == "https://u:***@host:5000"
    # an e-mail in a server URI's query is no password's: its host stays shown
    assert redact_uri("https://alice:s3cret@mlflow.example.com/x?email=a@b.com") == \
        "https://alice:***@mlflow.example.com/x?email=a@b.com"
    # secrets in a query by the other names they go by
    assert redact_uri("http://h/x?passwd=A&pwd=B&auth=C&jwt=D&credentials=E&page=2") == \
        "http://h/x?passwd=***&pwd=***&auth=***&jwt=***&credentials=***&page=2"
    assert redact_uri("http://bob:p'ss\"@mlflow:5000") == "http://bob:***@mlflow:5000"
    # a password holding "/", "?" or "#" unencoded (MLflow quotes such a URI in its "Invalid
    # url" error): all of it hidden, whatever the "/" leaves before it (a host:port look-alike)
    for secret in ("pa/ss", "12/ss", "pa?ss", "pa#ss"):
        text = redact_text(f"Invalid url: http://alice:{secret}@127.0.0.1:1/api/2.0/x")
        assert text == "Invalid url: http://alice:***@127.0.0.1:1/api/2.0/x", text
    # a presigned URL's signature and a token in a query, in a library's message
    assert redact_text("GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F1&"
                       "X-Amz-Signature=abc&part=2 failed") == \
        "GET https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&part=2 failed"
    assert redact_uri("https://mlflow:5000/api?access_token=ghp_S3CRET") == \
        "https://mlflow:5000/api?access_token=***"
    assert redact_text("https://storage.googleapis.com/b/k?X-Goog-Signature=S&X-Goog-Credential"
                       "=C&client_secret=S&api_key=K&page=2&monkey=1") == \
        ("https://storage.googleapis.com/b/k?X-Goog-Signature=***&X-Goog-Credential=***&"
         "client_secret=***&api_key=***&page=2&monkey=1")
    # a training job's repr (Ray Train can record a run's config by it) leaves the URI out
    from convs2s.config import PRESETS, TrainConfig
    from convs2s.train.job import TrainJob

    job = TrainJob(PRESETS["tiny"](), TrainConfig(), "b/train", "b/valid", "", 100, "runs", "r",
                   tracking_uri="http://bob:S3CRET@mlflow:5000")
    assert "S3CRET" not in repr(job) and job.tracking_uri.endswith("@mlflow:5000")
    # nor does the run's config as Ray Train's run state records it (its dashboard's Train view)
    import pickle

    from ray.train.v2._internal.state.schema import _to_json_serializable_value

    from convs2s.tracking.redact import Hidden

    recorded = _to_json_serializable_value({"job": job, "tracking_uri": Hidden(job.tracking_uri)})
    assert "S3CRET" not in str(recorded) and "bob:***@mlflow:5000" in str(recorded)
    assert pickle.loads(pickle.dumps(Hidden(job.tracking_uri))).value == job.tracking_uri
    assert pickle.loads(pickle.dumps(Hidden(None))).value is None  # (a run without tracking)
    # an "@" of a path or a model alias is no credential
    assert redact_text("s3://bucket/run@2 models:/m@champion http://host/x@y") == \
        "s3://bucket/run@2 models:/m@champion http://host/x@y"
    # a bare token is a secret, never named as "the user" the server refused
    assert runs._user_of("https://ghp_S3CRET@mlflow:5000") is None
    assert runs._user_of("https://bob:S3CRET@mlflow:5000") == "bob"
    uri = "http://bob:S3CRET@127.0.0.1:9"
    with caplog.at_level(logging.DEBUG, logger="convs2s"):
        runs.warn_unreachable(uri, "creating the run", ConnectionError(f"refused {uri}"))
        runs.warn_unreachable(uri, "logging", ConnectionError(f"refused {uri}"))
        # a long message cut inside the URI: redacted before it is cut
        runs.warn_unreachable(uri, "again", ConnectionError("x" * 287 + f" {uri}/api"))
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "bob:***@127.0.0.1:9" in logged and "S3CRET" not in logged and "bob:S" not in logged
    links = MlflowLinks(uri, "1")
    assert "S3CRET" not in links.run("abc") + links.compare(["a"]) + links.page("runs")
    rc = wmt14_en_fr.main(wmt14_en_fr.PRESETS, None, ["--dry-run", "--tracking-uri", uri,
                                                      "--storage-path", str(tmp_path)])
    out = capsys.readouterr()
    assert rc == 0 and "bob:***@" in out.out and "S3CRET" not in out.out + out.err


def test_a_sampler_still_starting_when_training_ends_never_starts(monkeypatch):
    """Node utilization sampling starts in a thread of its own, so no rank waits for the
    tracking server; a block that ends first (a server that accepts and never answers) waits
    at most STOP_WAIT_S, and the sampler that gets its answer later never starts sampling."""
    import socket
    import threading

    from convs2s.tracking import system_metrics

    with socket.socket() as silent:  # a listening socket that never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")  # (whole seconds: MLflow's int)
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        monkeypatch.setattr(system_metrics, "STOP_WAIT_S", 0.3)
        before = set(threading.enumerate())
        with system_metrics.node_metrics(uri, "0" * 32, "node0-test", 1.0):
            pass  # the training: over before the server's (non-)answer
        (starter,) = [t for t in threading.enumerate()
                      if t.name == "system-metrics-start" and t not in before]
        assert starter.is_alive()  # the block ended without waiting for the server
        starter.join(60)  # the request times out; the start gives up
        assert not starter.is_alive()
    assert not [t for t in threading.enumerate()
                if t.name == "SystemMetricsMonitor" and t not in before]


def test_every_nodes_sampler_asks_the_server_with_short_timeouts(monkeypatch):
    """Only rank 0's node had MLflow's short HTTP timeouts (its RunLogger sets them): another
    node's sampler asked a server that had gone with MLflow's defaults (7 retries, 120 s
    each), and the end of its training waited for them."""
    import socket
    import threading

    from convs2s.tracking import system_metrics
    from convs2s.tracking.runs import HTTP_ENV

    for k in HTTP_ENV:
        monkeypatch.delenv(k, raising=False)
    # (the settings given are what is checked; shorter than the real ones, not to wait for
    # their retry of a silent server: 3 s, again after 1 s, 3 s)
    monkeypatch.setitem(HTTP_ENV, "MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setitem(HTTP_ENV, "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr(system_metrics, "STOP_WAIT_S", 0.3)
    with socket.socket() as silent:  # a listening socket that never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        before = set(threading.enumerate())
        with system_metrics.node_metrics(f"http://127.0.0.1:{silent.getsockname()[1]}",
                                         "0" * 32, "node1-test", 1.0):
            assert {k: os.environ.get(k) for k in HTTP_ENV} == HTTP_ENV
        for t in set(threading.enumerate()) - before:
            if t.name.startswith("system-metrics"):
                t.join(30)  # (its request times out after HTTP_ENV's few seconds)


def test_the_system_metrics_monitor_never_logs_the_servers_password(monkeypatch, capfd):
    """MLflow's monitor warns "Failed to get mlflow run: API request to <URI> ..." when the
    server is away, with the URI's password: MLflow's loggers write through redaction."""
    from convs2s.tracking import system_metrics

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        uri = f"http://alice:S3CRET@127.0.0.1:{s.getsockname()[1]}"
    text = ""
    with system_metrics.node_metrics(uri, "0" * 32, "node0-test", 0.3):
        deadline = time.monotonic() + 30
        while "Failed to get mlflow run" not in text and time.monotonic() < deadline:
            time.sleep(0.5)
            out = capfd.readouterr()
            text += out.out + out.err
    out = capfd.readouterr()
    text += out.out + out.err
    assert "Failed to get mlflow run" in text and "alice:***@127.0.0.1" in text, text
    assert "S3CRET" not in text, text


def test_a_logger_into_a_bucket_writes_the_object_and_leaves_no_scratch_copy(s3, sqlite_uri):
    """metrics.jsonl in a bucket (no appends there): the lines gather in a local scratch copy,
    written whole over the object at each `sync` and on `close`, which also removes the copy;
    a resumed logger continues the object."""
    import json

    from storage import location

    target = location("s3://convs2s-test/tracking-scratch/run/metrics.jsonl")
    run = find_or_create_run(sqlite_uri, "exp", run_key="scratch", run_name="r")
    first = RunLogger(sqlite_uri, run, str(target))
    scratch = first.local_path
    assert scratch.is_file() and not str(scratch).startswith("s3:")
    first.log_metrics({"train/loss": 2.0}, 1)
    first.sync()
    assert [json.loads(line)["step"] for line in target.read_bytes().splitlines()] == [1]
    first.log_metrics({"train/loss": 1.5}, 2)
    first.close()
    assert not scratch.parent.exists()
    second = RunLogger(sqlite_uri, run, str(target))
    second.log_metrics({"train/loss": 1.0}, 2)  # already there: skipped
    second.log_metrics({"train/loss": 1.0}, 3)
    second.close()
    assert [json.loads(line)["step"] for line in target.read_bytes().splitlines()] == [1, 2, 3]
    assert not second.local_path.parent.exists()


class _Outage:
    """A TCP forwarder on loopback in front of a real server: `down()` closes its port and the
    connections open through it (a client's connection is cut, then refused, as when the
    server is gone), `up()` opens the port again."""

    def __init__(self, target_port: int):
        import threading

        self.target, self.threading = target_port, threading
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.listener, self.open = None, []
        self.up()

    def up(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(16)
        self.threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def down(self) -> None:
        try:  # (wakes the thread in accept(): a close alone left the port listening)
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in self.open:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.open.clear()

    def _accept(self, listener) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: down
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                self.threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """A real `mlflow server` on loopback that lists the host it is asked by (`--allowed-hosts
    127.0.0.1:*`, as infra/mlflow's MLFLOW_ALLOWED_HOSTS), for this module's tests: its URL."""
    from benchmarks.mlflow_ui import mlflow_server

    root = tmp_path_factory.mktemp("tracking_server")
    with mlflow_server(["server", "--backend-store-uri", f"sqlite:///{root / 'm.db'}",
                        "--allowed-hosts", "127.0.0.1:*"], root / "server.log") as url:
        yield url


@pytest.mark.slow
def test_metrics_logged_while_the_server_was_down_are_sent_when_it_answers_again(
        tracking_server, tmp_path, caplog, monkeypatch):
    """A tracking server that goes away for a while (a restart, a network cut) costs one
    warning: the server is asked again later, and when it answers, the metrics recorded
    meanwhile are sent from the local file, each step once, and logging goes on (the first
    failure ended a run's MLflow metrics for good: days of a long run)."""
    from convs2s.tracking import runs as tracking

    monkeypatch.setattr(tracking, "_WARNED", set())
    url = tracking_server  # (the proxy in front of it goes down and up)
    outage = _Outage(int(url.rsplit(":", 1)[1]))
    uri = f"http://127.0.0.1:{outage.port}"
    client = MlflowClient(url)
    run = client.create_run(client.create_experiment("outage")).info.run_id
    logger = RunLogger(uri, run, tmp_path / "metrics.jsonl", retry_s=0.5)
    with caplog.at_level(logging.WARNING):
        for step in range(1, 11):
            logger.log_metrics({"train/loss": 1.0 / step}, step)
        deadline = time.monotonic() + 30
        while len(client.get_metric_history(run, "train/loss")) < 10:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        outage.down()
        for step in range(11, 21):
            logger.log_metrics({"train/loss": 1.0 / step}, step)
            if step == 15:  # a tag set meanwhile (the dropout a budget chose): kept for then
                logger.set_tags({"convs2s.dropout": "0.3"})
        while logger.remote_ok:  # the thread found the server gone
            assert time.monotonic() < deadline + 30
            time.sleep(0.2)
        outage.up()
        time.sleep(0.6)  # past the first retry's time
        for step in range(21, 31):
            logger.log_metrics({"train/loss": 1.0 / step}, step)
            time.sleep(0.05)
        logger.close(timeout=30)
    steps = sorted(m.step for m in client.get_metric_history(run, "train/loss"))
    tags = client.get_run(run).data.tags
    outage.down()
    assert steps == list(range(1, 31))  # each once, those of the outage included
    assert tags.get("convs2s.dropout") == "0.3"  # (set during the outage: it was lost)
    said = [r.getMessage() for r in caplog.records if uri in r.getMessage()]
    assert len(said) == 2, said
    assert "is unavailable" in said[0] and "answers again" in said[1], said
    assert logger.remote_ok


def test_an_experiment_in_mlflows_trash_is_refused_before_a_run_is_made(sqlite_uri, tmp_path):
    """A deleted experiment (in MLflow's trash) takes no run: every stage's run was refused,
    the whole workflow untracked after one warning. Refused before its first run is made (the
    parent's: RunTree.open), with the fix."""
    from workflows.errors import SpecError
    from workflows.run_tree import RunTree

    client = MlflowClient(sqlite_uri)
    exp = client.create_experiment("binned")
    client.delete_experiment(exp)
    with pytest.raises(SpecError, match=re.escape(
            f"experiment 'binned' at {sqlite_uri} is deleted (in MLflow's trash, where it takes "
            f"no run): restore it (mlflow experiments restore --experiment-id {exp}) or give "
            "another --experiment")):
        RunTree.open(sqlite_uri, "binned", tmp_path / "r", "r")
    assert client.search_runs([exp], run_view_type=3) == []  # (ViewType.ALL: none made)
    assert RunTree.open(sqlite_uri, "never made", tmp_path / "r", "r").parent is not None


def test_a_server_refusing_the_uris_host_name_says_to_allow_it_not_to_ask_for_rights(
        tracking_server):
    """A tracking server (`mlflow server --allowed-hosts`, infra/mlflow's MLFLOW_ALLOWED_HOSTS)
    answers a host name it does not list with 403 "Invalid Host header": the run's one line
    names the allowed hosts as the fix (it said the user could not write to the experiment
    and to ask for EDIT rights, which nothing would mend). Measured on a real server."""
    from convs2s.tracking.runs import tracking_problem

    url = tracking_server  # (--allowed-hosts 127.0.0.1:*)
    assert tracking_problem(url, "exp") is None  # a listed host: runs go on
    named = url.replace("127.0.0.1", "localhost")
    problem = tracking_problem(named, "exp")
    assert problem is not None and "refuses the host name 'localhost:" in problem, problem
    assert "--allowed-hosts" in problem and "MLFLOW_ALLOWED_HOSTS" in problem
    assert "may not write" not in problem


def test_a_restart_after_a_crash_ends_the_runs_it_sets_apart(sqlite_uri, tmp_path):
    """A run killed (OOM, a lost node) leaves its child runs RUNNING; `--restart` then sets
    them apart ("(replaced)", "(superseded)") and makes new ones. Those still RUNNING are ended
    KILLED (they stayed RUNNING forever, and a later failed command's clean-up, which ends the
    runs under its folder, would have blamed them for its failure); one that had finished
    stays FINISHED."""
    from workflows.run_state import StageContext, set_aside
    from workflows.run_tree import RunTree

    run_dir = tmp_path / "runs" / "r"
    (run_dir / "train").mkdir(parents=True)  # (outputs a restart moves aside)
    tree = RunTree.open(sqlite_uri, "exp", run_dir, "r", restarting=True)
    pre, train = tree.child("preprocess", "preprocess"), tree.child("train", "train")
    scored = tree.child("eval/best/t", "eval")
    end_run(sqlite_uri, scored, "FINISHED")
    set_aside(StageContext(tree), "--restart")
    tree.start_over("restarted: --restart")
    client = MlflowClient(sqlite_uri)
    runs = {run_id: client.get_run(run_id) for run_id in (pre, train, scored)}
    assert runs[train].info.run_name == "train (replaced)"
    assert runs[pre].info.run_name == "preprocess (superseded)"
    assert [runs[i].info.status for i in (pre, train, scored)] == \
        ["KILLED", "KILLED", "FINISHED"]


def test_a_parent_made_anew_adopts_the_runs_of_the_stages_it_skips(sqlite_uri, tmp_path):
    """The parent run deleted in the UI, a rerun makes a new one; the stages finished earlier
    are skipped (`workflows.steps`), and their runs stayed children of the deleted parent:
    the new one showed a run without its training and scores. A skipped stage's run is made
    the new parent's child (`RunTree.adopt`)."""
    from workflows.run_tree import RunTree

    run_dir = tmp_path / "runs" / "r"
    first = RunTree.open(sqlite_uri, "exp", run_dir, "r")
    train = first.child("train", "train")
    client = MlflowClient(sqlite_uri)
    client.delete_run(first.parent)
    again = RunTree.open(sqlite_uri, "exp", run_dir, "r")
    assert again.parent != first.parent
    again.adopt(train)
    assert client.get_run(train).data.tags["mlflow.parentRunId"] == again.parent
