"""Grouping rows by an integer key across the whole split: the all-to-all exchange behind
dedupe buckets and batching windows. `group_by(ds, key, n_keys, fn, ...)` runs `fn` once per
key on all of that key's rows and returns the Ray dataset of its outputs, by one of two ways:

- "ray": Ray Data's own `groupby(key).map_groups(fn)` (hash shuffle through the object store,
  or on disk with `DataContext.use_disk_based_hash_shuffle`).
- "files" (the default): a task per block writes its rows as one Arrow IPC file with one record
  batch per key, in key order (`write_spill`); then a task per key reads that record batch of
  every file (`read_spill`), so a task holds one block or one key's rows, never the split.

Measured at 10M pairs on 2 CPUs (docs/benchmarks.md), Ray's shuffle took 2.5-3.3x the time of
the batches stage and 3-4x its peak memory (4.3-5.7 GB against 1.4 GB, object-store or disk
shuffle alike), failing the memory bar; so "files" is the default and "ray" stays selectable
(`PreprocessConfig.exchange`) for clusters with object store to spare. Both give the same
groups, and `fn` sorts each group totally, so the output bytes do not depend on the way.

Spill files live in a stage's temporary folder and are deleted before it is renamed into place.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from preprocessing.config import EXCHANGES
from preprocessing.stages import collect_stats, no_space
from storage import filesystem_of, is_uri, location

# Uncompressed: spill files live for seconds and are read back once, and CPU is what a small node
# runs out of (lz4 would cut them to ~40% for ~20% more CPU in the batches stage). On disk they
# take about twice the encoded parquet parts (zstd) of the split.
SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression=None)


def write_spill(table: pa.Table, key: str, n_keys: int, path: str,
                columns: list[str] | None = None) -> None:
    """Write `table` to `path` as n_keys record batches: batch k = its rows whose int column
    `key` is k (in table order), possibly empty; with `columns`, only those columns. Atomic (a
    retried task rewrites it whole)."""
    keys = table[key].to_numpy()
    if len(keys) and (keys.min() < 0 or keys.max() >= n_keys):
        raise ValueError(f"{key} outside 0..{n_keys - 1}")
    order = np.argsort(keys, kind="stable")
    table = (table.select(columns) if columns else table).take(order).combine_chunks()
    bounds = np.searchsorted(keys[order], np.arange(n_keys + 1))
    empty = pa.record_batch([pa.array([], f.type) for f in table.schema], schema=table.schema)
    try:
        # A bucket (a cluster's shared place): the file is made in memory and sent in one
        # write, so that an error while making it sends nothing (closing an object's stream,
        # as leaving the `with` does, stores what was written, a writer's footer included).
        bucket = is_uri(path)
        target = pa.BufferOutputStream() if bucket else pa.OSFile(path + ".tmp", "wb")
        with target as f:
            with pa.ipc.new_file(f, table.schema, options=SPILL_OPTIONS) as writer:
                for k in range(n_keys):
                    a, b = int(bounds[k]), int(bounds[k + 1])
                    writer.write_batch(table.slice(a, b - a).to_batches()[0] if b > a else empty)
            whole = f.getvalue() if bucket else None  # (the writer's footer written)
        if bucket:
            fs, key = filesystem_of(path)
            with fs.open_output_stream(key) as out:
                out.write(whole)
        else:
            os.replace(path + ".tmp", path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        raise (no_space(path, e) or e) from None


def read_spill(paths: list[str], k: int) -> pa.Table | None:
    """All rows of key k: record batch k of every spill file, in file order (None: no rows)."""
    batches = []
    for path in paths:
        fs, key = filesystem_of(path)
        with fs.open_input_file(key) as f:  # read, not memory-mapped: no file stays open
            batch = pa.ipc.open_file(f).get_batch(k)
        if batch.num_rows:
            batches.append(batch)
    return pa.Table.from_batches(batches) if batches else None


def spill_files(spill_dir: str | Path) -> list[str]:
    return sorted(str(p) for p in location(spill_dir).glob("*.arrow"))


def _scatter(table: pa.Table, *, key: str, n_keys: int, spill_dir: str,
             columns: list[str] | None = None) -> pa.Table:
    """Ray Data function: one block -> `<spill_dir>/<its first id>.arrow`; one row {rows_in}."""
    if table.num_rows:
        first = int(table["id"].to_numpy().min())
        write_spill(table, key, n_keys, f"{spill_dir.rstrip('/')}/{first:012d}.arrow", columns)
    return pa.table({"rows_in": pa.array([table.num_rows], pa.int64())})


def _gather(keys: pa.Table, *, spill_paths: list[str], fn: Callable,
            fn_kwargs: dict) -> Iterator[pa.Table]:
    """Ray Data generator: `fn` of each listed key's rows read from the spill files."""
    for k in keys.column(0).to_pylist():
        group = read_spill(spill_paths, int(k))
        if group is not None:  # a key no row has (small splits): nothing to do
            yield fn(group, **fn_kwargs)


def group_by(ds, *, key: str, n_keys: int, fn: Callable, fn_kwargs: dict, how: str,
             spill_dir: Path, label: str, columns: list[str] | None = None):
    """(outputs, rows scattered): `fn(rows of key k, **fn_kwargs)` for every key k in
    0..n_keys-1 that has rows, as a lazy Ray dataset. `ds` holds an int `id` and int `key`.
    `columns`: the columns `fn` needs, when it needs fewer than `ds` has ("files" spills only
    those; `id` and `key` may be left out).

    "files" runs the scatter half here (the gather half needs every file) and returns how many
    rows the spill files hold (None for "ray"); the returned dataset reads them.
    """
    import ray.data

    if how == "ray":
        return ds.groupby(key, num_partitions=min(n_keys, 200)).map_groups(
            fn, batch_format="pyarrow", fn_kwargs=fn_kwargs), None
    if how != "files":
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {how!r}")
    spill_dir.mkdir(parents=True, exist_ok=True)
    scattered = collect_stats(ds.map_batches(
        _scatter, batch_size=None, batch_format="pyarrow",
        fn_kwargs={"key": key, "n_keys": n_keys, "spill_dir": str(spill_dir),
                   "columns": columns}),
        f"{label} (scatter)")
    keys = ray.data.from_items([{key: k} for k in range(n_keys)], override_num_blocks=n_keys)
    gathered = keys.map_batches(_gather, batch_size=1, batch_format="pyarrow", fn_kwargs={
        "spill_paths": spill_files(spill_dir), "fn": fn, "fn_kwargs": fn_kwargs})
    return gathered, scattered.get("rows_in", 0)
