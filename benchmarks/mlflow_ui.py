"""A real `mlflow server` on a free loopback port, for what renders MLflow's UI: the analysis
benchmark's compare-view screenshot and the UI tests.

    with mlflow_server(["server", "--backend-store-uri", uri], log) as url:
        ...  # url answers /health with OK

As a benchmark, what MLflow's server-side job runner costs (the team server turns it off,
infra/mlflow/docker-compose.yaml): the CPU seconds of every process a server start adds, from
its launch until `--idle` seconds after /health answers, job execution on and off in turns:

    python -m benchmarks.mlflow_ui --rounds 3 --idle 30
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from workflows.cluster import free_port

# MLflow 3's switch for its server-side job runner (infra/mlflow/docker-compose.yaml says why
# the team server turns it off).
JOB_EXECUTION = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


@contextmanager
def mlflow_server(args: list[str], log: Path, timeout_s: float = 180.0,
                  wrapper: tuple[str, ...] = (), env: dict | None = None) -> Iterator[str]:
    """`python -m mlflow <args>` (`server ...` or `ui ...`; a --port in `args` is replaced) on
    127.0.0.1 at a free port with one worker, in its own process group so that its uvicorn
    workers end with it. Yields its URL once /health answers OK; a server that exits or does
    not answer within `timeout_s` is a RuntimeError with the end of its log. `wrapper`: a
    command that runs the server (infra/mlflow/auth-entrypoint.sh), `env` its environment
    (os.environ by default). As infra/mlflow runs it, the server starts no MLflow job runner
    (MLFLOW_SERVER_ENABLE_JOB_EXECUTION, unless `env` sets it)."""
    args = list(args)
    env = dict(os.environ if env is None else env)
    env.setdefault(JOB_EXECUTION, "false")
    port = str(free_port())
    if "--port" in args:
        args[args.index("--port") + 1] = port
    else:
        args += ["--port", port]
    log = Path(log)
    with open(log, "w") as out:
        proc = subprocess.Popen([*wrapper, sys.executable, "-m", "mlflow", *args, "--host",
                                 "127.0.0.1", "--workers", "1"], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.read().strip() == b"OK":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if proc.poll() is not None else f"did not answer in {timeout_s} s"
                raise RuntimeError(f"mlflow server {why}; the end of its log ({log}):\n"
                                   f"{log.read_text()[-3000:]}")
            time.sleep(0.2)  # (a refused connection is cheap: ready sooner, not a second late)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _cpu_of_new_processes(before: set[int]) -> float:
    from benchmarks.process_cpu import snapshot

    return sum(cpu for (pid, _), (_, cpu) in snapshot().items() if pid not in before)


def server_start_cpu(job_execution: bool, idle_s: float) -> dict:
    """One server on a fresh sqlite store: wall seconds to /health, and the CPU seconds of the
    processes it started (sampled before they end) at /health and `idle_s` later."""
    import tempfile

    from benchmarks.process_cpu import snapshot

    before = {pid for pid, _ in snapshot()}
    env = {**os.environ, JOB_EXECUTION: "true" if job_execution else "false"}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        with mlflow_server(["server", "--backend-store-uri", f"sqlite:///{d}/mlflow.db"],
                           Path(d) / "server.log", env=env):
            ready = time.monotonic() - t0
            at_health = _cpu_of_new_processes(before)
            time.sleep(idle_s)
            after_idle = _cpu_of_new_processes(before)
    return {"job_execution": job_execution, "ready_s": round(ready, 2),
            "cpu_at_health_s": round(at_health, 2), "cpu_after_idle_s": round(after_idle, 2)}


def main(argv: list[str] | None = None) -> None:
    import argparse

    from benchmarks.machine import load_average, machine_info
    from benchmarks.report import RESULTS_DIR, format_table, write_result

    p = argparse.ArgumentParser(prog="python -m benchmarks.mlflow_ui",
                                description="CPU of an MLflow server start, job runner on/off")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "mlflow_server_cpu.json")
    p.add_argument("--replace", action="store_true")
    args = p.parse_args(argv)
    load_before = load_average()
    rows = [dict(server_start_cpu(on, args.idle), round=r)
            for r in range(args.rounds) for on in (True, False)]  # alternated, one window
    print(format_table(rows, [("round", "round"), ("job_execution", "job runner"),
                              ("ready_s", "to /health s"), ("cpu_at_health_s", "CPU s then"),
                              ("cpu_after_idle_s", f"CPU s +{args.idle:g} s")]))
    mean = {on: sum(r["cpu_after_idle_s"] for r in rows if r["job_execution"] is on) / args.rounds
            for on in (True, False)}
    print(f"mean CPU s per start: job runner on {mean[True]:.1f}, off {mean[False]:.1f}")
    path = write_result(args.out, "mlflow_server_cpu", vars(args) | {"out": str(args.out)},
                        machine_info(), load_before, load_average(), {},
                        {"rounds": rows, "mean_cpu_on_s": round(mean[True], 2),
                         "mean_cpu_off_s": round(mean[False], 2)}, replace=args.replace)
    print(f"result: {path}")


if __name__ == "__main__":
    main()
