"""What a stopped test cluster leaves running: a `ray start --head` (benchmarks/local_cluster.py,
as tests/test_multinode.py starts them) is stopped with
`RayCliCluster.stop()`, then every process that belonged to it and still runs is watched until
it ends (or `--watch` seconds): how many there were and the CPU seconds they burned. Before the
stop, the head runs one job as the tests' do (`ray job submit --working-dir <folder> -- python
-c ...`; `--no-job`: an idle head). Compare checkouts in one window:

    python -m benchmarks.cluster_stop --checkout /tmp/old-checkout . --rounds 2

Each round stops one head from each checkout in turn (the checkout's local_cluster.py, this
checkout's way of finding the head's processes: its raylet's agents carry RAY_RAYLET_PID).
Writes benchmarks/results/cluster_stop.json (or --out).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, write_result

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster_stop",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, nargs="+", default=[REPO],
                   help="repository checkouts whose RayCliCluster stops the head (default: "
                        "this one)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--watch", type=float, default=300.0,
                   help="seconds to watch what is left before it is killed")
    p.add_argument("--no-job", action="store_true", help="stop an idle head")
    p.add_argument("--out", type=Path)
    p.add_argument("--replace", action="store_true")
    return p.parse_args(argv)


def _module(checkout: Path):
    spec = importlib.util.spec_from_file_location(
        f"local_cluster_{abs(hash(str(checkout)))}", checkout / "benchmarks" / "local_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (None: gone, or a zombie)."""
    import os

    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if stat[0] == "Z":
        return None
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def _submit_a_job(cluster) -> None:
    """One small job through the head's job API, its working directory uploaded."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "job.py").write_text("import ray\nray.init()\n"
                                             "print(ray.get(ray.remote(lambda: 1).remote()))\n")
        proc = subprocess.run(["ray", "job", "submit", "--working-dir", folder, "--",
                               "python", "job.py"], env={**cluster.env,
                                                         "RAY_ADDRESS": cluster.dashboard_url},
                              capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"the job failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def one_stop(checkout: Path, watch_s: float, job: bool = True) -> dict:
    """Start a head from `checkout`'s local_cluster.py, run a job on it (`job`), stop it,
    watch what is left."""
    import os
    import signal

    from benchmarks.local_cluster import RayCliCluster as Current

    module = _module(checkout)
    cluster = module.RayCliCluster(module.cli_env())
    cluster.start_head(num_cpus=1)
    time.sleep(3)  # the agents up
    if job:
        _submit_a_job(cluster)
    # Every process of the head, found this checkout's way while it runs (an older checkout's
    # processes lack the marker: they are found by temp dir, raylet and descendants).
    finder = Current(cluster.env, temp_dir=cluster.temp_dir)
    members = set(finder.pids())
    t0 = time.monotonic()
    cluster.stop()
    stop_s = time.monotonic() - t0
    start = {pid: _cpu_seconds(pid) for pid in members}
    left = {pid: cpu for pid, cpu in start.items() if cpu is not None}
    names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().strip()
             for pid in left}
    burned, lived = {}, {}
    t1 = time.monotonic()
    while left and time.monotonic() - t1 < watch_s:
        time.sleep(1.0)
        for pid in list(left):
            cpu = _cpu_seconds(pid)
            if cpu is None:
                lived[pid] = time.monotonic() - t1
                del left[pid]
            else:
                burned[pid] = cpu - start[pid]
    for pid in left:  # still running after the watch: ended here
        lived[pid] = watch_s
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"checkout": str(checkout), "stop_s": round(stop_s, 1),
            "left_running": len(names), "left": sorted(set(names.values())),
            "cpu_s_after_stop": round(sum(burned.values()), 1),
            "longest_lived_s": round(max(lived.values(), default=0.0), 1)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout]
    load_before = load_average()
    rows = []
    for r in range(args.rounds):
        for checkout in checkouts:
            row = {"round": r + 1, **one_stop(checkout, args.watch, not args.no_job)}
            print(row, file=sys.stderr)
            rows.append(row)
    print(format_table(rows, [("round", "round"), ("checkout", "checkout"),
                              ("left_running", "left running"),
                              ("cpu_s_after_stop", "CPU s after stop"),
                              ("longest_lived_s", "lived s")]))
    settings = {"checkout": [str(c) for c in checkouts], "rounds": args.rounds,
                "watch": args.watch, "job": not args.no_job}
    path = write_result(args.out or RESULTS_DIR / "cluster_stop.json", "cluster_stop", settings,
                        machine_info(), load_before, load_average(), {"quiet": None},
                        {"rows": rows},
                        notes=["rounds alternate the checkouts in one window"],
                        replace=args.replace)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
