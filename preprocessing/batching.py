"""Token-budget batches: one parquet row per training batch (`batches/<split>/`).

Rows go to pseudo-random windows of about `shuffle_window` rows (window = mix64(id, seed) mod
n_windows: a shuffle that depends only on ids and seed). Inside a window rows are sorted by
length (max of the two sides, then source, then target, then a random tie-break) and cut
greedily into batches with `n_sentences * max(max_src_len, max_tgt_len) <= max_tokens` and
`n_sentences <= max_sentences` (the reference's --max-tokens batching, paper §4/§5). The
window's batches are shuffled and written as `part-<window>.parquet`, one row per batch:
`{"id": list<int64>, "src": list<list<int32>>, "tgt": list<list<int32>>, "src_tokens": int64,
"tgt_tokens": int64, "padded_tokens": int64}` (padded_tokens = n * max(S, T)).

A sentence longer than `max_tokens` alone cannot be batched: it is dropped and counted.

Windows gather rows from every encoded part: an all-to-all exchange, through spill files (see
stages.py) rather than Ray's object store: `scatter_part` (a task per encoded part) writes the
part's rows with one record batch per window, `gather_window` (a task per window) reads one
window from every file, so a task holds one part or one window, never the split. The rows of a
window, and so its bytes, do not depend on the exchange: `batch_window` sorts them totally.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from preprocessing.stages import (index_dataset, mix64, parts_dataset, read_spill, write_part,
                                  write_spill)

BATCH_SCHEMA = pa.schema([("id", pa.list_(pa.int64())), ("src", pa.list_(pa.list_(pa.int32()))),
                          ("tgt", pa.list_(pa.list_(pa.int32()))), ("src_tokens", pa.int64()),
                          ("tgt_tokens", pa.int64()), ("padded_tokens", pa.int64())])


def cut_batches(lengths: np.ndarray, max_tokens: int,
                max_sentences: int | None) -> tuple[list[tuple[int, int]], int]:
    """Greedy cut of rows sorted by ascending length: ([(start, stop)], first unbatchable row).

    Rows from the returned index on are longer than max_tokens and go into no batch.
    """
    cap = max_sentences or len(lengths) or 1
    bounds, start = [], 0
    for i, n_tok in enumerate(lengths.tolist()):
        if n_tok > max_tokens:
            if i > start:
                bounds.append((start, i))
            return bounds, i
        n = i - start + 1  # batch size if row i joins; sorted, so row i is the longest
        if n > 1 and (n * n_tok > max_tokens or n > cap):
            bounds.append((start, i))
            start = i
    if start < len(lengths):
        bounds.append((start, len(lengths)))
    return bounds, len(lengths)


def _nested(column: pa.ChunkedArray, order: np.ndarray, sizes: np.ndarray) -> pa.ListArray:
    """list<list<int32>>: the rows `order` of a list<int32> column, grouped by `sizes`."""
    inner = column.take(pa.array(order)).combine_chunks()
    offsets = np.zeros(len(sizes) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), inner)


def add_window(batch: pa.Table, *, n_windows: int, seed: int) -> pa.Table:
    """Ray Data function: the window column, from row ids only."""
    w = mix64(batch["id"].to_numpy(), seed) % np.uint64(n_windows)
    return batch.append_column("window", pa.array(w.astype(np.int64)))


def batch_window(group: pa.Table, *, out_dir: str, max_tokens: int, max_sentences: int | None,
                 seed: int) -> dict:
    """Ray Data group function: sort one window by length, cut, shuffle, write its part."""
    window = int(group["window"][0].as_py())
    ids = group["id"].to_numpy()
    src_len = group["src_len"].to_numpy().astype(np.int64)
    tgt_len = group["tgt_len"].to_numpy().astype(np.int64)
    longest = np.maximum(src_len, tgt_len)
    tie = mix64(ids, seed + 1)  # ids are unique, so the order is total: same input, same bytes
    order = np.lexsort((tie, tgt_len, src_len, longest))
    bounds, stop = cut_batches(longest[order], max_tokens, max_sentences)
    rng = np.random.default_rng([seed, window])
    bounds = [bounds[i] for i in rng.permutation(len(bounds))]  # no length order across rows
    stats = {"window": window, "rows_in": len(ids), "rows_kept": stop,
             "drop_over_max_tokens": len(ids) - stop, "batches": len(bounds), "src_tokens": 0,
             "tgt_tokens": 0, "padded_tokens": 0, "padded_slots": 0}
    if bounds:
        rows = np.concatenate([order[a:b] for a, b in bounds])  # batch after batch
        sizes = np.array([b - a for a, b in bounds], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        s_tok, t_tok = (np.add.reduceat(x[rows], starts) for x in (src_len, tgt_len))
        s_max, t_max = (np.maximum.reduceat(x[rows], starts) for x in (src_len, tgt_len))
        padded = sizes * np.maximum(s_max, t_max)  # the budget measure: n * max(S, T)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        table = pa.Table.from_arrays([
            pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids[rows], pa.int64())),
            _nested(group["src"], rows, sizes), _nested(group["tgt"], rows, sizes),
            pa.array(s_tok, pa.int64()), pa.array(t_tok, pa.int64()), pa.array(padded, pa.int64()),
        ], schema=BATCH_SCHEMA)
        write_part(table, out_dir, f"part-{window:06d}.parquet")
        stats.update(src_tokens=int(s_tok.sum()), tgt_tokens=int(t_tok.sum()),
                     padded_tokens=int(padded.sum()),
                     # slots of the two padded tensors (B x S and B x T): padding efficiency
                     padded_slots=int((sizes * (s_max + t_max)).sum()))
    return {k: np.array([v], dtype=np.int64) for k, v in stats.items()}


def n_windows_for(rows: int, shuffle_window: int) -> int:
    return max(1, math.ceil(rows / shuffle_window))


def scatter_part(row: dict, *, spill_dir: str, n_windows: int, seed: int) -> dict:
    """Ray Data row function: encoded part `row["path"]` -> `<spill_dir>/<part>.arrow`, its
    rows (window column added) as n_windows record batches, batch w = the rows of window w."""
    table = add_window(pq.read_table(row["path"]), n_windows=n_windows, seed=seed)
    write_spill(table, "window", n_windows, os.path.join(spill_dir, Path(row["path"]).stem
                                                         + ".arrow"))
    return {"rows_in": table.num_rows}


STATS_KEYS = ("window", "rows_in", "rows_kept", "drop_over_max_tokens", "batches", "src_tokens",
              "tgt_tokens", "padded_tokens", "padded_slots")


def gather_window(row: dict, *, spill_paths: list[str], out_dir: str, max_tokens: int,
                  max_sentences: int | None, seed: int) -> dict:
    """Ray Data row function: batch window `row["window"]` from the spill files; stats row."""
    group = read_spill(spill_paths, int(row["window"]))
    if group is None:  # a window no row hashed to (small splits): no part
        return {k: int(row["window"]) if k == "window" else 0 for k in STATS_KEYS}
    stats = batch_window(group, out_dir=out_dir, max_tokens=max_tokens,
                         max_sentences=max_sentences, seed=seed)
    return {k: int(v[0]) for k, v in stats.items()}


def scatter_dataset(encoded_dir: str, spill_dir: str, n_windows: int,
                    seed: int) -> ray.data.Dataset:
    """Stats rows (one per encoded part) of spilling `encoded_dir` by window (lazy)."""
    os.makedirs(spill_dir, exist_ok=True)
    return parts_dataset(encoded_dir).map(
        scatter_part, fn_kwargs={"spill_dir": spill_dir, "n_windows": n_windows, "seed": seed})


def gather_dataset(spills: list[str], out_dir: str, n_windows: int, max_tokens: int,
                   max_sentences: int | None, seed: int) -> ray.data.Dataset:
    """Stats rows (one per window) of batching the spilled windows into `out_dir` (lazy)."""
    return index_dataset(n_windows, "window").map(gather_window, fn_kwargs={
        "spill_paths": spills, "out_dir": out_dir, "max_tokens": max_tokens,
        "max_sentences": max_sentences, "seed": seed})
