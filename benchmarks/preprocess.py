"""Preprocessing throughput and memory: pairs per second through clean + encode + batch with
Ray Data on all CPUs, against the same stage functions in one plain process, and peak memory
(driver and Ray workers) at two corpus sizes, to show that memory does not grow with the corpus.

The corpus is the synthetic demo corpus (`preprocessing.demo`), written once (and cached under
--workdir) as parquet laid out like the hub's `wmt/wmt14` (`fr-en/train-*.parquet`, rows
`{"translation": {"en", "fr"}}`), so the pipeline reads it the way it reads the real hub data:
one Ray task per row group. Generating the corpus is not timed (files are cached).

- Ray: `preprocessing.pipeline.run_pipeline` (the production entry) on a fresh local Ray of
  --cpus CPUs per size; the rate counts the clean, encoded and batches stages (seconds from
  their manifests); the BPE stage (a bounded sample, same cost at any size) is reported apart.
  Before the timer starts, Ray's worker processes are started and import what the pipeline's
  tasks import (ray.data, pyarrow, preprocessing: about 1.5 s of CPU per worker), as the plain
  process has imported it before its timer starts; that warm-up is reported apart
  (`ray_warmup_s`, and `pairs_per_s_incl_warmup` with it counted).
- Plain: the same functions (`clean_and_write`, the encoding class `Encoder`,
  `add_window` + `batch_window`) called in a loop in this process, reading and writing the
  same parquet parts, with the Ray run's BPE model; its batches are checked against Ray's.
- Memory (benchmarks/memory.py): a thread samples the process tree every 0.5 s: the driver's
  RSS, the proportional set size (PSS: shared object-store pages counted once) of Ray's worker
  processes (`ray::*`) and of everything together (driver, workers, raylet, GCS, ...); peaks
  overall and per stage (from the pipeline's `[stage] running` / `done` log lines).

    python -m benchmarks.preprocess --sizes 250000 1000000            # the recorded run
    python -m benchmarks.preprocess --sizes 20000 40000 --plain-rows 20000   # quick check

Writes benchmarks/results/preprocess.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import ray.data

from benchmarks.machine import load_average, machine_info, wait_for_quiet
from benchmarks.memory import MemorySampler, StageClock
from benchmarks.report import RESULTS_DIR, format_table, write_result
from preprocessing import demo
from preprocessing.batching import BATCH_SCHEMA, add_window, batch_stats, batch_window
from preprocessing.cleaning import CLEAN_SCHEMA, clean_block, clean_stats
from preprocessing.config import demo as demo_config
from preprocessing.encoding import ENCODED_SCHEMA, Encoder, SentencePieceVocabulary, encoded_stats
from preprocessing.parts import PartSink
from preprocessing.pipeline import run_pipeline
from preprocessing.stages import execution_settings

CHUNK_ROWS = 50_000  # rows per corpus file (one generating process each)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.preprocess",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000],
                   help="corpus sizes in pairs (Ray runs, one fresh Ray each)")
    p.add_argument("--plain-rows", type=int, default=0,
                   help="size of the single-process run (0: the smallest of --sizes)")
    p.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs given to Ray")
    p.add_argument("--encode-tasks", type=int, default=0,
                   help="encoding tasks at once (0: the pipeline's default, one per CPU)")
    p.add_argument("--block-rows", type=int, default=25_000,
                   help="rows per block / parquet row group")
    p.add_argument("--shuffle-window", type=int, default=50_000,
                   help="rows per length-sorting window of the batches stage")
    p.add_argument("--exchange", choices=["files", "ray"], default="files",
                   help="how windows gather rows (preprocessing/exchange.py)")
    p.add_argument("--object-store-mb", type=int, default=0,
                   help="Ray object store size (0: Ray's default)")
    p.add_argument("--no-isolate", dest="isolate", action="store_false",
                   help="run in this process (a Ray already started here is used as is)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/convs2s-bench-preprocess"),
                   help="corpus cache and stage outputs (deleted after each run, corpus kept)")
    p.add_argument("--max-load", type=float, default=1.5,
                   help="wait until the 1-minute load average is below this ...")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="... for at most this long (0: do not wait)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="result JSON path")
    p.add_argument("--replace", action="store_true",
                   help="overwrite the result file if it exists (default: keep it and write "
                        "<name>-<time>.json beside it)")
    args = p.parse_args(argv)
    args.plain_rows = args.plain_rows or min(args.sizes)
    return args


# --- the corpus: demo pairs as hub-shaped parquet --------------------------------------------


def _write_chunk(job: tuple) -> None:
    path, seed, start, count, group_rows = job
    pairs = demo.translation_pairs(seed, start, count)
    table = pa.table({"translation": pa.StructArray.from_arrays(
        [pa.array([s for s, _ in pairs]), pa.array([t for _, t in pairs])], names=["en", "fr"])})
    pq.write_table(table, f"{path}.tmp", row_group_size=group_rows, compression="zstd")
    os.replace(f"{path}.tmp", path)


OWNER_MARK = ".convs2s-bench-preprocess"  # in every folder this benchmark made: it may remove it


def fresh_dir(folder: Path) -> Path:
    """`folder` emptied for this benchmark: removed first only when this benchmark made it
    (its OWNER_MARK file); a folder without the mark is someone else's and is refused."""
    remove_own(folder)
    folder.mkdir(parents=True)
    (folder / OWNER_MARK).write_text("made by benchmarks/preprocess.py; removed by its next run\n")
    return folder


def remove_own(folder: Path) -> None:
    """Remove `folder` when this benchmark made it; refuse (SystemExit) when it did not."""
    if not folder.exists():
        return
    if not (folder / OWNER_MARK).is_file():
        raise SystemExit(f"{folder} exists and was not made by this benchmark (no {OWNER_MARK} "
                         "in it): give another --workdir, or move it away yourself")
    shutil.rmtree(folder)


def make_corpus(n: int, workdir: Path, seed: int, group_rows: int) -> Path:
    """`<workdir>/corpus-<n>/fr-en/train-*.parquet` holding demo pairs 0..n-1.

    Files of CHUNK_ROWS pairs are generated once into a cache keyed by the demo's DEMO_VERSION,
    the seed and the row-group size, and hard-linked into each corpus: the smaller corpus is a
    prefix of the larger one, and a rerun generates nothing.
    """
    cache = workdir / f"chunks-demo{demo.DEMO_VERSION}-seed{seed}-g{group_rows}"
    cache.mkdir(parents=True, exist_ok=True)
    spans = [(a, min(CHUNK_ROWS, n - a)) for a in range(0, n, CHUNK_ROWS)]
    chunk = lambda a, c: cache / f"pairs-{a:010d}-{c}.parquet"  # noqa: E731
    jobs = [(str(chunk(a, c)), seed, a, c, group_rows) for a, c in spans
            if not chunk(a, c).is_file()]
    if jobs:
        t0 = time.monotonic()
        with multiprocessing.get_context("spawn").Pool(os.cpu_count()) as pool:
            pool.map(_write_chunk, jobs)
        print(f"{sum(j[3] for j in jobs):,} demo pairs generated in {time.monotonic() - t0:.0f} "
              f"s into {cache}", flush=True)
    folder = fresh_dir(workdir / f"corpus-{n}")
    (folder / "fr-en").mkdir(parents=True)
    for i, (a, c) in enumerate(spans):
        os.link(chunk(a, c), folder / "fr-en" / f"train-{i:05d}-of-{len(spans):05d}.parquet")
    return folder


# --- the two ways of running the stages --------------------------------------------------------


def pipeline_config(args, n: int, corpus: Path, root: Path):
    return demo_config().replace(
        task=f"bench_{n}", source=str(corpus), hub_config="fr-en", splits={"train": "train"},
        root=str(root), block_rows=args.block_rows, shuffle_window=args.shuffle_window,
        encode_tasks=args.encode_tasks, seed=args.seed, exchange=args.exchange)


def _warm_worker(row: dict) -> dict:
    import preprocessing.batching  # noqa: F401 - the modules the pipeline's tasks import
    import preprocessing.cleaning  # noqa: F401
    import preprocessing.encoding  # noqa: F401
    import preprocessing.sources  # noqa: F401

    time.sleep(0.5)  # hold this worker, so that each task starts its own worker process
    return {"pid": os.getpid()}


def warm_up_ray(cpus: int) -> float:
    """Seconds to start `cpus` Ray worker processes and import the pipeline's modules in them
    (one Ray Data task each, no data)."""
    from benchmarks.preprocess import _warm_worker as warm  # by module name, even from __main__

    t0 = time.monotonic()
    execution_settings(ray.data.range(cpus, override_num_blocks=cpus).map(warm)).take_all()
    return time.monotonic() - t0


def run_ray(args, n: int, corpus: Path) -> tuple[dict, Path]:
    """The production pipeline on a fresh local Ray: stage seconds, counts, memory peaks."""
    root = fresh_dir(args.workdir / f"ray-{n}")
    cfg = pipeline_config(args, n, corpus, root)
    init = {"num_cpus": args.cpus, "include_dashboard": False, "configure_logging": False,
            "log_to_driver": False}
    if args.object_store_mb:
        init["object_store_memory"] = args.object_store_mb * 2**20
    owned = not ray.is_initialized()  # tests pass their session's Ray: used, not restarted
    if owned:
        ray.init(**init)
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # no per-stage progress dumps
    try:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        warmup = warm_up_ray(cpus)
        with MemorySampler(disk_path=str(args.workdir)) as mem, StageClock(mem):
            t0 = time.monotonic()
            out = run_pipeline(cfg)
            wall = time.monotonic() - t0
        spilled = object_store_spilled_mib()
    finally:
        if owned:
            ray.shutdown()
    m = out.manifests
    stages = {s: m[f"{s}/train"]["seconds"] for s in ("clean", "encoded", "batches")}
    seconds = sum(stages.values())
    return {"mode": "ray", "cpus": cpus, "pairs": n, "stage_seconds": stages,
            "spm_seconds": m["spm"]["seconds"], "seconds": seconds, "pipeline_wall_s": wall,
            "pairs_per_s": n / seconds, "ray_warmup_s": warmup,
            "pairs_per_s_incl_warmup": n / (seconds + warmup),
            "rows_kept": m["batches/train"]["rows_kept"],
            "batches": m["batches/train"]["batches"], "memory_mib": mem.peaks_mib(),
            "stage_memory_mib": mem.stage_peaks_mib(),
            "largest_processes_mib": mem.largest_processes_mib(),
            "object_store_spilled_mib": spilled, "disk_growth_peak_mib": mem.disk_growth_mib(),
            "output_mib": {s: folder_mib(Path(out.root) / s) for s in
                           ("clean", "encoded", "batches")},
            "rows": {k: {f: v.get(f) for f in ("rows_in", "rows_kept", "dropped")}
                     for k, v in m.items() if "rows_in" in v},
            # same input and seed -> the same digest, whatever the run (compare across runs)
            "batches_sha256": folder_digest(Path(out.batches["train"]))}, root


def folder_digest(folder: Path) -> str:
    """sha256 over the part files' names and bytes, in name order."""
    h = hashlib.sha256()
    for part in sorted(folder.glob("part-*.parquet")):
        h.update(part.name.encode())
        with open(part, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def folder_mib(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20, 1)


def object_store_spilled_mib() -> float | None:
    """MiB Ray spilled from the object store to disk so far (its memory summary), if known."""
    import re

    from ray._private.internal_api import memory_summary

    try:
        text = memory_summary(stats_only=True)
    except Exception:  # noqa: BLE001 - a figure we report, not one the run depends on
        return None
    found = re.search(r"Spilled (\d+) MiB", text)
    return float(found.group(1)) if found else 0.0


def _plain_clean(corpus: Path, out_dir: Path, cfg) -> None:
    opts = {"src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang, "row_shape": cfg.row_shape,
            "max_len": cfg.max_len, "max_len_ratio": cfg.max_len_ratio,
            "max_line_bytes": cfg.max_line_bytes}
    first = 0
    for f in sorted((corpus / "fr-en").glob("train-*.parquet")):
        pf = pq.ParquetFile(f)
        # one block per row group (the Ray reader joins consecutive groups of a file into
        # blocks of at least block_rows rows: the same rows, in as many or fewer parts)
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g, columns=["translation"])
            t = t.add_column(0, "id", pa.array(np.arange(first, first + t.num_rows)))
            t = t.append_column("error", pa.nulls(t.num_rows, pa.string()))
            _plain_sink(clean_block(t, **opts), out_dir, "part", CLEAN_SCHEMA, clean_stats)
            first += t.num_rows


def _plain_sink(table: pa.Table, out_dir: Path, key: str, schema, stats_fn, digits=12) -> dict:
    """What the pipeline's write operator does with one block, in this process."""
    sink = PartSink(str(out_dir), part_key=key, schema=schema, stats_fn=stats_fn,
                    key_digits=digits)
    return sink.write([table], None)["stats"]


def _plain_encode(clean_dir: Path, out_dir: Path, spm_model: str) -> None:
    encoder = Encoder(SentencePieceVocabulary(spm_model))
    for f in sorted(clean_dir.glob("part-*.parquet")):
        _plain_sink(encoder(pq.read_table(f, columns=["id", "src", "tgt"])), out_dir, "part",
                    ENCODED_SCHEMA, encoded_stats)


def _plain_batches(encoded_dir: Path, out_dir: Path, cfg) -> tuple[int, int]:
    """All encoded rows in memory, grouped by window (the pipeline shuffles them instead)."""
    table = pa.concat_tables(pq.read_table(f) for f in sorted(encoded_dir.glob("part-*.parquet")))
    n_windows = max(1, -(-table.num_rows // cfg.shuffle_window))
    table = add_window(table, n_windows=n_windows, seed=cfg.seed)
    table = table.take(np.argsort(table["window"].to_numpy(), kind="stable"))
    windows = table["window"].to_numpy()
    cuts = np.flatnonzero(np.diff(windows)) + 1
    n_batches = kept = 0
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(windows)]):
        rows = batch_window(table.slice(a, b - a), max_tokens=cfg.max_tokens,
                            max_sentences=cfg.max_sentences, seed=cfg.seed)
        stats = _plain_sink(rows, out_dir, "window", BATCH_SCHEMA, batch_stats, 6)
        n_batches += stats["batches"]
        kept += stats["rows_kept"]
    return n_batches, kept


def run_plain(args, n: int, corpus: Path, spm_model: str) -> dict:
    """The same stage functions in a loop in this process (no Ray), same parquet in and out."""
    cfg = pipeline_config(args, n, corpus, args.workdir / "plain")
    work = fresh_dir(args.workdir / f"plain-{n}")
    dirs = {s: work / s for s in ("clean", "encoded", "batches")}
    for d in dirs.values():
        d.mkdir(parents=True)
    stages = {}
    steps = [("clean", lambda: _plain_clean(corpus, dirs["clean"], cfg)),
             ("encoded", lambda: _plain_encode(dirs["clean"], dirs["encoded"], spm_model)),
             ("batches", lambda: _plain_batches(dirs["encoded"], dirs["batches"], cfg))]
    with MemorySampler() as mem:
        for name, fn in steps:
            mem.mark(f"{name}/train", "running")
            t0 = time.monotonic()
            result = fn()
            stages[name] = time.monotonic() - t0
            mem.mark(f"{name}/train", "done")
    n_batches, kept = result
    seconds = sum(stages.values())
    return {"mode": "plain", "cpus": 1, "pairs": n, "stage_seconds": stages, "seconds": seconds,
            "pairs_per_s": n / seconds, "rows_kept": kept, "batches": n_batches,
            "memory_mib": mem.peaks_mib(), "stage_memory_mib": mem.stage_peaks_mib(),
            "_batches_dir": str(dirs["batches"])}


def same_batches(ray_dir: Path, plain_dir: Path) -> bool:
    """Byte-identical batch shards (the pipeline is deterministic in ids and seed)."""
    a = sorted(p.name for p in ray_dir.glob("part-*.parquet"))
    b = sorted(p.name for p in plain_dir.glob("part-*.parquet"))
    return a == b and all((ray_dir / x).read_bytes() == (plain_dir / x).read_bytes() for x in a)


def _call(isolate: bool, fn, *fn_args):
    """fn(*fn_args), in a fresh spawned process when `isolate`: each measurement starts from a
    clean driver (Python keeps freed memory, so a run would inherit the previous one's peak)."""
    if not isolate:
        return fn(*fn_args)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *fn_args).result()


def run(args: argparse.Namespace) -> dict:
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    args.workdir.mkdir(parents=True, exist_ok=True)
    sizes = sorted(set(args.sizes) | {args.plain_rows})
    corpora = {n: make_corpus(n, args.workdir, args.seed, args.block_rows) for n in sizes}
    quiet = wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet else {}
    load_before = load_average()
    runs, kept_root, kept_data = [], None, None
    for n in sizes:  # Ray runs first, smallest first; the plain run last
        result, root = _call(args.isolate, run_ray, args, n, corpora[n])
        if n in args.sizes:
            runs.append(result)
        if n == args.plain_rows:
            kept_root = root  # its BPE model and batches serve the plain run
            (kept_data,) = (root / f"bench_{n}").iterdir()  # the one <data key> folder
        else:
            remove_own(root)
    n = args.plain_rows
    plain = _call(args.isolate, run_plain, args, n, corpora[n],
                  str(kept_data / "spm" / "spm.model"))
    (kept_batches,) = (kept_data / "batches").glob("*/train")  # its one batch cut
    plain["same_batches_as_ray"] = same_batches(kept_batches, Path(plain.pop("_batches_dir")))
    runs.append(plain)
    remove_own(args.workdir / f"plain-{n}")
    remove_own(kept_root)
    load_after = load_average()
    ray_runs = {r["pairs"]: r for r in runs if r["mode"] == "ray"}
    small, large = ray_runs[min(args.sizes)], ray_runs[max(args.sizes)]
    growth = lambda key: large["memory_mib"][key] / small["memory_mib"][key]  # noqa: E731
    results = {
        "runs": runs,
        "speedup_ray_vs_plain": (ray_runs[n]["pairs_per_s"] / plain["pairs_per_s"]
                                 if n in ray_runs else None),
        "speedup_ray_vs_plain_incl_warmup": (
            ray_runs[n]["pairs_per_s_incl_warmup"] / plain["pairs_per_s"]
            if n in ray_runs else None),
        "memory_growth_total_pss": growth("total_pss"),
        "memory_growth_workers_pss": growth("workers_pss"),
        "memory_growth_driver_rss": growth("driver_rss"),
        "memory_growth_by_stage_total_pss": {
            st: large["stage_memory_mib"][st]["total_pss"] / v["total_pss"]
            for st, v in small["stage_memory_mib"].items() if st in large["stage_memory_mib"]},
        "settings_note": "demo preset: vocab 1000, max_tokens 2000; sizes in pairs",
    }
    return {"machine": machine_info(), "load_before": load_before, "load_after": load_after,
            "quiet": quiet, "results": results}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = run(args)
    r = out["results"]
    path = args.out or RESULTS_DIR / "preprocess.json"
    notes = []
    load = out["load_before"][:1] + out["load_after"][:1]
    if load and max(load) > args.max_load:
        notes.append(f"measured under load (1-minute load average {load}): figures are low")
    path = write_result(path, "preprocess", {k: str(v) if isinstance(v, Path) else v
                                      for k, v in vars(args).items()},
                 out["machine"], out["load_before"], out["load_after"], out["quiet"], r, notes,
                 replace=args.replace)
    rows = [{**x, **x["memory_mib"], "clean s": x["stage_seconds"]["clean"],
             "encode s": x["stage_seconds"]["encoded"], "batch s": x["stage_seconds"]["batches"]}
            for x in r["runs"]]
    print(format_table(rows, [("mode", "mode"), ("cpus", "CPUs"), ("pairs", "pairs"),
                              ("clean s", "clean s"), ("encode s", "encode s"),
                              ("batch s", "batch s"), ("pairs_per_s", "pairs/s"),
                              ("driver_rss", "driver MiB"), ("workers_pss", "workers MiB"),
                              ("total_pss", "total MiB")]))
    stages = ["clean/train", "spm", "encoded/train", "batches/train"]
    print("peak total PSS per stage, MiB: " + ", ".join(stages))
    for x in r["runs"]:
        per = x.get("stage_memory_mib", {})
        print(f"  {x['mode']:>5} {x['pairs']:>9,}: " + "  ".join(
            f"{per[st]['total_pss']:>7,.0f}" if st in per else f"{'-':>7}" for st in stages))
    if r["speedup_ray_vs_plain"]:
        print(f"Ray Data vs one process: {r['speedup_ray_vs_plain']:.2f}x "
              f"({r['speedup_ray_vs_plain_incl_warmup']:.2f}x counting the worker warm-up, "
              + ", ".join(f"{x['ray_warmup_s']:.1f}" for x in r["runs"] if x["mode"] == "ray")
              + " s)")
    print(f"peak memory, largest / smallest corpus: total {r['memory_growth_total_pss']:.2f}x, "
          f"driver {r['memory_growth_driver_rss']:.2f}x   load "
          f"{'/'.join(f'{x:g}' for x in load)}  result: {path}")
    return out


if __name__ == "__main__":
    main()
