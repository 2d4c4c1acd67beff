"""A workflow tracked by the team server: the fr-en workflow of the tests (news-commentary-5k,
20 updates, short outputs) with its data and storage in a loopback S3 bucket, tracked by
infra/mlflow's `mlflow server --app-name basic-auth` (artifacts proxied to the bucket), as
tests/test_object_storage.py runs it. Each round runs the workflow once from each checkout, in
turn, and counts the requests the server answered: compare code versions in one window.

    python -m benchmarks.team_tracking --checkout /tmp/old-checkout . --rounds 2

Writes benchmarks/results/team_tracking.json (or --out) and prints seconds and requests per
checkout and round. `--auth-cache-ttl 0 60` also alternates the server's credential cache
(infra/mlflow/auth-entrypoint.sh's MLFLOW_AUTH_CACHE_TTL_SECONDS; 0: the password's hash
checked on every request) within each round.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, write_result

REPO = Path(__file__).resolve().parents[1]
BUCKET = "convs2s-bench"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.team_tracking",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, nargs="+", default=[REPO],
                   help="repository checkouts whose workflow runs (default: this one)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--auth-cache-ttl", type=int, nargs="+", default=[None],
                   help="the server's credential cache TTLs (s) to alternate (default: the "
                        "entrypoint's)")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" /
                   "news-commentary-5k", help="folder with nc-5k.en / nc-5k.fr")
    p.add_argument("--out", type=Path)
    p.add_argument("--replace", action="store_true")
    return p.parse_args(argv)


def one_run(checkout: Path, data: Path, index: int, ttl: int | None = None) -> dict:
    """The workflow from `checkout` against a new team server (credential cache TTL `ttl`,
    None: the entrypoint's default) and bucket prefix: seconds and the server's request
    count."""
    root = Path(tempfile.mkdtemp(prefix="convs2s-team-bench-"))
    try:
        return {**_run_in(root, checkout, data, index, ttl),
                "auth_cache_ttl": "default" if ttl is None else ttl}
    finally:
        shutil.rmtree(root, ignore_errors=True)  # made above: the server's store and log


def _run_in(root: Path, checkout: Path, data: Path, index: int, ttl: int | None) -> dict:
    from benchmarks.mlflow_ui import mlflow_server

    admin = ("admin", "admin-pw-for-benchmarks")
    prefix = f"s3://{BUCKET}/run{index}"
    env = {**os.environ, "MLFLOW_ADMIN_PASSWORD": admin[1],
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "a-key-for-benchmarks-only",
           "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
           "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{root / 'auth.db'}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    if ttl is not None:
        env["MLFLOW_AUTH_CACHE_TTL_SECONDS"] = str(ttl)
    with mlflow_server(["server", "--app-name", "basic-auth", "--backend-store-uri",
                        f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination",
                        f"{prefix}/mlflow", "--serve-artifacts"], root / "server.log",
                       wrapper=("sh", str(REPO / "infra" / "mlflow" / "auth-entrypoint.sh")),
                       env=env) as url:
        uri = url.replace("http://", f"http://{admin[0]}:{admin[1]}@")
        argv = ["--preset", "cpu", "--src", "fr", "--tgt", "en", "--data", f"{prefix}/corpus",
                "--split", "train=nc-5k[:4500]", "--split", "valid=nc-5k[4500:4750]",
                "--split", "test=nc-5k[4750:]", "--set", "data.vocab_size=2000",
                "--set", "ensemble.average_last=0", "--max-updates", "20",
                "--set", "search.max_len_a=1.2", "--set", "search.max_len_b=10",
                "--storage-path", f"{prefix}/runs", "--tracking-uri", uri, "--run-name", "fr-en"]
        from storage import location

        for name in ("nc-5k.en", "nc-5k.fr"):
            location(f"{prefix}/corpus/{name}").upload(data / name)
        t0 = time.monotonic()
        # the checkout's code first on the path (its Ray workers inherit it)
        proc = subprocess.run([sys.executable, str(checkout / "workflows" / "translation.py"),
                               *argv], cwd=root, env={**os.environ, "PYTHONPATH": str(checkout)},
                              capture_output=True, text=True)
        seconds = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"the workflow from {checkout} failed:\n{proc.stderr[-3000:]}")
        log = (root / "server.log").read_text(errors="replace")
    requests = len(re.findall(r'"(?:GET|POST|PUT|PATCH|DELETE) /(?:api|ajax-api)/', log))
    return {"checkout": str(checkout), "seconds": round(seconds, 1), "requests": requests}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.s3_server import LoopbackS3

    args = parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout]
    load_before = load_average()
    server = LoopbackS3.start()
    os.environ.update(server.env())  # test credentials of the loopback server, never real ones
    rows = []
    try:
        server.create_bucket(BUCKET)
        runs = [(c, t) for c in checkouts for t in args.auth_cache_ttl]
        for r in range(args.rounds):
            for i, (checkout, ttl) in enumerate(runs):
                row = {"round": r + 1, **one_run(checkout, args.data, r * len(runs) + i, ttl)}
                print(row, file=sys.stderr)
                rows.append(row)
    finally:
        server.stop()
    print(format_table(rows, [("round", "round"), ("checkout", "checkout"),
                              ("auth_cache_ttl", "cache ttl"), ("seconds", "seconds"),
                              ("requests", "requests")]))
    settings = {"checkout": [str(c) for c in checkouts], "rounds": args.rounds,
                "auth_cache_ttl": args.auth_cache_ttl, "data": str(args.data)}
    path = write_result(args.out or RESULTS_DIR / "team_tracking.json", "team_tracking",
                        settings, machine_info(), load_before, load_average(), {"quiet": None},
                        {"rows": rows},
                        notes=["rounds alternate the checkouts (and cache TTLs) in one window; "
                               "compare ratios"],
                        replace=args.replace)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
