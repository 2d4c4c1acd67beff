"""Tests of convs2s.serving.pyfunc: the translator logged as an MLflow pyfunc model, registered
with an
alias, loaded in a fresh process, and served over HTTP by `mlflow models serve`.

Run: .venv/bin/python -m pytest tests/test_serving.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import mlflow_store
from mlflow.tracking import MlflowClient

from convs2s.config import SearchConfig
from convs2s.metrics.scoring import read_lines
from convs2s.serving.pyfunc import FALLBACK_TAG, PRECISION_TAG, log_translator
from convs2s.inference.translate import load_for_inference
from workflows.cluster import free_port

REPO = Path(__file__).resolve().parents[1]
LOAD_AND_PREDICT = """
import json, sys
import mlflow
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
served = model.unwrap_python_model().translator.models
print(json.dumps(sorted({m.precision for m in served})), file=sys.stderr)
print(json.dumps(model.predict(json.loads(sys.stdin.read()))))
"""


def fresh_process_predict(tracking_uri: str, uri: str, lines: list[str], cwd: Path,
                          precision: str = "fp32") -> list:
    """Load the model in a new Python process started outside the checkout and predict; its
    models must serve with weights of `precision`."""
    res = subprocess.run([sys.executable, "-c", LOAD_AND_PREDICT, tracking_uri, uri],
                         input=json.dumps(lines), capture_output=True, text=True, cwd=cwd,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f'["{precision}"]' in res.stderr, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_ensemble_with_dictionary_round_trips_through_a_fresh_process(tiny_checkpoints,
                                                                      tmp_path):
    uri = mlflow_store(tmp_path)
    lex = tmp_path / "lex.txt"
    lex.write_text("cat CHAT\n")
    # served with int8 weights (convs2s.inference.quantize), as the logged model says; float32 only
    # on a
    # machine without int8 kernels (asked for, and tagged)
    search = SearchConfig(beam=2, max_len_a=0, max_len_b=4, replace_unk=True,
                          dictionary=str(lex), precision="int8", precision_fallback="fp32")
    ckpts = [tiny_checkpoints["a"], tiny_checkpoints["b"]]
    served = log_translator(ckpts, search, tracking_uri=uri, experiment_name="serving-test",
                            registered_model_name="tiny-ensemble", alias="candidate")
    assert served.registered_uri == "models:/tiny-ensemble@candidate"
    client = MlflowClient(uri)
    mv = client.get_model_version_by_alias("tiny-ensemble", "candidate")
    assert str(mv.version) == served.version
    tags = client.get_logged_model(served.model_id).tags
    assert tags[PRECISION_TAG] == "int8" and tags[FALLBACK_TAG] == "fp32"
    lines = ["The cat sleeps .", "", "A dog runs near the river ."]
    expected = load_for_inference(ckpts, search=search).translate(lines)
    outside = tmp_path / "elsewhere"  # a new process, started outside the checkout
    outside.mkdir()
    assert fresh_process_predict(uri, served.registered_uri, lines, outside, "int8") == expected
    assert expected[1] == ""


def test_the_pyfunc_model_bounds_a_request_before_any_search(tiny_checkpoints):
    """The pyfunc model refuses (MLflow's 400) what the Ray Serve deployment refuses: no
    sentences, a min_len no sentence can reach, more work than CONVS2S_SERVE_MAX_WORK (its
    own logged settings' too); within the limits it translates as the Translator does."""
    from mlflow.exceptions import MlflowException

    from convs2s.serving.pyfunc import TranslatorModel
    from convs2s.serving.requests import MAX_SENTENCES

    model = TranslatorModel()
    model.translator = load_for_inference([tiny_checkpoints["a"]], search=SearchConfig(
        beam=2, max_len_a=0, max_len_b=6))
    lines = ["The cat sleeps .", ""]
    assert model.predict(None, lines) == model.translator.translate(lines)
    long = " ".join(["a small house"] * 250)  # cut to the tiny model's 256 positions
    for inputs, params, says in [
        ([], None, "no sentences"),
        (["a"], {"beam": 16, "max_len_b": 1024, "min_len": 1024}, "min_len=1024 is more"),
        ([long] * 65, {"beam": 16, "max_len_b": 1024}, "(CONVS2S_SERVE_MAX_WORK)"),
    ]:
        with pytest.raises(MlflowException) as err:
            model.predict(None, inputs, params)
        assert err.value.get_http_status_code() == 400 and says in err.value.message
    model.translator.search = SearchConfig(beam=16, max_len_b=1024)  # as logged
    with pytest.raises(MlflowException, match=r"CONVS2S_SERVE_MAX_WORK"):
        model.predict(None, [long] * MAX_SENTENCES)
    # logged with nbest 3: a request's smaller beam is taken (one translation is returned;
    # it was refused, naming an nbest no request can send)
    model.translator.search = SearchConfig(beam=5, nbest=3, max_len_a=0, max_len_b=6)
    one = model.translator.translate(lines, SearchConfig(beam=2, nbest=1, max_len_a=0,
                                                         max_len_b=6))
    assert model.predict(None, lines, {"beam": 2}) == one


def _download_mlmodel(tracking_uri: str, model_uri: str, tmp_path: Path) -> Path:
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    try:
        return Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(tmp_path / "m"))) \
            / "MLmodel"
    finally:
        mlflow.set_tracking_uri(None)


def post(url: str, payload: dict, timeout: float = 120.0):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_trained_translator_is_served_over_http(demo_trained, tmp_path):
    t = demo_trained
    search = SearchConfig(max_len_a=1.5, max_len_b=10)
    served = log_translator([t.train.best_checkpoint], search, tracking_uri=t.tracking_uri,
                            run_id=t.train.run_id, registered_model_name="convs2s-demo",
                            alias="champion")
    # A logged model of the training run (its output), stored as code, not a pickled object.
    client = MlflowClient(t.tracking_uri)
    model = client.get_logged_model(served.model_id)
    assert model.source_run_id == t.train.run_id
    assert served.model_id in [o.model_id for o in client.get_run(t.train.run_id).outputs
                               .model_outputs]
    mlmodel = _download_mlmodel(t.tracking_uri, served.model_uri, tmp_path)
    assert "model_code_path" in mlmodel.read_text()
    assert not list(mlmodel.parent.rglob("python_model.pkl"))
    lines = read_lines(t.test_src)[:8] + [""]

    # The server starts (its own process) while this process and a fresh one load the model.
    port = free_port()
    # The venv's bin first on PATH, as after `source .venv/bin/activate`: the server execs
    # `uvicorn` by name.
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "MLFLOW_TRACKING_URI": t.tracking_uri,
           "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
    log_file = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [str(Path(venv_bin) / "mlflow"), "models", "serve", "-m",
         served.registered_uri, "--env-manager", "local", "-p", str(port), "-h", "127.0.0.1",
         "-w", "1"], stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        start_new_session=True)
    try:
        expected = load_for_inference([t.train.best_checkpoint],
                                      search=search).translate(lines)
        assert fresh_process_predict(t.tracking_uri, served.registered_uri, lines,
                                     tmp_path) == expected
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "server did not start within 300 s"
            time.sleep(0.25)
        answer = post(f"http://127.0.0.1:{port}/invocations", {"inputs": lines})
        assert answer == {"predictions": expected}
        # A request's own search settings (the signature's params, within their limits)
        greedy = load_for_inference([t.train.best_checkpoint],
                                    search=search.replace(beam=1)).translate(lines)
        assert post(f"http://127.0.0.1:{port}/invocations",
                    {"inputs": lines, "params": {"beam": 1}}) == {"predictions": greedy}
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(f"http://127.0.0.1:{port}/invocations",
                 {"inputs": lines[:1], "params": {"beam": 99}})
        assert refused.value.code == 400 and "beam=99 is outside" in refused.value.read().decode()
        # Over the limits: a 400 naming the limit, before any translation.
        from convs2s.serving.requests import MAX_CHARS, MAX_SENTENCES

        for too_much, says in (([lines[0]] * (MAX_SENTENCES + 1), "sentences in one request"),
                               (["a" * (MAX_CHARS + 1)], "characters; at most")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                post(f"http://127.0.0.1:{port}/invocations", {"inputs": too_much})
            assert refused.value.code == 400 and says in refused.value.read().decode()
        print("served:", list(zip(lines[:3], answer["predictions"][:3])))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its worker: our own group
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log_file.close()


def test_a_search_a_request_could_not_ask_is_refused_when_logged(tiny_checkpoints, tmp_path):
    """MLflow sends a logged model's search settings with every request that leaves them out:
    a model logged with beam 20 (over the requests' 16) would refuse every request, naming a
    setting its client never sent. It is refused at logging, naming the setting, and nothing
    is logged or registered."""
    uri = mlflow_store(tmp_path)
    with pytest.raises(ValueError, match=r"search beam=20 is outside \[1, 16\], what a request "
                                         r"may ask \(CONVS2S_SERVE_MAX_BEAM on the server\)"):
        log_translator([tiny_checkpoints["a"]], SearchConfig(beam=20), tracking_uri=uri,
                       registered_model_name="tiny")
    client = MlflowClient(uri)
    assert client.search_registered_models() == []
    assert [e.name for e in client.search_experiments()] == ["Default"]


def test_a_logged_models_float_params_are_floats_whatever_the_search_was_given():
    """A search built in Python with lenpen=1 (an int) typed the logged model's params schema
    `long`, and MLflow then refused a request's lenpen 0.6 (a float is no long)."""
    from mlflow.models import infer_signature

    from convs2s.config import SearchConfig
    from convs2s.serving.pyfunc import EXAMPLE, request_params

    params = request_params(SearchConfig(lenpen=1, max_len_a=2, unk_penalty=0))
    schema = {p.name: p.dtype.name
              for p in infer_signature(EXAMPLE, EXAMPLE, params).params.params}
    assert schema["lenpen"] == schema["max_len_a"] == schema["unk_penalty"] == "double"
    assert schema["beam"] == "long"


@pytest.mark.parametrize("path", ["../../secret", "/etc", "", None])
def test_a_logged_models_artifact_path_outside_its_folder_is_refused(tmp_path, path):
    """MLmodel comes from the artifact store (anyone with write access there wrote it): its
    artifact paths name files inside the model's folder, or the model is refused."""
    import yaml

    from convs2s.serving.logged_model import logged_model_artifacts

    arts = {"checkpoints": {"path": "artifacts/checkpoints"}, "search": {"path": path}}
    (tmp_path / "MLmodel").write_text(yaml.safe_dump(
        {"flavors": {"python_function": {"artifacts": arts}}}))
    with pytest.raises(ValueError, match="artifact 'search' has path .*not a path inside"):
        logged_model_artifacts(tmp_path)
    arts["search"] = {"path": "artifacts/search.json"}
    (tmp_path / "MLmodel").write_text(yaml.safe_dump(
        {"flavors": {"python_function": {"artifacts": arts}}}))
    assert logged_model_artifacts(tmp_path)["search"] == str(tmp_path / "artifacts/search.json")


def test_a_model_uri_that_does_not_fetch_is_named_without_its_secret(tmp_path):
    """`serve --model` quoted the URI it could not fetch whole: a token in its query, a
    password in an http URI."""
    from convs2s.serving.logged_model import fetch_logged_model

    with pytest.raises(ValueError, match=r"model runs:/abc/translator\?token=\*\*\* could not "
                                         "be fetched") as err:
        fetch_logged_model("runs:/abc/translator?token=TOKSECRET",
                           f"sqlite:///{tmp_path / 'm.db'}")
    assert "TOKSECRET" not in str(err.value)
