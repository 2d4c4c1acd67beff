"""What the batches stage's exchange asks of a bucket: the requests and the time of
`preprocessing.exchange.group_by` ("files": each block spilled as one file, each key's rows
gathered from every file) with its spill folder in a bucket on the S3-protocol server on
loopback (benchmarks/s3_server.py), counted by moto's request recorder.

    python -m benchmarks.exchange --rows 200000 --blocks 40 --keys 20

The rows are encoded-shaped (an id, a key, two lists of token ids); every block holds rows of
every key, as a split's blocks do of every shuffle window. The server is moto's, in memory on
this machine: the counts are the protocol's and do not depend on it; the times add no network
latency per request, which a cloud bucket does (tens of ms a request), so there the count is
what sets the stage's time.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, write_result


def rows_of(group: pa.Table) -> pa.Table:
    """The gather's work here: the rows of one key, counted (a window's batching, without its
    cost: the requests are what is measured)."""
    return pa.table({"rows": pa.array([group.num_rows], pa.int64()),
                     "ids": pa.array([int(np.sum(group["id"].to_numpy()))], pa.int64())})


def blocks(rows: int, n_blocks: int, n_keys: int, seed: int) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    per = -(-rows // n_blocks)
    out = []
    for b in range(n_blocks):
        ids = np.arange(b * per, min(rows, (b + 1) * per), dtype=np.int64)
        lengths = rng.integers(8, 40, size=(2, len(ids)))
        lists = [pa.array([rng.integers(4, 40000, n).astype(np.int32) for n in side],
                          pa.list_(pa.int32())) for side in lengths]
        out.append(pa.table({"id": ids, "window": rng.integers(0, n_keys, len(ids)),
                             "src_ids": lists[0], "tgt_ids": lists[1]}))
    return out


def one_round(server, bucket: str, tables: list[pa.Table], n_keys: int, tag: str) -> dict:
    """The exchange of `tables` by their `window` column through s3://`bucket`/exchange-`tag`
    on `server` (a LoopbackS3): the requests made on that folder, by method, and the times."""
    import ray

    from preprocessing.exchange import group_by
    from storage import location

    ds = ray.data.from_arrow(tables)
    folder = f"{bucket}/exchange-{tag}"
    with server.recorded() as requests:
        t0 = time.perf_counter()
        out, scattered = group_by(ds, key="window", n_keys=n_keys, fn=rows_of, fn_kwargs={},
                                  how="files", spill_dir=location(f"s3://{folder}"), label=tag)
        t1 = time.perf_counter()
        total = pa.concat_tables(ray.get(out.to_arrow_refs()))
        t2 = time.perf_counter()
    # (by the URL decoded: a listing names the folder as its prefix= parameter, %2F-quoted)
    log = [r for r in requests if folder in unquote(r["url"])]
    if int(pa.compute.sum(total["rows"]).as_py()) != scattered:
        raise RuntimeError(f"{tag}: gathered {total['rows']} rows, scattered {scattered}")
    ids = sum(int(t["id"].to_numpy().sum()) for t in tables)
    if int(pa.compute.sum(total["ids"]).as_py()) != ids:
        raise RuntimeError(f"{tag}: the gathered rows are not the scattered ones")
    by = Counter(f"{r['method']} " + ("list" if "list-type=" in r["url"] else "object")
                 for r in log)
    reads = sum(v for k, v in by.items() if k.split()[0] in ("GET", "HEAD"))
    return {"scatter_s": round(t1 - t0, 3), "gather_s": round(t2 - t1, 3),
            "requests": sum(by.values()), "read_requests": reads,
            "by_method": dict(sorted(by.items()))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.exchange", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--blocks", type=int, default=40, help="blocks (spill files)")
    p.add_argument("--keys", type=int, default=20, help="keys (shuffle windows)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--label", default="", help="a name for this code, in the result")
    p.add_argument("--out", default=str(RESULTS_DIR / "exchange_s3.json"))
    p.add_argument("--replace", action="store_true")
    args = p.parse_args(argv)

    import ray

    from benchmarks.s3_server import LoopbackS3

    load_before = load_average()
    server = LoopbackS3.start()
    try:
        os.environ.update(server.env())
        bucket = "bench-exchange"
        server.create_bucket(bucket)
        ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False,
                 configure_logging=False, runtime_env={"env_vars": server.env()})
        tables = blocks(args.rows, args.blocks, args.keys, seed=1)
        runs = []
        for r in range(args.rounds):
            run = one_round(server, bucket, tables, args.keys, f"r{r}")
            runs.append(run)
            print(f"round {r + 1}: {run['requests']:,} requests ({run['read_requests']:,} "
                  f"reads), scatter {run['scatter_s']:.2f} s, gather {run['gather_s']:.2f} s "
                  f"{run['by_method']}")
    finally:
        ray.shutdown()
        server.stop()
    import hashlib

    from preprocessing import exchange

    code = Path(exchange.__file__)  # (the code measured, whichever checkout it came from)
    path = write_result(
        args.out, "exchange",
        {"rows": args.rows, "blocks": args.blocks, "keys": args.keys, "label": args.label,
         "exchange_py": str(code),
         "exchange_py_sha256": hashlib.sha256(code.read_bytes()).hexdigest()},
        machine_info(), load_before, load_average(), {}, {"runs": runs},
        notes=["requests counted by moto's recorder (its /moto-api calls left out); every "
               "block holds rows of every key"], replace=args.replace)
    print(f"result: {path}")


if __name__ == "__main__":
    main()
