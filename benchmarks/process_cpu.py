"""Whose CPU a command costs: run it while every process on the machine is sampled from /proc,
and add up each process's CPU seconds by kind (Ray Train workers, Ray Data task workers, Ray
Train's controller and helper actors, Ray's own daemons, the command's own process...).

On a 2-core machine the test suite is CPU work (benchmarks.suite_phases: busy 83% of the time);
this says which processes do it, for one test or any command:

    python -m benchmarks.process_cpu --out r.json -- python -m pytest -q \\
        "tests/test_workflows.py::test_other_workflows_smoke_end_to_end[gigaword]"

Processes are read every --interval seconds (0.2): one that starts and ends between two reads
is missed, and a process's CPU is counted up to its last read. Processes that were running
before the command count only what they used while it ran. Writes
benchmarks/results/process_cpu.json (or --out).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, write_result

TICK = os.sysconf("SC_CLK_TCK")
# Command-line fragments that name a Ray process without a `ray::` title, and its name here
# (the first that matches: log_monitor.py before monitor.py).
DAEMONS = {"raylet": "raylet", "gcs_server": "gcs_server", "dashboard/agent.py": "dashboard agent",
           "dashboard/dashboard.py": "dashboard", "ray-dashboard-": "dashboard module",
           "runtime_env/agent": "runtime env agent", "log_monitor.py": "log monitor",
           "monitor.py": "autoscaler monitor", "ray_client_server": "ray client server"}


def kind(cmdline: str) -> str:
    """A process's kind: its Ray title (`ray::RayTrainWorker`, `ray::IDLE`: a task worker
    between tasks), a Ray daemon, or its command line's first three words (paths by their
    last part: `python burner.py`, `python -m pytest`)."""
    cmd = cmdline.strip()
    if cmd.startswith("ray::"):
        return cmd.split()[0]
    for fragment, name in DAEMONS.items():
        if fragment in cmd:
            return f"ray daemon: {name}"
    return " ".join(Path(w).name if "/" in w else w for w in cmd.split()[:3])[:60]


def snapshot() -> dict[tuple[int, int], tuple[str, float]]:
    """{(pid, start tick): (command line, CPU seconds)} of every process now."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the (name), which may hold spaces
        cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
        out[(int(pid), int(fields[19]))] = (cmd, cpu)
    return out


class Sampler:
    """Reads every process every `interval` s from start to stop (a thread)."""

    def __init__(self, interval: float):
        self.interval = interval
        self.before = snapshot()  # what the processes already running had used
        self.seen: dict[tuple[int, int], list] = {}  # key -> [cmd, first cpu, last cpu]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, (cmd, cpu) in snapshot().items():
                row = self.seen.setdefault(key, [cmd, self.before.get(key, ("", 0.0))[1], cpu])
                row[0], row[2] = cmd or row[0], cpu
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def by_kind(self, skip_pid: int) -> list[dict]:
        """CPU seconds and processes per kind, largest first (this process left out)."""
        agg = defaultdict(lambda: [0, 0.0])
        for (pid, _), (cmd, first, last) in self.seen.items():
            if pid == skip_pid or last - first <= 0:
                continue
            k = agg[kind(cmd)]
            k[0] += 1
            k[1] += last - first
        return [{"kind": k, "processes": n, "cpu_s": round(c, 2)}
                for k, (n, c) in sorted(agg.items(), key=lambda kv: -kv[1][1])]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.process_cpu",
        usage="%(prog)s [-h] [--interval S] [--top N] [--out FILE] [--replace] -- COMMAND ...",
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- is the command to run and measure; the tool exits with its "
               "exit status.")
    p.add_argument("--interval", type=float, default=0.2, metavar="S",
                   help="seconds between two reads of every process (default 0.2)")
    p.add_argument("--top", type=int, default=25, metavar="N",
                   help="kinds of process in the printed table (default 25; the file has all)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "process_cpu.json", metavar="FILE",
                   help="result JSON (default benchmarks/results/process_cpu.json)")
    p.add_argument("--replace", action="store_true",
                   help="overwrite --out if it exists (otherwise the result goes beside it, "
                        "named with the UTC time)")
    if "--" not in argv:
        p.parse_args(argv)  # --help prints the options and exits; other options are checked
        p.exit(1, p.format_usage() + "error: no COMMAND: give it after --\n")
    split = argv.index("--")
    args, command = p.parse_args(argv[:split]), argv[split + 1:]
    load_before = load_average()
    with Sampler(args.interval) as sampler:
        t0 = time.monotonic()
        rc = subprocess.call(command)
        wall = time.monotonic() - t0
    kinds = sampler.by_kind(skip_pid=os.getpid())
    total = sum(k["cpu_s"] for k in kinds)
    rows = [{**k, "share": f"{k['cpu_s'] / max(total, 1e-9):.1%}"} for k in kinds[:args.top]]
    print(format_table(rows, [("cpu_s", "CPU s"), ("share", "share"),
                              ("processes", "processes"), ("kind", "kind")]))
    print(f"{total:.1f} CPU s in {wall:.1f} s (exit {rc}), {os.cpu_count()} cores")
    path = write_result(args.out, "process_cpu", {"command": command, "interval": args.interval},
                        machine_info(), load_before, load_average(), {},
                        {"exit_code": rc, "wall_s": round(wall, 1), "cpu_s": round(total, 1),
                         "kinds": kinds}, replace=args.replace)
    print(f"result: {path}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
