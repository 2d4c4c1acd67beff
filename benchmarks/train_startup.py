"""Where a short Ray Train run's fixed start-up goes: bare `TorchTrainer.fit` runs (a loop
function that only notes when it started) on a fresh local Ray per variant, with the
controller's own phase times read from Ray Train's log.

A test suite run makes 25 or so training runs (22 on its session's Ray at 22f4d18), each
paying this start-up; this benchmark says which part of it a setting moves. Variants (each
its own Ray, since the raylet reads the environment when it starts; rounds alternate them):

- `default`: Ray's settings plus the suite's (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2, idle
  workers kept: tests/conftest.py);
- `preload`: the same, and every new Ray worker process imports torch and ray.train.torch
  before its first task (Ray's `preload_python_modules`, RAY_preload_python_modules);
- `no_env`: without RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (Ray Train then hands its workers an
  empty set of environment variables to propagate).
- `no_preempt`: the suite's settings with Ray Train's preemption watcher off
  (RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=0, as tests/conftest.py sets it).
- `no_metrics`: `no_preempt`, and Ray Train's own metrics off (RAY_TRAIN_METRICS_ENABLED=0:
  no controller and worker metrics callbacks).

Besides the times, each run's `busy_core_s`: the CPU seconds the whole machine spent over it
(/proc/stat), every process of Ray's included; the suite runs on 2 cores, so what a run
keeps busy is what the tests beside it cannot have.

    python -m benchmarks.train_startup --workers 2 --runs 3 --rounds 2

Writes benchmarks/results/train_startup.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

from benchmarks.machine import cpu_seconds, load_average, machine_info, wait_for_quiet
from benchmarks.report import RESULTS_DIR, add_result_args, format_table, write_result

SUITE_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_num_workers_soft_limit": "8",
             "RAY_idle_worker_killing_time_threshold_ms": "300000"}
VARIANTS = {
    "default": SUITE_ENV,
    "preload": {**SUITE_ENV, "RAY_preload_python_modules": "torch,ray.train.torch"},
    "no_env": {k: v for k, v in SUITE_ENV.items() if k != "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"},
    "no_preempt": {**SUITE_ENV, "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"},
    "no_metrics": {**SUITE_ENV, "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                   "RAY_TRAIN_METRICS_ENABLED": "0"},
}
# The controller's log lines that time its phases (Ray Train 2.60, DEBUG level).
PHASES = {"actors_created_s": r"worker actors created in ([0-9.]+)s",
          "context_init_s": r"Train context initialized on workers in ([0-9.]+)s",
          "group_start_s": r"Worker group startup completed in ([0-9.]+)s total"}


def controller_phases(log_text: str) -> dict:
    """The last run's phase times in a Ray Train controller log ({key: seconds or None})."""
    out = {}
    for key, pattern in PHASES.items():
        found = re.findall(pattern, log_text)
        out[key] = float(found[-1]) if found else None
    return out


def summarize(rows: list[dict], variants: list[str]) -> list[dict]:
    """Per variant, the medians over its warm runs (a Ray's first run is cold: left out)."""
    keys = ("total_s", "start_to_entry_s", "actors_created_s", "context_init_s",
            "entry_to_end_s", "busy_core_s")
    out = []
    for name in variants:
        warm = [x for x in rows if x["variant"] == name and x["run"] > 0]
        out.append({"variant": name, **{
            key: round(median(v), 2) if (v := [x[key] for x in warm if x.get(key) is not None])
            else None for key in keys}})
    return out


def _loop(config: dict) -> None:
    import time

    import ray.train

    if ray.train.get_context().get_world_rank() == 0:
        Path(config["entry_file"]).write_text(repr(time.time()))


def child(workers: int, runs: int) -> None:
    """One variant's runs, in this process (its environment set by the parent): prints one
    JSON line a run."""
    import time

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    tmp = Path(tempfile.mkdtemp(prefix="train_startup_"))
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    time.sleep(3.0)  # Ray's prestarted workers up, as in a session that has run for a while
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "train"
    for i in range(runs):
        entry = tmp / f"entry_{i}"
        start, (all0, idle0) = time.time(), cpu_seconds()
        TorchTrainer(_loop, train_loop_config={"entry_file": str(entry)},
                     scaling_config=ScalingConfig(num_workers=workers),
                     run_config=RunConfig(storage_path=str(tmp / "runs"), name=f"r{i}")).fit()
        end, (all1, idle1) = time.time(), cpu_seconds()
        busy = (all1 - all0) - (idle1 - idle0)
        entered = float(entry.read_text())
        row = {"run": i, "total_s": round(end - start, 3), "busy_core_s": round(busy, 2),
               "start_to_entry_s": round(entered - start, 3),
               "entry_to_end_s": round(end - entered, 3)}
        controllers = sorted(logs.glob("ray-train-sys-controller-*.log"),
                             key=lambda p: p.stat().st_mtime)
        text = controllers[-1].read_text(errors="replace") if controllers else ""
        row.update(controller_phases(text))
        print(json.dumps(row), flush=True)
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)  # made above: the bare runs' Ray Train folders


def run_variant(name: str, workers: int, runs: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items()
           if k not in {*SUITE_ENV, "RAY_preload_python_modules", "RAY_ADDRESS",
                        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER",
                        "RAY_TRAIN_METRICS_ENABLED"}}
    env.update(VARIANTS[name])
    proc = subprocess.run([sys.executable, "-m", "benchmarks.train_startup", "--child",
                           "--workers", str(workers), "--runs", str(runs)],
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"variant {name} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=3, help="runs per Ray; the first is cold")
    p.add_argument("--rounds", type=int, default=2, help="each variant once a round")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_result_args(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.workers, args.runs)
        return 0
    quiet = wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet else {}
    before = load_average()
    rows = []
    for r in range(args.rounds):
        for name in args.variants:
            for row in run_variant(name, args.workers, args.runs):
                rows.append({"variant": name, "round": r, **row})
    summary = summarize(rows, args.variants)
    print(format_table(summary, [("variant", "variant"), ("total_s", "total s"),
                                 ("start_to_entry_s", "to loop s"),
                                 ("actors_created_s", "actors s"),
                                 ("context_init_s", "context s"),
                                 ("entry_to_end_s", "loop to end s"),
                                 ("busy_core_s", "busy core s")]))
    path = write_result(args.out or RESULTS_DIR / "train_startup.json", "train_startup",
                        {k: v for k, v in vars(args).items() if k != "child"},
                        machine_info(), before, load_average(), quiet,
                        {"runs": rows, "median_warm": summary},
                        notes=["medians over the warm runs (each Ray's first run is cold)",
                               "actors / context: Ray Train's controller log (DEBUG lines)"],
                        replace=args.replace)
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
