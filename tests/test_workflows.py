"""The paper-task workflows: presets against the paper / reference settings, the command line,
clear errors without data, and (slow) every workflow's smoke preset end to end on the session's
Ray with its MLflow parent / child runs, and a rerun that resumes instead of redoing.

    timeout 900 .venv/bin/python -m pytest tests/test_workflows.py -q            # all
    timeout 300 .venv/bin/python -m pytest tests/test_workflows.py -q -m "not slow"
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import test_object_storage
from conftest import (QUARTER_DEMO, SHORT_OUTPUTS, SMOKE_ROWS, calls_in_a_fresh_process,
                      mlflow_store)

from preprocessing import config as pconfig
from workflows import gigaword, multi30k_en_de, wmt14_en_de, wmt14_en_fr, wmt16_en_ro
from workflows.catalog import paper_tasks, workflow_modules
from workflows.run_spec import SpecError, resolve
from workflows.workflow_config import RunOptions

# The fr-en runs of tests/test_object_storage.py (one process, in the background): the language
# pair test below takes their local run.
FR_EN_RUNS = test_object_storage.BACKGROUND_RUNS["fr_en_runs"]

REPO = Path(__file__).resolve().parents[1]
# The paper's tasks, as found in workflows/ (a new task's file is tested without a list here).
WORKFLOWS = paper_tasks()


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def _runs(uri: str, experiment: str) -> list:
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r} in {uri}"
    return client.search_runs([exp.experiment_id], max_results=1000)


def _family(uri: str, experiment: str, run_name: str):
    """(parent run, {child run name: run}) of one workflow run."""
    runs = _runs(uri, experiment)
    (parent,) = [r for r in runs if r.info.run_name == run_name
                 and "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    return parent, children


def _main(module, argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = module.main(module.PRESETS, module.__doc__, argv)
    return rc, buf.getvalue()


# --- presets ------------------------------------------------------------------------------------


def test_paper_presets_follow_the_paper_and_reference_recipes():
    fr, de, ro, giga = (m.paper() for m in (wmt14_en_fr, wmt14_en_de, wmt16_en_ro, gigaword))
    # Data (paper §4.1, docs/reference.md, Data): filters, vocabularies, hub sources.
    for cfg in (fr, de):
        assert (cfg.preprocess.max_len, cfg.preprocess.max_len_ratio) == (175, 1.5)
    assert (ro.preprocess.max_len, ro.preprocess.max_len_ratio) == (175, None)
    assert giga.preprocess.max_len_ratio is None and giga.preprocess.vocab_size == 30_000
    assert {c.preprocess.vocab_size for c in (fr, de, ro)} == {40_000}
    assert [c.preprocess.hub_config for c in (fr, de, ro)] == ["fr-en", "de-en", "ro-en"]
    assert all(c.data == "hub" and c.use_gpu for c in (fr, de, ro, giga))
    # En-Fr: the reference recipe, dropout 0.1, max-tokens 3000, 8 GPUs (paper §4.2).
    assert fr.model.dropout == 0.1 and fr.preprocess.max_tokens == 3000 and fr.num_workers == 8
    assert fr.model.encoder_layers[-1] == (4096, 1)
    for cfg in (fr, de):
        t = cfg.train
        assert (t.lr, t.momentum, t.clip_norm, t.label_smoothing) == (0.5, 0.99, 0.1, 0.1)
        assert (t.lr_schedule, t.anneal_from_epoch) == ("fixed", 50)
    # En-De: dropout 0.2, max-tokens 4000, the full newstest2014.
    assert de.model.dropout == 0.2 and de.preprocess.max_tokens == 4000
    assert de.model.encoder_layers[-1] == (2048, 1)
    # En-Ro and Gigaword: the paper's own optimizer (§4.2), 64 / 128 sentences per batch.
    for cfg, sentences in ((ro, 64), (giga, 128)):
        t = cfg.train
        assert (t.lr, t.momentum, t.clip_norm, t.lr_schedule, t.min_lr) == \
            (0.25, 0.99, 0.1, "anneal", 1e-4)
        assert t.label_smoothing == 0.0 and cfg.preprocess.max_sentences == sentences
    assert len(ro.model.encoder_layers) == 20 and ro.model.embed_dim == 512
    assert len(giga.model.encoder_layers) == 6 and giga.model.embed_dim == 256
    # Evaluation: beam 5 everywhere; summarization: ROUGE and at least 14 output tokens.
    assert all(c.search.beam == 5 for c in (fr, de, ro, giga))
    assert giga.task_kind == "summarization" and giga.search.min_len == 14
    assert [c.test_sets["test"] for c in (fr, de, ro)] == \
        ["newstest2014", "newstest2014", "newstest2016"]
    assert ro.preprocess.tgt_lang == "ro"  # scoring normalizes Romanian for "ro"


def test_every_preset_chooses_its_champion_on_validation_data_never_on_a_test_set():
    """Every task's presets score their validation split as they score the test set; the
    registered model's champion is the best there, and the test set only reports its score
    (and names the registered model)."""
    from workflows.engine import champion_sets

    for module in workflow_modules().values():
        for preset, make in module.PRESETS.items():
            cfg = make()
            assert "valid" in cfg.test_sets, (cfg.name, preset)
            assert champion_sets(cfg.test_sets) == (cfg.test_sets["valid"],
                                                    cfg.test_sets["test"]), (cfg.name, preset)
    # An added --test-set reports only; a run that scores no validation split chooses nothing.
    assert champion_sets({"test": "t", "valid": "v", "extra": "e"}) == ("v", "t")
    assert champion_sets({"extra": "e", "valid": "v"}) == ("v", "e")
    assert champion_sets({"test": "t"}) == (None, "t")


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_smoke_presets_run_on_the_embedded_corpus_on_cpu(name):
    cfg = WORKFLOWS[name].smoke()
    pre = resolve(cfg, RunOptions(preset="smoke")).data  # the preset's own --data
    assert cfg.data == "demo" and pre.source == "demo" and not cfg.use_gpu
    assert 1 <= cfg.num_workers <= 2
    assert cfg.model.embed_dim <= 128 and cfg.train.max_epochs <= 6
    expected = "demo_summarization" if name == "gigaword" else "demo"
    assert pre.task == expected
    assert cfg.task_kind == ("summarization" if name == "gigaword" else "translation")


def test_data_flag_picks_the_source_and_paths_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paper = wmt14_en_fr.paper()
    spec = resolve(paper, RunOptions(preset="paper", storage_path="out"))
    pre = spec.data
    assert pre.source == "hub" and pre.root == str(tmp_path / "out" / "preprocessed")
    assert spec.test_sets == {"test": "newstest2014", "valid": "newstest2013"}
    assert spec.run_dir.parent == tmp_path / "out" and spec.run_name.startswith("paper-")
    spec = resolve(paper, RunOptions(preset="paper", data="demo"))
    pre = spec.data
    assert pre.source == "demo" and pre.task == "demo"
    # The demo source brings its own settings (small vocabulary, rows per split), whatever the
    # preset's data settings, and its test sets are named after it.
    # (sentences longer than the model's positions dropped at the cut: the model's limit)
    assert pre == pconfig.demo().replace(root=str(tmp_path / "runs" / "preprocessed"),
                                         max_positions=spec.model.max_positions)
    assert spec.test_sets == {"test": "demo_test", "valid": "demo_valid"}
    giga = resolve(gigaword.paper(), RunOptions(preset="paper", data="demo"))
    assert giga.data == pconfig.demo_summarization().replace(
        root=str(tmp_path / "runs" / "preprocessed"), max_positions=giga.model.max_positions)
    pre = resolve(paper, RunOptions(preset="paper", data="corpora/wmt14")).data
    assert pre.source == str(tmp_path / "corpora" / "wmt14")
    assert pre.splits == {"train": "train", "valid": "newstest2013", "test": "newstest2014"}
    spec = resolve(paper, RunOptions(preset="paper", num_workers=2, use_gpu=False,
                                     max_updates=10))
    assert (spec.num_workers, spec.use_gpu, spec.eval_gpus) == (2, False, 0.0)
    # --max-updates alone stops on the update count, not on the preset's epoch count.
    assert (spec.train.max_updates, spec.train.max_epochs) == (10, 0)
    spec = resolve(paper, RunOptions(max_epochs=1))
    assert (spec.train.max_epochs, spec.train.max_updates) == (1, 0)
    assert resolve(paper, RunOptions(preset="paper")).eval_gpus == paper.eval_gpus > 0


def _run_script(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    full_env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, str(REPO / "workflows" / "wmt14_en_fr.py"), *args],
                          cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


def test_unreachable_hub_says_how_to_run_without_it(tmp_path):
    # A closed local port as the hub endpoint: the same failure as no network, in milliseconds.
    proc = _run_script(["--preset", "paper", "--storage-path", str(tmp_path)], tmp_path,
                       HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_ETAG_TIMEOUT="2")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot reach the Hugging Face hub" in proc.stderr
    assert "--data demo" in proc.stderr and "--data DIR" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()  # failed before any run was created


def test_missing_local_folder_is_a_one_line_error(tmp_path):
    proc = _run_script(["--preset", "smoke", "--data", str(tmp_path / "nope"),
                        "--storage-path", str(tmp_path)], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"source folder {tmp_path / 'nope'} does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- end to end (slow) ----------------------------------------------------------------------------


@pytest.mark.slow
def test_en_fr_smoke_tracks_a_parent_run_with_stage_children(smoke_workflow):
    w = smoke_workflow
    out = w.stdout
    assert "==== wmt14_en_fr (smoke) done" in out
    assert f"mlflow ui --backend-store-uri {w.tracking_uri}" in out and "compare:" in out
    parent, children = _family(w.tracking_uri, w.experiment, w.run_name)
    assert parent.info.status == "FINISHED"
    # Each set of weights scored on the test set and on the validation set (which chooses the
    # champion: lineage.register_champion).
    assert set(children) == {"preprocess", "train", "eval/best/demo_test",
                             "eval/avg_last2/demo_test", "eval/best/demo_valid",
                             "eval/avg_last2/demo_valid"}
    assert all(c.info.status == "FINISHED" for c in children.values())
    # The parent holds the whole configuration and the final scores.
    p = parent.data.params
    assert p["workflow.model.embed_dim"] == "128" and p["workflow.preset"] == "smoke"
    assert p["workflow.preprocess.source"] == "demo" and p["workflow.train.max_updates"] == "60"
    bleu = children["eval/best/demo_test"].data.metrics["bleu"]
    assert parent.data.metrics["bleu"] == pytest.approx(bleu)
    assert parent.data.metrics["eval/best/demo_test/bleu"] == pytest.approx(bleu)
    assert "eval/avg_last2/demo_test/bleu" in parent.data.metrics
    assert f"{bleu:.2f}" in out  # the printed table shows the logged score
    # Stage children: data statistics, the training curve, and comparable evaluation runs.
    pre = children["preprocess"].data
    assert pre.metrics["train.rows_kept"] > 19_000 and pre.params["preprocess.vocab_size"] == \
        "1000"
    train = children["train"].data
    assert train.metrics["valid/ppl"] < 300  # from ~1000 (uniform over the 1000 BPE types)
    # --attention 1: each evaluation run keeps the first sentence's attention pictures.
    arts = _client(w.tracking_uri).list_artifacts(children["eval/best/demo_test"].info.run_id,
                                                  "attention")
    assert [a.path for a in arts] == ["attention/demo_test_attention_000.png"]
    evals = [children[n].data for n in ("eval/best/demo_test", "eval/avg_last2/demo_test")]
    assert set(evals[0].params) == set(evals[1].params)  # compare view: same keys
    for e in evals:
        assert {"bleu", "bleu_tokenized", "chrf", "sentences_per_second"} <= set(e.metrics)
    assert bleu > 0.0  # 60 updates: far from learned (README smoke: the real score)


@pytest.mark.slow
def test_rerun_with_the_same_name_resumes_and_skips_finished_stages(smoke_workflow, capsys):
    w = smoke_workflow
    before = {r.info.run_id for r in _runs(w.tracking_uri, w.experiment)}
    rc, out = _main(wmt14_en_fr, w.argv)
    assert rc == 0
    assert "skipped (finished earlier): train, eval/best/demo_test, eval/avg_last2/demo_test, " \
        "eval/best/demo_valid, eval/avg_last2/demo_valid" in out
    assert out.count("(scored earlier)") == 4
    after = _runs(w.tracking_uri, w.experiment)
    assert {r.info.run_id for r in after} == before  # the same runs, reopened, none added
    # The same logged models (none logged twice) and the same champion version.
    client = _client(w.tracking_uri)
    exp = client.get_experiment_by_name(w.experiment)
    models = [m.name for m in client.search_logged_models([exp.experiment_id])
              if m.name.startswith(f"{w.run_name}-")]
    assert sorted(models) == [f"{w.run_name}-avg_last2", f"{w.run_name}-best"]
    assert len(client.search_model_versions("name = 'wmt14_en_fr-demo_test'")) == 1
    assert "models:/wmt14_en_fr-demo_test@champion (version 1)" in out
    parent, _ = _family(w.tracking_uri, w.experiment, w.run_name)
    assert parent.info.status == "FINISHED"
    # Nothing scored anew: the parent keeps its figures (logged again, each score had a
    # second value and workflow_minutes became the seconds this call took to skip)
    for key in ("bleu", "workflow_minutes"):
        assert len(client.get_metric_history(parent.info.run_id, key)) == 1, key


def test_a_run_inside_a_folder_another_command_holds_is_refused_before_it_writes(tmp_path,
                                                                                 capsys):
    """--storage-path naming a running sweep's folder and --run-name one of its trials: the
    trial's folder holds a workflow.json, so the run would have written into a live trial (and
    --restart moved its outputs aside). The sweep's lease covers its trials: refused in one
    line, naming the sweep's command, with nothing written."""
    import json
    import time

    sweep = tmp_path / "runs" / "abl"
    (sweep / "t0").mkdir(parents=True)
    (sweep / "t0" / "workflow.json").write_text("{}")
    now = time.time()
    (sweep / ".lease.json").write_text(json.dumps({
        "host": "other-host", "pid": 4242, "id": "sweep", "renewed": now, "expires": now + 120,
        "command": "wmt14_en_fr smoke --sweep paper-5.2"}))
    before = sorted(p.name for p in (sweep / "t0").iterdir())
    rc, _ = _main(wmt14_en_fr, ["--preset", "smoke", "--storage-path", str(sweep),
                                "--run-name", "t0", "--tracking-uri", mlflow_store(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"error: {sweep / 't0'} is inside {sweep}"), err
    assert "--sweep paper-5.2" in err[-1]
    assert sorted(p.name for p in (sweep / "t0").iterdir()) == before


@pytest.mark.parametrize("damage", ['{"settings": {"a": 1},', "[]"])
def test_a_damaged_workflow_json_is_one_line_naming_it_and_nothing_starts(tmp_path, capsys,
                                                                         damage):
    """A run's workflow.json cut short (a disk that filled) or edited into no object: the
    rerun says which file and what to do, in one line (it was a JSONDecodeError naming no
    file)."""
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "workflow.json").write_text(damage)
    rc, _ = _main(wmt14_en_fr, ["--preset", "smoke", "--storage-path", str(tmp_path / "runs"),
                                "--run-name", "r", "--tracking-uri", mlflow_store(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"error: {run / 'workflow.json'}: not "), err
    assert "restore it from a copy, or give another --run-name" in err[-1]
    assert sorted(p.name for p in run.iterdir()) == ["workflow.json"]


def test_a_rerun_on_data_changed_under_the_same_path_is_refused(tmp_path):
    """The run records the identity of its training and validation inputs (each file's size
    and modification time; a hub commit): new content under the same path is refused, not
    trained on from the old checkpoint."""
    from workflows import translation
    from workflows.run_spec import resolve
    from workflows.run_state import budgets, input_identity, result_settings, reuse_problem

    data = tmp_path / "data"
    data.mkdir()
    for lang, word in (("fr", "chat"), ("en", "cat")):
        (data / f"c.{lang}").write_text("".join(f"{word} {i}\n" for i in range(12)))
    opts = RunOptions(preset="cpu", src="fr", tgt="en", data=str(data), run_name="r",
                      split=["train=c[:8]", "valid=c[8:10]", "test=c[10:]"],
                      storage_path=str(tmp_path / "runs"))
    spec = resolve(translation.PRESETS["cpu"](), opts)
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / "workflow.json").write_text(json.dumps(
        {"settings": result_settings(spec), "budgets": budgets(spec),
         "inputs": input_identity(spec)}))
    assert reuse_problem(spec) is None  # the same files: the run continues
    (data / "c.en").write_text("".join(f"dog {i}\n" for i in range(12)))  # same path
    problem = reuse_problem(spec)
    assert "data.train: its files changed since the run trained on them" in problem
    assert "new --run-name" in problem and "--restart" in problem


def test_a_run_on_a_hub_branch_that_moved_goes_on_pinned_to_the_commit_it_trained_on(
        tmp_path, monkeypatch):
    """A hub dataset's data is the commit its revision resolved to. When the branch moves
    (a dataset updated, a parquet conversion redone), a rerun is refused naming the commit the
    run trained on, and that commit given as the revision (`--set data.hub_revision=<sha>`)
    is the same run, on the same data folder: its stages and batches are the ones it trained
    on (the checkpoint's data identity, convs2s.train.data), not a preprocessing over again."""
    from hub_mirror import HubMirror, hub_layout, served_as_the_hub

    from preprocessing.pipeline import data_dir
    from workflows.run_state import budgets, input_identity, result_settings, reuse_problem

    old, new = "a" * 40, "b" * 40
    commits = {"main": old}
    with HubMirror(hub_layout(tmp_path / "hub", "fr-en", ("fr", "en")), commits) as hub:
        served_as_the_hub(hub.url, monkeypatch)
        opts = RunOptions(preset="paper", storage_path=str(tmp_path / "runs"), run_name="r")
        spec = resolve(wmt14_en_fr.paper(), opts)
        assert (spec.data.source, spec.data.hub_revision) == ("hub", "main")
        spec.run_dir.mkdir(parents=True)
        (spec.run_dir / "workflow.json").write_text(json.dumps(
            {"settings": result_settings(spec), "budgets": budgets(spec),
             "inputs": input_identity(spec)}))
        assert reuse_problem(spec) is None
        folder = data_dir(spec.data)
        hub.commits["main"] = new  # the branch moves
        problem = reuse_problem(spec)
        assert (f"data.train: hub dataset wmt/wmt14 at revision 'main' is commit {new[:12]} "
                f"now, the run trained on commit {old[:12]} (--set data.hub_revision={old} "
                "goes on with it)") in problem, problem
        assert "its files changed" not in problem
        pinned = resolve(wmt14_en_fr.paper(), RunOptions(**{**vars(opts), "set": [
            f"data.hub_revision={old}"]}))
        assert reuse_problem(pinned) is None
        assert data_dir(pinned.data) == folder  # the folder (and stages) it trained from
        assert data_dir(spec.data) != folder  # the new commit is other data
        # another revision at another commit: refused as the branch that moved is
        hub.commits["v2"] = new
        other = resolve(wmt14_en_fr.paper(), RunOptions(**{**vars(opts), "set": [
            "data.hub_revision=v2"]}))
        assert f"--set data.hub_revision={old} goes on with it" in reuse_problem(other)
        # a folder keyed by the revision's name, as made before, is still this data's
        assert data_dir(pinned.data, by_revision=True) != folder
        # A run recorded before named its revision (its data folder keyed by it): the name is
        # kept when the run goes on pinned, for preprocessing to find that folder
        from workflows.run_state import StageContext, record_settings
        from workflows.run_tree import RunTree

        state = json.loads((spec.run_dir / "workflow.json").read_text())
        state["settings"]["data.hub_revision"] = "main"
        (spec.run_dir / "workflow.json").write_text(json.dumps(state))
        uri = mlflow_store(tmp_path)
        record_settings(StageContext(RunTree.open(uri, "exp", pinned.run_dir, "r")), pinned)
        state = json.loads((spec.run_dir / "workflow.json").read_text())
        assert state["data_keyed_by"] == "main" and "data.hub_revision" not in state["settings"]


@pytest.mark.slow
def test_an_edited_test_set_is_scored_again_on_a_rerun(smoke_workflow, tmp_path):
    """A score stands while its weights, its test text (by content) and the scoring that
    computed it are the ones scored: a copy of the smoke run whose reference file was edited
    scores the test set again, and a validation score recorded by an older BLEU tokenization
    (a record without `scoring`: version 1) is scored again; training and the rest skipped."""
    import shutil

    w = smoke_workflow
    shutil.copytree(w.storage, tmp_path / "runs")
    shutil.copy(Path(w.tracking_uri[len("sqlite:///"):]), tmp_path / "mlflow.db")
    # The run moved with its tracking store, as README says: its record names the new folder
    # and store (a copy beside its original, or on another store, is refused)
    state_file = tmp_path / "runs" / w.run_name / "workflow.json"
    state = json.loads(state_file.read_text().replace(str(w.storage), str(tmp_path / "runs")))
    assert state["tracking"] == w.tracking_uri
    state["tracking"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert state["eval"]["best/demo_valid"].pop("scoring") == 2  # translation's scoring now
    state_file.write_text(json.dumps(state))
    # The copy's finished stages are read where the copy is (its own text files, not the smoke
    # run's): the copy's reference is the file to edit.
    (ref,) = (tmp_path / "runs" / "preprocessed").glob("demo/*/text/*/test.fr")
    lines = ref.read_text().splitlines()
    argv = [*w.argv, "--storage-path", str(tmp_path / "runs"),
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    ref.write_text("\n".join(["une autre référence ."] + lines[1:]) + "\n")
    rc, out = _main(wmt14_en_fr, argv)
    assert rc == 0, out[-3000:]
    assert re.search(r"skipped \(finished earlier\): train, eval/avg_last2/demo_valid$", out,
                     flags=re.M), out[-2000:]
    table = re.findall(r"^(demo_test|demo_valid) +(best|avg_last2) .*?(\(scored earlier\))?$",
                       out, flags=re.M)  # (test set, job, "(scored earlier)" or "") per row
    assert [(t, job) for t, job, earlier in table if earlier] == [("demo_valid", "avg_last2")] \
        and len(table) == 4, out[-2000:]
    # The pairs scored on the edited text got runs of their own; the runs that scored the old
    # text keep their scores, set apart. The pair scored again by a newer scoring version (the
    # same weights and text) kept its run.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name(w.experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    for job in ("best", "avg_last2"):
        name = f"eval/{job}/demo_test"
        (new,) = [r for r in runs if r.info.run_name == name and w.run_name in
                  r.data.tags.get("convs2s.run_key", "")]
        (old,) = [r for r in runs if r.info.run_name == f"{name} (superseded)"]
        assert old.data.tags["convs2s.superseded"].endswith(": another test text")
        assert "bleu" in old.data.metrics and "bleu" in new.data.metrics
        assert old.info.run_id != new.info.run_id and old.data.params == new.data.params
    assert not [r for r in runs if r.info.run_name == "eval/best/demo_valid (superseded)"]


@pytest.mark.slow
def test_a_resumed_preprocess_stage_logs_its_metrics_again_only_when_a_stage_ran(
        demo_batches, tmp_path):
    """A resumed workflow whose preprocessing stages were all up to date keeps the metrics of
    the call that made the data: they were logged again at step 0, `seconds` becoming the
    time of the skipping. A run without them yet gets them; a call that ran a stage (another
    batch cut) logs them again, as training and evaluation log what they did."""
    from mlflow.tracking import MlflowClient

    from conftest import demo_batches_config
    from workflows.run_state import StageContext
    from workflows.run_tree import RunTree
    from workflows.steps import preprocess_stage

    assert {"clean/train", "spm", "encoded/train", "batches/train"} <= set(demo_batches.ran)
    cfg = demo_batches_config(Path(demo_batches.root).parents[1])
    uri = mlflow_store(tmp_path)
    ctx = StageContext(RunTree.open(uri, "exp", tmp_path / "runs" / "r", "r"))
    client = MlflowClient(uri)

    def seconds() -> list[float]:
        (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id],
                                    "tags.`convs2s.stage` = 'preprocess'")
        return [m.value for m in client.get_metric_history(run.info.run_id, "seconds")]

    assert preprocess_stage(ctx, cfg).ran == ()  # the fixture's data: nothing made again
    first = seconds()
    assert len(first) == 1  # a run without metrics yet: logged
    assert preprocess_stage(ctx, cfg).ran == () and seconds() == first  # resumed: kept
    other_cut = preprocess_stage(ctx, cfg.replace(max_tokens=700))
    assert set(other_cut.ran) == {"batches/train", "batches/valid", "batches/test"}
    assert len(seconds()) == 2  # a stage ran: its figures logged


def test_a_score_stands_only_for_its_weights_text_scoring_pictures_and_model():
    # A rerun skips a (job, test set) pair only while its record is that very score; a rerun
    # with a larger --attention scores the pair again, so that its pictures are drawn.
    from workflows.steps import score_stands

    rec = {"stamp": ["w", 1], "text": "t1", "scoring": 2, "attention": 1}
    assert score_stands(rec, ["w", 1], "t1", 2, 1) and score_stands(rec, ["w", 1], "t1", 2, 0)
    assert not score_stands(rec, ["w", 1], "t1", 2, 3)  # --attention 3 now: draw them
    assert not score_stands(rec, ["w", 2], "t1", 2, 1)  # other weights
    assert not score_stands(rec, ["w", 1], "t2", 2, 1)  # an edited test file
    assert not score_stands(rec, ["w", 1], "t1", 3, 1)  # another scoring version
    assert not score_stands(None, ["w", 1], "t1", 2, 0)
    # its logged model logged again (the first deleted): the new one has no score yet
    logged = {**rec, "model_id": "m-1"}
    assert score_stands(logged, ["w", 1], "t1", 2, 1, "m-1")
    assert not score_stands(logged, ["w", 1], "t1", 2, 1, "m-2")
    assert score_stands(logged, ["w", 1], "t1", 2, 1, None)  # tracking unreachable: no model
    older = {"stamp": ["w", 1], "text": "t1"}  # before `scoring` and `attention` were kept
    assert score_stands(older, ["w", 1], "t1", 1, 0)
    assert not score_stands(older, ["w", 1], "t1", 1, 1)


# The other tasks' smoke runs, one after another in one process of their own with its own local
# Ray, as `python workflows/<task>.py --preset smoke` runs (what the driver prints, as JSON).
OTHER_SMOKES = (
    "import contextlib, io, json, sys; sys.path[:0] = [{repo!r}]\n"
    "from workflows.catalog import paper_tasks\n"
    "out = {{}}\n"
    "for name in {names!r}:\n"
    "    module, buf = paper_tasks()[name], io.StringIO()\n"
    "    with contextlib.redirect_stdout(buf):\n"
    "        rc = module.main(module.PRESETS, module.__doc__, ['--preset', 'smoke',\n"
    "            '--max-updates', '20', *{short!r}, *{extra!r}.get(name, ()),\n"
    "            '--storage-path', {storage!r},\n"
    "            '--tracking-uri', {uri!r}, '--run-name', name + '-smoke'])\n"
    "    out[name] = [rc, buf.getvalue()]\n"
    "open({result!r}, 'w').write(json.dumps(out))\n")


# A setting one of them also checks: the lexical table the run asks for is searched with
EXTRA_SETTINGS = {"wmt16_en_ro": ("--set", "data.shortlist_per_source=8")}


def _run_other_smokes(ctx):
    """The smoke presets of every paper task but En-Fr (whose run is the session's
    `smoke_workflow`), cut to 20 updates on a quarter of the demo corpus, in a process of
    their own (its own local Ray: it shares nothing with the session's, so it runs in the
    background, tests/conftest.py `Background`). Returns storage, tracking_uri and
    {task: (exit code, stdout)}."""
    from types import SimpleNamespace

    root = ctx.tmp_path_factory.mktemp("other_smokes")
    uri, result = mlflow_store(root), root / "result.json"
    names = sorted(set(WORKFLOWS) - {"wmt14_en_fr"})
    # a quarter of the demo corpus (each task's 20 updates stay inside its first epoch), 200
    # pairs to validate and score on
    short = (*SHORT_OUTPUTS, *QUARTER_DEMO)
    code = OTHER_SMOKES.format(repo=str(REPO), names=names, short=short, extra=EXTRA_SETTINGS,
                               storage=str(root / "runs"), uri=uri, result=str(result))
    env = {k: v for k, v in ctx.env.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    proc = ctx.run([sys.executable, "-c", code], cwd=root, env=env, timeout=900)
    assert proc.returncode == 0 and result.is_file(), (proc.stdout + proc.stderr)[-4000:]
    runs = {k: tuple(v) for k, v in json.loads(result.read_text()).items()}
    return SimpleNamespace(storage=root / "runs", tracking_uri=uri, runs=runs)


@pytest.fixture(scope="session")
def other_smokes(background):
    return background.result("other_smokes")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(WORKFLOWS) - {"wmt14_en_fr"}))
def test_other_workflows_smoke_end_to_end(name, other_smokes):
    """The other tasks' smoke presets, cut to a few updates, run as their command lines run
    (`_run_other_smokes`; the first preprocesses the demo corpus, the others reuse it through
    the same storage path)."""
    w, module = other_smokes, WORKFLOWS[name]
    rc, out = w.runs[name]
    assert rc == 0, out[-3000:]
    parent, children = _family(w.tracking_uri, name, f"{name}-smoke")
    assert parent.info.status == "FINISHED"
    assert all(c.info.status == "FINISHED" for c in children.values())
    cfg = module.smoke()
    trains = {n for n in children if n.startswith("train")}
    assert len(trains) == cfg.ensemble.runs
    evals = {n: c.data.metrics for n, c in children.items() if n.startswith("eval/")}
    if name == "gigaword":
        # 20 updates leave one checkpoint: the average of the last two is not scored.
        assert set(evals) == {"eval/best/demo_test", "eval/best/demo_valid"}
        for m in evals.values():
            assert {"rouge1_f", "rouge2_f", "rougeL_f", "rouge1_r"} <= set(m)
        assert parent.data.metrics["rouge1_f"] == \
            pytest.approx(evals["eval/best/demo_test"]["rouge1_f"])
        assert children["eval/best/demo_test"].data.params["search.min_len"] == "3"
    elif name == "wmt14_en_de":  # two seeds and their ensemble (paper §5.2)
        assert set(evals) == {f"eval/{job}/{test}" for job in ("run1_best", "run2_best",
                                                               "ensemble_2")
                              for test in ("demo_test", "demo_valid")}
        assert children["eval/ensemble_2/demo_test"].data.params["eval.kind"] == "ensemble"
        # the main score is the first run's best checkpoint's
        assert parent.data.metrics["bleu"] == \
            pytest.approx(evals["eval/run1_best/demo_test"]["bleu"])
    else:
        assert set(evals) == {"eval/best/demo_test", "eval/best/demo_valid"}
        assert parent.data.metrics["bleu"] == pytest.approx(evals["eval/best/demo_test"]["bleu"])
    if name in EXTRA_SETTINGS:  # data.shortlist_per_source: the table built is searched with
        # (it was built, and scoring searched the whole vocabulary)
        shortlist = children["eval/best/demo_test"].data.params["search.shortlist"]
        assert shortlist.endswith("/shortlist.npz"), shortlist
    from convs2s.metrics.task_kinds import task_kind

    kind = task_kind(cfg.task_kind)  # its scores (a child's speed and seconds are its own)
    for child, metrics in evals.items():  # every score also on the parent, by its child's name
        scores = [k for k in kind.metrics if k not in kind.optional or k in metrics]
        assert set(scores) <= set(metrics), (child, metrics)
        for key in scores:
            assert parent.data.metrics[f"{child}/{key}"] == pytest.approx(metrics[key]), \
                (child, key)


@pytest.mark.slow
def test_a_dead_tracking_server_costs_one_warning_and_the_summary_says_where_metrics_went(
        smoke_workflow, caplog):
    """The En-Fr smoke run again, 5 updates, against a tracking server that is down (its
    preprocessing is reused from the smoke run's storage)."""
    import logging
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    w = smoke_workflow
    with caplog.at_level(logging.WARNING):
        # (outputs cut short, as every other test run's: a 5-update model decodes to the
        # presets' 200 pieces, most of a short run's evaluation)
        rc, out = _main(wmt14_en_fr, ["--preset", "smoke", "--max-updates", "5", *SMOKE_ROWS,
                                      *SHORT_OUTPUTS, "--storage-path", str(w.storage),
                                      "--tracking-uri", dead, "--run-name", "dead-tracker"])
    assert rc == 0, out[-2000:]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and (dead in r.getMessage() or "MLflow" in r.getMessage())]
    assert len(said) == 1 and f"MLflow tracking at {dead} is unavailable" in said[0], said
    run_dir = w.storage / "dead-tracker"
    assert "(id None)" not in out
    assert f"MLflow: tracking at {dead} was unavailable; training metrics are in {run_dir}" in out
    assert (run_dir / "train" / "metrics.jsonl").is_file()
    assert "demo_test" in (run_dir / "workflow.json").read_text()  # the scores are kept
    # ... and stand on a rerun while the server is still down: its runs are not known to be
    # gone (every finished beam search was made again at each rerun of an outage)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        rc, again = _main(wmt14_en_fr, ["--preset", "smoke", "--max-updates", "5",
                                        *SMOKE_ROWS, *SHORT_OUTPUTS, "--storage-path",
                                        str(w.storage), "--tracking-uri", dead, "--run-name",
                                        "dead-tracker"])
    assert rc == 0, again[-2000:]
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "pairs scored earlier, skipped" in said and "jobs as parallel Ray tasks" not in said, \
        said[-3000:]


# --- the README stays true ----------------------------------------------------------------------


def _readme_commands() -> list[str]:
    import re

    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [line.split("  #")[0].strip() for line in lines if line.strip()]


def test_readme_commands_name_real_targets_and_accepted_flags():
    import re
    import shlex

    from workflows.workflow_config import parse_args

    commands = _readme_commands()
    makefile = (REPO / "Makefile").read_text()
    scripts = set()
    for cmd in commands:
        if cmd.startswith("make "):
            assert re.search(rf"^{cmd.split()[1]}:", makefile, flags=re.M), cmd
        m = re.search(r"python (workflows/\w+\.py)(.*)$", cmd)
        if m:
            scripts.add(m.group(1))
            presets = workflow_modules()[Path(m.group(1)).stem].PRESETS
            # (a shell redirection of the output is not a flag)
            argv = shlex.split(m.group(2).split(" > ")[0].replace("$PWD", "/tmp"))
            opts = parse_args(argv, presets, None)
            assert opts.preset in presets
    assert scripts == {f"workflows/{n}.py" for n in workflow_modules()}
    # The two fresh-machine commands, and the CI entry runs the README's test command.
    assert {"make smoke", "make test"} <= set(commands)
    assert "make test" in (REPO / ".ci" / "run").read_text().splitlines()
    assert ".venv/bin/python workflows/wmt14_en_fr.py --preset smoke" in makefile


def test_declaring_a_workflow_imports_neither_torch_nor_ray():
    """Settings live in torch-free config modules: reading a workflow's presets (a driver
    that only submits, a notebook) imports none of the heavy packages."""
    code = ("import sys\n"
            "from workflows import gigaword, multi30k_en_de, wmt14_en_de, wmt14_en_fr, "
            "wmt16_en_ro\n"
            "for m in (gigaword, wmt14_en_de, wmt14_en_fr, wmt16_en_ro):\n"
            "    m.paper(), m.smoke()\n"
            "multi30k_en_de.reference(), multi30k_en_de.cpu()\n"
            "print(sorted(p for p in ('torch', 'ray', 'sentencepiece', 'mlflow') "
            "if p in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_refused_run_answers_before_torch_or_mlflow_loads(tmp_path):
    """Bad data (a missing folder, a test set with no files, one side of a pair) is refused
    in the checks before Ray, and those need neither torch nor MLflow: a refusal costs the
    command a fraction of a second, not the seconds their imports take (3.9 CPU s before:
    docs/benchmarks.md)."""
    (tmp_path / "one_side").mkdir()
    (tmp_path / "one_side" / "train.en").write_text("a\n")
    cases = [["--data", str(tmp_path / "missing")],
             ["--data", str(tmp_path), "--test-set", "nope"],
             ["--data", str(tmp_path / "one_side")]]
    results, loaded = calls_in_a_fresh_process(
        "from workflows import multi30k_en_de as w",
        f"w.main(w.PRESETS, w.__doc__, ['--preset', 'cpu', '--storage-path', "
        f"{str(tmp_path / 'runs')!r}, *extra])", cases)
    says = ["missing does not exist", "--test-set nope", "not its other side"]
    for (rc, err), said in zip(results, says):
        assert rc == 2 and said in err, err
    assert loaded == []
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flags, says", [
    (["--max-updates", "0"], "--max-updates 0: give a positive integer"),
    (["--max-epochs", "0"], "--max-epochs 0: give a positive integer"),
    (["--num-workers", "0"], "--num-workers 0: give a positive integer"),
    (["--attention", "-1"], "--attention -1: give a number of sentences"),
    (["--update-freq", "0"], "--update-freq 0: give a positive integer"),
    (["--max-tokens", "0"], "--max-tokens 0: give a positive integer"),
    (["--max-tokens", "4000", "--bogus"], "unrecognized arguments: --bogus"),
    (["--tracking-uri", "/tmp/mlruns"],
     "--tracking-uri: tracking URI '/tmp/mlruns' is a plain path"),
    (["--tracking-uri", "file:///tmp/mlruns"],
     "--tracking-uri: tracking URI 'file:///tmp/mlruns' is a file:// store"),
])
def test_bad_flag_values_are_refused_up_front_with_one_line(flags, says, capsys):
    from workflows.workflow_config import parse_args

    with pytest.raises(SystemExit) as exit_:
        parse_args(flags, {"smoke": wmt14_en_fr.smoke}, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert len(err) == 1 and f": error: {says}" in err[0], err  # (not argparse's usage first)


def test_summary_aligns_long_names_and_says_where_metrics_went_without_tracking():
    from workflows.engine import EvalScore, WorkflowResult
    from workflows.orchestrate import summary

    scores = [EvalScore("best", "test_2016_flickr", {"bleu": 38.1, "bleu_tokenized": 38.0,
                                                     "chrf": 63.2}, None, "/r/eval/a"),
              EvalScore("avg_last5", "val", {"bleu": 40.0, "bleu_tokenized": 40.1,
                                             "chrf": 64.0}, None, "/r/eval/b")]
    r = WorkflowResult(parent_run_id=None, experiment="multi30k_en_de",
                       tracking_uri="http://127.0.0.1:9", run_dir="/r", train=[],
                       scores=scores, skipped=[])
    text = summary(resolve(multi30k_en_de.cpu(), RunOptions(preset="cpu")), r, 60.0)
    header, row1, row2 = text.splitlines()[2:5]  # every column starts at the same offset
    assert header.index("job") == row1.index("best") == row2.index("avg_last5")
    ends = {line.index(x) + len(x) for line, x in ((header, "bleu"), (row1, "38.10"),
                                                     (row2, "40.00"))}
    assert len(ends) == 1, (header, row1, row2)
    assert "(id None)" not in text and "mlflow ui" not in text
    assert ("MLflow: tracking at http://127.0.0.1:9 was unavailable; training metrics are in "
            "/r/train*/metrics.jsonl and the scores in /r/workflow.json") in text


def _interrupt_preprocessing(ctx):
    """The En-Fr smoke workflow as a user runs it, then Ctrl-C (SIGINT to the terminal's
    process group) one second into its first cleaning stage. Its own local Ray: it runs in
    the background (tests/conftest.py, `Background`). Returns folder, exit code, console."""
    import signal
    import time
    from types import SimpleNamespace

    folder = ctx.tmp_path_factory.mktemp("ctrl_c")
    env = {k: v for k, v in ctx.env.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT (below) prints every thread's stack
    proc = ctx.popen([sys.executable, str(REPO / "workflows" / "wmt14_en_fr.py"), "--preset",
                      "smoke", "--run-name", "ctrlc"], cwd=folder, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "[clean/train] running" in line:
                time.sleep(1.0)
                os.killpg(proc.pid, signal.SIGINT)
                break
        try:
            rest, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # a hang: say where the driver waits
            os.kill(proc.pid, signal.SIGABRT)
            rest, _ = proc.communicate(timeout=30)
            raise AssertionError("the workflow had not ended 120 s after Ctrl-C; its console "
                                 "and its threads' stacks then:\n"
                                 + ("".join(seen) + rest)[-12000:]) from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return SimpleNamespace(folder=folder, returncode=proc.returncode,
                           console="".join(seen) + rest)


@pytest.fixture(scope="module")
def ctrl_c(background):
    return background.result("ctrl_c")


@pytest.mark.slow
def test_ctrl_c_during_preprocessing_says_how_to_resume_without_a_traceback(ctrl_c):
    """Ctrl-C while a stage runs (`_interrupt_preprocessing`): exit 130, one line naming the
    run to resume, no KeyboardInterrupt traceback; the parent run and the stage's are KILLED."""
    console = ctrl_c.console
    assert ctrl_c.returncode == 130, console[-3000:]
    assert "Traceback" not in console and "KeyboardInterrupt" not in console, console[-3000:]
    (said,) = [line for line in console.splitlines() if line.startswith("interrupted:")]
    assert "--run-name ctrlc" in said and str(ctrl_c.folder / "runs") in said
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{ctrl_c.folder / 'mlflow.db'}")
    exp = client.get_experiment_by_name("wmt14_en_fr")
    found = client.search_runs([exp.experiment_id])
    runs = {r.info.run_name: r.info.status for r in found}
    assert runs == {"ctrlc": "KILLED", "preprocess": "KILLED"}  # the stage's run too
    # the stopped call's minutes count (a 10-hour call that crashed added none)
    (parent,) = [r for r in found if r.info.run_name == "ctrlc"]
    assert 0 < parent.data.metrics["workflow_minutes"] < 10, parent.data.metrics


def test_the_processes_the_suite_starts_take_ctrl_c_however_the_suite_was_started():
    """A suite started in the background by a script inherits SIGINT ignored, and so would the
    workflows it presses Ctrl-C in (they would go on, as a `nohup`'d command should):
    tests/conftest.py gives the session Python's Ctrl-C handler, which a child resets to the
    default, so a Python child raises KeyboardInterrupt on Ctrl-C as from a terminal. Checked
    in a process started as such a suite is (SIGINT ignored) that loads tests/conftest.py."""
    check = ("import signal; "
             "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    suite = ("import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
             f"sys.path[:0] = [{str(REPO / 'tests')!r}, {str(REPO)!r}]; import conftest; "
             f"print(subprocess.run([sys.executable, '-c', {check!r}], capture_output=True, "
             "text=True).stdout.strip())")
    proc = subprocess.run([sys.executable, "-c", suite], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.stdout.strip() == "True", proc.stdout + proc.stderr[-2000:]


def test_system_metrics_are_on_by_default_and_one_flag_turns_them_off():
    from workflows.workflow_config import parse_args

    presets = {"smoke": wmt14_en_fr.smoke}
    on = parse_args([], presets, None)
    off = parse_args(["--no-system-metrics"], presets, None)
    cfg = wmt14_en_fr.smoke()
    assert resolve(cfg, on).system_metrics_s == cfg.system_metrics_s > 0
    assert resolve(cfg, off).system_metrics_s == 0


def test_the_training_precision_is_the_presets_auto_unless_a_flag_says_otherwise():
    from workflows.workflow_config import parse_args

    presets = {"smoke": wmt14_en_fr.smoke}
    cfg = wmt14_en_fr.smoke()
    assert resolve(cfg, parse_args([], presets, None)).train.precision == "auto"
    for choice in ("bf16", "fp32"):
        spec = resolve(cfg, parse_args(["--precision", choice], presets, None))
        assert spec.train.precision == choice
        assert spec.params()["workflow"]["train"]["precision"] == choice


# --- reusing a run name -------------------------------------------------------------------------


def _with_lr(module, lr):
    base = module.smoke()
    return lambda: base.replace(train=base.train.replace(lr=lr))


@pytest.mark.slow
def test_a_run_name_reused_with_other_settings_is_refused_before_anything_starts(
        smoke_workflow, capsys):
    """Training would resume the old weights under the new settings: refused with one line that
    names what differs and the two ways forward; nothing is touched."""
    w = smoke_workflow
    before = {r.info.run_id: r.info.status for r in _runs(w.tracking_uri, w.experiment)}
    state = (w.storage / w.run_name / "workflow.json").read_text()
    old_lr = wmt14_en_fr.smoke().train.lr
    rc = wmt14_en_fr.main({"smoke": _with_lr(wmt14_en_fr, old_lr * 2)}, None, w.argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: run 'smoke-test'")
    assert f"train.lr: {old_lr} -> {old_lr * 2}" in err[0]
    assert "new --run-name" in err[0] and "--restart" in err[0]
    assert {r.info.run_id: r.info.status for r in _runs(w.tracking_uri, w.experiment)} == before
    assert (w.storage / w.run_name / "workflow.json").read_text() == state


@pytest.mark.parametrize("extra, says", [
    (["--max-updates", "30"], "max_updates: 60 -> 30 (smaller)"),
    (["--num-workers", "1"], "update.micro_batches: 2 -> 1"),  # (half the update)
    (["--init-from", "{best}"], "init_from (--init-from): (none) -> "),
])
def test_a_rerun_that_adds_init_from_shrinks_a_budget_or_resizes_the_update_is_refused(
        smoke_workflow, capsys, extra, says):
    """Each would resume the old weights as if nothing changed: refused in one line, as any
    other changed setting is."""
    w = smoke_workflow
    best = str(w.storage / w.run_name / "train" / "best")
    rc = wmt14_en_fr.main({"smoke": wmt14_en_fr.smoke}, None,
                          [*w.argv, *(a.format(best=best) for a in extra)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: run 'smoke-test'"), err
    assert says in err[0] and "--restart" in err[0]


def _a_recorded_smoke_run(tmp_path):
    """(tracking URI, options, spec, run tree, stage context) of the smoke preset's run "r" in
    a new sqlite store, its settings recorded (`record_settings`) as a run's first command
    records them, nothing trained."""
    from workflows.run_state import StageContext, record_settings
    from workflows.run_tree import RunTree

    uri = mlflow_store(tmp_path)
    opts = RunOptions(preset="smoke", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=uri)
    spec = resolve(wmt14_en_fr.smoke(), opts)
    tree = RunTree.open(uri, "exp", spec.run_dir, "r")
    ctx = StageContext(tree)
    record_settings(ctx, spec)
    return uri, opts, spec, tree, ctx


def test_restart_sets_the_earlier_training_aside_and_a_larger_budget_continues(tmp_path,
                                                                               monkeypatch):
    """--restart moves the run's training, weights and scores into replaced-<time>/, re-keys
    their MLflow runs to there (so the new training gets new runs) and says so on the parent;
    a larger budget alone is a continuation, recorded on the parent. Real sqlite store and
    files, no training."""
    from convs2s.tracking.runs import RUN_KEY_TAG, find_or_create_run, run_key
    from workflows.run_state import record_settings, reuse_problem

    uri, opts, spec, tree, ctx = _a_recorded_smoke_run(tmp_path)
    run_dir = spec.run_dir
    for f in ("train/checkpoint_00000010/checkpoint.pt", "eval/best/demo_test.fr",
              "weights/best/model_00/checkpoint.pt", "preprocess_manifests.json"):
        (run_dir / f).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / f).write_text("x")
    train_id = find_or_create_run(uri, "exp", run_key(run_dir / "train"), "train", tree.parent)
    eval_id = tree.child("eval/best/demo_test", "evaluate")
    prep_id = tree.child("preprocess", "preprocess")
    state = ctx.state()
    state["train"]["train"] = {"key": "k", "result": {}}
    ctx.save_state(state)

    changed = resolve(wmt14_en_fr.smoke().replace(
        train=wmt14_en_fr.smoke().train.replace(lr=0.5)), opts)
    assert "train.lr" in reuse_problem(changed)
    from workflows.run_state import changed_settings
    # A field added by newer code (its default: the old behaviour) is not a change of the run.
    assert changed_settings({"a": "1"}, {"a": "1", "model.src_positions": "True"}) == []
    assert changed_settings({"a": "1"}, {"a": "2"}) == ["a: 1 -> 2"]
    restart = changed.replace(restart=True)
    assert reuse_problem(restart) is None
    first_parent = tree.parent
    tree.describe(first_parent, spec.params())
    record_settings(ctx, restart)
    (aside,) = run_dir.glob("replaced-*")
    assert sorted(p.name for p in aside.iterdir()) == ["eval", "train", "weights"]
    assert (aside / "train/checkpoint_00000010/checkpoint.pt").is_file()
    assert not (run_dir / "train").exists() and (run_dir / "preprocess_manifests.json").exists()
    client = _client(uri)
    for run_id, rel in ((train_id, "train"), (eval_id, "eval/best/demo_test")):
        run = client.get_run(run_id)
        assert run.data.tags[RUN_KEY_TAG] == run_key(aside / rel)
        assert run.info.run_name.endswith("(replaced)") and "train.lr" in \
            run.data.tags["convs2s.replaced"]
    # The parent and its preprocess run are set apart as well: their params name the earlier
    # settings (MLflow keeps a param's first value, so the new scores would sit beside
    # train.lr=0.25); the restarted run is a new parent, described with the new settings.
    for run_id, name in ((first_parent, "r"), (prep_id, "preprocess")):
        run = client.get_run(run_id)
        assert run.info.run_name == f"{name} (superseded)" and "train.lr" in \
            run.data.tags["convs2s.superseded"], name
        assert run.data.tags[RUN_KEY_TAG].startswith(f"{run_key(run_dir)}") and \
            run.data.tags[RUN_KEY_TAG] != run_key(run_dir / "preprocess")
    assert client.get_run(first_parent).info.status == "KILLED"  # (left RUNNING: reopened)
    assert client.get_run(first_parent).data.params["workflow.train.lr"] == str(spec.train.lr)
    assert tree.parent != first_parent and tree.child("preprocess", "preprocess") != prep_id
    tree.describe(tree.parent, restart.params())
    assert client.get_run(tree.parent).data.params["workflow.train.lr"] == "0.5"
    parent = client.get_run(tree.parent).data.tags
    assert "train.lr" in parent["convs2s.restarted"] and str(aside) in parent["convs2s.restarted"]
    assert ctx.state()["train"] == {} and reuse_problem(changed) is None
    # A second restart within the same second keeps the first one's folder whole (in a
    # bucket, where a folder is no object, it would have been written over).
    (run_dir / "train/checkpoint_00000020/checkpoint.pt").parent.mkdir(parents=True)
    (run_dir / "train/checkpoint_00000020/checkpoint.pt").write_text("y")
    import workflows.run_state as run_state

    monkeypatch.setattr(run_state.time, "strftime", lambda fmt: aside.name[len("replaced-"):])
    record_settings(ctx, restart)
    second = [p for p in run_dir.glob("replaced-*") if p != aside]
    assert len(second) == 1 and second[0].name.startswith(aside.name + "-")
    assert (second[0] / "train/checkpoint_00000020/checkpoint.pt").read_text() == "y"
    assert (aside / "train/checkpoint_00000010/checkpoint.pt").is_file()
    # The new training gets a new run under the old key.
    assert find_or_create_run(uri, "exp", run_key(run_dir / "train"), "train",
                              tree.parent) != train_id

    longer = resolve(_with_lr(wmt14_en_fr, 0.5)(), RunOptions(**{**vars(opts), "max_epochs": 9}))
    assert reuse_problem(longer) is None  # a larger budget continues the run
    # A limit where there was none (max_time 0: no limit) is a smaller budget: the run may
    # have trained past it, and its record would name a budget its weights did not keep.
    capped = resolve(_with_lr(wmt14_en_fr, 0.5)(),
                     RunOptions(**{**vars(opts), "max_epochs": 9, "max_time": 60.0}))
    assert "max_time: no limit -> 60.0 (smaller)" in (reuse_problem(capped) or "")
    record_settings(ctx, longer)
    continued = client.get_run(tree.parent).data.tags["convs2s.continued"]
    assert f"max_epochs {spec.train.max_epochs} -> 9" in continued


def test_a_restart_before_anything_was_trained_starts_a_new_parent_run(tmp_path):
    """A run whose preprocessing failed, rerun with other settings and --restart: nothing to
    set aside, but its parent and preprocess runs hold the earlier settings as params (MLflow
    keeps a param's first value): they are set apart and the restarted run is a new parent,
    described with the new settings. Real sqlite store, no training."""
    from workflows.run_state import record_settings

    uri, opts, spec, tree, ctx = _a_recorded_smoke_run(tmp_path)
    tree.describe(tree.parent, spec.params())
    prep_id = tree.child("preprocess", "preprocess")
    first_parent = tree.parent  # (its preprocessing failed here: nothing trained)

    restart = resolve(_with_lr(wmt14_en_fr, 0.5)(), opts).replace(restart=True)
    record_settings(ctx, restart)
    assert tree.parent != first_parent
    tree.describe(tree.parent, restart.params())
    client = _client(uri)
    assert client.get_run(tree.parent).data.params["workflow.train.lr"] == "0.5"
    assert "train.lr" in client.get_run(tree.parent).data.tags["convs2s.restarted"]
    for run_id, name in ((first_parent, "r"), (prep_id, "preprocess")):
        run = client.get_run(run_id)
        assert run.info.run_name == f"{name} (superseded)" and "train.lr" in \
            run.data.tags["convs2s.superseded"], name
    assert tree.child("preprocess", "preprocess") != prep_id
    assert not list(spec.run_dir.glob("replaced-*"))  # nothing was there to move


def test_a_restart_interrupted_while_moving_is_finished_by_the_next_command(tmp_path,
                                                                          monkeypatch):
    """In a bucket a move is a copy of every object, then their deletion: a --restart killed
    while it set the earlier work aside left part of it in place, under records a rerun
    trusted (a rerun with the old settings scored what was left). The folder it began is in
    workflow.json before anything moves; the next command finishes the move into it, and the
    run starts from nothing."""
    import workflows.run_state as run_state
    from workflows.run_state import StageContext, record_settings
    from workflows.run_tree import RunTree

    uri = mlflow_store(tmp_path)
    opts = RunOptions(preset="smoke", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=uri)
    spec = resolve(wmt14_en_fr.smoke(), opts)
    ctx = StageContext(RunTree.open(uri, "exp", spec.run_dir, "r"))
    record_settings(ctx, spec)
    run_dir = spec.run_dir
    for f in ("train/checkpoint_00000010/checkpoint.pt", "eval/best/demo_test.fr",
              "weights/best/model_00/checkpoint.pt"):
        (run_dir / f).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / f).write_text("x")
    state = ctx.state()
    state["train"]["train"] = {"key": "k", "result": {}}
    ctx.save_state(state)
    moved, real = [], run_state.move_tree

    def killed_after_one(src, dest):  # the command dies after its first folder
        if moved:
            raise KeyboardInterrupt
        moved.append(src)
        real(src, dest)

    monkeypatch.setattr(run_state, "move_tree", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        record_settings(ctx, spec.replace(restart=True))
    (aside,) = run_dir.glob("replaced-*")
    assert ctx.state()["restarting"] == aside.name and ctx.state()["train"]  # half done
    monkeypatch.setattr(run_state, "move_tree", real)
    record_settings(ctx, spec)  # the next command, the old settings, no --restart
    assert sorted(p.name for p in aside.iterdir()) == ["eval", "train", "weights"]
    assert not [p for p in ("train", "eval", "weights") if (run_dir / p).exists()]
    assert ctx.state()["train"] == {} and "restarting" not in ctx.state()
    assert list(run_dir.glob("replaced-*")) == [aside]


def test_a_gpu_request_this_machine_cannot_meet_is_refused_before_ray_starts(tmp_path, capsys):
    """One GPU per training worker, checked against this machine's GPUs before Ray starts: too
    few is one line with the fix, exit 2, nothing written."""
    import torch

    have = torch.cuda.device_count()
    argv = ["--preset", "smoke", "--use-gpu", "--num-workers", str(have + 1),
            "--storage-path", str(tmp_path / "runs"),
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    rc, _ = _main(wmt14_en_fr, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"needs {have + 1} GPU(s) (one per worker), but this machine has {have}" in err[0]
    assert ("--num-workers" if have else "without --use-gpu") in err[0]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_a_sqlite_store_a_node_does_not_see_is_refused_naming_the_node(monkeypatch, tmp_path):
    """On a cluster of several nodes rank 0's metrics and each node's system metrics are
    logged where the workers run: a sqlite database another node does not see was a database
    of its own there (the curves never reached the driver's). The folder's probe
    (storage.ray_join.node_not_seeing, run on a real cluster in tests/test_multinode.py)
    stands in here for a node that does not mount it; a tracking server is not probed."""
    from storage import ray_join
    from workflows.cluster import check_shared_storage

    storage, db = tmp_path / "shared", tmp_path / "local"
    asked = []

    def seen_but_db(folder, also=()):
        asked.append(Path(folder))
        return ("10.0.0.7", str(folder)) if Path(folder) == db else None

    monkeypatch.setattr(ray_join, "node_not_seeing", seen_but_db)
    with pytest.raises(SpecError, match=rf"--tracking-uri sqlite:///{db}/mlflow.db is a "
                                        rf"database on this node: the node at 10.0.0.7 does "
                                        rf"not see {db}, .* give a tracking server"):
        check_shared_storage(str(storage), f"sqlite:///{db}/mlflow.db")
    asked.clear()
    check_shared_storage(str(storage), "http://mlflow:5000")
    assert asked == [storage]


def test_a_missing_search_file_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    """replace_unk's dictionary (or a shortlist) is read by evaluation only, after the whole
    training run: a missing one is one line before anything starts."""
    argv = ["--preset", "smoke", "--set", "search.replace_unk=true", "--set",
            "search.dictionary=nodict.txt", "--storage-path", str(tmp_path / "runs"),
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    monkeypatch.chdir(tmp_path)
    rc, _ = _main(wmt14_en_fr, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "--set search.dictionary=" in err[0] and "nodict.txt: no such file" in err[0]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_accelerator_type_needs_gpus_and_reaches_the_training_job():
    with pytest.raises(SpecError, match="add --use-gpu"):
        resolve(wmt14_en_fr.paper(), RunOptions(preset="paper", use_gpu=False,
                                                accelerator_type="A100"))
    spec = resolve(wmt14_en_fr.paper(), RunOptions(preset="paper", accelerator_type="A100"))
    assert spec.use_gpu and spec.accelerator_type == "A100"


def test_gpus_are_counted_per_gpu_model_on_alive_nodes():
    from workflows.cluster import gpus_of

    nodes = [{"Alive": True, "Resources": {"CPU": 48.0, "GPU": 4.0,
                                           "accelerator_type:A10G": 1.0}},
             {"Alive": True, "Resources": {"CPU": 96.0, "GPU": 8.0,
                                           "accelerator_type:A100": 1.0}},
             {"Alive": False, "Resources": {"CPU": 96.0, "GPU": 8.0,
                                            "accelerator_type:A100": 1.0}},
             {"Alive": True, "Resources": {"CPU": 8.0}}]
    assert gpus_of(nodes) == 12
    assert gpus_of(nodes, "A100") == 8 and gpus_of(nodes, "A10G") == 4
    assert gpus_of(nodes, "H100") == 0


def test_training_workers_a_local_ray_cannot_hold_are_one_line_before_any_stage(
        ray_session, monkeypatch):
    """A local Ray (no RAY_ADDRESS) never grows: more workers than it holds side by side were
    retried by Ray Train for 15 minutes (a traceback a minute), then the run stopped, and an
    evaluation task larger than its node waited without end. Refused before any stage, with
    what fits; on a cluster the run waits for room (its autoscaler may add nodes). The
    session's real Ray: 2 CPUs."""
    from workflows.cluster import check_local_room

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cpu = wmt14_en_fr.smoke()
    check_local_room(resolve(cpu, RunOptions(num_workers=2)))  # 2 x 1 CPU: they fit
    with pytest.raises(SpecError) as err:
        check_local_room(resolve(cpu, RunOptions(num_workers=3)))
    assert str(err.value) == (
        "training asks for 3 worker(s) of 1 CPU, but this machine's Ray has 2 CPU(s): its "
        "workers could not start (a local Ray never grows; Ray Train would retry for 15 "
        "minutes, then stop); run with --num-workers 2, or submit the workflow to a cluster "
        "(`ray job submit`)")
    with pytest.raises(SpecError, match=r"run with --set workflow.cpus_per_worker=2 \(or"):
        check_local_room(resolve(cpu, RunOptions(num_workers=1,
                                                 set=["workflow.cpus_per_worker=3"])))
    with pytest.raises(SpecError, match=r"2 CPU\(s\) and 0 GPU\(s\): .*run without --use-gpu"):
        check_local_room(resolve(cpu, RunOptions(num_workers=1, use_gpu=True)))
    with pytest.raises(SpecError, match=r"workflow.eval_cpus=3: each evaluation task asks "
                       r"for 3 CPUs, but this machine's Ray has 2 .*eval_cpus=2 \(or fewer\)"):
        check_local_room(resolve(cpu, RunOptions(set=["workflow.eval_cpus=3"])))
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    check_local_room(resolve(cpu, RunOptions(num_workers=3, set=["workflow.eval_cpus=3"])))
    # a cluster ray.init() joined without RAY_ADDRESS (a `ray up` head) may grow too
    from storage import ray_join

    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(ray_join, "started_here", lambda: False)
    check_local_room(resolve(cpu, RunOptions(num_workers=3, set=["workflow.eval_cpus=3"])))


def test_a_cluster_without_the_gpus_asked_for_stops_with_the_fix_instead_of_waiting(
        ray_session, monkeypatch):
    """On a cluster (RAY_ADDRESS) the workflow asks the autoscaler for the GPUs (one bundle per
    worker, of the GPU model asked for: an autoscaler starts nodes only for demand it sees, and
    a wait is none) and waits for them at most CONVS2S_GPU_WAIT_S, then stops with one message
    and withdraws the request; the session's real Ray has no GPU (and no autoscaler: the
    request is read where Ray keeps it for one)."""
    import json

    from ray.experimental.internal_kv import _internal_kv_get

    from workflows import cluster

    monkeypatch.setenv("RAY_ADDRESS", "auto")  # what a submitted job sees; Ray is connected
    monkeypatch.setattr(cluster, "GPU_WAIT_S", 1.5)
    spec = resolve(wmt14_en_fr.paper(), RunOptions(preset="paper", num_workers=8,
                                                   accelerator_type="A100"))
    def standing() -> list:  # the request the autoscaler reads: every requester's, merged
        return json.loads(_internal_kv_get(b"autoscaler_resource_request") or b"[]")

    requested, send = [], cluster._GpuRequest.send

    def send_and_read(self):
        asked = send(self)
        requested.append(standing())
        return asked

    monkeypatch.setattr(cluster._GpuRequest, "send", send_and_read)
    with pytest.raises(SpecError) as err:
        cluster.await_cluster_gpus(spec)
    assert "the cluster has no A100 GPU after 2 s but --use-gpu asks for 8" in str(err.value)
    assert "accelerator_type:A100" in str(err.value)
    ours = {"CPU": spec.cpus_per_worker, "GPU": 1, "accelerator_type:A100": 0.001}
    # through Ray's autoscaling coordinator, which merges it with Ray Train's and Ray Data's
    # requests (one beside it was replaced at the coordinator's next send, within 20 s)
    assert requested and [b for b in requested[0] if b == ours] == [ours] * 8, requested
    assert ours not in standing()  # withdrawn


@pytest.mark.slow
def test_a_language_pair_cut_from_one_file_pair_trains_scores_and_registers(fr_en_runs):
    """workflows/translation.py, no Python written: French -> English from the one file pair
    of news-commentary-5k, cut into train / valid / test by line ranges (--split), a smaller
    vocabulary with --set; trained, scored and registered under the pair's own name. (The
    local run of tests/test_object_storage.py's background run, which compares it with the
    same run on a bucket.)"""
    rc, out = fr_en_runs.local
    uri, runs = fr_en_runs.local_uri, fr_en_runs.local_runs
    assert rc == 0, out + fr_en_runs.stderr[-3000:]
    parent, children = _family(uri, "translation_fr_en", "fr-en")
    assert parent.info.status == "FINISHED" and "bleu" in parent.data.metrics
    params = parent.data.params
    assert (params["workflow.preprocess.src_lang"], params["workflow.preprocess.tgt_lang"]) == \
        ("fr", "en")
    assert params["workflow.preprocess.vocab_size"] == "2000"
    # (each evaluation set named after its lines: a run on another corpus of the pair has a
    # registered model of its own)
    assert set(children) == {"preprocess", "train", "eval/best/nc-5k_4750-end",
                             "eval/best/nc-5k_4500-4750"}
    manifests = json.loads((runs / "fr-en" / "preprocess_manifests.json").read_text())
    rows = {s: manifests[f"clean/{s}"]["rows_in"] for s in ("train", "valid", "test")}
    assert rows == {"train": 4500, "valid": 250, "test": 250}
    hyps = (runs / "fr-en" / "eval" / "best" / "nc-5k_4750-end.en").read_text().splitlines()
    assert len(hyps) == 250
    assert "models:/translation_fr_en-nc-5k_4750-end@champion (version 1)" in out


# The runs above that share nothing with the session's Ray start in the background when the
# session starts (tests/conftest.py, `Background`).
BACKGROUND_RUNS = {"other_smokes": _run_other_smokes, "ctrl_c": _interrupt_preprocessing,
                   "fr_en_runs": FR_EN_RUNS}


@pytest.mark.slow
def test_sigterm_as_ray_job_stop_sends_it_stops_a_run_as_ctrl_c_does(ray_session, tmp_path,
                                                                      capsys):
    """`ray job stop` (and a pod's or an instance's shutdown) sends the driver SIGTERM. In any
    stage (here the first cleaning stage, in this process) the run stops as on Ctrl-C: exit
    130, the line that resumes, every run of the workflow KILLED, the run's lease given back,
    and the caller's SIGTERM handler in place again (here Ray's, from `ray.init`)."""
    import logging
    import signal

    from mlflow.tracking import MlflowClient

    from storage.signals import sigterm_handed_to_ctrl_c

    before = signal.getsignal(signal.SIGTERM)
    sent = []

    class TermOnCleaning(logging.Handler):  # the stage logs from this (the main) thread
        def emit(self, record):
            if not sent and "[clean/train] running" in record.getMessage():
                sent.append(signal.getsignal(signal.SIGTERM))
                os.kill(os.getpid(), signal.SIGTERM)

    uri = mlflow_store(tmp_path)
    storage = tmp_path / "runs"
    hook, pre_log = TermOnCleaning(), logging.getLogger("preprocessing")
    pre_log.addHandler(hook)
    level = pre_log.level
    pre_log.setLevel(logging.INFO)  # (a command's console shows INFO; this process may not)
    try:
        rc, _ = _main(wmt14_en_fr, ["--preset", "smoke", *QUARTER_DEMO, "--storage-path",
                                    str(storage), "--tracking-uri", uri, "--run-name", "term"])
    finally:
        pre_log.removeHandler(hook)
        pre_log.setLevel(level)
    said = capsys.readouterr().err
    assert sent and rc == 130, said[-2000:]
    # during the stages SIGTERM goes to the project's handler (Ray's own exits wherever the
    # driver is, and the command then ended in an abort); the caller's is back after
    assert sent[0] is sigterm_handed_to_ctrl_c and signal.getsignal(signal.SIGTERM) is before
    assert f"interrupted: finished stages are kept under {storage}; resume with the same " \
           f"--run-name term" in said
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("wmt14_en_fr")
    runs = {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}
    assert runs == {"term": "KILLED", "preprocess": "KILLED"}
    assert not (storage / "term" / ".lease.json").exists()


@pytest.mark.parametrize("kind", ["dashboard", "dead head", "web server's port", "silent port"])
def test_a_ray_address_no_workflow_can_join_is_one_line_naming_it_and_the_fix(tmp_path, kind):
    """RAY_ADDRESS as the infra guide exports it for `ray job submit` (the dashboard's
    http:// address), a head's address where nothing listens, a port where a web server
    answers (the dashboard's port without http://, which Ray retried for over 5 minutes), or
    a port that takes connections and says nothing (Ray retried it for over 3 minutes): a
    plain workflow command stops with one `error:` line that names RAY_ADDRESS, hides its
    password and says what to do (exit 2), not Ray's traceback nor minutes of Ray's
    connection retries."""
    import http.server
    import socket
    import threading

    from workflows.cluster import free_port

    port = free_port()  # nothing listens there ...
    address = {"dashboard": f"http://admin:s3cret@127.0.0.1:{port}",
               "dead head": f"127.0.0.1:{port}", "web server's port": f"127.0.0.1:{port}",
               "silent port": f"127.0.0.1:{port}"}[kind]
    if kind == "web server's port":  # ... but a web server, on every interface (Ray joins
        # localhost as this node's IP)
        web = http.server.ThreadingHTTPServer(("0.0.0.0", port),
                                              http.server.BaseHTTPRequestHandler)  # (501s)
        threading.Thread(target=web.serve_forever, daemon=True).start()
    if kind == "silent port":  # connections complete in the kernel's backlog, never answered
        silent = socket.socket()
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("0.0.0.0", port))
        silent.listen(16)
    env = {**os.environ, "RAY_ADDRESS": address, "CONVS2S_RAY_JOIN_WAIT_S": "2",
           "CONVS2S_RAY_SILENT_S": "2"}
    try:
        proc = subprocess.run([sys.executable, str(REPO / "workflows" / "wmt14_en_fr.py"),
                               "--preset", "smoke", "--storage-path", str(tmp_path / "runs"),
                               "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    finally:
        if kind == "web server's port":
            web.shutdown()
        if kind == "silent port":
            silent.close()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    said = lines[0]
    assert said.startswith("error: RAY_ADDRESS=") and "s3cret" not in said
    assert "unset RAY_ADDRESS to run on this machine" in said
    assert "HOST:6379" in said and "ray://HOST:10001" in said
    if kind == "dashboard":
        assert f"RAY_ADDRESS=http://admin:***@127.0.0.1:{port} is a Ray dashboard" in said
        assert "ray job submit --working-dir . -- python workflows/<task>.py" in said
    elif kind == "dead head":
        assert f"RAY_ADDRESS=127.0.0.1:{port}: nothing answers at" in said
    elif kind == "silent port":
        assert f"RAY_ADDRESS=127.0.0.1:{port}: " in said and \
            f":{port} takes connections but says nothing (for 2 s;" in said  # (its setting)
    else:
        assert f"RAY_ADDRESS=127.0.0.1:{port}: " in said and \
            f":{port} answers HTTP/1, as a web server does, not as Ray" in said


def test_a_ray_address_is_printed_with_its_password_hidden():
    """Every Ray command prints RAY_ADDRESS through `storage.ray_join.shown`: a password in it
    is `***` (the user kept, as MLflow URIs are shown), in a GCS address without a scheme too."""
    from storage.ray_join import shown

    assert shown("admin:s3cret@10.0.0.1:6379") == "admin:***@10.0.0.1:6379"
    assert shown("ray://admin:s3cret@head:10001") == "ray://admin:***@head:10001"
    assert shown("ray://t0ken@head:10001") == "ray://***@head:10001"
    assert shown("10.0.0.1:6379") == "10.0.0.1:6379" and shown("auto") == "auto"


def test_a_rerun_that_scores_one_set_again_logs_only_what_changed_on_the_parent():
    """A rerun that did some work (one test set scored again) logged every parent figure
    again, each unchanged score getting a second value at step 0, and workflow_minutes became
    the minutes of that call alone."""
    from workflows.engine import figures_to_log

    had = {"bleu": 30.0, "eval/best/t/bleu": 30.0, "eval/best/u/bleu": 20.0,
           "workflow_minutes": 50.0}
    figures = {"bleu": 30.0, "eval/best/t/bleu": 30.0, "eval/best/u/bleu": 21.0,
               "workflow_minutes": 2.0}
    assert figures_to_log(figures, had) == {"eval/best/u/bleu": 21.0, "workflow_minutes": 52.0}
    assert figures_to_log(figures, {}) == figures


def test_a_stopped_restart_says_to_resume_without_restart():
    """--restart sets a run's training aside whatever its settings: the same command again
    after a Ctrl-C or a lost node would throw away what the restarted run trained. Its resume
    line says to leave the flag out; a plain run's says nothing of it."""
    from workflows.orchestrate import restart_hint

    assert "leave out --restart" in restart_hint(RunOptions(restart=True))
    assert restart_hint(RunOptions()) == ""


def test_a_finished_training_is_found_finished_by_a_rerun_that_changes_only_how_it_trains():
    """The training stage's key is what was trained: a rerun that checkpoints more often, keeps
    more checkpoints, or shares the same micro-batches out over other GPUs (4 x 2 for 8 x 1)
    skips the finished run (it was opened again, its workers placed, and ended at once, its
    final validation figures lost from the record); another lr, budget or update is trained.
    A key recorded before (every setting, update_freq alone) still matches its run."""
    from workflows.run_state import digest
    from workflows.steps import train_key

    batches = {"config_hash": "c", "input_fingerprint": "f"}
    opts = RunOptions(preset="paper", storage_path="/nowhere")
    eight = resolve(wmt14_en_fr.paper(), opts)
    four = resolve(wmt14_en_fr.paper(), RunOptions(**{**vars(opts), "num_workers": 4}))
    assert (eight.num_workers, eight.train.update_freq, four.train.update_freq) == (8, 1, 2)
    key = train_key(eight, eight.train, batches)
    assert train_key(four, four.train, batches) == key
    assert train_key(eight, eight.train.replace(log_interval=7, keep_last=9,
                                                checkpoint_interval=50), batches) == key
    for other in (eight.train.replace(lr=0.1), eight.train.replace(max_epochs=3),
                  eight.train.replace(update_freq=2)):
        assert train_key(eight, other, batches) != key
    assert train_key(eight, eight.train, batches, recorded_before=True) == digest(
        {"model": eight.model.to_dict(), "train": eight.train.to_dict(),
         "data": ["c", "f"]})


def test_the_parents_headline_figures_are_the_reported_test_set_and_the_best_checkpoints():
    """The parent's unprefixed `bleu` is the test set the run reports on, whatever the order of
    its test_sets (listing `valid` first made it the validation score), and its `valid_ppl` is
    the best checkpoint's, the one scored (it was the last validation's)."""
    import math
    from types import SimpleNamespace

    from workflows.engine import parent_metrics
    from workflows.steps import EvalScore

    spec = resolve(multi30k_en_de.cpu(), RunOptions(preset="cpu", set=[
        "workflow.test_sets={valid: val, test: test_2016_flickr}"]))
    assert list(spec.test_sets) == ["valid", "test"]
    scores = [EvalScore("best", "val", {"bleu": 40.0}, None, ""),
              EvalScore("best", "test_2016_flickr", {"bleu": 35.0}, None, "")]
    trained = [SimpleNamespace(metrics={"val_ppl": 9.0, "best_val_loss": math.log(7.0),
                                        "update": 10, "epoch": 1})]
    out = parent_metrics(spec, trained, scores, 60.0)
    assert out["bleu"] == 35.0 and out["valid_ppl"] == pytest.approx(7.0)
    assert out["eval/best/val/bleu"] == 40.0


def test_runs_name_the_commit_a_cluster_copy_was_made_from_and_no_version_as_a_commit(
        monkeypatch):
    """A cluster's copy of the code has no .git: CONVS2S_CODE_VERSION (the image's GIT_COMMIT,
    or set on the job's command line) names the commit; a version that is no commit (the
    package's "0.1.0", when none is known) is no mlflow.source.git.commit (MLflow's Source
    column showed it as one)."""
    from convs2s.tracking.runs import code_version
    from workflows.engine import source_tags

    spec = resolve(wmt14_en_fr.smoke(), RunOptions(preset="smoke"))
    sha = "0123456789abcdef0123456789abcdef01234567"
    for given, commit in ((sha, sha), ("0.1.0 (no git commit)", None)):
        monkeypatch.setenv("CONVS2S_CODE_VERSION", given)
        code_version.cache_clear()
        tags = source_tags(spec)
        assert tags["convs2s.code_version"] == given
        assert tags.get("mlflow.source.git.commit") == commit
    code_version.cache_clear()
