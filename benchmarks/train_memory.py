"""A training process's memory over a long run: does it level off, or grow with the updates?

Runs `python -m convs2s train` (the whole loop without Ray: the same Trainer, reader and
checkpoints as a Ray Train worker) on a preprocessing output's batches for --updates updates,
and samples the process's PSS every second. Reports the PSS at each tenth of the run (by
updates, from the run's metrics.jsonl clock) and the growth over its second half: a process
whose memory grows with the updates (a leak) grows there as in the first half; one whose
caches fill with the batch shapes it meets (the allocator, oneDNN's kernels per shape) levels
off.

    python -m benchmarks.train_memory --data <prep>/batches/<key>/train \\
        --valid <prep>/batches/<key>/valid --spm <prep>/spm/spm.model --updates 6000

Writes benchmarks/results/train_memory.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, fresh_workdir, write_result
from convs2s.precision import CHOICES as TRAINING_PRECISIONS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_memory",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a batches/train folder")
    p.add_argument("--valid", type=Path, required=True, help="a batches/valid folder")
    p.add_argument("--spm", type=Path, required=True, help="its sentencepiece model")
    p.add_argument("--model", default="tiny", help="model preset (convs2s.config.PRESETS)")
    p.add_argument("--updates", type=int, default=6000)
    p.add_argument("--precision", default="auto", choices=TRAINING_PRECISIONS)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/convs2s-bench-train-memory"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--replace", action="store_true",
                   help="overwrite the result file if it exists (default: keep it and write "
                        "<name>-<time>.json beside it)")
    return p.parse_args(argv)


def run(args) -> dict:
    fresh_workdir(args.workdir, "train_memory")
    cmd = [sys.executable, "-m", "convs2s", "train", "--train-data", str(args.data),
           "--valid-data", str(args.valid), "--spm-model", str(args.spm), "--model", args.model,
           "--storage-path", str(args.workdir), "--run-name", "run", "--max-updates",
           str(args.updates), "--max-epochs", "0", "--precision", args.precision,
           "--set", "lr_schedule=fixed", "--set", "log_interval=100"]
    log = args.workdir / "train.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        ps, t0, series = psutil.Process(proc.pid), time.time(), []
        while proc.poll() is None:
            try:
                series.append((time.time(), ps.memory_full_info().pss))
            except psutil.Error:
                pass
            time.sleep(1.0)
    if proc.returncode != 0:
        raise SystemExit(f"training failed (exit {proc.returncode}); see {log}")
    from convs2s.tracking.run_logger import read_local_metrics

    clock = [(r["time"], r["step"]) for r in read_local_metrics(args.workdir / "run" /
                                                                "metrics.jsonl")
             if "train/loss" in r["metrics"]]

    def update_at(t: float) -> int:  # the last logged update at time t
        return max([s for ts, s in clock if ts <= t], default=0)

    rows = []
    for tenth in range(1, 11):
        want = args.updates * tenth // 10
        at = [(t, pss) for t, pss in series if update_at(t) <= want]
        t, pss = at[-1]
        rows.append({"updates": update_at(t), "seconds": round(t - t0, 1),
                     "pss_mib": round(pss / 2**20, 1)})
    half = [pss / 2**20 for t, pss in series if update_at(t) >= args.updates // 2]
    first = [pss / 2**20 for t, pss in series if 0 < update_at(t) < args.updates // 2]
    return {"tenths": rows, "samples": len(series), "peak_mib": round(max(half + first), 1),
            "first_half_growth_mib": round(max(first) - min(first), 1) if first else None,
            "second_half_growth_mib": round(max(half) - min(half), 1) if half else None,
            "second_half_min_mib": round(min(half), 1) if half else None,
            "log_tail": log.read_text().strip().splitlines()[-1]}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    load_before = load_average()
    r = run(args)
    path = write_result(args.out or RESULTS_DIR / "train_memory.json", "train_memory",
                        {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                        machine_info(), load_before, load_average(), {}, r, [],
                        replace=args.replace)
    print(format_table(r["tenths"], [("updates", "updates"), ("seconds", "s"),
                                     ("pss_mib", "PSS MiB")]))
    print(f"growth: first half {r['first_half_growth_mib']} MiB, second half "
          f"{r['second_half_growth_mib']} MiB (peak {r['peak_mib']} MiB)   result: {path}")
    return r


if __name__ == "__main__":
    main()
