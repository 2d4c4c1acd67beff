"""The lexical table's stage at scale (vocabulary selection, `preprocessing/lexical.py`): its
(source, target) pair counts through the pipeline's spill-file exchange (the default) against
Ray Data's groupby, on the same encoded split: time, peak memory, the rows that go through the
exchange, and whether the two tables are the same.

1. Real text: the pair rows a sentence pair gives (distinct within its block) on newstest
   2012-2014 En-Fr, BPE-encoded with a joint BPE learned on it, for blocks of several sizes
   (what the exchange is sized by, `preprocessing.lexical.PAIR_ROWS_PER_SENTENCE`, is between
   these and the synthetic split's).
2. Scale: a synthetic encoded split of --pairs pairs, in parts of --part-rows rows as the encoded
   stage writes them: the lengths drawn from part 1's encoded sentences, the ids from a Zipf law
   over the vocabulary, the target ids shifted from the source ids with noise, so that some pairs
   recur as translations do. `build_table` runs each way (--ways) on a fresh local Ray of
   --cpus CPUs while a thread samples the memory of the whole process tree
   (benchmarks/memory.py).

    python -m benchmarks.shortlist_table --pairs 200000            # the recorded run
    python -m benchmarks.shortlist_table --pairs 5000 --ways files  # quick check

Writes benchmarks/results/shortlist_table.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from benchmarks.corpus import DATA_DIR, encode, read_pairs, train_joint_bpe
from benchmarks.machine import load_average, machine_info, wait_for_quiet
from benchmarks.memory import MemorySampler
from benchmarks.report import RESULTS_DIR, format_table, write_result
from preprocessing.encoding import ENCODED_SCHEMA
from preprocessing.lexical import N_SPECIAL, TABLE_FILE, build_table, pair_counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.shortlist_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=200_000, help="pairs of the synthetic split")
    p.add_argument("--part-rows", type=int, default=50_000,
                   help="rows per part (PreprocessConfig.block_rows' default)")
    p.add_argument("--vocab", type=int, default=40_000, help="the model's joint vocabulary")
    p.add_argument("--bpe-vocab", type=int, default=16_000,
                   help="the BPE learned on newstest (part 1)")
    p.add_argument("--k", type=int, default=60, help="candidates per source token")
    p.add_argument("--ways", nargs="+", choices=["files", "ray"], default=["files", "ray"])
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--data", type=Path, default=DATA_DIR, help="the small real corpora")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-load", type=float, default=1.5)
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--replace", action="store_true", help="overwrite an existing --out")
    return p.parse_args(argv)


def real_rows_per_sentence(args, workdir: Path) -> tuple[dict, list, list]:
    """Part 1: {block size: pair rows a sentence pair}, and the encoded sentences."""
    pairs = read_pairs(args.data / "wmt14-en-fr", ["newstest2012", "newstest2013",
                                                   "newstest2014"], "en", "fr")
    sp = train_joint_bpe(pairs, args.bpe_vocab, workdir)
    src, tgt = encode(sp, [s for s, _ in pairs]), encode(sp, [t for _, t in pairs])
    out = {}
    for size in (s for s in (100, 1000, 3000, 9000) if s <= len(src)):
        rows = sentences = 0
        for a in range(0, len(src) - size + 1, size):
            block = pa.table({"id": list(range(a, a + size)), "src": src[a:a + size],
                              "tgt": tgt[a:a + size]})
            rows += sum(t.num_rows for t in pair_counts(block, 1, 1))
            sentences += size
        out[size] = round(rows / sentences, 1)
    return out, src, tgt


def synthetic_split(args, src: list, tgt: list, folder: Path) -> float:
    """Part 2's encoded split in `folder` (part-*.parquet); returns its pair rows a sentence
    pair in the first part's blocks."""
    rng = np.random.default_rng(args.seed)
    ids = np.arange(N_SPECIAL, args.vocab)
    zipf = 1.0 / (ids - N_SPECIAL + 10.0)
    zipf /= zipf.sum()
    src_len = np.array([len(s) for s in src])
    tgt_len = np.array([len(t) for t in tgt])
    folder.mkdir(parents=True)
    for part, a in enumerate(range(0, args.pairs, args.part_rows)):
        n = min(args.part_rows, args.pairs - a)
        which = rng.integers(0, len(src_len), n)
        ls, lt = src_len[which], tgt_len[which]
        s_tok = rng.choice(ids, size=int(ls.sum()), p=zipf).astype(np.int32)
        # a target token is one of its sentence's source tokens shifted (a "translation") two
        # times in three, else a draw of its own
        sent = np.repeat(np.arange(n), lt)
        pick = (np.cumsum(ls) - ls)[sent] + (rng.random(len(sent)) * ls[sent]).astype(np.int64)
        shifted = np.maximum((s_tok[pick] + 7) % args.vocab, N_SPECIAL)
        own = rng.choice(ids, size=len(sent), p=zipf)
        t_tok = np.where(rng.random(len(sent)) < 2 / 3, shifted, own).astype(np.int32)
        s_list = [x.tolist() for x in np.split(s_tok, np.cumsum(ls)[:-1])]
        t_list = [x.tolist() for x in np.split(t_tok, np.cumsum(lt)[:-1])]
        table = pa.table({"id": np.arange(a, a + n, dtype=np.int64),
                          "src": pa.array(s_list, pa.list_(pa.int32())),
                          "tgt": pa.array(t_list, pa.list_(pa.int32())),
                          "src_len": ls.astype(np.int32), "tgt_len": lt.astype(np.int32)},
                         schema=ENCODED_SCHEMA)
        pq.write_table(table, folder / f"part-{part:06d}.parquet")
        if part == 0:
            first = sum(t.num_rows for t in pair_counts(table.select(["id", "src", "tgt"]), 1,
                                                        1)) / n
    return round(first, 1)


def run_way(args, way: str, encoded: Path, spm: Path, out_dir: Path) -> dict:
    """build_table one way on a fresh local Ray, its memory sampled."""
    ray.init(num_cpus=args.cpus, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        out_dir.mkdir(parents=True)
        with MemorySampler(disk_path=str(out_dir)) as mem:
            t0 = time.monotonic()
            meta = build_table(encoded, spm, args.vocab, args.k, sample_pairs=args.pairs,
                               rows=args.pairs, out_dir=out_dir, exchange=way)
            seconds = time.monotonic() - t0
    finally:
        ray.shutdown()
    with np.load(out_dir / TABLE_FILE, allow_pickle=False) as z:
        table = z["table"]
    return {"way": way, "seconds": round(seconds, 1), "memory_mib": mem.peaks_mib(),
            "disk_growth_peak_mib": mem.disk_growth_mib(),
            "largest_processes_mib": mem.largest_processes_mib(), "manifest": meta,
            "table": table}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.pairs < 1 or args.part_rows < 1:
        raise SystemExit("--pairs and --part-rows must be at least 1")
    args.ways = list(dict.fromkeys(args.ways))  # each way once
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        real, src, tgt = real_rows_per_sentence(args, work)
        synthetic = synthetic_split(args, src, tgt, work / "encoded")
        spm = work / "spm.model"
        spm.write_bytes(b"stands in for a sentencepiece model: only its digest is read")
        quiet = wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet else {}
        load_before = load_average()
        runs = [run_way(args, w, work / "encoded", spm, work / f"table-{w}") for w in args.ways]
        load_after = load_average()
    same = all(np.array_equal(r["table"], runs[0]["table"]) for r in runs[1:])
    rows = [{k: v for k, v in r.items() if k != "table"} for r in runs]
    results = {"real_rows_per_sentence_by_block": real,
               "synthetic_rows_per_sentence_first_part": synthetic,
               "pairs": args.pairs, "runs": rows, "same_table": same if len(runs) > 1 else None}
    notes = []
    if max(load_before[:1] + load_after[:1]) > args.max_load:
        notes.append(f"measured under load (1-minute load average {load_before[:1]} before, "
                     f"{load_after[:1]} after)")
    path = write_result(args.out or RESULTS_DIR / "shortlist_table.json", "shortlist_table",
                        {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                        machine_info(), load_before, load_after, quiet, results, notes,
                        replace=args.replace)
    print(f"pair rows a sentence pair, newstest En-Fr (BPE {args.bpe_vocab:,}), by block size: "
          f"{real}; the synthetic split's first part: {synthetic}")
    print(format_table([{
        "way": r["way"], "s": r["seconds"],
        "peak total PSS MiB": round(r["memory_mib"]["total_pss"]),
        "pair rows": r["manifest"].get("pair_rows", "-"),
        "buckets": r["manifest"]["pair_buckets"]} for r in rows],
        [(k, k) for k in ("way", "s", "peak total PSS MiB", "pair rows", "buckets")]))
    print(f"same table both ways: {results['same_table']}; result: {path}")
    return results


if __name__ == "__main__":
    main()
