"""Token-budget batches: one parquet row per training batch (`batches/<split>/`).

Rows go to pseudo-random windows of about `shuffle_window` rows (window = mix64(id, seed) mod
n_windows: a shuffle that depends only on ids and seed). Inside a window rows are sorted by
length (max of the two sides, then source, then target, then a random tie-break) and cut
greedily into batches with `n_sentences * max(max_src_len, max_tgt_len) <= max_tokens` and
`n_sentences <= max_sentences` (the reference's --max-tokens batching, paper §4.2). The
window's batches are shuffled and written as `part-<window>.parquet`, one row per batch:
`{"id": list<int64>, "src": list<list<int32>>, "tgt": list<list<int32>>, "src_tokens": int64,
"tgt_tokens": int64, "padded_tokens": int64}` (padded_tokens = n * max(S, T)).

A sentence longer than `max_tokens` alone cannot be batched: it is dropped and counted.

Windows gather rows from every encoded part: `add_window` keys each row, `exchange.group_by`
brings each window's rows together, `batch_window` cuts one window, `PartSink` writes it. The
rows of a window, and so its bytes, do not depend on the exchange: `batch_window` sorts them
totally.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.stages import mix64

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


def batch_window(group: pa.Table, *, max_tokens: int, max_sentences: int | None,
                 seed: int, max_positions: int | None = None) -> pa.Table:
    """Ray Data group function: one window sorted by length, cut and shuffled into batch rows.

    Returns BATCH_SCHEMA's columns plus `window` (the part key), `padded_slots` (slots of the
    padded B x S and B x T tensors) and `reason` (null), then one row per sentence too long for
    the budget (reason `over_max_tokens`, no tokens) or for the model's positions (a side of
    more than `max_positions` pieces, EOS included: `over_max_positions`, which training would
    otherwise meet hours in): the sink counts them and writes the rest.
    """
    window = int(group["window"][0].as_py())
    ids = group["id"].to_numpy()
    src_len = group["src_len"].to_numpy().astype(np.int64)
    tgt_len = group["tgt_len"].to_numpy().astype(np.int64)
    longest = np.maximum(src_len, tgt_len)
    tie = mix64(ids, seed + 1)  # ids are unique, so the order is total: same input, same bytes
    order = np.lexsort((tie, tgt_len, src_len, longest))
    over_positions = np.zeros(0, dtype=np.int64)
    if max_positions is not None:
        beyond = longest[order] > max_positions
        order, over_positions = order[~beyond], order[beyond]
    bounds, stop = cut_batches(longest[order], max_tokens, max_sentences)
    rng = np.random.default_rng([seed, window])
    bounds = [bounds[i] for i in rng.permutation(len(bounds))]  # no length order across rows
    rows = (np.concatenate([order[a:b] for a, b in bounds]) if bounds  # batch after batch
            else np.zeros(0, dtype=np.int64))
    sizes = np.array([b - a for a, b in bounds], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    s_tok, t_tok, s_max, t_max = (np.zeros(0, dtype=np.int64),) * 4
    if bounds:
        s_tok, t_tok = (np.add.reduceat(x[rows], starts) for x in (src_len, tgt_len))
        s_max, t_max = (np.maximum.reduceat(x[rows], starts) for x in (src_len, tgt_len))
    # one row each, counted by the sink: longer than max_tokens alone, then than the positions
    dropped = np.concatenate([order[stop:], over_positions])
    n_drop = len(dropped)
    sizes_all = np.concatenate([sizes, np.ones(n_drop, dtype=np.int64)])
    offsets = np.concatenate([[0], np.cumsum(sizes_all)]).astype(np.int32)
    empty = np.zeros(n_drop, dtype=np.int64)
    no_lists = pa.ListArray.from_arrays(pa.array(np.zeros(n_drop + 1, dtype=np.int32)),
                                        pa.array([], pa.list_(pa.int32())))
    table = pa.Table.from_arrays([
        pa.ListArray.from_arrays(pa.array(offsets),
                                 pa.array(ids[np.concatenate([rows, dropped])], pa.int64())),
        pa.concat_arrays([_nested(group["src"], rows, sizes), no_lists]),
        pa.concat_arrays([_nested(group["tgt"], rows, sizes), no_lists]),
        pa.array(np.concatenate([s_tok, empty]), pa.int64()),
        pa.array(np.concatenate([t_tok, empty]), pa.int64()),
        # the budget measure: n * max(S, T)
        pa.array(np.concatenate([sizes * np.maximum(s_max, t_max), empty]), pa.int64()),
        pa.array(np.full(len(bounds) + n_drop, window, dtype=np.int64)),
        pa.array(np.concatenate([sizes * (s_max + t_max), empty]), pa.int64()),
        pa.array([None] * len(bounds) + ["over_max_tokens"] * (n_drop - len(over_positions))
                 + ["over_max_positions"] * len(over_positions), pa.string()),
    ], names=BATCH_SCHEMA.names + ["window", "padded_slots", "reason"])
    return table


def batch_stats(kept: pa.Table) -> dict[str, int]:
    """PartSink counts of kept batch rows: batches, tokens, padded tokens and slots, and the
    longest source and target sentence (PartSink keeps the largest of a `longest_` count): with
    the budget they give the data's largest step (convs2s.train.memory_fit)."""
    def longest(column: str) -> int:
        lengths = pc.list_value_length(pc.list_flatten(kept[column]))
        return int(pc.max(lengths).as_py() or 0) if len(lengths) else 0

    return {"batches": kept.num_rows,
            **{k: int(pc.sum(kept[k]).as_py() or 0)
               for k in ("src_tokens", "tgt_tokens", "padded_tokens", "padded_slots")},
            "longest_src": longest("src"), "longest_tgt": longest("tgt")}


def n_windows_for(rows: int, shuffle_window: int) -> int:
    return max(1, math.ceil(rows / shuffle_window))
