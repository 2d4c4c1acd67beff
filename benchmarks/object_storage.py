"""What object storage costs the training-row reader: the Multi30k training batches read as
training reads them (`convs2s.train.data`: the footers scanned once, then one epoch's rows in
plan order, each file read whole in a background thread) from local disk and from a bucket on
the S3-protocol server on loopback (benchmarks/s3_server.py), in alternated rounds.

    python -m benchmarks.object_storage --data ../shared/data/multi30k

The bucket is moto's server (Python, single process, in memory) on this machine: the figures
are the protocol's cost through pyarrow's S3 client plus that server's speed, not a cloud
bucket's (which adds network latency per request and has more bandwidth). Training never waits
for the reader while it reads rows faster than the workers train them (the step rate is in
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.machine import REPO, load_average, machine_info
from benchmarks.report import RESULTS_DIR, write_result


def _prepare(data: str, root: Path) -> str:
    """The Multi30k En-De batches (the workflow's cpu preset's settings), local."""
    import ray

    from preprocessing.config import multi30k_en_de
    from preprocessing.pipeline import run_pipeline

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False,
             configure_logging=False)
    cfg = multi30k_en_de().replace(source=str(Path(data).resolve()), root=str(root),
                                   splits={"train": "train", "valid": "val"})
    out = run_pipeline(cfg)
    ray.shutdown()
    return out.batches["train"]


def read_epochs(folder: str, epochs: int) -> dict:
    """Scan the footers, then read `epochs` epochs' rows in plan order (each epoch reads its
    files again, as training does): seconds, rows, rows/s."""
    from convs2s.train.data import TrainFiles, epoch_rows, read_rows

    t0 = time.perf_counter()
    files = TrainFiles.scan(folder)
    scanned = time.perf_counter()
    rows = 0
    for epoch in range(1, epochs + 1):
        refs = epoch_rows(files, seed=1, epoch=epoch, world=1, rank=0, shuffle_buffer=16)
        rows += sum(1 for _ in read_rows(files, refs))
    done = time.perf_counter()
    return {"files": len(files.paths), "rows": rows, "scan_s": round(scanned - t0, 4),
            "read_s": round(done - scanned, 4),
            "rows_per_s": round(rows / max(done - scanned, 1e-9), 1),
            "ms_per_epoch": round(1000 * (done - scanned) / epochs, 2)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=50, help="epochs read per round")
    p.add_argument("--out", default=str(RESULTS_DIR / "object_storage_reader.json"))
    p.add_argument("--replace", action="store_true")
    args = p.parse_args(argv)

    from benchmarks.s3_server import LoopbackS3

    server = LoopbackS3.start()
    os.environ.update(server.env())  # pyarrow reads the endpoint and credentials from here
    try:
        server.create_bucket("convs2s-bench")
        with tempfile.TemporaryDirectory() as tmp:
            local = _prepare(args.data, Path(tmp))
            from storage import publish_dir

            bucket = "s3://convs2s-bench/multi30k/batches/train"
            t0 = time.perf_counter()
            publish_dir(local, bucket, marker="manifest.json")
            upload_s = time.perf_counter() - t0
            before = load_average()
            rounds = {"local": [], "bucket": []}
            for r in range(args.rounds):  # alternated, so drift hits both alike
                order = ("local", "bucket") if r % 2 == 0 else ("bucket", "local")
                for where in order:
                    rounds[where].append(read_epochs(local if where == "local" else bucket,
                                                     args.epochs))
            after = load_average()
    finally:
        server.stop()
    best = {w: max(rs, key=lambda x: x["rows_per_s"]) for w, rs in rounds.items()}
    results = {"rounds": rounds, "best": best, "upload_s": round(upload_s, 2),
               "bucket_over_local_rows_per_s": round(best["bucket"]["rows_per_s"]
                                                     / best["local"]["rows_per_s"], 3)}
    for where, b in best.items():
        print(f"{where:6s}: {b['files']} file(s), {b['rows']:,} batch rows in {args.epochs} "
              f"epochs: footers {b['scan_s']:.3f} s, {b['ms_per_epoch']:.1f} ms an epoch = "
              f"{b['rows_per_s']:,.0f} batch rows/s")
    print(f"bucket / local: {results['bucket_over_local_rows_per_s']}")
    path = write_result(args.out, "object_storage_reader", vars(args), machine_info(), before,
                        after, {}, results,
                        notes=["bucket: moto's server on loopback (benchmarks/s3_server.py), "
                               "not a cloud bucket"], replace=args.replace)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
