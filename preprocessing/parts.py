"""Stage outputs on Ray Data's own operators: `read_stage` (a datasource of one block per part)
and `PartSink` (the write operator), which writes a stage's parquet parts and counts them.

A stage's last map emits rows that carry, besides the columns to store, a part key (which part
file a row belongs to: a block's first id, a dedupe bucket, a batching window) and a `reason`
column (null: kept; else why the row is dropped). `PartSink.write` splits what it receives by
part key, writes each part's kept rows as `part-<key>.parquet` (same rows, same bytes: no
timestamps in parquet metadata) and returns the stage's counts for those rows (`stats_fn`),
dropped rows counted by reason. On the driver `on_write_complete` sums the counts and checks that
no part key reached two write tasks (two tasks would write the same file).

Every drop is a row the sink sees, so the stage's accounting (`rows_in == kept + dropped`) comes
from the same pass that writes the data: no second pass, no side channel.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from ray.data.block import BlockAccessor, BlockMetadata
from ray.data.datasource import Datasink, Datasource, ReadTask

from preprocessing.errors import user_errors
from preprocessing.stages import execution_settings, part_paths, write_part

log = logging.getLogger("preprocessing")

StatsFn = Callable[[pa.Table], dict[str, int]]


def row_counts(table: pa.Table) -> np.ndarray:
    """Sentences per row: 1, or the length of the `id` list for a batch row."""
    ids = table["id"]
    if pa.types.is_list(ids.type):
        return pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.ones(table.num_rows, dtype=np.int64)


def accounting(table: pa.Table) -> dict[str, int]:
    """rows_in / rows_kept / drop_<reason> of a table with a `reason` column (in sentences)."""
    n = row_counts(table)
    reasons = table["reason"].to_pylist()
    kept = np.array([r is None for r in reasons], dtype=bool)
    out = {"rows_in": int(n.sum()), "rows_kept": int(n[kept].sum())}
    for r in sorted({r for r in reasons if r is not None}):
        out[f"drop_{r}"] = int(n[np.array([x == r for x in reasons])].sum())
    return out


class PartSink(Datasink):
    """Writes a stage's parts into `out_dir` and sums their counts (`totals` on the driver).

    part_key: the column that names a row's part (`part-<key:012d>.parquet`, or `<key:06d>`
    for small keys such as windows: `key_digits`); schema: what a part stores (its columns are
    selected and cast to it, so the bytes do not depend on how Ray built the arrays).
    """

    def __init__(self, out_dir: str, *, part_key: str, schema: pa.Schema,
                 stats_fn: StatsFn | None = None, key_digits: int = 12, label: str = ""):
        self.out_dir, self.part_key, self.schema = str(out_dir), part_key, schema
        self.stats_fn, self.key_digits, self.label = stats_fn, key_digits, label or out_dir
        self.totals: dict[str, int] = {}
        self.parts: list[int] = []

    def get_name(self) -> str:
        return "PartSink"

    def write(self, blocks: Iterable, ctx) -> dict:
        tables = [BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return {"parts": [], "stats": {}}
        table = pa.concat_tables(tables)
        stats = accounting(table)
        kept = table.filter(pc.is_null(table["reason"]))
        if self.stats_fn is not None:
            stats.update(self.stats_fn(kept))
        keys = kept[self.part_key].to_numpy()
        parts = sorted(set(keys.tolist()))
        for k in parts:
            part = kept.filter(pa.array(keys == k)).select(self.schema.names)
            write_part(part.cast(self.schema).combine_chunks(), self.out_dir,
                       f"part-{int(k):0{self.key_digits}d}.parquet")
        return {"parts": parts, "stats": stats}

    def log_done(self, t0: float) -> None:
        log.info("  %s: %s rows, %s parts written (%.0f s)", self.label,
                 f"{self.totals.get('rows_in', 0):,}", f"{len(self.parts):,}",
                 time.monotonic() - t0)

    def on_write_complete(self, write_result) -> None:
        totals: dict[str, int] = {}
        parts: list[int] = []
        for r in write_result.write_returns:
            parts += r["parts"]
            for k, v in r["stats"].items():  # counts add up; a `longest_` count is a maximum
                totals[k] = max(totals.get(k, 0), int(v)) if k.startswith("longest_") else \
                    totals.get(k, 0) + int(v)
        if len(parts) != len(set(parts)):  # two tasks wrote the same file: rows were lost
            twice = sorted({p for p in parts if parts.count(p) > 1})[:5]
            raise RuntimeError(f"{self.label}: parts {twice} were written by two write tasks; "
                               "a part's rows must reach the sink in one block")
        self.totals, self.parts = totals, sorted(parts)


def write_stage(ds, sink: PartSink) -> dict[str, int]:
    """Run `ds` into `sink`; the summed counts. Ray Data's progress goes to its own logger."""
    t0 = time.monotonic()
    with user_errors():
        execution_settings(ds).write_datasink(sink)
    sink.log_done(t0)
    return sink.totals


class PartsDatasource(Datasource):
    """A finished stage's parts, one read task (and one block) per part file.

    Ray's `read_parquet` bin-packs small files into ~128 MiB read units; stage parts are already
    the block size the next stage wants (one part = one encoder call = one output part), so
    each is read as it is.
    """

    def __init__(self, paths: list[str], columns: list[str] | None):
        super().__init__()
        self.paths, self.columns = paths, columns

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context=None) -> list[ReadTask]:
        cols = self.columns  # row counts left unknown: no footer read per part on the driver
        return [ReadTask(lambda p=path: [pq.read_table(p, columns=cols)],
                         BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None,
                                       input_files=[path]))
                for path in self.paths]


def read_stage(folder: str | Path, columns: list[str] | None = None):
    """A finished stage's parts as a Ray dataset of one block per part."""
    import ray.data

    paths = part_paths(folder)
    if not paths:
        raise RuntimeError(f"{folder} holds no parts")
    return ray.data.read_datasource(PartsDatasource(paths, columns),
                                    override_num_blocks=len(paths))
