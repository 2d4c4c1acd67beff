"""The lexical table behind vocabulary selection (the paper's §5.4 setup, after L'Hostis et al.
2016): for each source token, the target tokens that co-occur with it most specifically in the
training pairs, and the target tokens ranked by how many training sentences hold them.

At search time (`convs2s.inference.shortlist`) the output layer of a batch is cut to the most
frequent target tokens plus, for each source token of the batch, its candidates here: a few thousand
rows of fc3 instead of the whole vocabulary.

Counted on Ray Data from the encoded training split (one sentence pair counts each token and
each (source, target) token pair once), in two passes:

    encoded = read_stage(encoded/train)
    c_s, c_t = sum of encoded.map_batches(token_counts)         # V-sized, summed by the driver
    pairs = encoded.map_batches(pair_counts)                    # (s, t, n) per run, bucket s % K
    table = group_by(pairs, "bucket", best_targets_of, ...)     # per bucket: exact totals, top k

The pair rows are the bulk: 400-600 a sentence pair (distinct within a run of COUNT_CHUNK
counted pairs of a block; docs/benchmarks.md), so about 10^9 at the WMT tasks' 2,000,000 pairs
counted. They go through the pipeline's exchange (`preprocessing.exchange`,
`PreprocessConfig.exchange`): by default spill files on disk, a task per bucket of source tokens
summing its rows and ranking its tokens' targets, so no task holds more than one run or one
bucket; the rows ranked are checked against the rows spilled. (Until 2026-12-06 they went
through two Ray Data hash shuffles, the object store's: twice the time, three times the
memory.)

A candidate's score is the Dice coefficient 2 c(s, t) / (c(s) + c(t)) over sentence counts,
which ranks a token's translations above tokens that are merely frequent everywhere (those the
frequency list brings in anyway). Written as `shortlist.npz` (numpy arrays only, loaded without
pickle) with the digest of the sentencepiece model the ids belong to.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from storage import location, remove_tree, written_locally

TABLE_FILE = "shortlist.npz"
N_SPECIAL = 4  # BOS, PAD, EOS, UNK: always in a shortlist, never a candidate
COUNT_SCHEMA = pa.schema([("src", pa.int32()), ("tgt", pa.int32()), ("n", pa.int64())])
# A block's pair counts as they go through the exchange: 12 bytes a row (a block's count fits
# 32 bits), `id` and `bucket` left behind. `id` names the spill file of the rows a scatter task
# gets, by the smallest it holds, so it must differ from row to row: Ray Data cuts a map's
# output into blocks of at most `target_max_block_size` (a block's pairs are hundreds of MB),
# and pieces of one block named alike overwrote one another (rows lost). Row i of the block
# whose first id is f: f * 2**32 + i.
PAIR_SCHEMA = pa.schema([("id", pa.int64()), ("bucket", pa.int32()), ("src", pa.int32()),
                         ("tgt", pa.int32()), ("n", pa.int32())])
# Counted pairs whose pair keys are sorted together. A pair's rows, distinct within a run: 486
# on newstest En-Fr in runs of 3,000, 395 in runs of 9,000; 611 on the benchmark's synthetic
# split in runs of 10,000, 462 in runs of 50,000 at 2.9x the memory (~1.7 GB a task).
COUNT_CHUNK = 10_000
PAIR_ROWS_PER_SENTENCE = 600  # a sentence pair's rows, at most about (docs/benchmarks.md)
ROWS_PER_BUCKET = 10_000_000  # what a bucket's task sums and ranks: ~120 MB in, ~0.5 GB at work


def vocab_digest(spm_model: str | Path) -> str:
    """sha256 of the sentencepiece model file: the ids a table holds mean these pieces."""
    return hashlib.sha256(location(spm_model).read_bytes()).hexdigest()


def _sentence_tokens(batch: pa.Table, stride: int) -> tuple[list, list]:
    """The distinct non-special source and target ids of each counted pair of a block of
    encoded rows (id, src, tgt): only rows with id % stride == 0 (a deterministic sample)."""
    ids = batch.column("id").to_numpy()
    keep = np.flatnonzero(ids % stride == 0) if stride > 1 else np.arange(len(ids))
    srcs, tgts = batch.column("src").to_pylist(), batch.column("tgt").to_pylist()
    src_ids, tgt_ids = [], []
    for i in keep.tolist():
        s = np.unique(np.asarray(srcs[i], dtype=np.int64))
        t = np.unique(np.asarray(tgts[i], dtype=np.int64))
        src_ids.append(s[s >= N_SPECIAL])
        tgt_ids.append(t[t >= N_SPECIAL])
    return src_ids, tgt_ids


def _counted(keys: list) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys, how many of the per-sentence arrays hold each)."""
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.unique(np.concatenate(keys), return_counts=True)


def _pair_keys(src_ids: list, tgt_ids: list) -> list:
    return [(s[:, None] << 32 | t[None, :]).ravel() for s, t in zip(src_ids, tgt_ids)]


def _singles(src_ids: list, tgt_ids: list) -> tuple:
    """(s, t, n) columns of the token rows: (s, -1, n), (-1, t, n) and (-1, -1, pairs)."""
    s, ns = _counted(src_ids)
    t, nt = _counted(tgt_ids)
    return (np.concatenate([s, np.full_like(t, -1), [-1]]),
            np.concatenate([np.full_like(s, -1), t, [-1]]),
            np.concatenate([ns, nt, [len(src_ids)]]))


def _count_table(s, t, n) -> pa.Table:
    return pa.table({"src": np.asarray(s).astype(np.int32), "tgt": np.asarray(t).astype(np.int32),
                     "n": np.asarray(n).astype(np.int64)}, schema=COUNT_SCHEMA)


def cooccurrence_block(batch: pa.Table, stride: int = 1) -> pa.Table:
    """Sentence counts of one block of encoded rows (id, src, tgt), as (src, tgt, n) rows:
    (s, t, n) for token pairs, (s, -1, n) for source tokens, (-1, t, n) for target tokens and
    (-1, -1, n) for the pairs counted. Only rows with id % stride == 0 are counted (a
    deterministic sample). The stage counts the same in two parts, `token_counts` and
    `pair_counts`; this is both at once (`table_in_memory`)."""
    src_ids, tgt_ids = _sentence_tokens(batch, stride)
    keys, n = _counted(_pair_keys(src_ids, tgt_ids))
    s1, t1, n1 = _singles(src_ids, tgt_ids)
    return _count_table(np.concatenate([keys >> 32, s1]),
                        np.concatenate([keys & 0xFFFFFFFF, t1]), np.concatenate([n, n1]))


def token_counts(batch: pa.Table, stride: int = 1) -> pa.Table:
    """The token rows of `cooccurrence_block` only: at most 2 V + 1 rows a block."""
    return _count_table(*_singles(*_sentence_tokens(batch, stride)))


def pair_counts(batch: pa.Table, stride: int, n_buckets: int) -> Iterator[pa.Table]:
    """The pair rows of `cooccurrence_block`, distinct within each run of COUNT_CHUNK counted
    pairs (a table each), with an id of their own (from the block's first id) and each row's
    bucket (its source id modulo n_buckets) for the exchange (PAIR_SCHEMA)."""
    src_ids, tgt_ids = _sentence_tokens(batch, stride)
    first = int(batch.column("id").to_numpy().min()) if batch.num_rows else 0
    if first >= 2**31:
        raise ValueError(f"row id {first} past 2**31: the pair rows' ids would overflow")
    done = 0
    for a in range(0, len(src_ids), COUNT_CHUNK):
        keys, n = _counted(_pair_keys(src_ids[a:a + COUNT_CHUNK], tgt_ids[a:a + COUNT_CHUNK]))
        s = keys >> 32
        yield pa.table({"id": (first << 32) + done + np.arange(len(keys), dtype=np.int64),
                        "bucket": (s % n_buckets).astype(np.int32), "src": s.astype(np.int32),
                        "tgt": (keys & 0xFFFFFFFF).astype(np.int32), "n": n.astype(np.int32)},
                       schema=PAIR_SCHEMA)
        done += len(keys)


def best_targets_of(group: pa.Table, k: int, target_counts: np.ndarray,
                    source_counts: np.ndarray) -> pa.Table:
    """A bucket's pair rows (src, tgt, n: per-block counts, any order, a pair in several
    rows) -> each of its source tokens' k best targets by Dice over the summed counts, best
    first, ties by the smaller id: rows (src, targets, rows_in), rows_in the group's row count
    on the first row and 0 on the others."""
    if not group.num_rows:
        return pa.table({"src": pa.array([], pa.int32()),
                         "targets": pa.array([], pa.list_(pa.int32())),
                         "rows_in": pa.array([], pa.int64())})
    s = group.column("src").to_numpy().astype(np.int64)
    key = s << 32 | group.column("tgt").to_numpy().astype(np.int64)
    uniq, where = np.unique(key, return_inverse=True)
    c = np.bincount(where, weights=group.column("n").to_numpy().astype(np.float64))  # exact
    s, t = uniq >> 32, uniq & 0xFFFFFFFF
    dice = 2.0 * c / (source_counts[s] + target_counts[t])
    order = np.lexsort((t, -dice, s))  # by source token, then Dice down, then the target id
    s, t = s[order], t[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    rank = np.arange(len(s)) - np.repeat(starts, np.diff(np.r_[starts, len(s)]))
    best = rank < k
    offsets = np.r_[0, np.cumsum(np.minimum(np.diff(np.r_[starts, len(s)]), k))]
    rows_in = np.zeros(len(starts), np.int64)
    rows_in[0] = group.num_rows  # the rows this call was given, once: checked against the spill
    return pa.table({"src": pa.array(s[starts].astype(np.int32), pa.int32()),  # one row each
                     "targets": pa.ListArray.from_arrays(
                         pa.array(offsets.astype(np.int32), pa.int32()),
                         pa.array(t[best].astype(np.int32), pa.int32())),
                     "rows_in": rows_in})


def table_in_memory(src: list[list[int]], tgt: list[list[int]], vocab_size: int, k: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(table, target_order) of a small corpus counted in this process: the stage's own
    functions without Ray (benchmarks, tests), all source tokens in one bucket."""
    counts = cooccurrence_block(pa.table({"id": list(range(len(src))), "src": src,
                                          "tgt": tgt}))
    s, t, n = (counts.column(c).to_numpy() for c in ("src", "tgt", "n"))
    src_counts, tgt_counts = np.zeros(vocab_size), np.zeros(vocab_size)
    tgt_counts[t[(s == -1) & (t >= 0)]] = n[(s == -1) & (t >= 0)]
    src_counts[s[(t == -1) & (s >= 0)]] = n[(t == -1) & (s >= 0)]
    table = np.full((vocab_size, k), -1, dtype=np.int32)
    pairs = (s >= 0) & (t >= 0)
    best = best_targets_of(pa.table({"src": s[pairs], "tgt": t[pairs], "n": n[pairs]}), k,
                           tgt_counts, src_counts)
    for src_id, targets in zip(best.column("src").to_pylist(),
                               best.column("targets").to_pylist()):
        table[src_id, :len(targets)] = targets
    order = np.lexsort((np.arange(vocab_size), -tgt_counts))
    order = np.concatenate([np.arange(N_SPECIAL), order[order >= N_SPECIAL]]).astype(np.int32)
    return table, order


def build_table(encoded_train: str | Path, spm_model: str | Path, vocab_size: int, k: int,
                sample_pairs: int, rows: int, out_dir: Path, exchange: str = "files") -> dict:
    """Count the encoded training split (`rows` pairs, at most `sample_pairs` of them counted)
    on Ray Data and write `out_dir/shortlist.npz`; returns the manifest fields. The pair rows
    go through `exchange` ("files": spill files in `out_dir/.pairs`, which must not exist
    before, removed after, failed or not; "ray": Ray Data's groupby)."""
    from preprocessing.exchange import group_by
    from preprocessing.parts import read_stage
    from preprocessing.stages import execution_settings

    stride = max(1, -(-rows // sample_pairs))  # every stride-th pair: at most sample_pairs
    counted_rows = -(-rows // stride)
    encoded = read_stage(encoded_train, ["id", "src", "tgt"])
    # 1. each token's sentence count and the pairs counted (V-sized: summed here)
    src_counts, tgt_counts, counted = np.zeros(vocab_size), np.zeros(vocab_size), 0
    singles = encoded.map_batches(token_counts, batch_size=None, batch_format="pyarrow",
                                  fn_kwargs={"stride": stride})
    for b in execution_settings(singles).iter_batches(batch_size=None, batch_format="pyarrow"):
        s, t = b.column("src").to_numpy(), b.column("tgt").to_numpy()
        n = b.column("n").to_numpy()
        np.add.at(tgt_counts, t[(s == -1) & (t >= 0)], n[(s == -1) & (t >= 0)])
        np.add.at(src_counts, s[(t == -1) & (s >= 0)], n[(t == -1) & (s >= 0)])
        counted += int(n[(s == -1) & (t == -1)].sum())
    # 2. the pairs, by bucket of source tokens: each bucket's totals and its tokens' k best
    n_buckets = min(1024, max(1, -(-counted_rows * PAIR_ROWS_PER_SENTENCE // ROWS_PER_BUCKET)))
    pairs = encoded.map_batches(pair_counts, batch_size=None, batch_format="pyarrow",
                                fn_kwargs={"stride": stride, "n_buckets": n_buckets})
    spill = location(out_dir) / ".pairs"
    if spill.exists():  # (the pipeline's stage folders are fresh: a caller's own folder)
        raise RuntimeError(f"{spill} exists: the spill files of another count? Remove it, or "
                           "give another out_dir")
    table = np.full((vocab_size, k), -1, dtype=np.int32)  # -1: no more candidates
    gathered = 0
    try:
        best, pair_rows = group_by(pairs, key="bucket", n_keys=n_buckets, fn=best_targets_of,
                                   fn_kwargs={"k": k, "target_counts": tgt_counts,
                                              "source_counts": src_counts},
                                   how=exchange, spill_dir=spill, label="shortlist (pairs)",
                                   columns=["src", "tgt", "n"])
        for b in execution_settings(best).iter_batches(batch_size=None,
                                                       batch_format="pyarrow"):
            for s, targets in zip(b.column("src").to_pylist(), b.column("targets").to_pylist()):
                table[s, :len(targets)] = targets
            gathered += int(b.column("rows_in").to_numpy().sum())
    finally:
        remove_tree(spill)
    if pair_rows is not None and gathered != pair_rows:  # (a spill file lost or read twice)
        raise RuntimeError(f"shortlist: {gathered:,} pair rows ranked but {pair_rows:,} "
                           "spilled")
    # Targets by sentence count, most frequent first (ties by id); specials first of all.
    order = np.lexsort((np.arange(vocab_size), -tgt_counts))
    order = np.concatenate([np.arange(N_SPECIAL), order[order >= N_SPECIAL]]).astype(np.int32)
    meta = {"vocab_digest": vocab_digest(spm_model), "vocab_size": vocab_size, "k": k,
            "pairs_counted": counted, "stride": stride}
    with written_locally(out_dir / TABLE_FILE) as path:
        np.savez(path, table=table, target_order=order, meta=np.array(json.dumps(meta)))
    return {**meta, "sources_with_candidates": int((table[:, 0] >= 0).sum()),
            "pair_buckets": n_buckets,
            **({"pair_rows": pair_rows} if pair_rows is not None else {})}
