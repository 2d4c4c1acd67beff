"""What two of Ray's per-node pollers cost on a local Ray that has started many worker
processes: the log monitor and the dashboard agent's reporter, with Ray's defaults and with
the settings tests/conftest.py gives the suite's Rays.

- Ray's log monitor (one process a node) reads the new lines of the workers' log files and
  sends them to the drivers. Below RAY_LOG_MONITOR_MANY_FILES_THRESHOLD files (Ray's default:
  1,000) it lists the whole logs folder again on every pass, ten passes a second when nothing
  was written; at or above it, once every LOG_NAME_UPDATE_INTERVAL_S (0.5 s). New lines of
  the files it knows are still read on every pass. Variant `log_threshold_0`.
- The dashboard agent (one a node) reads every Ray process's CPU, memory and so on for the
  dashboard's node view and Ray's metrics every REPORTER_UPDATE_INTERVAL_MS (5,000 ms).
  Variant `reporter_30s` (30,000 ms); `both`, both settings.

A test session's Rays start hundreds of worker processes, each with its own log files.

Each variant is a fresh local Ray in a process of its own (the log monitor reads the variable
when it starts), with the dashboard as the suite's session Ray has it: `--workers` tasks, each
in a new worker process (`max_calls=1`), then `--idle` seconds with nothing running. Every
process on the machine is sampled from /proc (benchmarks.process_cpu); rounds alternate the
variants.

    python -m benchmarks.ray_daemons --workers 150 --idle 60 --rounds 2

Writes benchmarks/results/ray_daemons.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from statistics import median

from benchmarks.machine import load_average, machine_info, wait_for_quiet
from benchmarks.process_cpu import Sampler
from benchmarks.report import RESULTS_DIR, add_result_args, format_table, write_result

LOG_THRESHOLD = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}
REPORTER = {"REPORTER_UPDATE_INTERVAL_MS": "30000"}
VARIANTS = {"default": {}, "log_threshold_0": LOG_THRESHOLD, "reporter_30s": REPORTER,
            "both": {**LOG_THRESHOLD, **REPORTER}}


def child(workers: int, idle: float) -> None:
    """A local Ray that has run `workers` one-task worker processes, left idle `idle` s:
    prints one JSON line (the number of files in its logs folder)."""
    import ray

    from storage.ray_join import log_dir as ray_log_dir

    ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1",
             log_to_driver=False, configure_logging=False)

    @ray.remote(max_calls=1)  # a new worker process for every task
    def note(i: int) -> int:
        print("task", i)
        return i

    for start in range(0, workers, 10):
        ray.get([note.remote(i) for i in range(start, min(start + 10, workers))])
    files = len(os.listdir(ray_log_dir()))
    time.sleep(idle)
    ray.shutdown()
    print(json.dumps({"log_files": files}), flush=True)


def run_variant(name: str, workers: int, idle: float, interval: float) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", *LOG_THRESHOLD, *REPORTER)}
    env.update(VARIANTS[name])
    cmd = [sys.executable, "-m", "benchmarks.ray_daemons", "--child", "--workers", str(workers),
           "--idle", str(idle)]
    with Sampler(interval) as sampler:
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"variant {name} failed:\n{proc.stderr[-3000:]}")
    kinds = {k["kind"]: k["cpu_s"] for k in sampler.by_kind(skip_pid=os.getpid())}
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    return {"variant": name, "wall_s": round(wall, 1), **json.loads(line),
            "log_monitor_cpu_s": kinds.get("ray daemon: log monitor", 0.0),
            "dashboard_agent_cpu_s": kinds.get("ray::DashboardAgent", 0.0),
            "all_cpu_s": round(sum(kinds.values()), 2)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=150, help="one-task worker processes")
    p.add_argument("--idle", type=float, default=60.0, help="seconds idle after them")
    p.add_argument("--rounds", type=int, default=2, help="each variant once a round")
    p.add_argument("--interval", type=float, default=0.5, help="sampling interval, s")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_result_args(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.workers, args.idle)
        return 0
    quiet = wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet else {}
    before = load_average()
    rows = [{"round": r, **run_variant(name, args.workers, args.idle, args.interval)}
            for r in range(args.rounds) for name in VARIANTS]
    summary = [{"variant": name, **{key: median(x[key] for x in rows if x["variant"] == name)
                                    for key in ("wall_s", "log_files", "log_monitor_cpu_s",
                                                "dashboard_agent_cpu_s", "all_cpu_s")}}
               for name in VARIANTS]
    print(format_table(summary, [("variant", "variant"), ("wall_s", "wall s"),
                                 ("log_files", "log files"),
                                 ("log_monitor_cpu_s", "log monitor CPU s"),
                                 ("dashboard_agent_cpu_s", "dashboard agent CPU s"),
                                 ("all_cpu_s", "all processes CPU s")]))
    path = write_result(args.out or RESULTS_DIR / "ray_daemons.json", "ray_daemons",
                        {k: v for k, v in vars(args).items() if k != "child"},
                        machine_info(), before, load_average(), quiet,
                        {"runs": rows, "median": summary},
                        notes=["medians over the rounds; CPU of every process on the machine "
                               "while a variant's process ran (benchmarks.process_cpu)"],
                        replace=args.replace)
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
