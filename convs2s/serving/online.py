"""Online translation on Ray Serve: one deployment of the translator (checkpoint folders, or a
logged MLflow model such as `models:/NAME@champion`) that batches the sentences of concurrent
requests into one beam search, with per-request search settings.

    python -m convs2s serve --checkpoint RUN/train/best [--precision int8 --shortlist ...]
    python -m convs2s serve --model models:/convs2s-multi30k_en_de@champion \\
        --tracking-uri http://mlflow:5000 --replicas 2 --threads-per-replica 1
    serve run infra/serve/translator.yaml          # the same application from a config file

HTTP (port 8000 unless --port):
    POST /translate (or /invocations, MLflow's path and payload)
        {"inputs": ["a sentence", ...], "params": {"beam": 5, "nbest": 2, "attention": true}}
        -> {"predictions": ["...", ...]}                      (nbest 1, no attention)
        -> {"predictions": [[{"text", "score", "alignment", "attention"}, ...], ...]}
    GET /health -> {"status": "ok", "model": ..., "precision": ..., "replica": ...}
A request over the limits (convs2s.serving.requests) is an HTTP 400 naming the limit; a body
that is not a JSON object with a list of strings, a 422.

Dynamic batching (Ray Serve's `@serve.batch`, docs/reference.md, Ray): every sentence of every
request waiting at a replica joins one queue; up to `max_batch_size` sentences that ask the same
search settings are searched together, after waiting at most `batch_wait_ms` for more. A search
runs in a worker thread, so the replica keeps accepting requests and the next batch fills while
one is searched. Sentences of a batch are sorted by length as `translate` sorts them: a
sentence's translation does not depend on the others in float32 (bf16 and int8 may move
slightly with the batch, docs/benchmarks.md).

Replicas: `--replicas N` fixed, or autoscaling between `--min-replicas` and `--max-replicas`
on `--target-ongoing-requests` per replica; each holds `--threads-per-replica` CPUs (its torch
threads) or `--gpus-per-replica` of a GPU. Serve checks each replica's health (`check_health`)
and replaces one that fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from convs2s.config import SearchConfig
from convs2s.serving.requests import RequestError, check_sentences, search_for

log = logging.getLogger("convs2s.serving.online")

DEPLOYMENT = "Translator"


@dataclass
class ServeSettings:
    """What the application serves and how: resolved once, passed to every replica."""

    checkpoints: list[str] = field(default_factory=list)  # checkpoint folders, or:
    model: str | None = None  # an MLflow model URI (models:/NAME@alias, models:/m-..., runs:/)
    tracking_uri: str | None = None  # where `model` resolves (default: MLFLOW_TRACKING_URI)
    search: dict = field(default_factory=dict)  # SearchConfig fields over the model's own
    spm_model: str | None = None
    threads_per_replica: int = 1
    gpus_per_replica: float = 0.0
    replicas: int = 1
    min_replicas: int | None = None  # both set: autoscaling
    max_replicas: int | None = None
    target_ongoing_requests: float = 8.0
    max_batch_size: int = 32
    batch_wait_ms: float = 5.0
    max_ongoing_requests: int = 128

    def __post_init__(self) -> None:
        if bool(self.checkpoints) == bool(self.model):
            raise ValueError("serve either checkpoint folders (--checkpoint) or an MLflow model "
                             "URI (--model)")
        if self.threads_per_replica < 1 or self.replicas < 1 or self.max_batch_size < 1:
            raise ValueError("threads per replica, replicas and max_batch_size must be >= 1")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("autoscaling needs both --min-replicas and --max-replicas")
        if self.min_replicas is not None and not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 0 <= --min-replicas <= --max-replicas")
        if self.batch_wait_ms < 0:
            raise ValueError("batch_wait_ms must be >= 0")

    def deployment_options(self) -> dict:
        actor = {"num_cpus": self.threads_per_replica}
        if self.gpus_per_replica:
            actor["num_gpus"] = self.gpus_per_replica
        scale = {"num_replicas": self.replicas} if self.min_replicas is None else {
            "autoscaling_config": {"min_replicas": self.min_replicas,
                                   "max_replicas": self.max_replicas,
                                   "target_ongoing_requests": self.target_ongoing_requests}}
        # A replica holds a whole batch of requests at once, and the next one filling
        return {"ray_actor_options": actor, **scale,
                "max_ongoing_requests": max(self.max_ongoing_requests, 2 * self.max_batch_size),
                "health_check_period_s": 10, "health_check_timeout_s": 30}


# --- where the model comes from ------------------------------------------------------------------


def resolve_model_uri(uri: str, tracking_uri: str | None) -> str:
    """A registered model's alias pinned to the logged model it names now (models:/m-<id>), so
    that every replica serves the same weights even if the alias moves; other URIs as given.
    A URI that does not resolve raises ValueError with the reason."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    tracking_uri = tracking_uri or mlflow.get_tracking_uri()
    if uri.startswith("models:/") and "@" in uri:
        name, alias = uri[len("models:/"):].split("@", 1)
        try:
            mv = MlflowClient(tracking_uri).get_model_version_by_alias(name, alias)
        except MlflowException as err:
            raise ValueError(f"model {uri} does not resolve at {_public(tracking_uri)}: "
                             f"{err.message.splitlines()[0]}") from None
        return f"models:/{mv.model_id}" if getattr(mv, "model_id", None) else \
            f"models:/{name}/{mv.version}"
    return uri


def _public(uri: str) -> str:
    """A tracking URI without credentials (user:password@ in an http URI)."""
    import re

    return re.sub(r"//[^/@]*@", "//", uri)


def fetch_logged_model(uri: str, tracking_uri: str | None) -> Path:
    """The logged model's folder on this node (downloaded once per node and URI)."""
    import mlflow.artifacts

    from storage.paths import cache_root

    dest = cache_root() / "models" / hashlib.sha256(
        f"{tracking_uri}|{uri}".encode()).hexdigest()[:16]
    if (dest / "MLmodel").is_file():
        return dest
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    try:
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp))
    except Exception as err:  # MLflow raises several types for a URI that does not resolve
        raise ValueError(f"model {uri} could not be fetched: {str(err).splitlines()[0]}") \
            from None
    try:
        os.replace(tmp, dest)
    except OSError:  # another replica on this node finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def logged_model_artifacts(folder: Path) -> dict[str, str]:
    """name -> local path of a downloaded pyfunc model's artifacts (its MLmodel file says)."""
    import yaml

    meta = yaml.safe_load((folder / "MLmodel").read_text())
    arts = meta.get("flavors", {}).get("python_function", {}).get("artifacts") or {}
    if "checkpoints" not in arts or "search" not in arts:
        raise ValueError(f"{folder}: not a translator logged by this project (no checkpoints "
                         "and search artifacts)")
    return {name: str(folder / a["path"]) for name, a in arts.items()}


def load_translator(s: ServeSettings):
    """The Translator a replica serves (on a GPU when it holds one)."""
    import torch

    device = "cuda" if s.gpus_per_replica and torch.cuda.is_available() else "cpu"
    if s.model:
        from convs2s.serving.pyfunc import translator_from_artifacts

        folder = fetch_logged_model(s.model, s.tracking_uri)
        translator = translator_from_artifacts(logged_model_artifacts(folder), device)
        if s.search:
            translator.search = translator.search.replace(**s.search)
        return translator
    from convs2s.inference.translate import load_for_inference

    return load_for_inference(s.checkpoints, SearchConfig.from_dict(s.search), device,
                              spm_model=s.spm_model)


# --- the deployment ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Item:
    sentence: str
    search: SearchConfig
    attention: bool


def _answer(tr, search: SearchConfig, attention: bool):
    """One sentence's answer: its text, or with nbest > 1 / attention its hypotheses."""
    if search.nbest == 1 and not attention:
        return tr.text
    out = []
    for h in tr.hypotheses[:search.nbest]:
        hyp = {"text": h.text, "score": round(h.score, 4)}
        if attention:
            hyp["alignment"] = [list(p) for p in h.alignment()]
            hyp["attention"] = [[round(float(x), 4) for x in row]
                                for row in h.attention.tolist()]
        out.append(hyp)
    return out


class TranslatorReplica:
    """The replica's state: the loaded translator and the batched search. Wrapped as a Serve
    deployment with FastAPI routes by `deployment()`."""

    def __init__(self, settings: dict):
        import torch

        self.settings = ServeSettings(**settings)
        torch.set_num_threads(self.settings.threads_per_replica)
        logging.getLogger("convs2s.inference.translate").setLevel(logging.ERROR)
        self.translator = load_translator(self.settings)
        self._search_batch.set_max_batch_size(self.settings.max_batch_size)
        self._search_batch.set_batch_wait_timeout_s(self.settings.batch_wait_ms / 1000)
        self.served = 0

    async def translate(self, body: dict) -> dict:
        """A request body -> {"predictions": [...]}; RequestError for a bad request."""
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
            raise RequestError('the body must be a JSON object {"inputs": ["a sentence", ...], '
                               '"params": {...}}')
        sentences = body["inputs"]
        check_sentences(sentences)
        params = dict(body.get("params") or {})
        attention = params.pop("attention", False)
        if not isinstance(attention, bool):
            raise RequestError(f"attention must be true or false, got {attention!r}")
        search = search_for(self.translator.search, params)
        answers = await asyncio.gather(*[self._search_batch(_Item(s or "", search, attention))
                                         for s in sentences])
        self.served += len(sentences)
        return {"predictions": list(answers)}

    def health(self) -> dict:
        s = self.translator.search
        return {"status": "ok", "model": self.settings.model or self.settings.checkpoints,
                "precision": s.precision, "shortlist": bool(s.shortlist),
                "search": {k: getattr(s, k) for k in ("beam", "lenpen", "nbest")},
                "replica": os.getpid(), "sentences_served": self.served}

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose model is gone is replaced."""
        if not getattr(self, "translator", None) or not self.translator.models:
            raise RuntimeError("the translator is not loaded")

    def _search_groups(self, items: list[_Item]) -> list:
        """Blocking: the items' sentences searched per distinct settings, answers in order."""
        import torch

        answers: list = [None] * len(items)
        groups: dict[tuple, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault((item.search, item.attention), []).append(i)
        with torch.inference_mode():
            for (search, attention), idx in groups.items():
                trs = self.translator.translate_full([items[i].sentence for i in idx], search)
                for i, tr in zip(idx, trs):
                    answers[i] = _answer(tr, search, attention)
        return answers


def _batched(method):
    """`@serve.batch` applied where Ray Serve is importable (the module loads without it)."""
    from ray import serve

    return serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)(method)


async def _search_batch(self, items: list[_Item]) -> list:
    # A worker thread searches: the event loop keeps taking requests, so the next batch fills
    return await asyncio.to_thread(self._search_groups, items)


try:
    TranslatorReplica._search_batch = _batched(_search_batch)
except ImportError:  # Ray Serve not installed: the corpus job and the library still work
    pass


def deployment(settings: ServeSettings):
    """The Serve application: the replica class behind FastAPI routes, with the settings'
    replicas, resources and batching."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse
    from ray import serve

    app = FastAPI(title="convs2s translation", docs_url=None, redoc_url=None)

    @serve.deployment(name=DEPLOYMENT)
    @serve.ingress(app)
    class Translator(TranslatorReplica):
        @app.post("/translate")
        @app.post("/invocations")
        async def post_translate(self, body: dict) -> JSONResponse:
            try:
                return JSONResponse(await self.translate(body))
            except RequestError as err:
                raise HTTPException(status_code=400, detail=str(err)) from None

        @app.get("/health")
        def get_health(self) -> dict:
            return self.health()

    return Translator.options(**settings.deployment_options()).bind(settings.__dict__)


def build_app(args: dict):
    """Serve's application builder (`import_path: convs2s.serving.online:build_app` in a
    config file, infra/serve/translator.yaml): `args` are ServeSettings fields."""
    settings = ServeSettings(**args)
    if settings.model:
        settings.model = resolve_model_uri(settings.model, settings.tracking_uri)
    return deployment(settings)


def run(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000,
        name: str = "convs2s", blocking: bool = False):
    """Start (or update) the application on the Ray this process is connected to; returns
    Serve's handle. With `blocking`, serves until interrupted."""
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    t0 = time.perf_counter()
    handle = serve.run(build_app(settings.__dict__), name=name, route_prefix="/",
                       blocking=False)
    log.info("serving %s on http://%s:%d/translate (ready in %.1f s)",
             settings.model or settings.checkpoints, host, port, time.perf_counter() - t0)
    if blocking:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.delete(name)
    return handle
