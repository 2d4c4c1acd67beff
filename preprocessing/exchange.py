"""Grouping rows by an integer key across the whole split: the all-to-all exchange behind
dedupe buckets and batching windows. `group_by(ds, key, n_keys, fn, ...)` runs `fn` once per
key on all of that key's rows and returns the Ray dataset of its outputs, by one of two ways:

- "ray": Ray Data's own `groupby(key).map_groups(fn)` (hash shuffle through the object store,
  or on disk with `DataContext.use_disk_based_hash_shuffle`).
- "files" (the default): a task per block writes its rows as one spill file holding an Arrow
  IPC stream per key, in key order, and returns where each key's stream starts (`write_spill`);
  then a task per key (per `KEYS_PER_READ` consecutive keys when the files are in a bucket)
  reads their byte range of every file in one ranged read, none where the file has no row of
  them (`read_keys`), so a task holds one block or a few keys' rows, never the split.

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
from storage import filesystem_of, is_uri

# Uncompressed: spill files live for seconds and are read back once, and CPU is what a small node
# runs out of (lz4 would cut them to ~40% for ~20% more CPU in the batches stage). On disk they
# take about twice the encoded parquet parts (zstd) of the split.
SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression=None)


# Keys a gather task reads together from a bucket: one ranged read of a spill file covers all
# of them. There every read is a request (two: the object's size, then its bytes), a task's
# time is mostly their latency, and the exchange is all to all (a window holds rows of every
# block): 40.8M pairs in 816 blocks and 204 windows made 166k reads of four requests each (a
# file's footer, its size and the batch) when each key's task read every file for its own
# record batch. On a local disk a read is cheap and a task per key spreads the work best.
KEYS_PER_READ = 4


def write_spill(table: pa.Table, key: str, n_keys: int, path: str,
                columns: list[str] | None = None) -> list[int]:
    """Write `table` to `path` as one Arrow IPC stream per key k in 0..n_keys-1 that has rows
    (its rows whose int column `key` is k, in table order), one after another; with
    `columns`, only those columns. Returns the n_keys + 1 byte offsets where each key's stream
    starts (key k's bytes: offsets[k]:offsets[k + 1], none where it has no row). Atomic (a
    retried task rewrites it whole)."""
    keys = table[key].to_numpy()
    if len(keys) and (keys.min() < 0 or keys.max() >= n_keys):
        raise ValueError(f"{key} outside 0..{n_keys - 1}")
    order = np.argsort(keys, kind="stable")
    table = (table.select(columns) if columns else table).take(order).combine_chunks()
    bounds = np.searchsorted(keys[order], np.arange(n_keys + 1))
    offsets = [0]
    try:
        # A bucket (a cluster's shared place): the file is made in memory and sent in one
        # write, so that an error while making it sends nothing (closing an object's stream,
        # as leaving the `with` does, stores what was written).
        bucket = is_uri(path)
        target = pa.BufferOutputStream() if bucket else pa.OSFile(path + ".tmp", "wb")
        with target as f:
            for k in range(n_keys):
                a, b = int(bounds[k]), int(bounds[k + 1])
                if b > a:
                    with pa.ipc.new_stream(f, table.schema, options=SPILL_OPTIONS) as writer:
                        writer.write_batch(table.slice(a, b - a).to_batches()[0])
                offsets.append(f.tell())
            whole = f.getvalue() if bucket else None
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
    return offsets


def read_keys(spills: list[tuple[str, list[int]]], first: int, last: int,
              base: int = 0) -> dict[int, pa.Table]:
    """The rows of keys first..last-1 as {key: table} (keys without rows left out): from each
    spill file (path, its offsets from `write_spill`, or their part from key `base` on), in
    list order, the byte range of those keys in one ranged read, none where the file holds no
    row of them."""
    parts: dict[int, list[pa.RecordBatch]] = {}
    for path, offsets in spills:
        offsets = {k: offsets[k - base] for k in range(first, last + 1)}
        start, end = offsets[first], offsets[last]
        if end == start:
            continue
        fs, key = filesystem_of(path)
        with fs.open_input_file(key) as f:  # read, not memory-mapped: no file stays open
            data = f.read_at(end - start, start)
        for k in range(first, last):
            a, b = offsets[k] - start, offsets[k + 1] - start
            if b > a:
                parts.setdefault(k, []).extend(pa.ipc.open_stream(data[a:b]).read_all()
                                               .to_batches())
    return {k: pa.Table.from_batches(batches) for k, batches in sorted(parts.items())}


def read_spill(spills: list[tuple[str, list[int]]], k: int) -> pa.Table | None:
    """All rows of key k (`read_keys`), in file order (None: no rows)."""
    return read_keys(spills, k, k + 1).get(k)


def _scatter(table: pa.Table, *, key: str, n_keys: int, spill_dir: str,
             columns: list[str] | None = None) -> pa.Table:
    """Ray Data function: one block -> `<spill_dir>/<its first id>.arrow`; one row {rows_in,
    spill (its path, "" for an empty block), offsets (`write_spill`'s)}."""
    path, offsets = "", []
    if table.num_rows:
        first = int(table["id"].to_numpy().min())
        path = f"{spill_dir.rstrip('/')}/{first:012d}.arrow"
        offsets = write_spill(table, key, n_keys, path, columns)
    return pa.table({"rows_in": pa.array([table.num_rows], pa.int64()),
                     "spill": [path], "offsets": pa.array([offsets], pa.list_(pa.int64()))})


def _gather(groups: pa.Table, *, fn: Callable, fn_kwargs: dict) -> Iterator[pa.Table]:
    """Ray Data generator: `fn` of each key's rows of a group of keys (one row: first, last,
    and the spill files' paths and offsets of those keys, `group_by`)."""
    for g in groups.to_pylist():
        keys = read_keys(list(zip(g["paths"], g["offsets"])), g["first"], g["last"],
                         base=g["first"])
        for rows in keys.values():
            yield fn(rows, **fn_kwargs)


def gather_groups(scattered: list[dict], n_keys: int, per_read: int = 1) -> list[dict]:
    """The gather's tasks from the scatter's rows (`_scatter`): one per `per_read` keys,
    {first, last, paths, offsets}, each given only its keys' offsets in each spill file, the
    files in the order of their first ids (the order the rows of a key are read in)."""
    spills = sorted((r for r in scattered if r["spill"]), key=lambda r: r["spill"])
    return [{"first": a, "last": min(a + per_read, n_keys),
             "paths": [r["spill"] for r in spills],
             "offsets": [[int(x) for x in r["offsets"][a:min(a + per_read, n_keys) + 1]]
                         for r in spills]}
            for a in range(0, n_keys, per_read)]


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
    spills: list[dict] = []
    scattered = collect_stats(ds.map_batches(
        _scatter, batch_size=None, batch_format="pyarrow",
        fn_kwargs={"key": key, "n_keys": n_keys, "spill_dir": str(spill_dir),
                   "columns": columns}),
        f"{label} (scatter)", rows=spills)
    groups = gather_groups(spills, n_keys, KEYS_PER_READ if is_uri(str(spill_dir)) else 1)
    gathered = ray.data.from_items(groups, override_num_blocks=len(groups)).map_batches(
        _gather, batch_size=1, batch_format="pyarrow", fn_kwargs={"fn": fn,
                                                                  "fn_kwargs": fn_kwargs})
    return gathered, scattered.get("rows_in", 0)
