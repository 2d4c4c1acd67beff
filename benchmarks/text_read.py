"""How a large line-aligned text pair is read: the cleaning stage (read + clean + write parts)
of `--data DIR` text (`train.en` + `train.fr`, uncompressed) with one read task streaming
both files, against a task per block of lines from byte offsets found by one pass on the
driver (`preprocessing.reading.line_index`), in alternated rounds on one Ray.

    python -m benchmarks.text_read --pairs 1000000 --rounds 2

The text is the demo grammar's pairs (short sentences). Both ways give the same rows (tests/
test_sources.py, tests/test_preprocessing_pipeline.py); the time is what differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, write_result


def write_pair(folder: Path, pairs: int, seed: int) -> None:
    from preprocessing import demo

    with open(folder / "train.en", "w") as en, open(folder / "train.fr", "w") as fr:
        for a in range(0, pairs, 100_000):
            for s, t in demo.translation_pairs(seed, a, min(100_000, pairs - a)):
                en.write(s + "\n")
                fr.write(t + "\n")


def clean_once(data: Path, out: Path, indexed: bool, block_rows: int) -> dict:
    from preprocessing import reading
    from preprocessing.config import PreprocessConfig
    from preprocessing.pipeline import _clean
    from preprocessing.sources import resolve_split

    cfg = PreprocessConfig(task="bench_text", source=str(data), splits={"train": "train"},
                           block_rows=block_rows)
    keep = reading.INDEX_BYTES
    reading.INDEX_BYTES = 0 if indexed else 1 << 62
    try:
        t0 = time.perf_counter()
        src = resolve_split(cfg, "train")
        t1 = time.perf_counter()
        tasks = len(reading.SplitDatasource(src, cfg).get_read_tasks(1))
        t2 = time.perf_counter()
        out.mkdir(parents=True)
        m = _clean(cfg, "train", src, out)
        t3 = time.perf_counter()
    finally:
        reading.INDEX_BYTES = keep
    parts = len(list(out.glob("part-*.parquet")))
    return {"indexed": indexed, "read_tasks": tasks, "resolve_s": round(t1 - t0, 3),
            "index_s": round(t2 - t1, 3), "clean_stage_s": round(t3 - t2, 3),
            "total_s": round(t3 - t0, 3), "rows_in": m["rows_in"], "rows_kept": m["rows_kept"],
            "parts": parts}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.text_read", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cpus", type=int, default=os.cpu_count())
    p.add_argument("--block-rows", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS_DIR / "text_read.json"))
    p.add_argument("--replace", action="store_true")
    args = p.parse_args(argv)

    import ray

    load_before = load_average()
    work = Path(tempfile.mkdtemp(prefix="convs2s-bench-text-read-"))
    try:
        data = work / "data"
        data.mkdir()
        write_pair(data, args.pairs, args.seed)
        size = sum(f.stat().st_size for f in data.iterdir())
        ray.init(num_cpus=args.cpus, log_to_driver=False, include_dashboard=False,
                 configure_logging=False)
        runs = []
        for r in range(args.rounds):
            for indexed in ((False, True) if r % 2 == 0 else (True, False)):
                run = clean_once(data, work / f"out-{r}-{int(indexed)}", indexed,
                                 args.block_rows)
                runs.append({"round": r + 1, **run})
                print(f"round {r + 1} {'indexed' if indexed else 'one task'}: "
                      f"{run['read_tasks']} read task(s), index {run['index_s']:.2f} s, "
                      f"clean stage {run['clean_stage_s']:.2f} s, {run['parts']} parts, "
                      f"{run['rows_kept']:,} rows kept")
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    if len({(r["rows_in"], r["rows_kept"]) for r in runs}) != 1:  # the same work, both ways
        raise RuntimeError(f"the two ways read other rows: {runs}")
    # (the clean stage builds its read tasks, the index pass included; index_s is that pass
    # timed apart, once more)
    one = [r["clean_stage_s"] for r in runs if not r["indexed"]]
    many = [r["clean_stage_s"] for r in runs if r["indexed"]]
    ratio = sum(one) / sum(many)
    print(f"one task / indexed, the clean stage (the index pass in it): {ratio:.2f}x")
    path = write_result(args.out, "text_read",
                        {"pairs": args.pairs, "bytes": size, "cpus": args.cpus,
                         "block_rows": args.block_rows, "rounds": args.rounds},
                        machine_info(), load_before, load_average(), {},
                        {"runs": runs, "one_task_over_indexed": round(ratio, 3)},
                        notes=["the cleaning stage of a text pair (read, clean, write parts); "
                               "index_s: the driver's pass finding the blocks' byte offsets"],
                        replace=args.replace)
    print(f"result: {path}")


if __name__ == "__main__":
    main()
