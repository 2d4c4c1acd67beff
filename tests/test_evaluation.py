"""Tests of workflows.evaluation: evaluation jobs, ensembling jobs, parallel Ray evaluation with
one MLflow child run per (model, test set) pair.

The slow tests evaluate the demo model trained for a few minutes by convs2s.train.launch.fit
(`demo_trained` in tests/conftest.py) on a local Ray (`ray_session`) and a sqlite MLflow store.

Run: .venv/bin/python -m pytest tests/test_evaluation.py -q            (add -m "not slow")
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, mlflow_store
from storage import location
from mlflow.tracking import MlflowClient

from convs2s.io.checkpoint import (
    best_checkpoint,
    checkpoint_dir_name,
    load_checkpoint,
    save_checkpoint,
)
from convs2s.config import SearchConfig, summarization_search
from convs2s.metrics.scoring import read_lines
from convs2s.inference.translate import load_for_inference
from workflows.evaluation import (
    EvalJob,
    TestSet,
    averaging_job,
    evaluate_all,
    evaluate_job,
    evaluation_jobs,
    share_cpus,
)

SHORT = SearchConfig(beam=2, max_len_a=0, max_len_b=4)


def fake_run(tiny_checkpoints, root: Path, updates: list[int], best: str) -> Path:
    """A run directory laid out as convs2s.train.launch leaves it, from the tiny checkpoints."""
    for i, u in enumerate(updates):
        state = load_checkpoint(tiny_checkpoints["ab"[i % 2]])
        state.update(update=u, epoch=i + 1, val_loss=float(10 - i))
        save_checkpoint(root / checkpoint_dir_name(u), state, tiny_checkpoints["spm"],
                        end_of_epoch=True)
    shutil.copytree(tiny_checkpoints[best], root / "best")
    return root


def tiny_test_set(tiny_checkpoints, tmp_path: Path, n: int = 6,
                  task_kind="translation") -> TestSet:
    pairs = tiny_checkpoints["pairs"][-n:]
    (tmp_path / "t.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "t.fr").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return TestSet("tiny", str(tmp_path / "t.en"), str(tmp_path / "t.fr"), "fr", task_kind)


def test_evaluation_jobs_pick_best_and_last_checkpoints(tiny_checkpoints, tmp_path):
    run_a = fake_run(tiny_checkpoints, tmp_path / "a", [100, 200, 300], "a")
    run_b = fake_run(tiny_checkpoints, tmp_path / "b", [50, 150], "b")
    tests = [TestSet("t", "src", "ref", "fr"), TestSet("u", "src2", "ref2", "fr")]
    jobs = evaluation_jobs([str(run_a), str(run_b)], tests, average_last=2,
                           attention_sentences=3, num_cpus=2)
    by_name = {j.name: j for j in jobs if j.test_set.name == "t"}
    # The workflows' names: runs counted from 1, the ensemble of the runs' bests.
    assert sorted(by_name) == ["ensemble_2", "run1_avg_last2", "run1_best", "run2_avg_last2",
                               "run2_best"]
    assert [j.name for j in jobs if j.test_set.name == "u"] == [j.name for j in jobs
                                                                if j.test_set.name == "t"]
    assert by_name["ensemble_2"].checkpoints == (str(run_a / "best"), str(run_b / "best"))
    assert by_name["ensemble_2"].kind == "ensemble" and by_name["run1_best"].kind == "single"
    avg = by_name["run1_avg_last2"]
    assert avg.kind == "average" and avg.num_cpus == 2 and avg.attention_sentences == 3
    assert avg.checkpoints == tuple(str(run_a / checkpoint_dir_name(u)) for u in (200, 300))
    assert best_checkpoint(run_a).path == str(run_a / "best")
    # One run: bare names; a run with a single checkpoint has no average.
    run_c = fake_run(tiny_checkpoints, tmp_path / "c", [10], "a")
    assert [j.name for j in evaluation_jobs([str(run_c)], tests[:1], 5)] == ["best"]
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        averaging_job("x", str(tmp_path), 2, tests[0])


def test_evaluate_job_without_ray(tiny_checkpoints, tmp_path):
    """The task body: averaged checkpoints translate like the averaged checkpoint itself, and
    the metrics and pictures come back. The average is staged once on the driver
    (`stage_weights`, the one staging path): a task never averages on its own."""
    from workflows.evaluation import stage_weights

    test = tiny_test_set(tiny_checkpoints, tmp_path)
    job = EvalJob("avg", (tiny_checkpoints["a"], tiny_checkpoints["b"]), test, SHORT,
                  average=True, attention_sentences=2)
    with pytest.raises(ValueError, match="stage it first"):
        evaluate_job(job)
    out = evaluate_job(stage_weights([job], tmp_path / "weights")[0])
    assert {"bleu", "bleu_tokenized", "chrf", "length_ratio", "sentences_per_second"} <= \
        set(out["metrics"])
    assert out["metrics"]["sentences"] == 6 and len(out["hypotheses"]) == 6
    assert sorted(out["pngs"]) == ["attention_000.png", "attention_001.png"]
    assert out["served"] == {"precision": SHORT.precision, "device": "cpu"}
    # what a node served is what it could run, not what was asked (logged as tags beside the
    # asked `search.precision` param): int8 without the quantized kernels, fallback allowed
    from convs2s.inference import quantize

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantize, "_supported_engines", lambda: [])  # a build without them
        int8 = dataclasses.replace(job, search=dataclasses.replace(
            SHORT, precision="int8", precision_fallback="fp32"), attention_sentences=0)
        assert evaluate_job(stage_weights([int8], tmp_path / "weights")[0])["served"] == \
            {"precision": "fp32", "device": "cpu"}
    from convs2s.io.averaging import average_checkpoints

    avg = average_checkpoints([tiny_checkpoints["a"], tiny_checkpoints["b"]], tmp_path / "avg")
    assert out["hypotheses"] == load_for_inference([avg], search=SHORT).translate(
        read_lines(test.src))
    summ_set = tiny_test_set(tiny_checkpoints, tmp_path, task_kind="summarization")
    summ = evaluate_job(EvalJob("s", (tiny_checkpoints["a"],), summ_set,
                                summarization_search(beam=2, min_len=3, max_len_b=5)))
    assert {"rouge1_f", "rouge2_r", "rougeL_f", "length_ratio"} <= set(summ["metrics"])


@pytest.mark.slow
def test_parallel_evaluation_logs_one_child_run_per_pair(demo_trained, tmp_path):
    t = demo_trained
    test = TestSet("test", t.test_src, t.test_ref, "fr")
    search = SearchConfig(max_len_a=1.5, max_len_b=10)
    ckpts = t.train.checkpoints
    jobs = [EvalJob("best", (t.train.best_checkpoint,), test, search, attention_sentences=2),
            EvalJob("untrained", (t.untrained,), test, search),
            EvalJob("ensemble_last2", tuple(ckpts[-2:]), test, search),
            averaging_job("avg_last3", t.train.run_dir, 3, test, search)]
    results = evaluate_all(jobs, t.tracking_uri, t.train.run_id, out_dir=str(tmp_path / "eval"))
    bleu = {r.job.name: r.metrics["bleu"] for r in results}
    print("demo test BLEU by job:", {k: round(v, 2) for k, v in bleu.items()},
          "sentences/s:", {r.job.name: round(r.metrics["sentences_per_second"], 1)
                           for r in results})
    assert [r.job.name for r in results] == [j.name for j in jobs]
    assert bleu["untrained"] < 2.0
    for name in ("best", "ensemble_last2", "avg_last3"):
        assert bleu[name] > bleu["untrained"] + 10.0, name

    client = MlflowClient(t.tracking_uri)
    children = client.search_runs(
        [client.get_run(t.train.run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{t.train.run_id}'")
    assert sorted(c.data.params["eval.job"] for c in children) == sorted(bleu)
    for child in children:
        r = next(r for r in results if r.run_id == child.info.run_id)
        assert child.info.status == "FINISHED"
        assert (child.data.tags["convs2s.served.precision"],
                child.data.tags["convs2s.served.device"]) == (search.precision, "cpu")
        for key in ("bleu", "bleu_tokenized", "chrf", "length_ratio", "sentences_per_second"):
            assert child.data.metrics[key] == pytest.approx(r.metrics[key])
        logged = client.download_artifacts(child.info.run_id, "hypotheses/test.fr",
                                           str(tmp_path / child.info.run_id))
        assert read_lines(logged) == read_lines(r.hyp_path)
        assert len(read_lines(logged)) == len(read_lines(t.test_src))
    best = next(c for c in children if c.data.params["eval.job"] == "best")
    assert sorted(a.path for a in client.list_artifacts(best.info.run_id, "attention")) == \
        ["attention/test_attention_000.png", "attention/test_attention_001.png"]
    # The parallel job's hypotheses are the translate entry's.
    direct = load_for_inference([t.train.best_checkpoint], search=search)
    assert read_lines(results[0].hyp_path) == direct.translate(read_lines(t.test_src))


@pytest.mark.slow
def test_failed_job_marks_its_run_and_summarization_is_scored(demo_trained, tmp_path):
    t = demo_trained
    src, ref = tmp_path / "s.en", tmp_path / "s.fr"
    src.write_text("".join(line + "\n" for line in read_lines(t.test_src)[:30]))
    ref.write_text("".join(line + "\n" for line in read_lines(t.test_ref)[:30]))
    summ = TestSet("short", str(src), str(ref), "fr", task_kind="summarization")
    jobs = [EvalJob("summary", (t.train.best_checkpoint,), summ,
                    summarization_search(max_len_a=1.5, max_len_b=10)),
            EvalJob("missing", (str(tmp_path / "nope"),), summ)]
    logged = []  # (a workflow records each score as it comes: the failure keeps them)
    with pytest.raises(RuntimeError, match="missing/short: .*does not exist"):
        evaluate_all(jobs, t.tracking_uri, t.train.run_id, out_dir=str(tmp_path / "eval"),
                     on_result=logged.append)
    assert [r.job.name for r in logged] == ["summary"] and "rouge1_f" in logged[0].metrics
    client = MlflowClient(t.tracking_uri)
    runs = {r.data.params["eval.job"]: r for r in client.search_runs(
        [client.get_run(t.train.run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{t.train.run_id}' and "
                      "params.`test.name` = 'short'")}
    assert runs["missing"].info.status == "FAILED"
    assert runs["summary"].info.status == "FINISHED"
    assert runs["summary"].data.params["search.min_len"] == "14"
    assert {"rouge1_f", "rouge2_f", "rougeL_f", "rouge1_r"} <= set(runs["summary"].data.metrics)
    assert (tmp_path / "eval" / "summary" / "short.fr").is_file()


def test_an_evaluation_stopped_while_logging_its_results_leaves_no_run_running(
        tiny_checkpoints, ray_session, tmp_path):
    """The command line (`python -m workflows.evaluation`) has no workflow around it to end
    its child runs: an error while logging a result (here the hypotheses cannot be written:
    the output folder is a file), or Ctrl-C, ends every run still open as stopped runs are
    ended (FAILED; KILLED for Ctrl-C), and the error comes through."""
    uri = mlflow_store(tmp_path)
    test = tiny_test_set(tiny_checkpoints, tmp_path)
    jobs = [EvalJob("a", (tiny_checkpoints["a"],), t, SHORT)
            for t in (test, dataclasses.replace(test, name="tiny2"))]
    blocked = tmp_path / "eval"
    blocked.write_text("a file where the hypotheses' folder should be")
    with pytest.raises(OSError, match="Not a directory|File exists|Is a directory"):
        evaluate_all(jobs, uri, out_dir=str(blocked), experiment_name="stopped")
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("stopped").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["eval/a/tiny", "eval/a/tiny2"]
    assert [r.info.status for r in runs] == ["FAILED", "FAILED"]
    # Ctrl-C once the first result is logged: that run finished, the others are KILLED
    jobs.append(EvalJob("a", (tiny_checkpoints["a"],), dataclasses.replace(test, name="tiny3"),
                        SHORT))

    def interrupt(result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate_all(jobs, uri, out_dir=str(tmp_path / "eval2"), experiment_name="interrupted",
                     on_result=interrupt)
    runs = client.search_runs([client.get_experiment_by_name("interrupted").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED", "KILLED"]


def test_an_evaluation_whose_folder_another_command_took_writes_no_hypotheses_there(
        tiny_checkpoints, ray_session, tmp_path):
    """A command that lost its folder's lease while it searched (stalled past the ttl, another
    command took the folder over) writes no hypotheses there: `evaluate_all` checks the lease
    before each result's files and stops naming the taker, its runs ended FAILED. (The
    workflows pass their run folder's lease; `python -m workflows.evaluation` its --out's.)"""
    from storage.lease import LeaseLost, RunLease

    uri = mlflow_store(tmp_path)
    test = tiny_test_set(tiny_checkpoints, tmp_path)
    out = tmp_path / "out"
    ours = RunLease(out, command="A", ttl_s=0.3, heartbeat_s=1000).acquire()  # never renewed
    time.sleep(0.5)  # stale
    taker = RunLease(out, command="B", heartbeat_s=1000).acquire()
    try:
        with pytest.raises(LeaseLost, match=r"holds it now \(B\)\), so this stops before "
                                            "writing a/tiny's hypotheses"):
            evaluate_all([EvalJob("a", (tiny_checkpoints["a"],), test, SHORT)], uri,
                         out_dir=str(out / "eval"), experiment_name="taken", lease=ours.ref())
    finally:
        taker.release()
        ours.release()
    assert not (out / "eval").exists()
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("taken").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_the_evaluation_commands_out_taken_over_while_it_ran_is_one_line(
        tiny_checkpoints, ray_session, tmp_path, monkeypatch, capsys):
    """`python -m workflows.evaluation --out` taken over by another command while it searched
    (its holder stalled past the ttl): one line naming the taker, exit 1, no traceback (the
    lease's own release found it lost and raised again), and no hypotheses written."""
    from storage import lease as leases
    from workflows.evaluation_command import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    real_lease, real_check, takers = leases.RunLease, leases.LeaseRef.check, []

    class Stalled(real_lease):  # never renewed, stale after 0.3 s
        def __init__(self, *args, **kw):
            super().__init__(*args, **{**kw, "ttl_s": 0.3, "heartbeat_s": 1000})

    def taken_first(ref, before="writing"):
        if not takers:  # another command takes the stale --out as the search ends
            time.sleep(0.5)
            takers.append(real_lease(location(ref.path).parent, command="B",
                                     heartbeat_s=1000).acquire())
        return real_check(ref, before)

    monkeypatch.setattr(leases, "RunLease", Stalled)
    monkeypatch.setattr(leases.LeaseRef, "check", taken_first)
    test = tiny_test_set(tiny_checkpoints, tmp_path)
    out = tmp_path / "out"
    try:
        rc = main(["--checkpoint", f"a={tiny_checkpoints['a']}", "--tracking-uri",
                   mlflow_store(tmp_path), "--out", str(out), "--test", test.name, test.src,
                   test.ref, test.tgt_lang])
    finally:
        for taker in takers:
            taker.release()
    printed = capsys.readouterr().err
    err = [line for line in printed.splitlines() if "error" in line.lower()]
    assert rc == 1 and len(err) == 1 and "Traceback" not in printed, printed
    assert err[0].endswith("holds it now (B)), so this stops before writing a/tiny's "
                           "hypotheses: two commands never write one run. Check what the other "
                           "command wrote; resume the run with one command at a time"), err
    assert not (out / "a").exists()


def test_a_job_no_node_of_a_local_ray_holds_is_refused_before_any_run(
        tiny_checkpoints, tmp_path, ray_session, monkeypatch, capsys):
    """A local Ray (no RAY_ADDRESS) never grows: a task asking for a GPU on this CPU machine, or
    more CPUs than it has, waited without end. Refused before any run is logged, naming the job
    and the fix; on a cluster the task waits for the autoscaler. The session's Ray: 2 CPUs."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    test = tiny_test_set(tiny_checkpoints, tmp_path)
    store = tmp_path / "mlflow.db"
    for resources, says in (({"num_gpus": 1.0}, "asks for 1 CPU(s) and 1 GPU(s)"),
                            ({"num_cpus": 3.0}, "asks for 3 CPU(s) and 0 GPU(s)")):
        job = EvalJob("a", (tiny_checkpoints["a"],), test, SHORT, **resources)
        with pytest.raises(ValueError) as err:
            evaluate_all([job], f"sqlite:///{store}", out_dir=str(tmp_path / "eval"))
        assert str(err.value) == (
            f"a on {test.name} {says}, but this machine's Ray has 2 CPU(s) and 0 GPU(s): its "
            "task could not start (a local Ray never grows); give --num-cpus and --num-gpus "
            "that fit, or submit the job to a cluster (`ray job submit`)")
    assert not store.exists() and not (tmp_path / "eval").exists()
    # the command: refused before it logs the --checkpoint's model
    from workflows.evaluation_command import main

    with pytest.raises(SystemExit) as exit_:
        main(["--checkpoint", f"a={tiny_checkpoints['a']}", "--num-gpus", "1",
              "--tracking-uri", f"sqlite:///{store}", "--out", str(tmp_path / "eval"),
              "--test", test.name, test.src, test.ref, test.tgt_lang])
    assert exit_.value.code == 2
    assert f"error: a on {test.name} asks for 1 CPU(s) and 1 GPU(s)" in capsys.readouterr().err
    assert not store.exists() and not (tmp_path / "eval").exists()
    # on a cluster (RAY_ADDRESS, or one joined without it) the task waits for room instead
    from storage import ray_join
    from workflows.evaluation import _check_room

    nodes = ray_session.nodes()
    monkeypatch.setattr(ray_join, "started_here", lambda: False)
    _check_room([("a on t", 1.0, 1.0)], nodes)


def test_a_path_the_evaluation_command_cannot_use_is_one_line_before_ray_starts(tmp_path,
                                                                               capsys):
    """`python -m workflows.evaluation` with a --run-dir, --test file or --out that storage
    refuses ("s3:/bkt/x", one slash; a query) or a run directory without checkpoints: one line
    naming the flag, exit 2, a signature unseen; they were tracebacks, exit 1."""
    from workflows.evaluation_command import main

    (tmp_path / "run").mkdir()
    src, ref = tmp_path / "t.en", tmp_path / "t.de"
    src.write_text("a\n")
    ref.write_text("b\n")
    test = ["--test", "t", str(src), str(ref), "de"]
    out = ["--out", str(tmp_path / "eval")]
    for argv, says in (
            (["--run-dir", "s3:/bkt/x", *test, *out], "--run-dir s3:/bkt/x has one slash"),
            (["--run-dir", "s3://bkt?sig=SECRETSIG&X-Amz-Credential=AKIAEX:1", *test, *out],
             "--run-dir s3://bkt: a storage URI takes no query"),
            (["--run-dir", str(tmp_path / "run"), "--test", "t", "s3:/bkt/t.en", str(ref),
              "de", *out], "--test t s3:/bkt/t.en has one slash"),
            (["--run-dir", str(tmp_path / "run"), *test, "--out", "s3:/bkt/eval"],
             "--out s3:/bkt/eval has one slash"),
            (["--run-dir", str(tmp_path / "run"), *test, *out],
             f"{tmp_path / 'run'} has no best/ checkpoint")):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"python -m workflows.evaluation: error: {says}"), err
        assert "SECRETSIG" not in err and "AKIAEX" not in err
    assert not (tmp_path / "eval").exists()


def test_what_the_evaluation_command_can_know_before_ray_starts_is_one_line(
        tiny_checkpoints, tmp_path, capsys):
    """Each was found after Ray started and runs were made (a traceback, or a failure in every
    scoring task), or not at all: a negative --last-n (-1 averaged every checkpoint but the
    oldest), two test sets of one name, a test file that is not there or whose references do
    not line up, a best/ whose meta.json is damaged, a --checkpoint named as a --run-dir job."""
    from workflows.evaluation_command import main

    run = fake_run(tiny_checkpoints, tmp_path / "run", [100, 200, 300], "a")
    src, ref, short = tmp_path / "t.en", tmp_path / "t.de", tmp_path / "short.de"
    src.write_text("a\nb\n")
    ref.write_text("c\nd\n")
    short.write_text("c\n")
    test = ["--test", "t", str(src), str(ref), "de"]
    out = ["--out", str(tmp_path / "eval")]
    for argv, says in (
            (["--run-dir", str(run), *test, "--last-n", "-1", *out], "--last-n -1: give a count"),
            (["--run-dir", str(run), *test, *test, *out], "--test: each test set needs a name"),
            (["--run-dir", str(run), "--test", "t", str(tmp_path / "nope.en"), str(ref), "de",
              *out], f"--test t: {tmp_path / 'nope.en'} does not exist"),
            (["--run-dir", str(run), "--test", "t", str(src), str(short), "de", *out],
             f"--test t: {src} has 2 lines, {short} 1"),
            (["--run-dir", str(run), "--checkpoint", f"best={tiny_checkpoints['b']}", *test,
              *out], "--checkpoint best=...: a job of --run-dir has that name"),
            # any search setting is --set (the length penalty: a trained run's, tuned)
            (["--run-dir", str(run), *test, *out, "--set", "lenpn=0.6"],
             "--set lenpn=0.6: SearchConfig has no field 'lenpn' (did you mean lenpen"),
            (["--run-dir", str(run), *test, *out, "--set", "search.beam=3"],
             "--set search.beam=3: search.beam is set by --beam"),
            (["--run-dir", str(run), *test, *out, "--set", "lenpen=x"],
             "--set lenpen=x: search.lenpen takes float"),
            (["--run-dir", str(run), *test, *out, "--set", "nbest=3"],
             "--set nbest=3: an evaluation scores one translation a sentence"),
            # (a traceback, or both logged as models before one, or taken by Ray)
            (["--run-dir", str(run), *test, *out, "--beam", "0"], "beam must be >= 1, got 0"),
            (["--checkpoint", f"a={tiny_checkpoints['a']}", "--checkpoint",
              f"a={tiny_checkpoints['b']}", *test, *out], "--checkpoint a=...: two checkpoints "
                                                          "named a; name each its own"),
            (["--run-dir", str(run), *test, *out, "--attention-sentences", "-3"],
             "--attention-sentences -3: give a number >= 0"),
            (["--run-dir", str(run), *test, *out, "--num-cpus", "-1"],
             "--num-cpus -1.0: give a number >= 0"),
            # (the password was printed)
            (["--checkpoint", "a=s3://AK:SECRET@b/ck", *test, *out],
             "--checkpoint 'a=s3://***@b/ck': give NAME=DIR"),
            # ("[Errno 17] File exists"; "train it first")
            (["--run-dir", str(run), *test, "--out", str(src)], f"--out {src} is a file: give "
                                                                "a folder"),
            (["--run-dir", tiny_checkpoints["a"], *test, *out],
             f"{tiny_checkpoints['a']} has no best/ checkpoint and no checkpoint with a "
             "validation loss: train it first; a checkpoint folder goes to --checkpoint")):
        try:
            rc = main(argv)
        except SystemExit as exit_:  # (argparse's refusals)
            rc = exit_.code
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith(f"python -m workflows.evaluation: error: {says}"), err
    (run / "best" / "meta.json").write_text("[]")
    assert main(["--run-dir", str(run), *test, *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("meta.json is not a checkpoint's meta.json (no epoch, update, "
                            "val_loss and end_of_epoch): copy the checkpoint again or pick "
                            "another of the run"), err
    assert not (tmp_path / "eval").exists()


def test_a_checkpoints_model_that_cannot_be_logged_is_one_line_without_the_password(
        tiny_checkpoints, tmp_path, ray_session, monkeypatch, capsys):
    """`--checkpoint NAME=DIR` logs its model first; a tracking server that does not answer
    was an uncaught MLflow error whose traceback quoted the URI, password and all. One line
    naming the checkpoint and the server (password hidden), exit 2."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    from workflows.evaluation_command import main

    test = tiny_test_set(tiny_checkpoints, tmp_path)
    with pytest.raises(SystemExit) as exit_:  # nothing listens on port 9
        main(["--checkpoint", f"a={tiny_checkpoints['a']}", "--tracking-uri",
              "http://alice:S3CRET@127.0.0.1:9", "--out", str(tmp_path / "eval"),
              "--test", test.name, test.src, test.ref, test.tgt_lang])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "S3CRET" not in err, err
    assert "--checkpoint a: its model could not be logged at http://alice:***@127.0.0.1:9" \
        in err, err


def test_staging_removes_what_a_killed_stager_left_and_never_a_live_ones(tiny_checkpoints,
                                                                         tmp_path):
    """Weights are staged beside their target and renamed into place. A stager killed midway
    left its `.partial-*` folder (an ensemble's or an average's weights: gigabytes at WMT
    scale) for good, since only a process of its pid removed it; and two stagers of one
    target shared one `.old-*` name. Each folder is named by its writer now: the next staging
    on this machine removes those whose process is gone, and no other."""
    import subprocess

    from convs2s.io.staging import stage_models
    from storage.scratch import place

    target = tmp_path / "weights" / "best"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has any more
    dead = target.parent / f".partial-best-{place()}-{gone.pid}-x1"
    live = target.parent / f".partial-best-{place()}-{os.getppid()}-x2"  # (this test's parent)
    for left in (dead, live):
        (left / "model_00").mkdir(parents=True)
    models = stage_models([tiny_checkpoints["a"]], False, target)
    assert [Path(m).name for m in models] == ["model_00"] and (target / "staged.json").is_file()
    assert not dead.exists() and live.exists()
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(["best", live.name])
    restaged = stage_models([tiny_checkpoints["b"]], False, target)  # other weights: swapped
    assert restaged == models and sorted(p.name for p in target.parent.iterdir()) == \
        sorted(["best", live.name])


def test_idle_cpus_are_shared_out_to_the_cpu_jobs_there_are():
    """Equal whole shares that fit on the nodes at once (a task runs on one node), never less
    than a job asked for; GPU jobs keep their request."""
    test = TestSet("t", "src", "ref", "fr")
    one = [EvalJob("best", ("a",), test)]
    assert [j.num_cpus for j in share_cpus(one, [2.0])] == [2.0]  # alone on 2 CPUs: both
    assert [j.num_cpus for j in share_cpus(one, [16.0, 4.0])] == [16.0]  # one node's, at most
    three = [EvalJob(n, ("a",), test) for n in "abc"]
    assert [j.num_cpus for j in share_cpus(three, [8.0, 4.0])] == [4.0] * 3  # 2 + 1 fit
    assert [j.num_cpus for j in share_cpus(three, [2.0])] == [1.0] * 3  # more jobs than CPUs
    assert share_cpus(three, []) == three  # CPUs taken (or no CPU node): as asked
    asked = [dataclasses.replace(j, num_cpus=3.0) for j in three]
    assert share_cpus(asked, [4.0, 4.0]) == asked  # a share of 2 is less than asked
    gpu = EvalJob("g", ("a",), test, num_gpus=0.25)
    assert share_cpus([gpu, *one], [4.0]) == [gpu, dataclasses.replace(one[0], num_cpus=4.0)]


@pytest.mark.slow
def test_a_lone_job_on_an_idle_cluster_searches_with_its_cpus(demo_trained, tmp_path):
    """The session's Ray (2 CPUs, idle between tests) scores one checkpoint with 2 threads: its
    child run says so, and the hypotheses are those of one thread."""
    import torch

    t = demo_trained
    src, ref = tmp_path / "s.en", tmp_path / "s.fr"
    src.write_text("".join(line + "\n" for line in read_lines(t.test_src)[:60]))
    ref.write_text("".join(line + "\n" for line in read_lines(t.test_ref)[:60]))
    job = EvalJob("lone", (t.train.best_checkpoint,), TestSet("lone", str(src), str(ref), "fr"),
                  SearchConfig(max_len_a=1.5, max_len_b=10))
    # Idle first: the tasks of the test before have ended, but on a loaded host the raylet's
    # report of their CPUs as free can trail by more than evaluate_all's 1 s settle (when it
    # does, a job keeps the CPU it asked for: slower, not wrong).
    import ray

    for _ in range(300):
        if ray.available_resources().get("CPU", 0.0) >= ray.cluster_resources().get("CPU", 0.0):
            break
        time.sleep(0.1)
    (result,) = evaluate_all([job], t.tracking_uri, t.train.run_id, out_dir=str(tmp_path / "e"))
    assert result.job.num_cpus == 2.0, (ray.available_resources(), ray.cluster_resources())
    run = MlflowClient(t.tracking_uri).get_run(result.run_id).data
    # (a tag, which a rescore on other resources updates; as a param it kept the first value)
    assert run.tags["convs2s.eval.num_cpus"] == "2.0" and "eval.num_cpus" not in run.params
    threads = torch.get_num_threads()
    try:
        one_thread = evaluate_job(job)  # num_cpus=1: one torch thread, in this process
    finally:
        torch.set_num_threads(threads)
    assert read_lines(result.hyp_path) == one_thread["hypotheses"]
    # The same --out again, another search under the same job and test names: the run of the
    # first is set apart with its own params (logged into it, its params still named beam 5);
    # the same evaluation once more logs into its run again.
    client = MlflowClient(t.tracking_uri)
    other = dataclasses.replace(job, search=SearchConfig(beam=2, max_len_a=1.5, max_len_b=10))
    (second,) = evaluate_all([other], t.tracking_uri, t.train.run_id,
                             out_dir=str(tmp_path / "e"))
    assert second.run_id != result.run_id
    first = client.get_run(result.run_id)
    assert first.data.params["search.beam"] == "5"
    assert first.data.tags["mlflow.runName"] == "eval/lone/lone (superseded)"
    assert "other search.beam" in first.data.tags["convs2s.superseded"]
    assert client.get_run(second.run_id).data.params["search.beam"] == "2"
    (third,) = evaluate_all([other], t.tracking_uri, t.train.run_id,
                            out_dir=str(tmp_path / "e"))
    assert third.run_id == second.run_id


def test_weights_are_staged_once_as_the_files_that_are_scored(tiny_checkpoints, tmp_path):
    """An averaging job's average and an ensemble's members are written once per job name (not
    per test set) as slim inference copies; staging again from unchanged checkpoints reuses
    them, new weights under the same paths are staged anew."""
    from convs2s.io.staging import STAGED_FILE
    from workflows.evaluation import stage_weights

    a = shutil.copytree(tiny_checkpoints["a"], tmp_path / "ck" / "a")
    b = shutil.copytree(tiny_checkpoints["b"], tmp_path / "ck" / "b")
    tests = [TestSet("t", "src", "ref", "fr"), TestSet("u", "src2", "ref2", "fr")]
    jobs = [EvalJob(n, (str(a), str(b)), t, average=avg) for t in tests
            for n, avg in (("avg", True), ("ens", False))]
    staged = stage_weights(jobs, tmp_path / "weights")
    by = {(j.name, j.test_set.name): j.staged for j in staged}
    assert by[("avg", "t")] == by[("avg", "u")] == (str(tmp_path / "weights/avg/model_00"),)
    assert by[("ens", "t")] == tuple(str(tmp_path / f"weights/ens/model_0{i}") for i in (0, 1))
    avg_state = load_checkpoint(by[("avg", "t")][0])
    assert avg_state["averaged_from"] == [str(a), str(b)] and "optimizer" not in avg_state
    assert "optimizer" not in load_checkpoint(by[("ens", "t")][1])
    mtime = (tmp_path / "weights/avg/model_00/checkpoint.pt").stat().st_mtime_ns
    stage_weights(jobs, tmp_path / "weights")  # unchanged sources: reused
    assert (tmp_path / "weights/avg/model_00/checkpoint.pt").stat().st_mtime_ns == mtime
    state = load_checkpoint(b)
    state["model"] = {k: v + 1 if v.is_floating_point() else v for k, v in state["model"].items()}
    save_checkpoint(b, state, tiny_checkpoints["spm"])  # new weights under the same path
    stage_weights(jobs, tmp_path / "weights")
    new = load_checkpoint(tmp_path / "weights/avg/model_00")["model"]
    key = next(k for k, v in new.items() if v.is_floating_point())
    assert not new[key].equal(avg_state["model"][key])
    assert (tmp_path / "weights/avg" / STAGED_FILE).is_file()
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["avg", "ens"]
    # The staged average is what a task scores.
    out = evaluate_job(dataclasses.replace(staged[0], test_set=tiny_test_set(
        tiny_checkpoints, tmp_path), search=SHORT))
    assert len(out["hypotheses"]) == 6


def test_the_command_joins_ray_address_as_every_command_does(tmp_path):
    """`python -m workflows.evaluation` joins RAY_ADDRESS through `storage.ray_join`, as the
    workflows and `python -m preprocessing` do: the dashboard's address is one `error:` line,
    its password hidden, exit 2 (it was Ray's traceback); nothing is logged or scored."""
    from workflows.cluster import free_port

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.pt").write_bytes(b"")  # (not read before Ray starts)
    for name in ("src.en", "ref.de"):
        (tmp_path / name).write_text("a b\n")
    env = {**os.environ, "RAY_ADDRESS": f"http://admin:s3cret@127.0.0.1:{free_port()}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "workflows.evaluation", "--checkpoint",
         f"a={tmp_path / 'ckpt'}", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
         "--out", str(tmp_path / "eval"), "--test", "t", str(tmp_path / "src.en"),
         str(tmp_path / "ref.de"), "de"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: RAY_ADDRESS=http://admin:***@127.0.0.1:"), lines
    assert "ray job submit --working-dir . -- python -m workflows.evaluation" in lines[0]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "eval").exists()


def test_an_out_another_command_holds_is_refused_before_ray_starts(tmp_path, capsys):
    """--out is held as a workflow holds its run folder: an evaluation into a running
    workflow's eval/ (or onto another evaluation's --out) replaced the weights the other's
    scoring tasks were reading and wrote over its hypotheses. One line, exit 2, nothing
    written."""
    import json
    import time

    from storage.lease import LEASE_FILE
    from workflows.evaluation_command import main

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.pt").write_bytes(b"")  # (not read before Ray starts)
    for name in ("src.en", "ref.de"):
        (tmp_path / name).write_text("a b\n")
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    now = time.time()
    (run / LEASE_FILE).write_text(json.dumps({
        "host": "other-host", "pid": 4242, "id": "someone", "command": "wmt14_en_de paper",
        "renewed": now, "expires": now + 120}))
    argv = ["--checkpoint", f"a={tmp_path / 'ckpt'}", "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}", "--test", "t", str(tmp_path / "src.en"),
            str(tmp_path / "ref.de"), "de"]
    assert main([*argv, "--out", str(run / "eval")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run / 'eval'} is inside {run}, which is in use by another " \
        "command (wmt14_en_de paper)" in err[0] and "give another --out" in err[0], err
    assert not (run / "eval").exists() and not (tmp_path / "mlflow.db").exists()


def test_evaluating_another_runs_checkpoints_gets_a_run_of_its_own(tmp_path):
    """Two runs' best models (runs/A/train/best, runs/B/train/best) scored with the same --out:
    the params show the paths' last two parts, the same for both, so B's scores went into A's
    run (two values of each metric, A's hypotheses overwritten). The run's tag names what it
    scored in full: B gets a run of its own, A's is set apart; the same evaluation again, or
    new weights under the same path, are told apart the same way."""
    from workflows.evaluation import EvalJob, TestSet, _run_of

    uri = mlflow_store(tmp_path)
    (tmp_path / "t.src").write_text("a\n")
    (tmp_path / "t.ref").write_text("b\n")
    test = TestSet("t", str(tmp_path / "t.src"), str(tmp_path / "t.ref"), tgt_lang="de")
    bests = []
    for run in ("A", "B"):
        best = tmp_path / "runs" / run / "train" / "best"
        best.mkdir(parents=True)
        (best / "checkpoint.pt").write_bytes(run.encode())
        bests.append(str(best))
    job = lambda best: EvalJob("best", (best,), test)  # noqa: E731
    from convs2s.tracking.runs import end_run

    a = _run_of(uri, "exp", job(bests[0]), tmp_path / "eval", None)
    assert _run_of(uri, "exp", job(bests[0]), tmp_path / "eval", None) == a  # the same again
    end_run(uri, a, "FINISHED")  # (scored)
    b = _run_of(uri, "exp", job(bests[1]), tmp_path / "eval", None)
    assert b != a
    client = MlflowClient(uri)
    assert client.get_run(a).data.tags["mlflow.runName"] == "eval/best/t (superseded)"
    assert "checkpoints or test files" in client.get_run(a).data.tags["convs2s.superseded"]
    # set apart as it was: finished, not reopened (it stayed RUNNING forever, tagged as taken
    # up again)
    assert client.get_run(a).info.status == "FINISHED"
    assert "convs2s.reopened" not in client.get_run(a).data.tags
    tag = "convs2s.eval.identity"
    assert client.get_run(b).data.tags[tag] != client.get_run(a).data.tags[tag]
    os.utime(Path(bests[1]) / "checkpoint.pt", ns=(1, 1))  # new weights under the same path
    # b never ended (its evaluation killed): set apart KILLED, not left RUNNING
    assert _run_of(uri, "exp", job(bests[1]), tmp_path / "eval", None) != b
    assert client.get_run(b).info.status == "KILLED"


def test_a_pair_scored_again_into_its_run_logs_only_scores_that_changed(tmp_path):
    """A pair scored again into its own run (more attention pictures asked, a new scoring
    version) logged every unchanged score a second time at step 0, on the run and on its
    logged model: two values of one BLEU. A changed score and the speed are logged again;
    a new logged model of the same weights gets its scores."""
    from convs2s.tracking.runs import DatasetRecord, find_or_create_run
    from workflows.evaluation import EvalJob, TestSet, _log_result

    uri = mlflow_store(tmp_path)
    (tmp_path / "t.src").write_text("a\n")
    (tmp_path / "t.ref").write_text("b\n")
    test = TestSet("t", str(tmp_path / "t.src"), str(tmp_path / "t.ref"), tgt_lang="de")
    run = find_or_create_run(uri, "exp", run_key="k", run_name="eval/best/t")
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("exp").experiment_id
    model = client.create_logged_model(exp, name="r-best").model_id
    job = EvalJob("best", (str(tmp_path),), test, model_id=model)
    data = DatasetRecord("t", "d1", str(tmp_path / "t.ref"))

    def scored(bleu: float, speed: float) -> dict:
        return {"metrics": {"bleu": bleu, "chrf": 50.0, "sentences_per_second": speed},
                "signatures": {}, "served": {}}

    _log_result(uri, run, job, scored(30.0, 5.0), data)
    _log_result(uri, run, job, scored(30.0, 6.0), data)  # the same scores again
    history = {k: [m.value for m in client.get_metric_history(run, k)]
               for k in ("bleu", "chrf", "sentences_per_second")}
    assert history == {"bleu": [30.0], "chrf": [50.0], "sentences_per_second": [5.0, 6.0]}
    _log_result(uri, run, job, scored(31.0, 6.0), data)  # a new scoring version's
    assert [m.value for m in client.get_metric_history(run, "bleu")] == [30.0, 31.0]
    other = client.create_logged_model(exp, name="r-best").model_id  # logged again
    _log_result(uri, run, dataclasses.replace(job, model_id=other), scored(31.0, 6.0), data)
    assert {m.key: m.value for m in client.get_logged_model(other).metrics} == \
        {"bleu": 31.0, "chrf": 50.0}
    # The same model on a second test set, whose scores equal the first's: its own values (the
    # model's metrics are per dataset; compared across them, they were taken as logged)
    run_v = find_or_create_run(uri, "exp", run_key="k2", run_name="eval/best/v")
    valid = DatasetRecord("v", "d2", str(tmp_path / "t.ref"))
    _log_result(uri, run_v, job, scored(31.0, 6.0), valid)  # the first model's
    for _ in range(2):  # its weights logged again: the new model gets its scores on v once
        _log_result(uri, run_v, dataclasses.replace(job, model_id=other), scored(31.0, 6.0),
                    valid)
    assert [m.value for m in client.get_metric_history(run_v, "bleu")] == [31.0, 31.0]
    assert sorted((m.dataset_name, m.key) for m in client.get_logged_model(other).metrics) == \
        [("t", "bleu"), ("t", "chrf"), ("v", "bleu"), ("v", "chrf")]


def test_a_named_checkpoint_that_does_not_load_is_one_line(tiny_checkpoints, ray_session,
                                                           tmp_path, capsys):
    """`--checkpoint NAME=DIR` whose checkpoint is cut short, or a `--set shortlist=` that is
    not there, was a traceback (exit 1) as its model was logged: one line, exit 2."""
    import shutil

    from workflows.evaluation_command import main

    cut = tmp_path / "cut"
    shutil.copytree(tiny_checkpoints["a"], cut)
    whole = (cut / "checkpoint.pt").read_bytes()
    (cut / "checkpoint.pt").write_bytes(whole[:1000])
    (tmp_path / "t.en").write_text("a\n")
    (tmp_path / "t.de").write_text("b\n")
    test = ["--test", "t", str(tmp_path / "t.en"), str(tmp_path / "t.de"), "de"]
    uri = ["--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--out", str(tmp_path / "e")]
    for argv, says in (([f"a={cut}"], f"--checkpoint a: {cut} is not a whole checkpoint"),
                       ([f"a={tiny_checkpoints['a']}", "--set", "shortlist=/no/such.npz"],
                        "--checkpoint a: ")):
        with pytest.raises(SystemExit) as exit_:
            main(["--checkpoint", *argv, *test, *uri])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and err[-1].startswith(
            f"python -m workflows.evaluation: error: {says}"), err
        assert "Traceback" not in "\n".join(err)


def test_on_several_nodes_the_evaluation_asks_each_for_what_its_tasks_read(
        ray_session, tiny_checkpoints, tmp_path, monkeypatch, capsys):
    """The scoring tasks run on any node, in the folder its raylet started in (not the
    driver's): relative --test files are handed to them absolute, and on a cluster of several
    nodes --out (the weights staged there), the checkpoints and the test files are asked of
    each node first (storage.ray_join.node_not_seeing, run for real in
    tests/test_multinode.py; here it stands in for a node that does not see the test set):
    one line naming the node and the file, exit 2, nothing logged or scored."""
    from storage import ray_join
    from workflows.evaluation_command import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.en").write_text("a house .\n")
    (tmp_path / "t.de").write_text("ein haus .\n")
    asked = []

    def unseen_test(folder, also=()):
        asked.append((folder, also))
        return "10.0.0.7", also[0]

    monkeypatch.setattr(ray_join, "node_not_seeing", unseen_test)
    with pytest.raises(SystemExit) as stop:
        main(["--checkpoint", f"m={tiny_checkpoints['a']}", "--test", "t", "t.en", "t.de",
              "de", "--out", "eval", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2, err  # (argparse's usage, then the error)
    assert err[-1].endswith(f"error: {tmp_path / 't.en'} is not shared: the node at 10.0.0.7 "
                           "does not see it, and scoring tasks run there; give --out, the runs "
                           "and the test sets in folders every node mounts (NFS / EFS / a "
                           "shared volume) or bucket URIs (s3://...)")
    assert asked == [("eval", (str(tmp_path / "t.en"), str(tmp_path / "t.de"),
                               str(Path(tiny_checkpoints["a"]).resolve())))]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "eval" / "m").exists()


def test_a_test_set_of_relative_paths_is_found_by_the_scoring_tasks(
        tiny_checkpoints, ray_session, tmp_path, monkeypatch):
    """Ray tasks run in the folder their node's Ray started in (this session's: the
    repository), not the caller's: `evaluate_all` hands them the test set's files absolute, as
    the caller names them relative to its own folder. The job and its result keep the paths as
    given."""
    uri = mlflow_store(tmp_path)
    tiny_test_set(tiny_checkpoints, tmp_path)
    monkeypatch.chdir(tmp_path)
    test = TestSet("tiny", "t.en", "t.fr", "fr")
    (result,) = evaluate_all([EvalJob("a", (tiny_checkpoints["a"],), test, SHORT)], uri,
                             out_dir=str(tmp_path / "eval"), experiment_name="relative")
    assert result.metrics["sentences"] == 6.0 and result.job.test_set == test
    assert len(Path(result.hyp_path).read_text().splitlines()) == 6
