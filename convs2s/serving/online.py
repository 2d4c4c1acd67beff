"""Online translation on Ray Serve: one deployment of the translator (checkpoint folders, or a
logged MLflow model such as `models:/NAME@champion`) that batches the sentences of concurrent
requests into one beam search, with per-request search settings.

    python -m convs2s serve --checkpoint RUN/train/best [--precision int8 --shortlist ...]
    python -m convs2s serve --model models:/multi30k_en_de-test_2016_flickr@champion \\
        --tracking-uri http://mlflow:5000 --replicas 2 --threads-per-replica 1
    serve run infra/serve/translator.yaml          # the same application from a config file

HTTP (port 8000 unless --port):
    POST /translate (or /invocations, MLflow's path and payload)
        {"inputs": ["a sentence", ...], "params": {"beam": 5, "nbest": 2, "attention": true}}
        -> {"predictions": ["...", ...]}                      (nbest 1, no attention)
        -> {"predictions": [[{"text", "score", "alignment", "attention"}, ...], ...]}
        (+ "truncated": [i, ...]: the sentences cut to the model's positions, partly translated;
         + "untranslated": [i, ...]: sentences with no finite translation, answered "" or [])
    GET /health -> {"status": "ok", "model": ..., "precision": ..., "replica": ...}
A body over CONVS2S_SERVE_MAX_BODY bytes is an HTTP 413, before it is parsed (`BodyLimit`). A
request over the limits (convs2s.serving.requests: sentences, characters, search settings,
the work its settings may ask) is an HTTP 400 naming the limit, before any search; so are no
sentences (`"inputs": []`), a "params" that is not an object and a key other than "inputs" and
"params"; a body that is not a JSON object, a 422. A setting given as null is its default
("attention": null, no attention). Attention is kept only for a request that asks it.

Dynamic batching: every sentence of every request waiting at a replica joins one queue; when
the replica's search thread is free, one consumer takes every sentence waiting (up to
`max_batch_size`; at rest, a sentence waits at most `batch_wait_ms` for company) and searches
those that ask the same settings together. Under load a batch holds what arrived during the
previous search, so batches grow with the load and latency stays one or two searches. (Ray
Serve's `@serve.batch` cuts the next batch within its wait window while the previous one still
runs, then queues it: its batches stayed at 2-5 sentences with 16 clients here,
docs/benchmarks.md, Serving.) The search runs on one thread of its own, so the replica keeps
accepting requests meanwhile. Sentences of a batch are sorted by length as `translate` sorts
them; in float32 a sentence's translation does not depend on the others (bf16 and int8 may
move slightly with the batch, docs/benchmarks.md), except with a shortlist (`--shortlist`):
the target vocabulary searched is the union of the shortlists of the batch's sentences, so a
sentence's translation may then depend on the sentences searched with it, in float32 too.

Overload: each replica takes `max_ongoing_requests` requests at once (at least two batches'
worth); past them, requests wait in each proxy's queue, at most `--max-queued-requests` (256)
there, and the next is answered 503 at once (Serve's back-pressure) rather than queued
without end, its body held by the proxy. `--request-timeout` ends a request that waited and
searched longer with a 408 (none by default, as Serve's; a client's `x-request-timeout-seconds`
header replaces it, Serve's proxy reads it).

Replicas: `--replicas N` fixed, or autoscaling between `--min-replicas` and `--max-replicas`
on `--target-ongoing-requests` per replica; each holds `--threads-per-replica` CPUs (its torch
threads) or `--gpus-per-replica` of a GPU. Serve checks each replica's health (`check_health`)
and replaces one that fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field

from convs2s.config import SearchConfig
from convs2s.serving.logged_model import (fetch_logged_model, logged_model_artifacts,
                                          resolve_model_uri)
from convs2s.serving.requests import (MAX_BODY, RequestError, batch_bound, check_sentences,
                                      check_work, search_for)

log = logging.getLogger("convs2s.serving.online")

DEPLOYMENT = "Translator"
BODY_KEYS = ("inputs", "params")  # what a request body may hold


@dataclass
class ServeSettings:
    """What the application serves and how: resolved once, passed to every replica."""

    checkpoints: list[str] = field(default_factory=list)  # checkpoint folders, or:
    # an MLflow model URI (models:/NAME@alias, models:/m-..., runs:/); not in the repr, nor
    # the next (a URI may hold a password)
    model: str | None = field(default=None, repr=False)
    # where `model` resolves (default: MLFLOW_TRACKING_URI, read once where the application is
    # built and passed on: a replica's environment may not have it; never printed unredacted)
    tracking_uri: str | None = field(default=None, repr=False)
    search: dict = field(default_factory=dict)  # SearchConfig fields over the model's own
    spm_model: str | None = None
    threads_per_replica: int = 1
    gpus_per_replica: float = 0.0
    replicas: int = 1
    min_replicas: int | None = None  # both set: autoscaling
    max_replicas: int | None = None
    target_ongoing_requests: float = 8.0
    max_batch_size: int = 32
    batch_wait_ms: float = 2.0
    max_ongoing_requests: int = 128
    # requests each caller (an HTTP proxy, a handle) holds waiting for a replica; past them,
    # 503 at once; -1: no limit (Serve's default)
    max_queued_requests: int = 256
    # seconds a request may take from the proxy on (a 408 after); None: no limit. Serve's
    # HTTP option: `python -m convs2s serve` starts Serve with it; a config file sets it in
    # its `http_options` (it is not the application's)
    request_timeout_s: float | None = None

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
        if not 0 <= self.batch_wait_ms < math.inf:  # (inf / nan: a lone request waited for
            raise ValueError("batch_wait_ms must be >= 0 and finite")  # a full batch, forever)
        if self.max_queued_requests < 1 and self.max_queued_requests != -1:
            raise ValueError("--max-queued-requests must be >= 1, or -1 for no limit")
        if self.request_timeout_s is not None and not 0 < self.request_timeout_s < math.inf:
            raise ValueError("--request-timeout must be > 0 seconds and finite")
        # (Serve refuses these itself, with a traceback, after Ray started and the model loaded)
        if self.min_replicas is not None and not 0 < self.target_ongoing_requests < math.inf:
            raise ValueError("--target-ongoing-requests must be > 0 and finite")
        if not 0 <= self.gpus_per_replica < math.inf:
            raise ValueError("--gpus-per-replica must be >= 0 and finite")

    def for_replicas(self) -> "ServeSettings":
        """These settings with their local paths absolute (checkpoints, sentencepiece model,
        shortlist, dictionary), as the replicas, which do not run in this process's folder,
        must be given them; URIs as they are."""
        from dataclasses import replace

        from storage import worker_path

        search = dict(self.search)
        for name in ("shortlist", "dictionary"):
            if search.get(name):
                search[name] = worker_path(search[name])
        return replace(self, checkpoints=[worker_path(c) for c in self.checkpoints],
                       spm_model=worker_path(self.spm_model), search=search)

    def deployment_options(self) -> dict:
        actor = {"num_cpus": self.threads_per_replica}
        # The request limits (convs2s.serving.requests, read where each replica imports it)
        # as this process has them: a replica on a cluster's node, or on a Ray this process
        # joined, has that node's environment, not the one `serve` was started in
        limits = {k: v for k, v in os.environ.items() if k.startswith("CONVS2S_SERVE_")}
        if limits:
            actor["runtime_env"] = {"env_vars": limits}
        if self.gpus_per_replica:
            actor["num_gpus"] = self.gpus_per_replica
        scale = {"num_replicas": self.replicas} if self.min_replicas is None else {
            "autoscaling_config": {"min_replicas": self.min_replicas,
                                   "max_replicas": self.max_replicas,
                                   "target_ongoing_requests": self.target_ongoing_requests}}
        # A replica holds a whole batch of requests at once, and the next one filling
        return {"ray_actor_options": actor, **scale,
                "max_ongoing_requests": max(self.max_ongoing_requests, 2 * self.max_batch_size),
                "max_queued_requests": self.max_queued_requests,
                "health_check_period_s": 10, "health_check_timeout_s": 30}


# --- where the model comes from (a logged one: convs2s.serving.logged_model) --------------------


def load_translator(s: ServeSettings):
    """The Translator a replica serves (on a GPU when it holds one: one that holds GPUs torch
    cannot see is refused, not served on its CPU)."""
    import torch

    if s.gpus_per_replica and not torch.cuda.is_available():
        raise RuntimeError(f"this replica holds {s.gpus_per_replica:g} GPU(s) but PyTorch sees "
                           f"no CUDA device here (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}): a CUDA build of "
                           "torch on the GPU nodes, or serve without --gpus-per-replica")
    device = "cuda" if s.gpus_per_replica else "cpu"
    if s.model:
        from convs2s.serving.pyfunc import translator_from_artifacts

        folder = fetch_logged_model(s.model, s.tracking_uri)
        # the settings given here over the logged ones, before the weights are converted (a
        # precision or shortlist changes what is loaded, not only how it searches)
        return translator_from_artifacts(logged_model_artifacts(folder), device, s.search)
    from convs2s.inference.translate import load_for_inference

    return load_for_inference(s.checkpoints, SearchConfig.from_dict(s.search), device,
                              spm_model=s.spm_model)


# --- the deployment ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Item:
    sentence: str
    search: SearchConfig
    attention: bool


@dataclass
class _Failed:
    """A request's search that raised: the error its caller gets."""

    err: Exception


def _answer(tr, search: SearchConfig, attention: bool):
    """One sentence's answer: its text, or with nbest > 1 / attention its hypotheses."""
    import torch

    if search.nbest == 1 and not attention:
        return tr.text
    out = []
    for h in tr.hypotheses[:search.nbest]:
        hyp = {"text": h.text, "score": round(h.score, 4)}
        if attention:
            hyp["alignment"] = [list(p) for p in h.alignment()]
            # rounded by torch, not value by value in Python (4M values, the most a request
            # gets: over a second of the search thread)
            hyp["attention"] = torch.round(h.attention.double(), decimals=4).tolist()
        out.append(hyp)
    return out


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is answered 413 before the
    application reads it, by its Content-Length or, without one (chunked), as it arrives;
    a body within it is passed on whole."""

    def __init__(self, app, limit: int = MAX_BODY):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self._refuse(send, int(length))
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._refuse(send, None)
        whole = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay():
            return whole.pop() if whole else await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, send, length: int | None) -> None:
        size = f"{length:,} bytes" if length is not None else "more bytes"
        detail = (f"the request body has {size}; at most {self.limit:,} "
                  "(CONVS2S_SERVE_MAX_BODY): split the request")
        data = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})


class TranslatorReplica:
    """The replica's state: the loaded translator and the batched search. Wrapped as a Serve
    deployment with FastAPI routes by `deployment()`."""

    def __init__(self, settings: dict):
        from concurrent.futures import ThreadPoolExecutor

        self.settings = ServeSettings(**settings)
        # (the search's warnings about cut lines, one per request, are the answer's
        # "truncated"; those about lines with no finite translation are kept: "untranslated"
        # tells the client, the log the operator)
        from convs2s.inference.translate import without_cut_line_warnings

        logging.getLogger("convs2s.inference.translate").addFilter(without_cut_line_warnings)
        # Every torch call of the replica (loading, then each search) runs on this one thread:
        # the event loop stays free to take requests while a batch is searched, and torch's
        # CPU threads (an OpenMP team per calling thread) serve one caller. Searches issued
        # from another thread than the one that loaded the model took twice as long with 2
        # torch threads (docs/benchmarks.md, Serving).
        self._torch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        self.translator = self._torch.submit(self._load).result()
        self._queue: asyncio.Queue | None = None  # (item, future): made in the serving loop
        self._batcher: asyncio.Task | None = None
        self.served = 0  # sentences answered
        self.batches, self.search_s = 0, 0.0  # searches run, and their time

    async def translate(self, body: dict) -> dict:
        """A request body -> {"predictions": [...]}; RequestError for a bad request: one over
        the limits (convs2s.serving.requests, its work included, measured on its sentences'
        source pieces before any search), no sentences (`"inputs": []`: a 400, not an empty
        answer), a "params" that is not a JSON object (`[]`, `0`, `""` too: not read as
        "no params"), a key other than "inputs" and "params"."""
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
            raise RequestError('the body must be a JSON object {"inputs": ["a sentence", ...], '
                               '"params": {...}}')
        unknown = sorted(set(body) - set(BODY_KEYS))
        if unknown:  # (a misspelt "params" would otherwise be searched with the defaults)
            raise RequestError(f"unknown key(s) {', '.join(map(repr, unknown))} in the body; it "
                               f"may hold {', '.join(map(repr, BODY_KEYS))}")
        sentences = body["inputs"]
        check_sentences(sentences)
        params = body.get("params")
        params = {} if params is None else params
        if not isinstance(params, dict):
            raise RequestError(f'"params" must be a JSON object of search settings, got '
                               f"{type(params).__name__}")
        params = dict(params)
        attention = params.pop("attention", None)
        attention = False if attention is None else attention  # null: the default, as others
        if not isinstance(attention, bool):
            raise RequestError(f"attention must be true or false, got {attention!r}")
        # one translation a sentence unless the request asks more (a config file's search
        # with nbest 3 answered lists to plain requests and refused a beam under 3, naming a
        # setting the client never sent; the MLflow model does the same)
        search = search_for(self.translator.search.replace(nbest=1), params)
        sentences = [s or "" for s in sentences]
        # (the tokenizer, off the event loop: the replica keeps taking requests)
        lengths = await asyncio.to_thread(self.translator.source_lengths, sentences)
        max_positions = self.translator.max_positions
        check_work(lengths, search, max_positions, attention)
        search = batch_bound(search, max_positions, attention)
        answers = await asyncio.gather(*[self._enqueue(_Item(s, search, attention))
                                         for s in sentences])
        self.served += len(sentences)
        out = {"predictions": [answer for answer, _, _ in answers]}
        cut = [i for i, (_, truncated, _) in enumerate(answers) if truncated]
        if cut:  # the sentences cut to the model's positions: their answers are partial
            out["truncated"] = cut
        failed = [i for i, (_, _, untranslated) in enumerate(answers) if untranslated]
        if failed:  # sentences with no finite translation: "" (or []) is not their answer
            out["untranslated"] = failed
        return out

    # --- dynamic batching (the module docstring says why not @serve.batch) -------------------

    async def _enqueue(self, item: _Item):
        if self._batcher is None or self._batcher.done():
            self._queue = self._queue or asyncio.Queue()
            self._batcher = asyncio.get_running_loop().create_task(self._batch_loop())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((item, future))
        return await future

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        wait_s, most = self.settings.batch_wait_ms / 1000, self.settings.max_batch_size
        while True:
            batch: list = []  # (item, future) taken off the queue, answered below
            try:
                batch.append(await self._queue.get())
                deadline = loop.time() + wait_s
                while len(batch) < most:
                    if not self._queue.empty():
                        batch.append(self._queue.get_nowait())
                        continue
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                    except asyncio.TimeoutError:
                        break
                batch = [(item, f) for item, f in batch if not f.cancelled()]  # clients gone
                if not batch:
                    continue
                try:
                    answers = await loop.run_in_executor(self._torch, self._search_groups,
                                                         [item for item, _ in batch])
                except Exception as err:  # (outside the searches) every request gets the error
                    answers = [_Failed(err)] * len(batch)
            except BaseException:  # this loop cancelled (the replica stopping) while it
                # gathered or searched a batch: its callers get an error now, not an answer
                # that never comes (requests still queued are taken by the next loop
                # `_enqueue` starts)
                for _, f in batch:
                    if not f.done():
                        f.set_exception(RuntimeError("the replica's batching stopped while "
                                                     "this request was searched; send it "
                                                     "again"))
                raise
            for (_, f), answer in zip(batch, answers):
                if f.done():
                    continue
                if isinstance(answer, _Failed):
                    f.set_exception(answer.err)
                else:
                    f.set_result(answer)

    def _load(self):
        import torch

        torch.set_num_threads(self.settings.threads_per_replica)
        return load_translator(self.settings)

    def health(self) -> dict:
        s = self.translator.search
        from convs2s.tracking.redact import redact_uri

        model = redact_uri(self.settings.model) if self.settings.model else \
            self.settings.checkpoints  # (a URI's password is no client's to read)
        return {"status": "ok", "model": model,
                "precision": s.precision, "shortlist": bool(s.shortlist),
                "search": {"beam": s.beam, "lenpen": s.lenpen, "nbest": 1},
                "replica": os.getpid(), "sentences_served": self.served,
                "batches": self.batches,
                "mean_batch": round(self.served / self.batches, 2) if self.batches else None,
                "search_s": round(self.search_s, 3)}

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose model is gone is replaced."""
        if not getattr(self, "translator", None) or not self.translator.models:
            raise RuntimeError("the translator is not loaded")

    def _search_groups(self, items: list[_Item]) -> list:
        """Blocking: the items' sentences searched per distinct settings, answers in order."""
        import torch

        t0 = time.perf_counter()
        answers: list = [None] * len(items)
        groups: dict[tuple, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault((item.search, item.attention), []).append(i)
        with torch.inference_mode():
            for (search, attention), idx in groups.items():
                try:  # a group that fails (out of memory at a wide beam) fails its own requests
                    trs = self.translator.translate_full([items[i].sentence for i in idx],
                                                         search, attention=attention)
                    for i, tr in zip(idx, trs):
                        answers[i] = (_answer(tr, search, attention), tr.truncated,
                                      tr.untranslated)
                except Exception as err:  # noqa: BLE001 - given to those requests' callers
                    for i in idx:
                        answers[i] = _Failed(err)
        self.batches += 1
        self.search_s += time.perf_counter() - t0
        return answers


def deployment(settings: ServeSettings):
    """The Serve application: the replica class behind FastAPI routes, with the settings'
    replicas, resources and batching."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse
    from ray import serve

    app = FastAPI(title="convs2s translation", docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit)

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
    config file, infra/serve/translator.yaml): `args` are ServeSettings fields, local paths
    taken from the folder it runs in (`serve run`'s, `python -m convs2s serve`'s)."""
    if args.get("request_timeout_s") is not None:  # (it would be ignored here)
        raise ValueError("request_timeout_s is an HTTP option of Serve, not of the application: "
                         "set it under the config file's http_options")
    settings = ServeSettings(**args).for_replicas()
    if settings.model:
        import mlflow

        settings.tracking_uri = settings.tracking_uri or mlflow.get_tracking_uri()
        settings.model = resolve_model_uri(settings.model, settings.tracking_uri)
    return deployment(settings)


def run(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000,
        name: str = "convs2s", blocking: bool = False, replace: bool = True):
    """Start (or, with `replace`, update) the application `name` on the Ray this process is
    connected to, its endpoints under / (a prefix another application holds is refused:
    DeployError); returns Serve's handle. Without `replace` an application of that name that
    is running already (another user's `serve`, a config file's) is refused, untouched: Serve
    would redeploy it in place, and this process's Ctrl-C would then delete it. With
    `blocking`, serves until interrupted (Ctrl-C, or SIGTERM as `ray job stop` sends: the
    application is deleted, and a Serve this process started on a Ray it joined is shut down:
    nothing it started is left running). Serve takes its HTTP host and port once, as it
    starts: on a Serve running already they are its, said in a warning."""
    from storage.signals import sigterm_as_ctrl_c

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # Serve's start-up INFO lines
    # (SIGTERM as Ctrl-C once Ray, which installs its own handler, has started: Ray's handler
    # exited wherever the process was, and the application was never deleted)
    with sigterm_as_ctrl_c() if blocking else contextlib.nullcontext():
        return _run(settings, host, port, name, blocking, replace)


class DeployError(RuntimeError):
    """Serve could not deploy the application (its replicas failed to start, or its route
    prefix is another application's): its reason."""


def _last_line(text: str) -> str:
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in text.splitlines()]
    return next((line for line in reversed(lines) if line), text)


def _replica_failure(serve, name: str) -> str | None:
    """Why the application's replicas failed to start: the last line of a failed deployment's
    status message, which ends with the replica's traceback (the error `serve.run` raises says
    only "Failed to update the deployments [...]"). None if Serve's status does not say."""
    try:
        app = serve.status().applications.get(name)
    except Exception:  # noqa: BLE001 - the status is only for the message
        return None
    for deployment, status in (app.deployments.items() if app else ()):
        if "FAILED" in str(status.status) and status.message:
            return f"{deployment}: {_last_line(status.message)}"
    return None


def _say_while_deploying(serve, name: str, stop: threading.Event, every_s: float = 5.0):
    """Serve waits without end for replicas it cannot place (for an autoscaler to add nodes),
    and on a slow start, and says so only in its controller's log: each of its "taken more than
    30s" status messages for the application's deployments (the resources a replica asks and
    those free; a slow __init__) is logged here, once, until `stop` is set. (A replica that
    failed and is retried is not: the deploy ends with its reason.)"""
    from convs2s.tracking.redact import redact_text

    said: set[str] = set()
    while not stop.wait(every_s):
        try:
            app = serve.status().applications.get(name)
        except Exception:  # noqa: BLE001 - a status not read now may be read at the next poll
            continue
        for status in (app.deployments.values() if app else ()):
            message = " ".join(line.strip() for line in (status.message or "").splitlines()
                               if line.strip())
            if "taken more than" in message and message not in said and not stop.is_set():
                said.add(message)
                log.warning("still deploying: %s (Ctrl-C stops)", redact_text(message))


def _run(settings: ServeSettings, host: str, port: int, name: str, blocking: bool,
         replace: bool = True):
    from ray import serve
    from ray.exceptions import RayTaskError
    from ray.serve.exceptions import RayServeException

    from convs2s.tracking.redact import redact_text

    ours = _serve_http(serve) is None  # no Serve on this Ray yet: this process starts it
    # (where Serve's internals cannot say, `_serve_http` answers "unknown": not ours)
    try:
        http = {"host": host, "port": port}
        if settings.request_timeout_s is not None:
            http["request_timeout_s"] = settings.request_timeout_s
        serve.start(http_options=http)
        running = _serve_http(serve)
        if running not in (None, _UNKNOWN, (host, port)):  # Serve takes them as it starts
            log.warning("Serve runs on this Ray already, its HTTP on %s:%d: --host %s --port "
                        "%d are not taken (stop that Serve, `serve shutdown`, to choose)",
                        *running, host, port)
            host, port = running
        if not replace and name in serve.status().applications:
            raise DeployError(f"an application named {name!r} is running on this Ray already "
                              "(another serve, or a config file's), on the route this one "
                              "takes (/): stop it first, or --replace to redeploy it with this "
                              "model; it is left as it is")
        t0 = time.perf_counter()
        stop = threading.Event()
        saying = threading.Thread(target=_say_while_deploying, args=(serve, name, stop),
                                  daemon=True)
        saying.start()
        try:
            try:
                handle = serve.run(build_app(settings.__dict__), name=name, route_prefix="/",
                                   blocking=False)
            finally:
                stop.set()
                saying.join(timeout=10)  # (no line of it after the outcome's)
        except RayTaskError as err:  # Serve's controller refused it (the prefix is another
            # application's): its reason, not the controller's task line and traceback
            if not isinstance(err.cause, RayServeException):
                raise
            raise DeployError(redact_text(f"the application {name!r} could not be deployed: "
                                          f"{_last_line(str(err.cause))}")) from None
        except RuntimeError as err:
            if f"Deploying application {name} failed" not in str(err):
                raise
            reason = _replica_failure(serve, name) or _last_line(str(err))
            serve.delete(name)  # (on a cluster it would stay, failed, beside the others)
            raise DeployError(redact_text(f"the application {name!r} could not be deployed: "
                                          f"{reason}")) from None
        log.info("serving %s on http://%s:%d/translate (ready in %.1f s; Ctrl-C stops)",
                 redact_text(settings.model) if settings.model else settings.checkpoints, host,
                 port, time.perf_counter() - t0)
        if not blocking:
            return handle
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        log.info("stopping: the application %r is deleted", name)
        serve.delete(name)
        _shut_down_if_ours(serve, ours)
        return None
    except Exception:  # a deploy that failed (DeployError): the Serve it started goes too
        with contextlib.suppress(Exception):  # (the error said is the deploy's)
            _shut_down_if_ours(serve, ours)
        raise


def _shut_down_if_ours(serve, ours: bool) -> None:
    """Shut down the Serve this process started (`ours`) on a Ray it joined, when it serves
    nothing now: its controller and proxies, detached, held the port after the command ended
    (after Ctrl-C, or a deploy that failed). A local Ray ends with this process, Serve too;
    a Serve others deployed applications to meanwhile (another user's `serve --name`) is
    theirs too: kept."""
    if ours and not _ray_started_here() and not serve.status().applications:
        log.info("stopping: the Serve this command started on the cluster is shut down")
        serve.shutdown()


_UNKNOWN = ("", -1)  # `_serve_http` where Serve's internals cannot say


def _serve_http(serve) -> tuple[str, int] | None:
    """(host, port) of the Serve running on the connected Ray, None where none runs, or
    `_UNKNOWN` where its client cannot say (Serve's internals): never taken for "none"."""
    try:
        from ray.serve import context

        client = context._get_global_client(raise_if_no_controller_running=False)
        return None if client is None else (client.http_config.host, client.http_config.port)
    except Exception:  # noqa: BLE001 - another Ray's internals
        return _UNKNOWN


def _ray_started_here() -> bool:
    from storage.ray_join import started_here

    return started_here()
