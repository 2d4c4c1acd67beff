"""A load generator for the online translator: real HTTP over loopback, single-sentence
requests from 1, 4 and 16 concurrent clients, against the Ray Serve deployment
(`python -m convs2s serve`, dynamic batching) and `mlflow models serve` of the same logged
model, in the same run.

The model is logged once (`convs2s.serving.pyfunc.log_translator`, a sqlite store in a scratch
folder) and registered with the alias `champion`; both servers load that registered model, so
they serve the same weights and search settings (its search.json). Both start as a user starts
them, in their own processes (MLflow: one uvicorn worker, torch's default threads; Serve: its
own local Ray). For each client count, rounds alternate the servers (the order swapped each
round); each measurement sends up to --requests requests (at most --max-seconds), after a
warm-up. A client sends its next request when the last one is answered (closed loop); the
sentences are the test set's, in turn. Figures: requests/s, p50 / p99 latency; translations are
compared sentence by sentence between the servers.

    python -m benchmarks.serving --checkpoint RUN/train/best \\
        --test ../shared/data/multi30k/test_2016_flickr.en.gz --clients 1 4 16 --rounds 2

Writes benchmarks/results/serving_<precision>.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from statistics import median

from benchmarks.machine import load_average, machine_info, wait_for_quiet
from benchmarks.report import (RESULTS_DIR, add_result_args, add_search_args, format_table,
                               read_sentences, write_result)
from workflows.cluster import free_port


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--test", type=Path, required=True, help="source sentences (text or .gz)")
    add_search_args(p)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=400, help="most requests per measurement")
    p.add_argument("--max-seconds", type=float, default=30.0, help="most time per measurement")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--threads-per-replica", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-wait-ms", type=float, default=2.0)
    add_result_args(p)
    return p.parse_args(argv)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready after {timeout_s} s")
        time.sleep(1)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers: its own group
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def measure(url: str, sentences: list[str], clients: int, requests: int,
                  max_seconds: float) -> dict:
    """Closed-loop clients: each sends its next single-sentence request when the last one is
    answered, until `requests` were sent or `max_seconds` passed."""
    import aiohttp

    latencies: list[float] = []
    answers: dict[int, str] = {}
    counter = iter(range(requests))
    t_end = time.perf_counter() + max_seconds

    async def client(session):
        for i in counter:
            if time.perf_counter() > t_end:
                return
            k = i % len(sentences)
            t0 = time.perf_counter()
            async with session.post(url, json={"inputs": [sentences[k]]}) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status}: {body}")
            latencies.append(time.perf_counter() - t0)
            answers[k] = body["predictions"][0]

    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=clients),
            timeout=aiohttp.ClientTimeout(total=300)) as session:
        for k in range(min(4, len(sentences))):  # warm-up, not counted
            async with session.post(url, json={"inputs": [sentences[k]]}) as r:
                await r.read()
        t0 = time.perf_counter()
        await asyncio.gather(*[client(session) for _ in range(clients)])
        elapsed = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"requests": len(lat), "seconds": round(elapsed, 2),
            "requests_per_s": round(len(lat) / elapsed, 2),
            "p50_ms": round(1000 * lat[len(lat) // 2], 1),
            "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
            "answers": answers}


def main(argv=None) -> None:
    args = parse_args(argv)
    from convs2s.config import SearchConfig
    from convs2s.serving.pyfunc import log_translator

    quiet = (wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet
             else {"quiet": None})
    load_before = load_average()
    sentences = read_sentences(args.test)
    search = SearchConfig(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                          precision=args.precision,
                          shortlist=str(args.shortlist) if args.shortlist else None,
                          shortlist_frequent=args.shortlist_frequent)
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        tmp = Path(tmp)
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        served = log_translator([args.checkpoint], search, tracking_uri=uri,
                                registered_model_name="bench", alias="champion")
        venv_bin = str(Path(sys.executable).parent)
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri,
               "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
        env.pop("RAY_ADDRESS", None)
        ports = {"mlflow models serve": free_port(), "ray serve": free_port()}
        cmds = {
            "mlflow models serve": [str(Path(venv_bin) / "mlflow"), "models", "serve", "-m",
                                    served.registered_uri, "--env-manager", "local", "-p",
                                    str(ports["mlflow models serve"]), "-h", "127.0.0.1",
                                    "-w", "1"],
            "ray serve": [sys.executable, "-m", "convs2s", "serve", "--model",
                          served.registered_uri, "--tracking-uri", uri, "--port",
                          str(ports["ray serve"]), "--replicas", str(args.replicas),
                          "--threads-per-replica", str(args.threads_per_replica),
                          "--max-batch-size", str(args.max_batch_size),
                          "--batch-wait-ms", str(args.batch_wait_ms)]}
        ready = {"mlflow models serve": "/ping", "ray serve": "/health"}
        path = {"mlflow models serve": "/invocations", "ray serve": "/translate"}
        procs = {}
        try:
            for name, cmd in cmds.items():
                log = tmp / f"{name.replace(' ', '_')}.log"
                procs[name] = subprocess.Popen(cmd, stdout=open(log, "w"),
                                               stderr=subprocess.STDOUT, env=env, cwd=tmp,
                                               start_new_session=True)
                wait_ready(f"http://127.0.0.1:{ports[name]}{ready[name]}", procs[name], log)
            for clients in args.clients:
                for r in range(args.rounds):
                    order = list(cmds)[:: 1 if r % 2 == 0 else -1]
                    for name in order:
                        url = f"http://127.0.0.1:{ports[name]}{path[name]}"
                        res = asyncio.run(measure(url, sentences, clients, args.requests,
                                                  args.max_seconds))
                        res.update(server=name, clients=clients, round=r + 1)
                        results.append(res)
                        print(f"{name}, {clients} clients, round {r + 1}: "
                              f"{res['requests_per_s']} req/s, p50 {res['p50_ms']} ms, "
                              f"p99 {res['p99_ms']} ms", file=sys.stderr, flush=True)
        finally:
            for proc in procs.values():
                stop(proc)
    rows, answers = [], {}
    for r in results:
        answers.setdefault(r["server"], {}).update(r.pop("answers"))
    for clients in args.clients:
        by = {name: [r for r in results if r["server"] == name and r["clients"] == clients]
              for name in cmds}
        base = {k: median(r[k] for r in by["mlflow models serve"])
                for k in ("requests_per_s", "p50_ms", "p99_ms")}
        for name, rs in by.items():
            row = {k: median(r[k] for r in rs) for k in ("requests_per_s", "p50_ms", "p99_ms")}
            rows.append({"server": name, "clients": clients, **row,
                         "rounds_requests_per_s": [r["requests_per_s"] for r in rs],
                         "x_mlflow_requests_per_s": round(row["requests_per_s"]
                                                          / base["requests_per_s"], 2),
                         "x_mlflow_p50": round(row["p50_ms"] / base["p50_ms"], 2),
                         "x_mlflow_p99": round(row["p99_ms"] / base["p99_ms"], 2)})
    common = set(answers["mlflow models serve"]) & set(answers["ray serve"])
    same = sum(answers["mlflow models serve"][k] == answers["ray serve"][k] for k in common)
    print(format_table(rows, [("server", "server"), ("clients", "clients"),
                              ("requests_per_s", "req/s"), ("p50_ms", "p50 ms"),
                              ("p99_ms", "p99 ms"), ("x_mlflow_requests_per_s", "x req/s"),
                              ("x_mlflow_p99", "x p99")]))
    print(f"identical translations: {same} of {len(common)} sentences answered by both")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    out = write_result(
        args.out or RESULTS_DIR / f"serving_{args.precision}"
        f"{'_shortlist' if args.shortlist else ''}.json", "serving", settings, machine_info(),
        load_before, load_average(), quiet,
        {"rows": rows, "measurements": results,
         "identical": {"same": same, "compared": len(common)}},
        notes=["closed-loop clients, one sentence a request; the servers alternate per round; "
               "medians over rounds"], replace=args.replace)
    print(out)


if __name__ == "__main__":
    main()
