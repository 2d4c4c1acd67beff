"""Online translation on Ray Serve (`convs2s.serving.online`, `python -m convs2s serve`,
infra/serve/translator.yaml): real HTTP over loopback to a deployment on the test session's
Ray; concurrent requests batched into one search give each sentence its own translation;
per-request search settings with limits; health; the model from a checkpoint folder or a
registered MLflow model.

    .venv/bin/python -m pytest tests/test_online.py -q
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import mlflow_store
import yaml

from convs2s.config import SearchConfig
from workflows.cluster import free_port

REPO = Path(__file__).resolve().parents[1]
SEARCH = {"beam": 3, "max_len_a": 0, "max_len_b": 12}  # a random tiny model: short outputs


def gpus_here() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def post(url: str, body, timeout: float = 60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def refused(url: str, body) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as err:
        post(url, body)
    return err.value.code, err.value.read().decode()


def config_args() -> dict:
    """The application args of infra/serve/translator.yaml."""
    cfg = yaml.safe_load((REPO / "infra" / "serve" / "translator.yaml").read_text())
    (app,) = cfg["applications"]
    assert app["import_path"] == "convs2s.serving.online:build_app"
    return app["args"]


def replicas_health(served: str, replicas: int = 2) -> dict:
    """replica pid -> its /health answer, asked until every replica has answered (a request
    goes to one replica; the router picks)."""
    def ask(_):
        return json.loads(urllib.request.urlopen(f"{served}/health", timeout=10).read())

    seen = {}
    with ThreadPoolExecutor(4) as pool:  # bursts, so that a busy replica passes some on
        for _ in range(50):
            seen.update((info["replica"], info) for info in pool.map(ask, range(4)))
            if len(seen) == replicas:
                return seen
    raise AssertionError(f"only replicas {sorted(seen)} answered /health in 200 requests")


@pytest.fixture(scope="module")
def served(tiny_checkpoints, ray_session):
    """The config file's application, serving a tiny checkpoint instead of its registry model,
    with 2 fixed replicas of one thread."""
    from ray import serve

    from convs2s.serving.online import ServeSettings, run

    args = {**config_args(), "model": None, "checkpoints": [tiny_checkpoints["a"]],
            "search": SEARCH, "min_replicas": None, "max_replicas": None, "replicas": 2,
            "batch_wait_ms": 20}
    port = free_port()
    run(ServeSettings(**args), port=port, name="convs2s-test")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


def test_a_failing_search_fails_its_own_requests_and_cut_sentences_are_named(tiny_checkpoints):
    """Requests batched together but searched with other settings are answered when one
    settings group's search raises (out of memory at a wide beam); an answer names the
    sentences cut to the model's positions; a "params" that is not an object is a bad request,
    not a server error. (The replica's class, without Serve.)"""
    import asyncio

    from convs2s.serving.online import TranslatorReplica
    from convs2s.serving.requests import RequestError

    replica = TranslatorReplica({
        **config_args(), "model": None, "checkpoints": [tiny_checkpoints["a"]],
        "search": SEARCH, "min_replicas": None, "max_replicas": None, "replicas": 1,
        "batch_wait_ms": 500})
    real = replica.translator.translate_full

    def fails_at_beam_5(sentences, search, attention):
        if search.beam == 5:
            raise RuntimeError("CUDA out of memory (as a wide beam would)")
        return real(sentences, search, attention)

    replica.translator.translate_full = fails_at_beam_5

    long = " ".join(["a small house"] * 250)  # far past the tiny model's positions

    async def requests():  # (one event loop, as the replica's: its queue belongs to it)
        together = await asyncio.gather(
            replica.translate({"inputs": ["a small house", "the cat"]}),
            replica.translate({"inputs": ["a dog"], "params": {"beam": 5}}),
            return_exceptions=True)
        return together, await replica.translate({"inputs": ["the cat", long]}), \
            await replica.translate({"inputs": ["the cat"]})

    (ok, failed), cut, whole = asyncio.run(requests())
    assert isinstance(failed, RuntimeError) and "out of memory" in str(failed)
    assert ok == {"predictions": alone(tiny_checkpoints["a"], ["a small house", "the cat"])}
    assert replica.batches == 3  # the first two requests searched in one batch
    assert cut["truncated"] == [1] and len(cut["predictions"]) == 2
    assert "truncated" not in whole
    for params in ("ab", 5, [["beam", 2]]):
        with pytest.raises(RequestError, match=r'"params" must be a JSON object'):
            asyncio.run(replica.translate({"inputs": ["a"], "params": params}))


def test_a_sentence_without_a_finite_translation_is_named_in_the_answer_and_the_log(
        tiny_checkpoints, caplog):
    """Weights that give NaN or infinite log-probabilities (damaged, or an overflow in low
    precision) leave a sentence without a translation: the answer lists it under
    "untranslated" and the replica logs it (it was a 200 with "" and no line anywhere: the
    replica silenced the search's warnings); an empty sentence is no failure."""
    import asyncio
    import logging

    import torch

    from convs2s.serving.online import TranslatorReplica

    replica = TranslatorReplica({
        **config_args(), "model": None, "checkpoints": [tiny_checkpoints["a"]],
        "search": SEARCH, "min_replicas": None, "max_replicas": None, "replicas": 1})
    async def before_and_after():  # (one event loop, as the replica's: its queue's)
        fine = await replica.translate({"inputs": ["a small house"]})
        with torch.no_grad():
            replica.translator.models[0].decoder.fc3.bias[10] = float("inf")
        return fine, await replica.translate({"inputs": ["", "a small house"]})

    with caplog.at_level(logging.WARNING, logger="convs2s.inference.translate"):
        fine, got = asyncio.run(before_and_after())
    assert "untranslated" not in fine
    assert got == {"predictions": ["", ""], "untranslated": [1]}
    assert "no finite translation" in caplog.text


def test_a_request_being_searched_when_the_batching_stops_gets_an_error_not_a_wait(
        tiny_checkpoints):
    """The replica's batching loop cancelled while it searches (the replica stopping) fails
    the requests of that batch at once, and a request after it is answered by a new loop.
    (The replica's class, without Serve.)"""
    import asyncio
    import threading

    from convs2s.serving.online import TranslatorReplica

    replica = TranslatorReplica({
        **config_args(), "model": None, "checkpoints": [tiny_checkpoints["a"]],
        "search": SEARCH, "min_replicas": None, "max_replicas": None, "replicas": 1,
        "batch_wait_ms": 1})
    real, searching, release = replica.translator.translate_full, threading.Event(), \
        threading.Event()

    def held(sentences, search, attention):  # the first search waits until released
        searching.set()
        release.wait(30)
        return real(sentences, search, attention)

    replica.translator.translate_full = held

    async def requests():
        first = asyncio.ensure_future(replica.translate({"inputs": ["the cat"]}))
        while not searching.is_set():
            await asyncio.sleep(0.01)
        replica._batcher.cancel()
        try:
            got = await asyncio.wait_for(first, 10)
        except asyncio.TimeoutError:
            got = "still waiting"
        except RuntimeError as err:
            got = err
        release.set()
        replica.translator.translate_full = real
        return got, await asyncio.wait_for(replica.translate({"inputs": ["the cat"]}), 30)

    stopped, after = asyncio.run(requests())
    assert isinstance(stopped, RuntimeError) and "batching stopped" in str(stopped)
    assert after == {"predictions": alone(tiny_checkpoints["a"], ["the cat"])}


def test_a_request_taken_into_a_gathering_batch_when_the_batching_stops_gets_an_error(
        tiny_checkpoints):
    """The batching loop cancelled while it waits for company (`batch_wait_ms`) for the
    sentence it took off the queue: that request fails at once, not a wait without end."""
    import asyncio

    from convs2s.serving.online import TranslatorReplica

    replica = TranslatorReplica({
        **config_args(), "model": None, "checkpoints": [tiny_checkpoints["a"]],
        "search": SEARCH, "min_replicas": None, "max_replicas": None, "replicas": 1,
        "batch_wait_ms": 60_000})

    async def requests():
        first = asyncio.ensure_future(replica.translate({"inputs": ["the cat"]}))
        while replica._queue is None or not replica._queue.empty() or replica.batches:
            await asyncio.sleep(0.01)  # (until the loop has taken the sentence)
        await asyncio.sleep(0.1)
        replica._batcher.cancel()
        try:
            return await asyncio.wait_for(first, 10)
        except asyncio.TimeoutError:
            return "still waiting"
        except RuntimeError as err:
            return err

    stopped = asyncio.run(requests())
    assert isinstance(stopped, RuntimeError) and "batching stopped" in str(stopped)


def test_a_request_is_bounded_by_the_work_it_may_ask_before_any_search(tiny_checkpoints):
    """Within every per-setting limit, a request's search may still run for minutes: it is
    refused (400, naming the limit and its variable) when its sentences x beam x steps pass
    CONVS2S_SERVE_MAX_WORK, its attention CONVS2S_SERVE_MAX_ATTENTION, or its min_len the most
    pieces any sentence may get; no sentences and a "params" that is not an object are bad
    requests too. The largest default request fits. (The replica's class, without Serve.)"""
    import asyncio

    from convs2s.serving.online import TranslatorReplica
    from convs2s.serving.requests import (MAX_ATTENTION, MAX_SENTENCES, MAX_WORK, RequestError,
                                          batch_bound, check_work)

    replica = TranslatorReplica({
        **config_args(), "model": None, "checkpoints": [tiny_checkpoints["a"]],
        "search": SEARCH, "min_replicas": None, "max_replicas": None, "replicas": 1})
    tr = replica.translator
    long = " ".join(["a small house"] * 250)  # cut to the tiny model's 256 positions
    for body, says in [
        ({"inputs": []}, "no sentences"),
        *[({"inputs": ["a"], "params": p}, '"params" must be a JSON object')
          for p in ([], 0, False, "")],
        ({"inputs": ["a"], "params": {"beam": 16, "max_len_b": 1024, "min_len": 1024}},
         "min_len=1024 is more output pieces than this search gives any sentence: at most 255"),
        ({"inputs": [long] * 65, "params": {"beam": 16, "max_len_b": 1024, "min_len": 255}},
         f"this request may take 266,240 hypothesis steps (65 sentences x beam 16 x up to 256 "
         f"steps each: max_len_a=0 x source positions + max_len_b=1024 output pieces + EOS); "
         f"at most {MAX_WORK:,} (CONVS2S_SERVE_MAX_WORK)"),
        ({"inputs": [long] * 5, "params": {"beam": 16, "max_len_b": 255, "attention": True}},
         f"at most {MAX_ATTENTION:,} (CONVS2S_SERVE_MAX_ATTENTION)"),
    ]:
        with pytest.raises(RequestError) as err:
            asyncio.run(replica.translate(body))
        assert says in str(err.value), (body, str(err.value))
    assert replica.batches == 0  # refused before any search
    # one sentence fewer is at the limit, as the attention of 4 is (beam x steps x source
    # positions: 16 x 256 x 256 each)
    check_work(tr.source_lengths([long] * 64), tr.search.replace(
        beam=16, max_len_b=1024, min_len=255), tr.max_positions)
    check_work(tr.source_lengths([long] * 4), tr.search.replace(beam=16, max_len_b=255),
               tr.max_positions, attention=True)
    # the largest request at the default search (beam 5, 200 pieces) and longest sources fits
    assert MAX_WORK == MAX_SENTENCES * 1024
    check_work([tr.max_positions] * MAX_SENTENCES, SearchConfig(), tr.max_positions)
    # a search keeping attention is cut into batches of at most MAX_ATTENTION of it; one
    # without is searched as it is
    default = SearchConfig()
    assert batch_bound(default, 1024, attention=False) is default
    bounded = batch_bound(default, 1024, attention=True)
    assert bounded.max_tokens * default.beam * (200 + 1) <= MAX_ATTENTION
    assert batch_bound(default.replace(replace_unk=True), 1024, False).max_tokens == \
        bounded.max_tokens
    # the server's operator sets the limits (the environment, read at import)
    code = ("from convs2s.config import SearchConfig\n"
            "from convs2s.serving.requests import RequestError, check_work\n"
            "try:\n    check_work([10] * 2, SearchConfig(), 256)\n"
            "except RequestError as err:\n    print(err)")
    env = {**__import__("os").environ, "CONVS2S_SERVE_MAX_WORK": "2000"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=60).stdout
    assert "2,010 hypothesis steps" in out and "at most 2,000 (CONVS2S_SERVE_MAX_WORK)" in out


def alone(checkpoint: str, sentences: list[str], **changes) -> list[str]:
    from convs2s.inference.translate import load_for_inference

    tr = load_for_inference([checkpoint], SearchConfig(**SEARCH).replace(**changes), "cpu")
    return [tr.translate([s])[0] for s in sentences]


def test_a_replica_that_cannot_load_its_model_fails_the_deploy_in_one_line_naming_why(
        ray_session, tmp_path, monkeypatch):
    """`serve` loads the model as its replicas will before it deploys, but a replica on another
    node reads that node's disk: a checkpoint folder only the driver's machine holds fails every
    replica. Serve gives up after three starts; the error is one line with the replica's own
    reason (Serve's error says only that it failed to update the deployments), and the failed
    application is deleted, not left on the cluster beside the others, as is the Serve the
    command started on a cluster it joined (its detached proxies held the port after the
    command ended). (Before `served`, which holds the session's CPUs with its replicas.)"""
    from ray import serve

    import convs2s.serving.online as online
    from convs2s.serving.online import DeployError, ServeSettings, run

    missing = tmp_path / "only-on-the-driver"
    # as on a cluster this process joined (RAY_ADDRESS): the session's Ray outlives the command
    monkeypatch.setattr(online, "_ray_started_here", lambda: False)
    assert online._serve_http(serve) is None  # no Serve yet: this command starts it
    try:
        with pytest.raises(DeployError) as err:
            run(ServeSettings(checkpoints=[str(missing)], search=SEARCH), port=free_port(),
                name="convs2s-deploy-fails")
        said = str(err.value)
        assert "\n" not in said and "\x1b" not in said, said
        assert said.startswith("the application 'convs2s-deploy-fails' could not be deployed: "
                               "Translator: "), said
        assert f"checkpoint {missing} does not exist" in said, said
        assert online._serve_http(serve) is None, "the Serve the command started still runs"
    finally:
        serve.shutdown()  # (its HTTP options are `served`'s to set)


def test_concurrent_requests_are_batched_and_each_gets_its_own_translation(
        served, tiny_checkpoints):
    sentences = [s for s, _ in tiny_checkpoints["pairs"][:48]] + [""]
    before = replicas_health(served)
    with ThreadPoolExecutor(16) as pool:  # 16 clients, one sentence a request
        answers = list(pool.map(lambda s: post(f"{served}/translate", {"inputs": [s]}),
                                sentences))
    assert [a["predictions"][0] for a in answers] == alone(tiny_checkpoints["a"], sentences)
    # concurrent requests shared searches: over both replicas, at least 1.5 sentences a search
    # on average (16 clients over 2 replicas keep about 8 waiting at each while one searches;
    # 49 sentences took 12 searches here, on 2 busy cores; the bar leaves room for clients
    # slowed by a loaded host), not merely fewer searches than sentences (one pair searched
    # together would pass that)
    after = replicas_health(served)
    served_now = sum(after[r]["sentences_served"] - before[r]["sentences_served"] for r in after)
    searches = sum(after[r]["batches"] - before[r]["batches"] for r in after)
    assert served_now == len(sentences) and 1.5 * searches <= len(sentences), (before, after)
    # MLflow's path and payload answer the same, several sentences in one request
    assert post(f"{served}/invocations", {"inputs": sentences[:5]})["predictions"] == \
        [a["predictions"][0] for a in answers[:5]]
    health = urllib.request.urlopen(f"{served}/health", timeout=10)
    info = json.loads(health.read())
    assert info["status"] == "ok" and info["precision"] == "fp32"
    assert info["search"]["beam"] == 3


def test_a_request_sets_its_own_search_within_limits(served, tiny_checkpoints):
    from convs2s.serving.requests import MAX_BEAM, MAX_CHARS, MAX_SENTENCES

    s = [x for x, _ in tiny_checkpoints["pairs"][:3]]
    greedy = post(f"{served}/translate", {"inputs": s, "params": {"beam": 1}})
    assert greedy["predictions"] == alone(tiny_checkpoints["a"], s, beam=1)
    two = post(f"{served}/translate", {"inputs": s, "params": {"nbest": 2, "attention": True}})
    for hyps, best in zip(two["predictions"], alone(tiny_checkpoints["a"], s)):
        assert len(hyps) == 2 and hyps[0]["text"] == best
        assert hyps[0]["score"] >= hyps[1]["score"]
        assert hyps[0]["alignment"] and len(hyps[0]["attention"]) >= 2
    for body, says in [
        ({"inputs": ["a"] * (MAX_SENTENCES + 1)}, "sentences in one request"),
        ({"inputs": ["a" * (MAX_CHARS + 1)]}, "characters; at most"),
        ({"inputs": ["a"], "params": {"beam": MAX_BEAM + 1}}, f"beam={MAX_BEAM + 1} is outside"),
        ({"inputs": ["a"], "params": {"nbest": 4}}, "nbest must be in [1, beam=3]"),
        ({"inputs": ["a"], "params": {"temperature": 1}}, "unknown parameter(s) temperature"),
        ({"inputs": ["a"], "params": {"beam": "five"}}, "beam must be an integer"),
        ({"inputs": [3]}, "sentence 0 is a int"),
        ({"text": "a"}, "the body must be a JSON object"),
    ]:
        code, text = refused(f"{served}/translate", body)
        assert code == 400 and says in text, (body, code, text)


def _post_raw(url: str, chunks, length: int | None = None) -> tuple[int, str]:
    """POST `chunks` (bytes) as one body: with a Content-Length of `length`, or chunked."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if length is not None:
        headers["Content-Length"] = str(length)
    try:
        conn.request("POST", parts.path, body=iter(chunks), headers=headers,
                     encode_chunked=length is None)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_a_body_over_the_limit_is_a_413_before_it_is_parsed(served, tiny_checkpoints):
    """A body over CONVS2S_SERVE_MAX_BODY (12.1 MiB by default: the most sentences of the most
    characters, each escaped as JSON may: 12 bytes outside the BMP) is refused by its
    Content-Length, or as it arrives when it is sent in chunks, with the limit named; a body
    within it is answered as ever (it was parsed whole first, a multi-GB one into several
    times its size in Python objects)."""
    from convs2s.serving.requests import MAX_BODY

    from convs2s.serving.requests import MAX_CHARS, MAX_SENTENCES

    # every request within the other limits fits, in the longest form JSON may take (a
    # character outside the BMP escaped as two \uXXXX)
    assert len(json.dumps({"inputs": ["\U0001F600" * MAX_CHARS] * MAX_SENTENCES,
                           "params": {"beam": 5, "lenpen": 1.0}})) <= MAX_BODY
    over = MAX_BODY + 1
    body = b'{"inputs": ["' + b"a" * (over - len(b'{"inputs": [""]}')) + b'"]}'
    assert len(body) == over
    # By its Content-Length: answered before the body is read (here only its start is sent:
    # the server closes the connection after its answer, and a client still sending would
    # meet a reset); in chunks, the whole body sent and refused once it passes the limit
    for chunks, length in (([body[:1024]], over),
                           ([body[i:i + (1 << 20)] for i in range(0, over, 1 << 20)], None)):
        code, text = _post_raw(f"{served}/translate", chunks, length)
        assert code == 413, (length, code, text[:300])
        assert f"at most {MAX_BODY:,} (CONVS2S_SERVE_MAX_BODY): split the request" in text
    s = [x for x, _ in tiny_checkpoints["pairs"][:2]]
    chunks = [b'{"inputs": [', json.dumps(s[0]).encode(), b", ", json.dumps(s[1]).encode(),
              b"]}"]
    code, text = _post_raw(f"{served}/translate", chunks, None)  # chunked, within the limit
    assert code == 200 and json.loads(text)["predictions"] == alone(tiny_checkpoints["a"], s)


def test_the_request_limits_set_where_serve_starts_reach_every_replica(monkeypatch):
    """CONVS2S_SERVE_* (the request limits, read where each replica imports them) travel in the
    deployment's runtime environment: a replica on a cluster's node, or on a Ray `serve`
    joined, had that node's environment, and a beam the operator allowed was refused with a
    message naming the variable already set."""
    from convs2s.serving.online import ServeSettings

    monkeypatch.delenv("CONVS2S_SERVE_MAX_BEAM", raising=False)
    for name in [k for k in os.environ if k.startswith("CONVS2S_SERVE_")]:
        monkeypatch.delenv(name)
    assert "runtime_env" not in ServeSettings(checkpoints=["x"]).deployment_options()[
        "ray_actor_options"]
    monkeypatch.setenv("CONVS2S_SERVE_MAX_BEAM", "32")
    assert ServeSettings(checkpoints=["x"]).deployment_options()["ray_actor_options"][
        "runtime_env"] == {"env_vars": {"CONVS2S_SERVE_MAX_BEAM": "32"}}


def test_a_replica_answers_one_translation_unless_asked_and_shows_no_uri_password(
        tiny_checkpoints):
    """A search whose nbest is 3 (a config file's) answers plain requests with one translation
    each and takes a beam under 3 (it answered lists, and refused beam 2 naming an nbest the
    client never sent); /health and the settings' repr show a model URI without its
    password."""
    import asyncio

    from convs2s.serving.online import ServeSettings, TranslatorReplica

    replica = TranslatorReplica({
        **config_args(), "model": None, "checkpoints": [tiny_checkpoints["a"]],
        "search": {**SEARCH, "beam": 4, "nbest": 3}, "min_replicas": None,
        "max_replicas": None, "replicas": 1})

    async def ask():
        return (await replica.translate({"inputs": ["a small house"]}),
                await replica.translate({"inputs": ["a small house"], "params": {"beam": 2}}),
                await replica.translate({"inputs": ["a small house"], "params": {"nbest": 2}}))

    plain, narrow, two = asyncio.run(ask())
    assert isinstance(plain["predictions"][0], str) and isinstance(narrow["predictions"][0], str)
    assert len(two["predictions"][0]) == 2
    assert replica.health()["search"]["nbest"] == 1
    replica.settings.model = "https://alice:s3cret@models.example.com/artifacts/translator"
    assert "s3cret" not in json.dumps(replica.health())
    settings = ServeSettings(model="runs:/x/translator",
                             tracking_uri="http://alice:s3cret@tracking:5000")
    assert "s3cret" not in repr(settings)


def test_requests_past_the_proxys_queue_are_refused_not_queued_without_end():
    """Each proxy holds at most --max-queued-requests requests waiting for a replica (Serve
    answers the next 503 at once); the flag reaches the deployment."""
    from convs2s.serving.online import ServeSettings

    options = ServeSettings(checkpoints=["x"]).deployment_options()
    assert options["max_queued_requests"] == 256
    assert ServeSettings(checkpoints=["x"], max_queued_requests=-1).deployment_options()[
        "max_queued_requests"] == -1
    for bad, says in ((0, "--max-queued-requests must be >= 1, or -1"),
                      (-2, "--max-queued-requests must be >= 1, or -1")):
        with pytest.raises(ValueError, match=says):
            ServeSettings(checkpoints=["x"], max_queued_requests=bad)
    with pytest.raises(ValueError, match="--request-timeout must be > 0 seconds"):
        ServeSettings(checkpoints=["x"], request_timeout_s=0)
    # what Serve itself refuses only after Ray started and the model loaded (a traceback)
    with pytest.raises(ValueError, match="--target-ongoing-requests must be > 0"):
        ServeSettings(checkpoints=["x"], min_replicas=1, max_replicas=2,
                      target_ongoing_requests=0)
    with pytest.raises(ValueError, match="--gpus-per-replica must be >= 0"):
        ServeSettings(checkpoints=["x"], gpus_per_replica=-1)
    # inf / nan passed the "< 0" checks: a lone request then waited for a full batch forever
    for field in ("batch_wait_ms", "request_timeout_s", "gpus_per_replica"):
        for bad in (math.inf, math.nan):
            with pytest.raises(ValueError, match="and finite"):
                ServeSettings(checkpoints=["x"], **{field: bad})
    with pytest.raises(ValueError, match="and finite"):
        ServeSettings(checkpoints=["x"], min_replicas=1, max_replicas=2,
                      target_ongoing_requests=math.inf)
    from convs2s.serving.corpus import CorpusError, CorpusJob

    with pytest.raises(CorpusError, match="--gpus-per-actor must be >= 0 and finite"):
        CorpusJob(checkpoints=["x"], input="i", output="o", gpus_per_actor=math.nan)
    import argparse

    from convs2s.cli.serve_command import _port

    assert _port("8000") == 8000
    for bad in ("70000", "0", "-1"):  # (binding 70000 was an OverflowError's traceback)
        with pytest.raises(argparse.ArgumentTypeError, match="is not a TCP port"):
            _port(bad)
    from convs2s.serving.online import build_app

    with pytest.raises(ValueError, match="request_timeout_s is an HTTP option of Serve, not of "
                                         "the application: set it under the config file's "
                                         "http_options"):
        build_app({"checkpoints": ["x"], "request_timeout_s": 30})


@pytest.mark.slow
def test_a_registered_model_is_served_pinned_to_the_version_its_alias_names(
        tiny_checkpoints, tmp_path):
    import torch

    from convs2s.serving.logged_model import fetch_logged_model, resolve_model_uri
    from convs2s.serving.online import ServeSettings, load_translator
    from convs2s.serving.pyfunc import log_translator

    uri = mlflow_store(tmp_path)
    search = SearchConfig(**SEARCH)
    first = log_translator([tiny_checkpoints["a"]], search, tracking_uri=uri,
                           registered_model_name="tiny", alias="champion")
    pinned = resolve_model_uri("models:/tiny@champion", uri)
    assert pinned == f"models:/{first.model_id}"  # the logged model, whatever the alias does
    log_translator([tiny_checkpoints["b"]], search, tracking_uri=uri,
                   registered_model_name="tiny", alias="champion")  # the alias moves on
    tr = load_translator(ServeSettings(model=pinned, tracking_uri=uri))
    s = [x for x, _ in tiny_checkpoints["pairs"][:4]]
    assert tr.translate(s) == alone(tiny_checkpoints["a"], s)  # still the first model
    # a precision given at serve time converts the logged weights, not only the label
    bf16 = load_translator(ServeSettings(model=pinned, tracking_uri=uri,
                                         search={"precision": "bf16"}))
    assert bf16.search.precision == "bf16"
    assert next(bf16.models[0].parameters()).dtype == torch.bfloat16
    # fetched once per node: a second fetch downloads nothing (the same files, untouched)
    folder = fetch_logged_model(pinned, uri)
    files = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*")}
    assert (folder / "MLmodel") in files
    assert fetch_logged_model(pinned, uri) == folder
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*")} == files
    with pytest.raises(ValueError, match=r"models:/tiny@nope does not resolve"):
        resolve_model_uri("models:/tiny@nope", uri)
    proc = subprocess.run([sys.executable, "-m", "convs2s", "serve", "--model",
                           "models:/other@champion", "--tracking-uri", uri], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "models:/other@champion does not resolve" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr


def test_a_route_prefix_another_application_holds_is_one_line_naming_it(served,
                                                                      tiny_checkpoints):
    """A second application on the prefix the served one holds is refused in one line naming
    that application (Serve's controller raises its task line and traceback), and the served
    one goes on serving."""
    from ray import serve

    from convs2s.serving.online import DeployError, ServeSettings, run

    with pytest.raises(DeployError) as err:
        run(ServeSettings(checkpoints=[tiny_checkpoints["a"]], search=SEARCH),
            port=int(served.rsplit(":", 1)[1]), name="convs2s-second")
    assert str(err.value) == (
        "the application 'convs2s-second' could not be deployed: Prefix / is being used by "
        'application "convs2s-test". Failed to deploy application "convs2s-second".')
    assert set(serve.status().applications) == {"convs2s-test"}
    assert len(post(f"{served}/translate", {"inputs": ["a"]})["predictions"]) == 1


def test_an_application_of_the_same_name_is_refused_and_left_serving(served,
                                                                     tiny_checkpoints,
                                                                     caplog):
    """`serve` under a name another application runs as (another user's, a config file's):
    refused in one line, that application untouched (Serve redeployed it in place with this
    model, and this command's Ctrl-C then deleted it). Its --port is not the running Serve's,
    which Serve ignores: said, naming the port that serves (the start line named the port
    asked)."""
    import logging

    from ray import serve

    from convs2s.serving.online import DeployError, ServeSettings, run

    with caplog.at_level(logging.WARNING, logger="convs2s.serving.online"), \
            pytest.raises(DeployError, match="an application named 'convs2s-test' is running "
                          "on this Ray already .*stop it first, or --replace"):
        run(ServeSettings(checkpoints=[tiny_checkpoints["b"]], search=SEARCH),
            port=free_port(), name="convs2s-test", replace=False)
    assert f"its HTTP on 127.0.0.1:{served.rsplit(':', 1)[1]}: --host 127.0.0.1 --port " \
        in caplog.text
    assert set(serve.status().applications) == {"convs2s-test"}
    assert len(post(f"{served}/translate", {"inputs": ["a"]})["predictions"]) == 1


def test_a_replica_holding_a_gpu_torch_cannot_see_is_refused_not_served_on_its_cpu(
        tiny_checkpoints, monkeypatch):
    """A GPU node whose torch is a CPU build (or whose driver is missing): the replica served
    on its CPU without a word, every request at a CPU's speed."""
    import torch

    from convs2s.serving.online import ServeSettings, load_translator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"this replica holds 1 GPU\(s\) but PyTorch sees no "
                                           "CUDA device here"):
        load_translator(ServeSettings(checkpoints=[tiny_checkpoints["a"]], search=SEARCH,
                                      gpus_per_replica=1))


@pytest.mark.gpu
def test_a_gpu_replica_serves_its_model_on_the_gpu(tiny_checkpoints, ray_session):
    """--gpus-per-replica: the replica's model sits on CUDA and answers like the CPU (near-ties
    of a random model aside)."""
    from convs2s.serving.online import ServeSettings, load_translator

    tr = load_translator(ServeSettings(checkpoints=[tiny_checkpoints["a"]], search=SEARCH,
                                       gpus_per_replica=1))
    assert next(tr.models[0].parameters()).is_cuda
    s = [x for x, _ in tiny_checkpoints["pairs"][:20]]
    got = tr.translate(s)
    assert sum(a == b for a, b in zip(got, alone(tiny_checkpoints["a"], s))) >= 16


def test_a_logged_model_is_fetched_whole_from_its_own_store_and_latest_is_pinned(
        tiny_checkpoints, tmp_path, monkeypatch):
    """`runs:/RUN/translator` (which MLflow downloads into a folder of that name) is fetched
    whole; a URI that names no model is one ValueError naming it, leaving no partial download
    behind; the cache tells stores apart when $MLFLOW_TRACKING_URI names the store (the same
    `models:/tiny/1` in two stores is two models); `models:/NAME/latest` is pinned to the logged
    model it names at start, as an alias is."""
    import shutil

    import mlflow
    from mlflow.tracking import MlflowClient

    from convs2s.serving.logged_model import fetch_logged_model, resolve_model_uri
    from convs2s.serving.pyfunc import log_translator
    from storage.transfer import cache_root

    monkeypatch.setenv("CONVS2S_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    one, two = mlflow_store(tmp_path / "one"), mlflow_store(tmp_path / "two")
    search = SearchConfig(**SEARCH)
    client = MlflowClient(one)
    run = client.create_run(client.create_experiment(  # (artifacts in this test's folder,
        "serve-test", artifact_location=str(tmp_path / "artifacts")))  # not ./mlruns)
    first = log_translator([tiny_checkpoints["a"]], search, tracking_uri=one,
                           run_id=run.info.run_id, registered_model_name="tiny")
    log_translator([tiny_checkpoints["b"]], search, tracking_uri=two,
                   registered_model_name="tiny")
    try:
        folder = fetch_logged_model(f"runs:/{run.info.run_id}/translator", one)
        assert (folder / "MLmodel").is_file()
        assert fetch_logged_model(f"runs:/{run.info.run_id}/translator", one) == folder
        with pytest.raises(ValueError, match=rf"model runs:/{run.info.run_id}/nope "):
            fetch_logged_model(f"runs:/{run.info.run_id}/nope", one)
        assert [p.name for p in (cache_root() / "models").iterdir()] == [folder.name]
        # the store from the environment is part of the cache key
        weights = []
        for store in (one, two):
            mlflow.set_tracking_uri(None)  # (as a new process: the store from the environment)
            monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
            got = fetch_logged_model("models:/tiny/1", None)
            weights.append([p.read_bytes() for p in sorted(got.rglob("checkpoint.pt"))])
        assert weights[0] != weights[1]
        assert resolve_model_uri("models:/tiny/latest", one) == f"models:/{first.model_id}"
        second = log_translator([tiny_checkpoints["b"]], search, tracking_uri=one,
                                registered_model_name="tiny")
        assert resolve_model_uri("models:/tiny/latest", one) == f"models:/{second.model_id}"
        # `Latest` in any case, and a stage, are pinned too (each was served as the first
        # download of its URI on the node, whatever version it named later)
        assert resolve_model_uri("models:/tiny/Latest", one) == f"models:/{second.model_id}"
        with pytest.warns(FutureWarning):  # (stages are deprecated in MLflow 3, still read)
            client.transition_model_version_stage("tiny", "1", "Production")
        assert resolve_model_uri("models:/tiny/production", one) == f"models:/{first.model_id}"
        with pytest.warns(FutureWarning):
            client.transition_model_version_stage("tiny", "2", "Production")
        assert resolve_model_uri("models:/tiny/Production", one) == f"models:/{second.model_id}"
        with pytest.raises(ValueError, match="has no version in stage 'Staging'"):
            resolve_model_uri("models:/tiny/Staging", one)
        # a store whose driver this machine lacks is one line, its password hidden (it was
        # a ModuleNotFoundError's traceback)
        with pytest.raises(ValueError, match=r"postgresql://alice:\*\*\*@db/x cannot be "
                           "opened here") as err:
            resolve_model_uri("models:/tiny@champion", "postgresql://alice:s3cret@db/x")
        assert "s3cret" not in str(err.value)
        # an artifact location, which may be written again, is downloaded by each fetch: a
        # model logged again there is served as it is now, not as the node's first download
        where = tmp_path / "exported"
        shutil.copytree(folder, where)
        before = fetch_logged_model(str(where), one)
        (where / "MLmodel").write_text((where / "MLmodel").read_text() + "# again\n")
        after = fetch_logged_model(str(where), one)
        assert after != before and (after / "MLmodel").read_text().endswith("# again\n")
        assert before.parent.name.startswith("unpinned-")  # this process's, not the cache's
    finally:
        mlflow.set_tracking_uri(None)


def test_serve_refuses_what_every_replica_would_fail_in_one_line_before_ray(
        tiny_checkpoints, tmp_path):
    """`serve --checkpoint` loads the model once on the driver, on the CPU, as each replica
    will: a folder without checkpoint.pt, a corrupt checkpoint, a missing --shortlist, int8
    weights on GPU replicas, and a --port already taken are each one line, exit 2, before Ray
    starts (they failed in every replica while Serve retried them); so are more CPUs or GPUs
    than this machine has for the replicas it starts with, on a new local Ray (Serve waited for
    them without end, saying nothing)."""
    import shutil
    import socket

    from conftest import calls_in_a_fresh_process

    (tmp_path / "empty").mkdir()
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_checkpoints["a"], corrupt)
    (corrupt / "checkpoint.pt").write_bytes(b"not a checkpoint")
    ck = ["--checkpoint", tiny_checkpoints["a"]]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = [
            (["--checkpoint", str(tmp_path / "empty")], "empty"),
            (["--checkpoint", str(corrupt)], "corrupt"),
            (ck + ["--shortlist", str(tmp_path / "nope.npz")], "nope.npz"),
            (ck + ["--precision", "int8", "--gpus-per-replica", "1"], "int8 inference runs on "
             "CPUs"),
            (ck + ["--port", str(port)], f"--port {port} on --host 127.0.0.1 cannot be bound"),
            (ck + ["--replicas", "2", "--threads-per-replica", "4096"],
             "2 replica(s) x --threads-per-replica 4096 need 8192 CPUs, and this machine has"),
            (ck + ["--min-replicas", "0", "--max-replicas", "2", "--threads-per-replica",
                   "4096"], "1 replica(s) x --threads-per-replica 4096 need 4096 CPUs"),
            (ck + ["--replicas", str(3 * gpus_here() + 1), "--gpus-per-replica", "0.34"],
             f"need more GPUs than this machine has ({gpus_here()}: {2 * gpus_here()} such "),
        ]
        results, _ = calls_in_a_fresh_process(
            "from convs2s.cli import main", "main(['serve', *extra])",
            [extra for extra, _ in cases])
    for (extra, says), (rc, err) in zip(cases, results):
        assert rc == 2 and says in err, (extra, err)
        assert err.startswith("python -m convs2s serve: error: ") and err.count("\n") == 1, \
            (extra, err)


@pytest.mark.slow
def test_sigterm_stops_serve_as_ctrl_c_and_deletes_the_application(tiny_checkpoints, tmp_path):
    """SIGTERM (what `ray job stop` sends the driver) ends `python -m convs2s serve` as Ctrl-C
    does: the application is deleted, exit 0, no traceback (Ray's own handler exited wherever
    the process was, and the application was left deployed). Its own local Ray."""
    import os
    import signal
    import time

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "convs2s", "serve", "--checkpoint", tiny_checkpoints["a"],
             "--port", str(port), "--max-len-b", "12"], cwd=REPO, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                                         timeout=5).read())
                if info["status"] == "ok":
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "stopping: the application 'convs2s' is deleted" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_a_body_key_other_than_inputs_and_params_is_refused_and_null_attention_is_off(
        tiny_checkpoints):
    """A misspelt "params" (`"param"`) is a 400 naming the key and the known ones, not a search
    with the defaults; `"attention": null` is the default (none kept), as a null setting is.
    (The replica's class, without Serve.)"""
    import asyncio

    from convs2s.serving.online import TranslatorReplica
    from convs2s.serving.requests import RequestError

    replica = TranslatorReplica({
        **config_args(), "model": None, "checkpoints": [tiny_checkpoints["a"]],
        "search": SEARCH, "min_replicas": None, "max_replicas": None, "replicas": 1})
    with pytest.raises(RequestError, match=r"unknown key\(s\) 'param' in the body; it may hold "
                                           r"'inputs', 'params'"):
        asyncio.run(replica.translate({"inputs": ["the cat"], "param": {"beam": 1}}))
    assert replica.batches == 0
    got = asyncio.run(replica.translate({"inputs": ["the cat"],
                                         "params": {"attention": None, "beam": None}}))
    assert got == {"predictions": alone(tiny_checkpoints["a"], ["the cat"])}


def test_serve_on_several_nodes_asks_each_for_the_model_files(
        ray_session, tiny_checkpoints, tmp_path, monkeypatch, capsys):
    """Serve places replicas on any node, and each loads the model's local files there: on a
    cluster of several nodes they are asked of each node before the deploy
    (storage.ray_join.node_not_seeing, run for real in tests/test_multinode.py; here it stands
    in for a node that does not see the checkpoint), and nothing is written into the model's
    folders (no probe file). One line naming the node and the folder, exit 2."""
    from convs2s.cli.serve_command import serve
    from storage import ray_join

    asked = []

    def unseen_model(folder, also=()):
        asked.append((folder, also))
        return "10.0.0.7", also[0]

    monkeypatch.setattr(ray_join, "node_not_seeing", unseen_model)
    # (were the nodes not asked, the deploy would serve until interrupted: failed at once)
    monkeypatch.setattr("convs2s.serving.online.run", lambda *a, **k: pytest.fail(
        "deployed: the model's files were not asked of the nodes"))
    ckpt = tiny_checkpoints["a"]
    assert serve(["--checkpoint", ckpt, "--spm-model", tiny_checkpoints["spm"],
                  "--port", str(free_port())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"python -m convs2s serve: error: {ckpt} is not shared: the node at "
                       "10.0.0.7 does not see it, and Serve may place replicas there; put the "
                       "model's files in a folder every node mounts (NFS / EFS / a shared "
                       "volume) or a bucket, or serve a logged model (--model)"), err
    assert asked == [(None, (ckpt, tiny_checkpoints["spm"]))]
