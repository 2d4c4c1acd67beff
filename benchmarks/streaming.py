"""Training streamed from preprocessing output at scale, on two Ray nodes of this host.

Starts a two-node Ray cluster (`ray start --head` + `ray start --address`, --cpus-per-node CPUs
each: two raylets, as on a real cluster) and, on the batches of a large preprocessing run
(--data: `<root>/<task>/batches/train`, e.g. the 10M-pair benchmark output), measures:

1. stream: the input side alone. Two consumer actors, one per node, each read their rank's
   rows of epoch 1 the way the training loop does (`convs2s.train.data`: the epoch's plan of
   rows, read with pyarrow from the shared files a window ahead) and collate them, for
   --stream-seconds: the input rate per worker, in batches/s and target tokens/s.
2. train: `convs2s.train.launch.fit` with 2 workers (one per node) for --updates updates, on
   the whole --data folder and on a slice of its first parts, in --rounds alternated rounds
   (full, slice, full, slice, ...: the host's speed drifts). The slice holds enough batches
   (--slice-batches; by default 1.1 x updates x workers) for both runs to train within their
   first epoch: a second epoch repeats batch shapes whose kernels the CPU has cached by then,
   and ran 1.2x faster, which a slice that wrapped around counted as the input path's.
   Step rate = updates/s of the logged intervals after the first (start-up excluded), and the
   PSS of each training worker sampled every second (first quarter, last quarter, peak).

Reports the step-rate ratio (full / slice; each round's and their mean), the input rate over
what the step consumes, and the training workers' memory over each run.

    python -m benchmarks.streaming --data /tmp/prep/bench_10000000/batches/train \\
        --spm /tmp/prep/bench_10000000/spm/spm.model --vocab 1000

Writes benchmarks/results/streaming.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.local_cluster import RayCliCluster, cli_env
from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, fresh_workdir, write_result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.streaming",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a batches/train folder")
    p.add_argument("--spm", type=Path, required=True, help="its sentencepiece model")
    p.add_argument("--vocab", type=int, required=True, help="its vocabulary size")
    p.add_argument("--preset", default="tiny", help="model preset (convs2s.config.PRESETS)")
    p.add_argument("--updates", type=int, default=1500, help="updates per training run")
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--slice-batches", type=int, default=0,
                   help="batch rows in the slice (default: 1.1 x updates x 2 workers)")
    p.add_argument("--rounds", type=int, default=2, help="alternated full / slice rounds")
    p.add_argument("--stream-seconds", type=float, default=60.0)
    p.add_argument("--cpus-per-node", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/convs2s-bench-streaming"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--replace", action="store_true",
                   help="overwrite the result file if it exists (default: keep it and write "
                        "<name>-<time>.json beside it)")
    p.add_argument("--inner-result", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --- data ----------------------------------------------------------------------------------


def pairs_in(part: Path) -> int:
    ids = pq.read_table(part, columns=["id"])["id"]
    return int(pc.sum(pc.list_value_length(ids)).as_py() or 0)


def make_slice(data: Path, batches: int, out: Path) -> dict:
    """`out` = hard links to the first parts of `data` holding at least `batches` batch rows."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rows = pairs = 0
    for part in sorted(data.glob("part-*.parquet")):
        os.link(part, out / part.name)
        rows += pq.read_metadata(part).num_rows
        pairs += pairs_in(part)
        if rows >= batches:
            break
    return {"parts": len(list(out.glob("part-*.parquet"))), "batches": rows, "pairs": pairs}


def make_valid(data: Path, rows: int, out: Path) -> None:
    """A small validation folder: the first `rows` batch rows of the first part."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    first = sorted(data.glob("part-*.parquet"))[0]
    pq.write_table(pq.read_table(first).slice(0, rows), out / "part-000000.parquet")


def data_profile(data: Path) -> dict:
    parts = sorted(data.glob("part-*.parquet"))
    rows = sum(pq.read_metadata(p).num_rows for p in parts)
    return {"parts": len(parts), "batches": rows,
            "bytes": sum(p.stat().st_size for p in parts)}


# --- memory of the training workers ----------------------------------------------------------


class WorkerMemory:
    """Every second, the PSS of each process whose title names a training worker and whose
    raylet belongs to this cluster (not another Ray on the same host)."""

    def __init__(self, match: str = "RayTrainWorker"):
        self.match, self.series = match, {}  # pid -> [(t, bytes)]
        self.cluster_dir = os.environ.get("STREAMING_BENCH_CLUSTER_DIR", "")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self):
        import psutil

        while not self._stop.wait(1.0):
            for p in psutil.process_iter(["name"]):
                if self.match in (p.info["name"] or ""):
                    try:  # a worker's parent is its node's raylet, started in the temp dir
                        if self.cluster_dir not in " ".join(p.parent().cmdline()):
                            continue
                        pss = p.memory_full_info().pss
                    except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
                        continue
                    self.series.setdefault(p.pid, []).append((time.monotonic(), pss))

    def summary_mib(self) -> dict:
        """Per worker: median PSS over the first and the last quarter of its samples, peak."""
        out = {}
        for pid, s in self.series.items():
            vals = [v / 2**20 for _, v in s]
            q = max(1, len(vals) // 4)
            first, last = sorted(vals[:q]), sorted(vals[-q:])
            out[str(pid)] = {"samples": len(vals),
                             "first_quarter": round(first[len(first) // 2], 1),
                             "last_quarter": round(last[len(last) // 2], 1),
                             "peak": round(max(vals), 1)}
        return out


# --- 1. the input side alone ----------------------------------------------------------------


def stream_rates(data: Path, seconds: float, cpus_per_node: int) -> list[dict]:
    """Two consumer actors, one per node, each draining its rank's rows for `seconds`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from convs2s.config import TrainConfig
    from convs2s.train.data import TrainFiles

    files, shuffle = TrainFiles.scan(data), TrainConfig().shuffle_buffer

    @ray.remote(num_cpus=cpus_per_node)
    class Consumer:
        def run(self, rank: int, seconds: float) -> dict:
            from convs2s.train.collate import collate_arrow
            from convs2s.train.data import epoch_rows, read_rows

            start, t0, n, tokens = time.monotonic(), None, 0, 0
            refs = epoch_rows(files, 1, 1, 2, rank, shuffle)
            for row in read_rows(files, refs, shuffle):
                batch = collate_arrow(row)
                if t0 is None:  # the clock starts at the first batch (start-up is apart)
                    t0, first = time.monotonic(), time.monotonic() - start
                    continue
                n += 1
                tokens += int(batch.target.ne(1).sum())  # PAD = 1
                if time.monotonic() - t0 >= seconds:
                    break
            dt = time.monotonic() - t0
            return {"node": ray.get_runtime_context().get_node_id()[:8], "batches": n,
                    "first_batch_s": round(first, 2), "seconds": round(dt, 2),
                    "batches_per_s": n / dt, "target_tokens_per_s": tokens / dt}

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    consumers = [Consumer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote() for node in nodes[:2]]
    return ray.get([c.run.remote(rank, seconds) for rank, c in enumerate(consumers)])


# --- 2. training from the full data and from a slice ----------------------------------------


def train_run(args, name: str, data: Path, valid: Path, storage: Path) -> dict:
    from convs2s.config import PRESETS, TrainConfig
    from convs2s.tracking.run_logger import read_local_metrics
    from convs2s.train.launch import fit
    from convs2s.train.job import TrainJob

    job = TrainJob(model=PRESETS[args.preset](), train=TrainConfig(
        max_updates=args.updates, max_epochs=0, log_interval=args.log_interval,
        lr_schedule="fixed", lr=0.25, keep_last=1), train_data=str(data),
        valid_data=str(valid), spm_model=str(args.spm), vocab_size=args.vocab,
        storage_path=str(storage), run_name=name, num_workers=2,
        cpus_per_worker=args.cpus_per_node, tracking_uri=f"sqlite:///{storage / 'mlflow.db'}",
        experiment_name="streaming-bench", max_failures=0)
    t0 = time.monotonic()
    with WorkerMemory() as mem:
        result = fit(job)
    wall = time.monotonic() - t0
    train = [r["metrics"] for r in read_local_metrics(Path(result.run_dir) / "metrics.jsonl")
             if "train/updates_per_s" in r["metrics"]]
    rates = [m["train/updates_per_s"] for m in train]
    tok = [m["train/tokens_per_s"] for m in train]
    steady, steady_tok = rates[1:] or rates, tok[1:] or tok
    return {"run": name, "data": str(data), "wall_s": round(wall, 1),
            "updates": result.metrics.get("update"), "epoch": result.metrics.get("epoch"),
            "updates_per_s": sum(steady) / len(steady),
            "target_tokens_per_s": sum(steady_tok) / len(steady_tok),
            "updates_per_s_by_interval": [round(r, 3) for r in rates],
            "worker_memory_mib": mem.summary_mib()}


def measure(args) -> dict:
    """The measurements, in a driver connected to the cluster (RAY_ADDRESS set)."""
    import ray

    ray.init(log_to_driver=False)
    try:
        nodes = sum(n["Alive"] for n in ray.nodes())
        stream = stream_rates(args.data, args.stream_seconds, args.cpus_per_node)
        storage = Path(tempfile.mkdtemp(prefix="runs-", dir=args.workdir))
        runs = []
        for k in range(1, args.rounds + 1):  # alternated: full, slice, full, slice, ...
            runs.append(train_run(args, f"full{k}", args.data, args.workdir / "valid", storage))
            runs.append(train_run(args, f"slice{k}", args.workdir / "slice",
                                  args.workdir / "valid", storage))
    finally:
        ray.shutdown()
    return {"nodes": nodes, "stream": stream, "train": runs}


WORKDIR_MARK = ".convs2s-bench-streaming"  # in a --workdir this benchmark made


def _fresh_workdir(workdir: Path) -> None:
    """An empty --workdir (benchmarks.report.fresh_workdir): a folder it did not create is
    never deleted."""
    fresh_workdir(workdir, "streaming")


def run(args, argv: list[str]) -> dict:
    """Start the two-node cluster, run `measure` in a driver process connected to it as on a
    real cluster (RAY_ADDRESS set, like `ray job submit`), stop the cluster."""
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    _fresh_workdir(args.workdir)
    sliced = make_slice(args.data, args.slice_batches or int(1.1 * args.updates * 2),
                        args.workdir / "slice")
    make_valid(args.data, 8, args.workdir / "valid")
    cluster = RayCliCluster(cli_env())
    inner = args.workdir / "measured.json"
    try:
        cluster.start_head(num_cpus=args.cpus_per_node)
        cluster.add_node(num_cpus=args.cpus_per_node)
        env = {**cluster.env, "RAY_ADDRESS": cluster.gcs_address,
               "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
               "STREAMING_BENCH_CLUSTER_DIR": cluster.temp_dir}
        subprocess.run([sys.executable, "-m", "benchmarks.streaming", *argv,
                        "--inner-result", str(inner)], env=env, check=True)
    finally:
        cluster.stop()
    r = json.loads(inner.read_text())
    runs = r["train"]
    ratios = [f["updates_per_s"] / p["updates_per_s"] for f, p in zip(runs[::2], runs[1::2])]
    full_rate = max(f["updates_per_s"] for f in runs[::2])
    per_worker_in = min(s["batches_per_s"] for s in r["stream"])
    return {"machine": machine_info(), **r, "data": data_profile(args.data), "slice": sliced,
            "step_rate_full_over_slice_by_round": ratios,
            "step_rate_full_over_slice": sum(ratios) / len(ratios),
            # each update takes one batch per worker: input batches/s per worker over updates/s
            "input_over_need": per_worker_in / max(full_rate, 1e-9)}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.inner_result:  # the driver process started by `run`
        args.inner_result.write_text(json.dumps(measure(args)))
        return {}
    load_before = load_average()
    r = run(args, argv)
    path = args.out or RESULTS_DIR / "streaming.json"
    path = write_result(path, "streaming", {k: str(v) if isinstance(v, Path) else v
                                     for k, v in vars(args).items()},
                 r.pop("machine"), load_before, load_average(), {}, r, [],
                 replace=args.replace)
    print(format_table([{**s, "what": "stream"} for s in r["stream"]],
                       [("what", "what"), ("node", "node"), ("batches", "batches"),
                        ("batches_per_s", "batches/s"), ("target_tokens_per_s", "tgt tok/s")]))
    print(format_table(r["train"], [("run", "run"), ("updates", "updates"), ("epoch", "epoch"),
                                    ("updates_per_s", "updates/s"),
                                    ("target_tokens_per_s", "tgt tok/s"), ("wall_s", "wall s")]))
    for t in r["train"]:
        for pid, m in t["worker_memory_mib"].items():
            print(f"  {t['run']:>5} worker {pid}: PSS {m['first_quarter']:,.0f} -> "
                  f"{m['last_quarter']:,.0f} MiB (peak {m['peak']:,.0f})")
    print("step rate full / slice by round: "
          + ", ".join(f"{x:.3f}" for x in r["step_rate_full_over_slice_by_round"]))
    print(f"step rate full / slice: {r['step_rate_full_over_slice']:.3f}; input per worker / "
          f"need: {r['input_over_need']:.1f}x   result: {path}")
    return r


if __name__ == "__main__":
    main()
