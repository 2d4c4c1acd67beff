"""The trained translator as an MLflow pyfunc model: weights, configs, sentencepiece model and
search settings in one logged (and optionally registered) model.

    from convs2s.serving.pyfunc import log_translator
    served = log_translator(["runs/demo/best"], SearchConfig(beam=5), tracking_uri=uri,
                            run_id=train_run_id, registered_model_name="convs2s-demo",
                            alias="champion")
    served.model_uri        # models:/m-...  (the logged model)
    served.registered_uri   # models:/convs2s-demo@champion

    import mlflow
    mlflow.pyfunc.load_model(served.registered_uri).predict(["the cat is small ."])

Serve over HTTP (the project's venv, its bin/ on PATH: the server execs `uvicorn`). POST
{"inputs": ["a sentence", ...]} to /invocations, answer {"predictions": ["...", ...]}; the
model's signature comes from its list[str] type hints, so MLflow accepts only the "inputs"
payload (not dataframe_split / instances), refuses a null sentence (Ray Serve's deployment
translates it as an empty line) and an integer setting written as a float ("beam": 5.0); it
returns one translation a sentence (a request's "nbest" is not a parameter here):

    MLFLOW_TRACKING_URI=sqlite:////abs/mlflow.db mlflow models serve \\
        -m models:/convs2s-demo@champion --env-manager local -p 5001

The workflows log one such model per evaluated set of weights (`workflows.lineage`), with the
training run as its source run, and register the best under the task's name. The model is
stored as code (`convs2s/serving/model_code.py`, MLflow's "models from code"), not as a pickled
Python object.

The model's artifacts are slim copies of the checkpoints (weights + model config + the
sentencepiece model, no optimizer state; `convs2s.io.averaging`), `search.json` (a
`convs2s.config.SearchConfig`) and the replace-unk dictionary if one is set. The `convs2s`
package travels with the model (`code_paths`), so a process without the project installed
loads it as long as torch, sentencepiece, pyarrow and mlflow are there (they are the model's
pip requirements); `storage/` (the filesystem layer convs2s reads files through) travels too.
Predictions run on CUDA when the serving machine has a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import mlflow
import mlflow.pyfunc

from convs2s.serving.requests import (RequestError, batch_bound, check_default_search,
                                      check_sentences, check_work, search_for)

SEARCH_FILE = "search.json"
PRECISION_TAG = "convs2s.inference_precision"  # on the logged model
FALLBACK_TAG = "convs2s.inference_precision_fallback"
EXAMPLE = ["the cat is small ."]
# Search settings a request may change here (`params`, in the model's signature; MLflow fills
# the logged values for those a request leaves out, and drops a parameter the signature does
# not name with a warning: no 400 for it here). n-best lists and attention need a richer
# answer than list[str]: the Ray Serve deployment (convs2s.serving.online) gives them.
PYFUNC_PARAMS = ("beam", "lenpen", "max_len_a", "max_len_b", "min_len", "unk_penalty")


def translator_from_artifacts(artifacts: dict[str, str], device: str | None = None,
                              overrides: dict | None = None):
    """The Translator of a logged model's artifacts (local paths by name: checkpoints, search,
    and the dictionary and shortlist when its search names them), with `overrides` (search
    settings) over the logged search."""
    import torch

    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference
    from convs2s.precision import runs_on_gpus

    cfg = json.loads(Path(artifacts["search"]).read_text())
    if cfg.get("dictionary"):
        cfg["dictionary"] = artifacts["dictionary"]
    if cfg.get("shortlist"):
        cfg["shortlist"] = artifacts["shortlist"]
    cfg.update(overrides or {})
    root = Path(artifacts["checkpoints"])
    paths = sorted(p for p in root.iterdir() if (p / "checkpoint.pt").is_file())
    if device is None:  # int8 weights run on PyTorch's quantized CPU kernels
        device = "cuda" if torch.cuda.is_available() \
            and runs_on_gpus(cfg.get("precision", "fp32")) else "cpu"
    return load_for_inference(paths, SearchConfig.from_dict(cfg), device)


class TranslatorModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper: a list of source sentences in, their translations out (same order)."""

    def load_context(self, context) -> None:
        self.translator = translator_from_artifacts(context.artifacts)

    def predict(self, context, model_input: list[str], params: dict | None = None) -> list[str]:
        # The list[str] type hints give the model its signature: MLflow checks and converts
        # inputs (a list, or a one-column DataFrame from the REST server) to a list of str.
        check_request(model_input)
        sentences = [s or "" for s in model_input]
        tr = self.translator
        # One translation a sentence is returned: the search keeps one (a model logged with
        # nbest 3 refused every request for a beam under 3, naming an nbest its client could
        # not send, and searched three for each sentence)
        base = tr.search.replace(nbest=1)
        try:
            search = search_for(base, params, PYFUNC_PARAMS) if params else base
            # the work its settings may ask, measured on its source pieces (the logged
            # settings' too): refused before any search
            check_work(tr.source_lengths(sentences), search, tr.max_positions)
        except RequestError as err:
            raise _bad_request(str(err)) from None
        # (no attention kept, but for replace_unk: then batches bounded by its size)
        return tr.translate(sentences, batch_bound(search, tr.max_positions, False))


def _bad_request(message: str):
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)  # HTTP 400


def check_request(sentences: list) -> None:
    """A request over the limits (convs2s.serving.requests) is refused before any work
    (MLflow's server answers 400 with this message)."""
    try:
        check_sentences(sentences)
    except RequestError as err:
        raise _bad_request(str(err)) from None


def request_params(search) -> dict:
    """The model's default per-request params (its signature's params schema)."""
    return {name: getattr(search, name) for name in PYFUNC_PARAMS}


@dataclass
class ServedModel:
    model_uri: str  # the logged model: models:/m-...
    run_id: str | None  # its source run
    model_id: str | None = None  # the logged model's id (m-...)
    registered_name: str | None = None
    version: str | None = None
    alias: str | None = None

    @property
    def registered_uri(self) -> str | None:
        """models:/<name>@<alias> (or /<version>) when the model was registered."""
        if not self.registered_name:
            return None
        return f"models:/{self.registered_name}@{self.alias}" if self.alias else \
            f"models:/{self.registered_name}/{self.version}"


def _pip_requirements() -> list[str]:
    torch_version = version("torch").split("+")[0]  # the CUDA image installs its own build
    # sacremoses and subword-nmt: the text pipeline of imported reference models
    return [f"torch=={torch_version}", f"sentencepiece=={version('sentencepiece')}",
            f"sacremoses=={version('sacremoses')}", f"subword-nmt=={version('subword-nmt')}",
            f"mlflow=={version('mlflow')}",
            f"pyarrow=={version('pyarrow')}"]  # storage/, the filesystem layer


def stage_artifacts(checkpoints: list[str | os.PathLike], search, out_dir: Path,
                    average: bool = False, as_is: bool = False) -> dict:
    """Slim checkpoint copies (or, with `average`, their weight average as one model; with
    `as_is`, the folders copied unchanged: inference copies staged already), search.json (and
    the dictionary) under out_dir -> the pyfunc artifacts map."""
    from convs2s.io.staging import STAGED_FILE, stage_models
    from storage import local_copy  # (a search file in a bucket, or file://)

    ck_dir = out_dir / "checkpoints"
    if as_is:
        for i, p in enumerate(checkpoints):
            shutil.copytree(p, ck_dir / f"model_{i:02d}")
    else:  # the one staging path (convs2s.io.staging), as the evaluation tasks score weights
        stage_models(list(checkpoints), average, ck_dir)
        (ck_dir / STAGED_FILE).unlink()  # a record of the local paths: not the model's
    artifacts = {"checkpoints": str(ck_dir), "search": str(out_dir / SEARCH_FILE)}
    cfg = search.to_dict()
    if search.dictionary:
        shutil.copyfile(local_copy(search.dictionary), out_dir / "dictionary.txt")
        artifacts["dictionary"] = str(out_dir / "dictionary.txt")
        cfg["dictionary"] = "dictionary.txt"  # replaced by the artifact path at load
    if search.shortlist:  # vocabulary selection's lexical table travels with the model
        shutil.copyfile(local_copy(search.shortlist), out_dir / "shortlist.npz")
        artifacts["shortlist"] = str(out_dir / "shortlist.npz")
        cfg["shortlist"] = "shortlist.npz"
    (out_dir / SEARCH_FILE).write_text(json.dumps(cfg, indent=1))
    return artifacts


def log_translator(checkpoints: list[str | os.PathLike], search=None, *,
                   tracking_uri: str, run_id: str | None = None,
                   experiment_name: str = "convs2s", name: str = "translator",
                   average: bool = False, as_is: bool = False, params: dict | None = None,
                   tags: dict | None = None,
                   registered_model_name: str | None = None, alias: str | None = None,
                   input_example: list[str] | None = None) -> ServedModel:
    """Log checkpoints (one model, an ensemble, or with `average` their weight average) and
    the search settings (with the replace-unk dictionary and the shortlist table they name) as
    a pyfunc model (an MLflow 3 logged model named `name`, with
    `params` and `tags`; with `as_is`, checkpoint folders that are already the inference
    copies to serve, copied unchanged). With `run_id` the model's source run is that run and
    the run lists it among its outputs; without, it goes to `experiment_name`. Registers it and
    sets `alias` when `registered_model_name` is given. The input example is translated once at
    logging time, which checks that the logged model loads and predicts. A search a request
    could not ask (beam 20 over CONVS2S_SERVE_MAX_BEAM's 16) is a ValueError, nothing logged:
    MLflow sends the logged settings with every request."""
    from mlflow.entities import LoggedModelOutput
    from mlflow.tracking import MlflowClient

    import convs2s
    import storage
    from convs2s.config import SearchConfig
    from convs2s.tracking.runs import get_or_create_experiment, global_tracking_uri, quiet_mlflow
    from convs2s.inference.translate import load_for_inference

    search = search or SearchConfig()
    check_default_search(search, PYFUNC_PARAMS)  # before anything is staged or logged
    if alias and not registered_model_name:
        raise ValueError("an alias needs registered_model_name")
    client = MlflowClient(tracking_uri)
    # MLflow resolves models:/ URIs (logging, registering) through its global tracking URI.
    with global_tracking_uri(tracking_uri), quiet_mlflow(), \
            tempfile.TemporaryDirectory() as tmp:
        artifacts = stage_artifacts(checkpoints, search, Path(tmp), average, as_is)
        # Load what will be served (an average is one model), once, before anything is
        # logged: a bad checkpoint or dictionary fails here with a clear error. MLflow's own
        # check of the input example only warns.
        staged = sorted(Path(artifacts["checkpoints"]).iterdir())
        load_for_inference(staged, search, "cpu")
        # Created first, then filled: the model gets its source run without this process
        # opening the run (which would copy the run's params and step-0 metrics into it).
        exp_id = client.get_run(run_id).info.experiment_id if run_id else \
            get_or_create_experiment(tracking_uri, experiment_name)
        model = client.create_logged_model(
            exp_id, name=name, source_run_id=run_id, model_type="translator",
            params={k: str(v) for k, v in (params or {}).items()},
            # what it serves with: fp32 as trained, or bf16 / int8 weights
            # (convs2s.inference.quantize)
            tags={PRECISION_TAG: search.precision,
                  # fp32 where the serving machine cannot run that precision (with a warning)
                  **({FALLBACK_TAG: search.precision_fallback} if search.precision_fallback
                     else {}),
                  **{k: str(v) for k, v in (tags or {}).items()}})
        info = mlflow.pyfunc.log_model(
            name=name, python_model=str(Path(__file__).with_name("model_code.py")),
            artifacts=artifacts,
            # The project's code the model imports: convs2s and the filesystem layer it reads
            # files through (storage/).
            code_paths=[str(Path(convs2s.__file__).parent), str(Path(storage.__file__).parent)],
            pip_requirements=_pip_requirements(), model_id=model.model_id,
            # (sentences, params): the signature's params schema, with this search's values
            # as the defaults a request may change
            input_example=(input_example or EXAMPLE, request_params(search)))
        if run_id:
            client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
        served = ServedModel(model_uri=info.model_uri, run_id=run_id, model_id=model.model_id)
        if registered_model_name:
            mv = mlflow.register_model(info.model_uri, registered_model_name)
            served.registered_name, served.version = registered_model_name, str(mv.version)
            if alias:
                client.set_registered_model_alias(registered_model_name, alias, mv.version)
                served.alias = alias
    return served
