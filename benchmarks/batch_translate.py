"""A large corpus on this machine: the Ray Data job (`translate --actors N`) against today's
single process (`translate`, every core's thread in one process), as a user runs them.

Both are the project's command lines in subprocesses, on the same model, settings and input
(the first --lines lines of a file, e.g. Multi30k's train.en: 20,000 distinct captions), in
alternated rounds (each once per round, the order swapped every round). Per run:
- the single process's own rate (its log line: translation only, model load excluded);
- the job's rate from its manifest (from the end of its split to the last part: the local
  Ray's start-up, the actors' and the model loading included), and its split time;
- the actors' own rate (lines over the parts' search time shared among the actors);
- both commands' wall time (Python start, Ray start for the job, model loading: everything).
Outputs must be identical line for line (the job's parts are batched as one process batches:
convs2s.serving.corpus, shard_lines).

    python -m benchmarks.batch_translate --checkpoint RUN/train/best \\
        --input ../shared/data/multi30k/train.en.gz --lines 20000 --precision bf16 \\
        --shortlist DATA/shortlist/KEY/shortlist.npz --rounds 2

Writes benchmarks/results/batch_translate_<precision>[_shortlist].json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from benchmarks.machine import load_average, machine_info, wait_for_quiet
from benchmarks.report import (RESULTS_DIR, add_result_args, add_search_args, format_table,
                               read_sentences, write_result)

RATE = re.compile(r"translated (\d+) lines in ([\d.]+) s")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batch_translate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--input", type=Path, required=True, help="text or .gz, one sentence a line")
    p.add_argument("--lines", type=int, default=20_000)
    add_search_args(p)
    p.add_argument("--actors", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--rounds", type=int, default=2)
    add_result_args(p)
    return p.parse_args(argv)


def _search_flags(args) -> list[str]:
    flags = ["--beam", str(args.beam), "--max-len-a", str(args.max_len_a), "--max-len-b",
             str(args.max_len_b), "--precision", args.precision]
    if args.shortlist:
        flags += ["--shortlist", str(args.shortlist), "--shortlist-frequent",
                  str(args.shortlist_frequent)]
    return flags


def _run(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall, proc.stderr


def single_process(args, src: Path, out: Path, env: dict) -> dict:
    wall, log = _run([sys.executable, "-m", "convs2s", "translate", "--checkpoint",
                      args.checkpoint, "--input", str(src), "--output", str(out),
                      *_search_flags(args)], env)
    n, secs = RATE.search(log).groups()
    return {"sentences_per_s": int(n) / float(secs), "translate_s": float(secs),
            "wall_s": wall, "lines": out.read_text().split("\n")[:-1]}


def ray_job(args, src: Path, out: Path, env: dict) -> dict:
    wall, _ = _run([sys.executable, "-m", "convs2s", "translate", "--checkpoint",
                    args.checkpoint, "--input", str(src), "--output", str(out), "--actors",
                    str(args.actors), "--no-progress", *_search_flags(args)], env)
    manifest = json.loads((out / "manifest.json").read_text())
    split = json.loads((out / "source" / "manifest.json").read_text())["seconds"]
    lines = "".join((out / p).read_text() for p in manifest["parts"]).split("\n")[:-1]
    # The actors' own rate: lines over the parts' search time shared by the actors (no Ray
    # start, actor start-up or model loading: what a corpus of millions of lines approaches)
    busy = sum(json.loads((out / p.replace(".txt", ".json")).read_text())["seconds"]
               for p in manifest["parts"])
    return {"sentences_per_s": manifest["sentences_per_s"], "translate_s": manifest["seconds"],
            "steady_sentences_per_s": len(lines) / (busy / args.actors),
            "split_s": split, "wall_s": wall, "lines": lines}


def main(argv=None) -> None:
    args = parse_args(argv)
    quiet = (wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet
             else {"quiet": None})
    load_before = load_average()
    lines = read_sentences(args.input, args.lines)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)  # the job starts its own local Ray, as on a workstation
    runs: dict[str, list[dict]] = {"one process": [], "ray data job": []}
    with tempfile.TemporaryDirectory(prefix="batch-translate-") as tmp:
        src = Path(tmp) / "input.en"
        src.write_text("\n".join(lines) + "\n")
        for r in range(args.rounds):
            order = ["one process", "ray data job"][:: 1 if r % 2 == 0 else -1]
            for name in order:
                out = Path(tmp) / f"{name.replace(' ', '_')}_{r}"
                res = single_process(args, src, out, env) if name == "one process" else \
                    ray_job(args, src, out, env)
                runs[name].append(res)
                print(f"round {r + 1}: {name}: {res['sentences_per_s']:.1f} sentences/s, "
                      f"wall {res['wall_s']:.1f} s", file=sys.stderr, flush=True)
    first = runs["one process"][0]["lines"]
    identical = {name: [sum(a == b for a, b in zip(first, run["lines"])) for run in rs]
                 for name, rs in runs.items()}
    base = median(r["sentences_per_s"] for r in runs["one process"])
    base_wall = median(r["wall_s"] for r in runs["one process"])
    rows = []
    for name, rs in runs.items():
        rate = median(r["sentences_per_s"] for r in rs)
        wall = median(r["wall_s"] for r in rs)
        rows.append({"layout": name if name == "one process" else
                     f"ray data job, {args.actors} actors x 1 thread",
                     "sentences_per_s": round(rate, 1),
                     "rounds": [round(r["sentences_per_s"], 1) for r in rs],
                     "speedup": round(rate / base, 2),
                     "wall_s": round(wall, 1), "wall_speedup": round(base_wall / wall, 2),
                     "split_s": round(median(r.get("split_s", 0) for r in rs), 2),
                     "steady_sentences_per_s": round(median(
                         r.get("steady_sentences_per_s", r["sentences_per_s"]) for r in rs), 1),
                     "identical_lines": identical[name], "lines": len(first)})
    for row in rows:
        row["steady_speedup"] = round(row["steady_sentences_per_s"] / base, 2)
    print(format_table(rows, [("layout", "layout"), ("sentences_per_s", "sentences/s"),
                              ("speedup", "x one process"),
                              ("steady_sentences_per_s", "actors' own rate"),
                              ("steady_speedup", "x"), ("wall_s", "wall s"),
                              ("wall_speedup", "wall x"), ("identical_lines", "identical")]))
    name = f"batch_translate_{args.precision}{'_shortlist' if args.shortlist else ''}.json"
    path = write_result(
        args.out or RESULTS_DIR / name, "batch_translate",
        {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        machine_info(), load_before, load_average(), quiet, {"rows": rows},
        notes=["one process: its own log's rate (translation only); the job: its manifest's "
               "(Ray's and the actors' start-up and model loading included); the actors' own "
               "rate: lines over the parts' search time divided among the actors; wall: the "
               "whole command"],
        replace=args.replace)
    print(path)


if __name__ == "__main__":
    main()
