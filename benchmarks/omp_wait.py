"""OpenMP's wait policy on a shared machine: a two-thread beam search (`benchmarks.generation`,
the `small` model, beam 5) and training step (`benchmarks.training`) alone and beside one busy
single-thread process, with OpenMP's threads spinning while they wait (libgomp's default,
300,000 spins), spinning less (GOMP_SPINCOUNT) and sleeping at once (OMP_WAIT_POLICY=PASSIVE),
in alternated rounds. Each measurement is a process of its own: libgomp reads these when torch
loads it.

    python -m benchmarks.omp_wait --rounds 2

Writes benchmarks/results/omp_wait.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, write_result

POLICIES = {
    "spin": {},  # libgomp's default
    "spin_10000": {"GOMP_SPINCOUNT": "10000"},
    "spin_1000": {"GOMP_SPINCOUNT": "1000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}
# One busy thread for as long as it is not killed, as a Ray worker beside the measured process.
BUSY = ("import torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\n"
        "while True:\n    a @ a\n")


def _command(workload: str, threads: int, out: Path) -> list[str]:
    common = ["--preset", "small", "--threads", str(threads), "--peak-sizes", "256",
              "--out", str(out)]
    if workload == "beam":
        return [sys.executable, "-m", "benchmarks.generation", "--limit", "200", "--beams", "5",
                "--repeats", "1", *common]
    return [sys.executable, "-m", "benchmarks.training", "--steps", "30", "--warmup", "3",
            *common]


def measure(workload: str, policy: str, threads: int, busy: bool) -> float:
    """Sentences/s (beam) or seconds a step (train, the median) under `policy`, with or without
    the busy neighbour."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(POLICIES[policy])
    neighbour = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            proc = subprocess.run(_command(workload, threads, out), env=env, capture_output=True,
                                  text=True, timeout=900, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"{workload} run failed:\n{proc.stderr[-3000:]}")
            result = json.loads(out.read_text())["results"]
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    if workload == "beam":
        return round(result["runs"][0]["sentences_per_s"], 1)
    return round(result["median_step_s"], 4)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.omp_wait",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workloads", nargs="+", choices=["beam", "train"], default=["beam", "train"])
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "omp_wait.json")
    p.add_argument("--replace", action="store_true")
    args = p.parse_args(argv)
    load_before = load_average()
    runs = []  # alternated: each round measures every case once
    for r in range(args.rounds):
        for workload in args.workloads:
            for busy in (False, True):
                for policy in POLICIES:
                    v = measure(workload, policy, args.threads, busy)
                    runs.append({"round": r, "workload": workload, "policy": policy,
                                 "beside_busy_thread": busy, "value": v})
                    print(f"round {r}: {workload} {policy:10s} "
                          f"{'beside a busy thread' if busy else 'alone':20s} {v}", flush=True)
    rows = []
    for workload in args.workloads:
        for policy in POLICIES:
            row = {"workload": workload, "policy": policy}
            for busy, key in ((False, "alone"), (True, "busy")):
                vals = [x["value"] for x in runs if x["workload"] == workload
                        and x["policy"] == policy and x["beside_busy_thread"] == busy]
                row[key] = statistics.median(vals)
                row[f"{key}_rounds"] = vals
            rows.append(row)
    print("beam: sentences/s (higher is better); train: seconds a step (lower is better)")
    print(format_table(rows, [("workload", "workload"), ("policy", "policy"),
                              ("alone", "alone"), ("busy", "beside a busy thread")]))
    path = write_result(
        args.out, "omp_wait",
        {"rounds": args.rounds, "threads": args.threads, "workloads": args.workloads,
         "preset": "small", "neighbour": "one thread of 512x512 matmuls",
         "units": {"beam": "sentences/s, beam 5, 200 sentences", "train": "median step s"},
         "policies": POLICIES,
         "command": "python -m benchmarks.omp_wait "
         + " ".join(sys.argv[1:] if argv is None else argv)},
        machine_info(), load_before, load_average(), {}, {"cases": rows, "runs": runs},
        replace=args.replace)
    print(f"result: {path}")


if __name__ == "__main__":
    main()
