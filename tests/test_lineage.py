"""What the En-Fr smoke workflow leaves in its MLflow store (sqlite), as MLflow 3 users expect:
an experiment marked as model training, dataset inputs with digests on the runs, one logged
model per evaluated set of weights with its scores linked to it and to the test set, and the
task's registered model whose `champion` alias loads and translates.

    timeout 900 .venv/bin/python -m pytest tests/test_lineage.py -q
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def _store(w):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(w.tracking_uri)
    exp = client.get_experiment_by_name(w.experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    (parent,) = [r for r in runs if r.info.run_name == w.run_name
                 and "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: client.get_run(r.info.run_id) for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    return client, exp, client.get_run(parent.info.run_id), children


def _job_models(client, w) -> dict[str, str]:
    """{job: logged model id} of the smoke run."""
    exp = client.get_experiment_by_name(w.experiment)
    return {m.name.removeprefix("smoke-test-"): m.model_id
            for m in client.search_logged_models([exp.experiment_id])
            if m.name.startswith("smoke-test-")}


def _store_copy(w, tmp_path):
    """(uri, client, {job: model id}, the best model's bleu on demo_test) of a copy of the
    smoke store, for a test that changes scores."""
    import shutil

    from mlflow.tracking import MlflowClient

    shutil.copy(w.tracking_uri[len("sqlite:///"):], tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    ids = _job_models(client, w)
    (old,) = [m for m in client.get_logged_model(ids["best"]).metrics
              if m.key == "bleu" and m.dataset_name == "demo_test"]
    return uri, client, ids, old


def _inputs(run) -> dict[str, tuple[str, str]]:
    """{dataset name: (digest, context)} of a run's dataset inputs."""
    return {d.dataset.name: (d.dataset.digest, {t.key: t.value for t in d.tags}
                             ["mlflow.data.context"]) for d in run.inputs.dataset_inputs}


def test_experiment_opens_on_its_runs_and_runs_show_their_data(smoke_workflow):
    w = smoke_workflow
    _, exp, parent, children = _store(w)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    manifests = json.loads((w.storage / w.run_name / "preprocess_manifests.json").read_text())
    expected = {}
    for split, context in (("train", "training"), ("valid", "validation")):
        m = manifests[f"batches/{split}"]
        expected[f"demo/{split}"] = (m["config_hash"][:8] + m["input_fingerprint"][:8], context)
    assert _inputs(parent) == expected
    assert _inputs(children["train"]) == expected
    train_input = next(d for d in children["train"].inputs.dataset_inputs
                       if d.dataset.name == "demo/train")
    profile = json.loads(train_input.dataset.profile)
    assert profile["rows"] == manifests["batches/train"]["rows_kept"]
    assert profile["tgt_tokens"] == manifests["batches/train"]["tokens"]["tgt_tokens"]
    # The runs table's Source column names the workflow file.
    assert parent.data.tags["mlflow.source.name"] == "workflows/wmt14_en_fr.py"
    # Params compare across machines: no absolute paths.
    for run in (parent, *children.values()):
        absolute = {k: v for k, v in run.data.params.items() if v.startswith("/")}
        assert not absolute, (run.info.run_name, absolute)
    assert children["eval/best/demo_test"].data.params["eval.checkpoints"] == "train/best"


def test_each_evaluated_checkpoint_is_a_logged_model_ranked_by_its_scores(smoke_workflow):
    w = smoke_workflow
    client, exp, _, children = _store(w)
    models = {m.name: m for m in client.search_logged_models([exp.experiment_id])
              if m.name.startswith(f"{w.run_name}-")}
    assert set(models) == {"smoke-test-best", "smoke-test-avg_last2"}
    train = children["train"]
    assert {o.model_id for o in train.outputs.model_outputs} == \
        {m.model_id for m in models.values()}
    for job in ("best", "avg_last2"):
        model = models[f"smoke-test-{job}"]
        run = children[f"eval/{job}/demo_test"]
        assert str(model.status) == "READY" and model.source_run_id == train.info.run_id
        assert model.params["job"] == job and model.params["search.beam"] == "5"
        (digest, context), = _inputs(run).values()
        assert context == "evaluation" and "demo_test" in _inputs(run)
        assert [i.model_id for i in run.inputs.model_inputs] == [model.model_id]
        # The model's scores on each set it was evaluated on (the validation set's too), each
        # linked to its dataset: the test set's are the evaluation run's.
        assert {m.dataset_name for m in model.metrics} == {"demo_test", "demo_valid"}
        linked = {m.key: m for m in model.metrics if m.dataset_name == "demo_test"}
        for key in ("bleu", "bleu_tokenized", "chrf"):
            assert linked[key].value == pytest.approx(run.data.metrics[key])
            assert (linked[key].dataset_name, linked[key].dataset_digest) == ("demo_test", digest)
        assert "sentences_per_second" not in linked  # a figure of the run, not of the model


def test_best_model_is_registered_and_its_alias_translates(smoke_workflow, tmp_path):
    import mlflow

    from convs2s.io.averaging import average_checkpoints
    from convs2s.io.checkpoint import list_checkpoints, pick_checkpoints
    from convs2s.metrics.scoring import read_lines
    from convs2s.inference.translate import load_for_inference
    from workflows import wmt14_en_fr

    w = smoke_workflow
    client, _, _, children = _store(w)
    valid, test = ({job: children[f"eval/{job}/{name}"].data.metrics["bleu"]
                    for job in ("best", "avg_last2")} for name in ("demo_valid", "demo_test"))
    # Registered per test set: the smoke run's demo_test model is not the paper's newstest2014.
    mv = client.get_model_version_by_alias("wmt14_en_fr-demo_test", "champion")
    job = mv.tags["convs2s.job"]
    # Chosen on the validation set (a tie: the first job, best); its test score only reported.
    assert valid[job] == max(valid.values())
    # the version's tags say both, by set (they said `bleu` and a test_set of the valid one)
    assert mv.tags["convs2s.chosen_on"] == "demo_valid"
    assert mv.tags["bleu.demo_valid"] == f"{valid[job]:.2f}"
    assert mv.tags["bleu.demo_test"] == f"{test[job]:.2f}"
    assert f"best model: {job} (bleu {valid[job]:.2f} on demo_valid, the validation set it is " \
        f"chosen on; {test[job]:.2f} on demo_test) is models:/wmt14_en_fr-demo_test@champion" \
        in w.stdout
    model = client.get_logged_model(mv.source.removeprefix("models:/"))
    assert model.name == f"smoke-test-{job}"
    assert json.loads(model.tags["mlflow.modelVersions"])[-1] == \
        {"name": "wmt14_en_fr-demo_test", "version": str(mv.version)}
    assert f"is models:/wmt14_en_fr-demo_test@champion (version {mv.version})" in w.stdout
    assert "mlflow models serve -m models:/wmt14_en_fr-demo_test@champion --env-manager local" \
        in w.stdout
    assert "python -m convs2s serve --model models:/wmt14_en_fr-demo_test@champion" in w.stdout
    assert not client.search_registered_models("name = 'wmt14_en_fr'")  # no paper model touched
    registered = client.get_registered_model("wmt14_en_fr-demo_test")
    assert registered.tags["convs2s.chosen_on"] == "demo_valid"
    assert registered.tags["convs2s.chosen_on_digest"]

    run_dir = w.storage / w.run_name / "train"
    if job == "best":
        weights = [run_dir / "best"]
    else:
        last2 = [i.path for i in pick_checkpoints(list_checkpoints(run_dir), last=2)]
        weights = [average_checkpoints(last2, tmp_path / "avg")]
    # <task>/<data key>/text/<key of the test sets>
    (text,) = (w.storage / "preprocessed" / "demo").glob("*/text/*")
    src = read_lines(text / "test.en")[:6]
    expected = load_for_inference(weights, search=wmt14_en_fr.smoke().search) \
        .translate(src)
    mlflow.set_tracking_uri(w.tracking_uri)
    try:
        served = mlflow.pyfunc.load_model("models:/wmt14_en_fr-demo_test@champion")
        assert served.predict(src) == expected
    finally:
        mlflow.set_tracking_uri(None)


def test_the_alias_moves_only_to_a_better_model_on_the_same_test_data(smoke_workflow):
    """register_champion on the smoke store under another name: first registration, an
    earlier champion that scored higher stays, a better model takes the alias."""
    from mlflow.tracking import MlflowClient

    from workflows.lineage import register_champion
    from workflows.engine import EvalScore

    w = smoke_workflow
    client = MlflowClient(w.tracking_uri)
    ids = _job_models(client, w)
    real = {k: {m.key: m.value for m in client.get_logged_model(v).metrics
                if m.dataset_name == "demo_test"}["bleu"] for k, v in ids.items()}

    def score(job, bleu):
        return EvalScore(job, "demo_test", {"bleu": bleu}, None, "")

    first = register_champion(w.tracking_uri, "lineage-test", [score("best", real["best"])],
                              ids, "demo_test", "bleu")
    assert first.moved and first.version == "1" and first.uri == "models:/lineage-test@champion"
    # The other model, claiming a lower score than the champion's linked one: no new version.
    stays = register_champion(w.tracking_uri, "lineage-test",
                              [score("avg_last2", real["best"] - 1.0)], ids, "demo_test", "bleu")
    assert not stays.moved and stays.version == "1"
    assert client.get_model_version_by_alias("lineage-test", "champion").version in (1, "1")
    # Claiming a higher score: it becomes version 2 and takes the alias.
    moved = register_champion(w.tracking_uri, "lineage-test",
                              [score("avg_last2", real["best"] + 1.0)], ids, "demo_test", "bleu")
    assert moved.moved and moved.version == "2"
    mv = client.get_model_version_by_alias("lineage-test", "champion")
    assert mv.source == f"models:/{ids['avg_last2']}"
    # Rerunning with the champion's own model changes nothing.
    again = register_champion(w.tracking_uri, "lineage-test",
                              [score("avg_last2", real["best"] + 1.0)], ids, "demo_test", "bleu")
    assert again.moved and again.version == "2"
    assert len(client.search_model_versions("name = 'lineage-test'")) == 2


def test_a_champion_chosen_on_a_test_set_gives_way_to_one_chosen_on_validation_data(
        smoke_workflow, monkeypatch):
    """A registered model from before champions were chosen on validation data (tagged with
    its test set; its champion has no validation score): the first model chosen on a validation
    set takes the alias, saying why, and tags the registered model; later ones compare."""
    from mlflow.tracking import MlflowClient

    from workflows.engine import EvalScore
    from workflows.lineage import global_tracking_uri, register_champion

    w = smoke_workflow
    client = MlflowClient(w.tracking_uri)
    ids = _job_models(client, w)
    valid = {job: next(m.value for m in client.get_logged_model(i).metrics
                       if m.key == "bleu" and m.dataset_name == "demo_valid")
             for job, i in ids.items()}
    exp = client.get_experiment_by_name(w.experiment)
    old = client.create_logged_model(exp.experiment_id, name="chosen-on-test")
    client.create_registered_model("lineage-legacy", tags={  # (the tags it was made with)
        "convs2s.test_set": "demo_test", "convs2s.test_set_digest": "0123",
        "convs2s.metric": "bleu"})
    with global_tracking_uri(w.tracking_uri):  # (MLflow resolves models:/ through it)
        client.create_model_version("lineage-legacy", f"models:/{old.model_id}",
                                    model_id=old.model_id)
    client.set_registered_model_alias("lineage-legacy", "champion", "1")

    def chosen(job, bleu):
        return register_champion(w.tracking_uri, "lineage-legacy",
                                 [EvalScore(job, "demo_valid", {"bleu": bleu}, None, "")], ids,
                                 "demo_valid", "bleu")

    # A registry failure before the alias names this run's version leaves the model as it was
    # (still legacy: a later run replaces its champion)
    def fails(self, *args, **kwargs):
        raise RuntimeError("API request timed out")

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", fails)
    assert chosen("best", valid["best"]) is None  # (its version 2 made, the alias not moved)
    monkeypatch.undo()
    assert "convs2s.chosen_on" not in client.get_registered_model("lineage-legacy").tags
    moved = chosen("best", valid["best"])
    assert moved.moved and moved.version == "3" and "was chosen on a test set" in moved.reason
    tags = client.get_registered_model("lineage-legacy").tags
    assert tags["convs2s.chosen_on"] == "demo_valid" and tags["convs2s.chosen_on_digest"]
    stays = chosen("avg_last2", valid["best"] - 1.0)  # now compared on the validation set
    assert not stays.moved and stays.version == moved.version and "scored bleu" in stays.reason


def test_two_runs_finishing_together_agree_on_the_better_model(smoke_workflow, monkeypatch):
    """Two registrations at once (threads, one sqlite store) under a new name: each compares,
    sets, and re-reads the alias after the default pause; the alias ends on the better-scored
    model and neither run claims a champion the alias does not name."""
    import threading

    from mlflow.tracking import MlflowClient

    from workflows import lineage
    from workflows.engine import EvalScore
    from workflows.lineage import register_champion

    # the default pause (the suite sets a shorter one: tests/conftest.py)
    monkeypatch.setattr(lineage, "REGISTRY_SETTLE_S", lineage.DEFAULT_REGISTRY_SETTLE_S)

    w = smoke_workflow
    client = MlflowClient(w.tracking_uri)
    ids = _job_models(client, w)
    real = {k: {m.key: m.value for m in client.get_logged_model(v).metrics
                if m.dataset_name == "demo_test"}["bleu"] for k, v in ids.items()}
    results, barrier = {}, threading.Barrier(2)

    def finish(job):
        barrier.wait()
        results[job] = register_champion(
            w.tracking_uri, "lineage-race", [EvalScore(job, "demo_test", {"bleu": real[job]},
                                                       None, "")], ids, "demo_test", "bleu")

    threads = [threading.Thread(target=finish, args=(job,)) for job in ("best", "avg_last2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    mv = client.get_model_version_by_alias("lineage-race", "champion")
    winner = next(job for job in ids if mv.source == f"models:/{ids[job]}")
    assert real[winner] == max(real.values())
    for job, champion in results.items():
        assert champion is not None and champion.moved == (job == winner), (job, champion)


def test_a_registry_error_leaves_the_alias_where_it_is(smoke_workflow, monkeypatch, caplog):
    """Reading the current champion fails (a timeout, not "no such alias"): nothing is
    compared, so the alias does not move, and the warning says so."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from workflows.engine import EvalScore
    from workflows.lineage import register_champion

    w = smoke_workflow
    client = MlflowClient(w.tracking_uri)
    ids = _job_models(client, w)
    first = register_champion(w.tracking_uri, "lineage-error",
                              [EvalScore("best", "demo_test", {"bleu": 1.0}, None, "")], ids,
                              "demo_test", "bleu")
    assert first.moved

    def times_out(self, name, alias):
        raise MlflowException("API request timed out", error_code="TEMPORARILY_UNAVAILABLE")

    monkeypatch.setattr(MlflowClient, "get_model_version_by_alias", times_out)
    after = register_champion(w.tracking_uri, "lineage-error",
                              [EvalScore("avg_last2", "demo_test", {"bleu": 99.0}, None, "")],
                              ids, "demo_test", "bleu")
    monkeypatch.undo()
    assert after is None and "the champion alias was not moved" in caplog.text
    assert client.get_model_version_by_alias("lineage-error", "champion").version in (1, "1")
    assert len(client.search_model_versions("name = 'lineage-error'")) == 1


OTHER_DIGEST = "0123456789abcdef"


def _registered_on_other_data(w, name: str):
    """(client, {job: model id}): `name` registered with the smoke run's best model as its
    champion (version 1), then tagged as chosen on other data than the smoke run's."""
    from mlflow.tracking import MlflowClient

    from workflows.engine import EvalScore
    from workflows.lineage import DIGEST_TAG, register_champion

    client = MlflowClient(w.tracking_uri)
    ids = _job_models(client, w)
    first = register_champion(w.tracking_uri, name,
                              [EvalScore("best", "demo_test", {"bleu": 10.0}, None, "")], ids,
                              "demo_test", "bleu")
    assert first.moved and first.version == "1"
    client.set_registered_model_tag(name, DIGEST_TAG, OTHER_DIGEST)
    return client, ids


def _refused_as_other_data(client, name: str, result) -> None:
    """`result` (a Champion) refused as scored on other data: no version added, the alias
    where it was."""
    assert not result.moved and result.version == "1" and "not comparable" in result.reason
    assert OTHER_DIGEST in result.reason
    assert len(client.search_model_versions(f"name = '{name}'")) == 1
    assert client.get_model_version_by_alias(name, "champion").version in (1, "1")


def test_a_model_scored_on_other_data_never_moves_the_alias(smoke_workflow):
    """A registered model keeps the digest of the test data it compares on: a model scored on
    another test set, or on other data under the same name, leaves the alias where it is, and
    the result says why, however high its score."""
    from workflows.lineage import register_champion
    from workflows.engine import EvalScore

    w = smoke_workflow
    # Other data under the same test set name (another digest): refused before any version.
    client, ids = _registered_on_other_data(w, "lineage-data")
    other = register_champion(w.tracking_uri, "lineage-data",
                              [EvalScore("avg_last2", "demo_test", {"bleu": 99.0}, None, "")],
                              ids, "demo_test", "bleu")
    _refused_as_other_data(client, "lineage-data", other)
    # Another test set (demo_valid's text against the demo_test the model was chosen on)
    first = register_champion(w.tracking_uri, "lineage-set",
                              [EvalScore("best", "demo_test", {"bleu": 10.0}, None, "")], ids,
                              "demo_test", "bleu")
    assert first.moved and first.version == "1"
    valid = register_champion(w.tracking_uri, "lineage-set",
                              [EvalScore("avg_last2", "demo_valid", {"bleu": 99.0}, None, "")],
                              ids, "demo_valid", "bleu")
    assert not valid.moved and valid.version == "1" and "not comparable" in valid.reason, valid
    assert len(client.search_model_versions("name = 'lineage-set'")) == 1
    assert client.get_model_version_by_alias("lineage-set", "champion").version in (1, "1")


def test_a_run_registering_at_once_with_a_run_on_other_data_leaves_the_model_to_it(
        smoke_workflow, monkeypatch):
    """Two runs register a task's first model at once, on other validation data: the second
    looked before the first made the registered model (its read said there was none), and finds
    it made when it makes it itself. The model is keyed by the first run's data, so the second
    adds no version and moves no alias: it used to add its version and set the alias to it,
    leaving a champion neither run's data could compare with."""
    from mlflow.tracking import MlflowClient

    from workflows.engine import EvalScore
    from workflows.lineage import register_champion

    w = smoke_workflow
    client, ids = _registered_on_other_data(w, "lineage-first")  # the first run's, its data
    looked = MlflowClient.search_registered_models

    def before_it_was_made(self, *args, **kwargs):  # the second run's read, made earlier
        monkeypatch.setattr(MlflowClient, "search_registered_models", looked)
        return []

    monkeypatch.setattr(MlflowClient, "search_registered_models", before_it_was_made)
    second = register_champion(w.tracking_uri, "lineage-first",
                               [EvalScore("avg_last2", "demo_test", {"bleu": 99.0}, None, "")],
                               ids, "demo_test", "bleu")
    _refused_as_other_data(client, "lineage-first", second)


def test_each_model_is_logged_from_the_files_its_scores_were_computed_on(smoke_workflow,
                                                                         tmp_path):
    """The weights of each job are staged once under the run folder (an average computed once);
    the evaluation task scored those files and the logged model holds the same bytes."""
    import hashlib

    import mlflow

    w = smoke_workflow
    client, exp, _, children = _store(w)
    models = {m.name: m for m in client.search_logged_models([exp.experiment_id])
              if m.name.startswith(f"{w.run_name}-")}
    staged_root = w.storage / w.run_name / "weights"
    for job in ("best", "avg_last2"):
        staged = staged_root / job / "model_00" / "checkpoint.pt"
        assert staged.is_file() and not (staged_root / job / "model_01").exists()
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=f"{models[f'smoke-test-{job}'].artifact_location}/artifacts/"
                         "checkpoints/model_00/checkpoint.pt",
            dst_path=str(tmp_path / job), tracking_uri=w.tracking_uri)
        digest = [hashlib.sha256(open(f, "rb").read()).hexdigest() for f in (staged, local)]
        assert digest[0] == digest[1], job
        assert children[f"eval/{job}/demo_test"].data.params["eval.job"] == job


def test_a_model_scored_again_is_compared_by_its_newest_score(smoke_workflow, tmp_path):
    """A logged model holds every score it was given on a test set (scored again by a newer
    scoring version, say): the alias compares the champion's newest one, not whichever MLflow
    lists first. (On a copy of the smoke store: the champion's scores are changed here.)"""
    import time

    from workflows.lineage import register_champion
    from workflows.engine import EvalScore

    uri, client, ids, old = _store_copy(smoke_workflow, tmp_path)
    first = register_champion(uri, "lineage-newest",
                              [EvalScore("best", "demo_test", {"bleu": old.value}, None, "")],
                              ids, "demo_test", "bleu")
    assert first.moved and first.version == "1"
    # The champion scored again on the same data, higher (a later timestamp).
    client.log_metric(old.run_id, "bleu", old.value + 50.0, timestamp=old.timestamp + 1000,
                      step=0, dataset_name="demo_test", dataset_digest=old.dataset_digest,
                      model_id=ids["best"])
    time.sleep(0.01)
    below_newest = register_champion(
        uri, "lineage-newest",
        [EvalScore("avg_last2", "demo_test", {"bleu": old.value + 10.0}, None, "")], ids,
        "demo_test", "bleu")
    assert not below_newest.moved and below_newest.version == "1", below_newest.reason


def test_a_champion_scored_by_another_scoring_version_is_not_compared(smoke_workflow,
                                                                      tmp_path):
    """Each evaluation run is tagged with the scoring version that computed its scores. A
    champion scored by another version (BLEU with another tokenizer, say) keeps the alias
    against any score, with the reason, until it is scored again by this one. (On a copy of
    the smoke store.)"""
    import time

    from convs2s.metrics.task_kinds import task_kind
    from workflows.engine import EvalScore
    from workflows.evaluation import SCORING_TAG
    from workflows.lineage import register_champion

    uri, client, ids, old = _store_copy(smoke_workflow, tmp_path)
    version = task_kind("translation").scoring_for("fr")
    assert client.get_run(old.run_id).data.tags[SCORING_TAG] == str(version)

    def claim(bleu, scoring):
        return register_champion(uri, "lineage-scoring",
                                 [EvalScore("avg_last2", "demo_test", {"bleu": bleu}, None, "")],
                                 ids, "demo_test", "bleu", scoring=scoring)

    first = register_champion(uri, "lineage-scoring",
                              [EvalScore("best", "demo_test", {"bleu": old.value}, None, "")],
                              ids, "demo_test", "bleu", scoring=version)
    assert first.moved and first.version == "1"
    # A run scored by a newer version, far higher: the champion's score is not comparable.
    newer = claim(old.value + 30.0, version + 1)
    assert not newer.moved and newer.version == "1"
    assert f"scoring version {version}, this run's by {version + 1}" in newer.reason
    # The champion scored again by the newer version (a rerun of its workflow): compared now.
    rescored = client.create_run(client.get_run(old.run_id).info.experiment_id,
                                 tags={SCORING_TAG: str(version + 1)}).info.run_id
    client.log_metric(rescored, "bleu", old.value, timestamp=old.timestamp + 1000, step=0,
                      dataset_name="demo_test", dataset_digest=old.dataset_digest,
                      model_id=ids["best"])
    time.sleep(0.01)
    moved = claim(old.value + 30.0, version + 1)
    assert moved.moved and moved.version == "2", moved.reason
    # A champion scored before evaluation runs were tagged: its version is not known, so it is
    # compared as before (read as version 1, every translation champion stayed for good)
    client.delete_tag(rescored, SCORING_TAG)  # (the best model's newest score's run)

    def register(job, bleu):
        return register_champion(uri, "lineage-untagged",
                                 [EvalScore(job, "demo_test", {"bleu": bleu}, None, "")], ids,
                                 "demo_test", "bleu", scoring=version + 1)

    assert register("best", old.value).version == "1"
    after = register("avg_last2", old.value + 30.0)
    assert after.moved and after.version == "2", after.reason


def test_a_logged_model_replaced_by_new_weights_of_its_job_says_so(tiny_checkpoints, tmp_path):
    """A continued run's job (avg_last5 of new checkpoints, a restart's best) logs a new model
    under the same name: the one it replaces is tagged convs2s.superseded, naming the new one
    (two models of one name were told apart by nothing in the Models view)."""
    from mlflow.tracking import MlflowClient

    from conftest import mlflow_store
    from workflows.evaluation import EvalJob, TestSet
    from workflows.lineage import SUPERSEDED_TAG, log_job_models

    uri = mlflow_store(tmp_path)
    (tmp_path / "t.en").write_text("a\n")
    test = TestSet("t", str(tmp_path / "t.en"), str(tmp_path / "t.en"), tgt_lang="fr")
    known: dict = {}
    first = log_job_models(uri, [EvalJob("best", (tiny_checkpoints["a"],), test)], {}, "r",
                           {}, known)
    again = log_job_models(uri, [EvalJob("best", (tiny_checkpoints["a"],), test)], {}, "r",
                           {}, known)
    assert again == first  # the same weights: the same model
    new = log_job_models(uri, [EvalJob("best", (tiny_checkpoints["b"],), test)], {}, "r", {},
                         known)
    client = MlflowClient(uri)
    assert new["best"] != first["best"]
    assert f"replaced by {new['best']}" in client.get_logged_model(first["best"]).tags[
        SUPERSEDED_TAG]
    assert SUPERSEDED_TAG not in client.get_logged_model(new["best"]).tags


def test_each_logged_model_is_kept_in_the_runs_state_as_it_is_logged(tiny_checkpoints,
                                                                      tmp_path):
    """The workflow's state gets each job's model as it is logged (`on_logged`): a run
    stopped between two jobs' models takes the first up again, not logging it twice (a
    duplicate without scores)."""
    from conftest import mlflow_store
    from workflows.evaluation import EvalJob, TestSet
    from workflows.lineage import log_job_models

    uri = mlflow_store(tmp_path)
    (tmp_path / "t.en").write_text("a\n")
    test = TestSet("t", str(tmp_path / "t.en"), str(tmp_path / "t.en"), tgt_lang="fr")
    jobs = [EvalJob("best", (tiny_checkpoints["a"],), test),
            EvalJob("last", (tiny_checkpoints["b"],), test)]
    known, saved = {}, []

    def stop_after_the_first():
        saved.append(json.loads(json.dumps(known)))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        log_job_models(uri, jobs, {}, "r", {}, known, on_logged=stop_after_the_first)
    assert list(saved[0]) == ["best"]
    again = log_job_models(uri, jobs, {}, "r", {}, saved[0])
    assert again["best"] == saved[0]["best"]["model_id"] and set(again) == {"best", "last"}
