"""Where the test suite's time goes: for every test's setup, call and teardown, the wall time
and the machine's busy and idle CPU seconds over it (from /proc/stat, all cores: on this 2-core
machine the suite's Ray workers, servers and workflow processes count, not just pytest's).

Record (a pytest plugin; one JSON line a phase), then summarize:

    SUITE_PHASES_OUT=/tmp/phases.jsonl python -m pytest -q -p benchmarks.suite_phases
    python -m benchmarks.suite_phases /tmp/phases.jsonl --top 30 --out suite.json

The summary gives the totals (wall, busy and idle core seconds), the slowest phases and the
time per test file. Idle core seconds are what running tests side by side could use at most;
busy ones are the work itself. Writes benchmarks/results/suite_phases.json (or --out).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.machine import cpu_seconds

OUT_ENV = "SUITE_PHASES_OUT"
T0 = time.monotonic()  # the plugin's load: every record's `t` counts from it


def _write(rec: dict) -> None:
    path = os.environ.get(OUT_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")


@contextlib.contextmanager
def span(name: str):
    """Record a stretch that is not a test phase (a background run of tests/conftest.py) as
    `{"background": name, "t", "wall", "busy", "idle"}`; the tests' phases it overlaps count
    the same CPU too."""
    t0, (all0, idle0) = time.monotonic(), cpu_seconds()
    try:
        yield
    finally:
        (all1, idle1) = cpu_seconds()
        _write({"background": name, "t": t0 - T0, "wall": time.monotonic() - t0,
                "busy": (all1 - all0) - (idle1 - idle0), "idle": idle1 - idle0})


class _Phase:
    def __init__(self, item, phase: str):
        self.item, self.phase = item, phase

    def __enter__(self):
        self.t0, self.cpu0 = time.monotonic(), cpu_seconds()

    def __exit__(self, *exc):
        (all0, idle0), (all1, idle1) = self.cpu0, cpu_seconds()
        _write({"id": self.item.nodeid, "phase": self.phase, "t": self.t0 - T0,
                "wall": time.monotonic() - self.t0,
                "busy": (all1 - all0) - (idle1 - idle0), "idle": idle1 - idle0})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _Phase(item, "setup"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _Phase(item, "call"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _Phase(item, "teardown"):
        yield


def summarize(rows: list[dict], top: int = 30) -> dict:
    """Totals, the `top` slowest phases and the time per test file of recorded phases; the
    background runs (`span`) apart, with when each started (s from the session's start)."""
    background = [{"name": r["background"], "start_s": round(r["t"], 1),
                   "wall_s": round(r["wall"], 1), "busy_core_s": round(r["busy"], 1),
                   "idle_core_s": round(r["idle"], 1)} for r in rows if "background" in r]
    rows = [r for r in rows if "id" in r]
    def tally(key) -> list[dict]:
        acc = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        for r in rows:
            a = acc[key(r)]
            a[0], a[1], a[2] = a[0] + r["wall"], a[1] + r["busy"], a[2] + r["idle"]
        out = [{"name": k, "wall_s": round(w, 1), "busy_core_s": round(b, 1),
                "idle_core_s": round(i, 1)} for k, (w, b, i) in acc.items()]
        return sorted(out, key=lambda x: -x["wall_s"])

    wall, busy, idle = (sum(r[k] for r in rows) for k in ("wall", "busy", "idle"))
    return {"tests": len({r["id"] for r in rows}),
            "wall_s": round(wall, 1), "busy_core_s": round(busy, 1), "idle_core_s": round(idle, 1),
            "idle_share": round(idle / (busy + idle), 3) if busy + idle else 0.0,
            "slowest_phases": tally(lambda r: f'{r["phase"]} {r["id"]}')[:top],
            "per_file": tally(lambda r: r["id"].split("::")[0]),
            "background": background}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.machine import machine_info
    from benchmarks.report import RESULTS_DIR, format_table, write_result

    p = argparse.ArgumentParser(prog="python -m benchmarks.suite_phases",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("phases", type=Path, help="the JSON lines the plugin wrote")
    p.add_argument("--top", type=int, default=30, help="slowest phases to list")
    p.add_argument("--command", default="", help="the pytest command that recorded them")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "suite_phases.json")
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in args.phases.read_text().splitlines() if line.strip()]
    if not rows:
        print(f"error: no phases in {args.phases}", file=sys.stderr)
        return 2
    res = summarize(rows, args.top)
    print(f'{res["tests"]} tests: {res["wall_s"]:,} s wall, {res["busy_core_s"]:,} busy and '
          f'{res["idle_core_s"]:,} idle core s ({res["idle_share"]:.0%} idle)')
    cols = [("wall_s", "wall s"), ("busy_core_s", "busy core s"),
            ("idle_core_s", "idle core s"), ("name", "phase")]
    print(format_table([{**r, "name": r["name"][:100]} for r in res["slowest_phases"]], cols))
    if res["background"]:
        print("background runs (tests/conftest.py):")
        print(format_table(res["background"], [("start_s", "start s"), *cols]))
    path = write_result(args.out, "suite_phases", {"phases": str(args.phases),
                                                   "command": args.command},
                        machine_info(), [], [], {}, res)
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
