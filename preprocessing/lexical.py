"""The lexical table behind vocabulary selection (the paper's §5.4 setup, after L'Hostis et al.
2016): for each source token, the target tokens that co-occur with it most specifically in the
training pairs, and the target tokens ranked by how many training sentences hold them.

At search time (`convs2s.inference.shortlist`) the output layer of a batch is cut to the most
frequent target tokens plus, for each source token of the batch, its candidates here: a few thousand
rows of fc3 instead of the whole vocabulary.

Counted on Ray Data from the encoded training split (one sentence pair counts each token and
each (source, target) token pair once):

    rows = read_stage(encoded/train).map_batches(cooccurrence_block)   # per-block counts
    counts = rows.groupby(["src", "tgt"]).sum("n")                    # exact totals
    table = counts.groupby("src").map_groups(best_targets)            # top k per source token

A candidate's score is the Dice coefficient 2 c(s, t) / (c(s) + c(t)) over sentence counts,
which ranks a token's translations above tokens that are merely frequent everywhere (those the
frequency list brings in anyway). Written as `shortlist.npz` (numpy arrays only, loaded without
pickle) with the digest of the sentencepiece model the ids belong to.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from storage import location, written_locally

TABLE_FILE = "shortlist.npz"
N_SPECIAL = 4  # BOS, PAD, EOS, UNK: always in a shortlist, never a candidate
COUNT_SCHEMA = pa.schema([("src", pa.int32()), ("tgt", pa.int32()), ("n", pa.int64())])


def vocab_digest(spm_model: str | Path) -> str:
    """sha256 of the sentencepiece model file: the ids a table holds mean these pieces."""
    return hashlib.sha256(location(spm_model).read_bytes()).hexdigest()


def cooccurrence_block(batch: pa.Table, stride: int = 1) -> pa.Table:
    """Sentence counts of one block of encoded rows (id, src, tgt), as (src, tgt, n) rows:
    (s, t, n) for token pairs, (s, -1, n) for source tokens, (-1, t, n) for target tokens and
    (-1, -1, n) for the pairs counted. Only rows with id % stride == 0 are counted (a
    deterministic sample)."""
    ids = batch.column("id").to_numpy()
    keep = np.flatnonzero(ids % stride == 0) if stride > 1 else np.arange(len(ids))
    srcs, tgts = batch.column("src").to_pylist(), batch.column("tgt").to_pylist()
    pairs, src_ids, tgt_ids = [], [], []
    for i in keep.tolist():
        s = np.unique(np.asarray(srcs[i], dtype=np.int64))
        t = np.unique(np.asarray(tgts[i], dtype=np.int64))
        s, t = s[s >= N_SPECIAL], t[t >= N_SPECIAL]
        src_ids.append(s)
        tgt_ids.append(t)
        pairs.append((s[:, None] << 32 | t[None, :]).ravel())
    cols = []
    for keys, make in ((pairs, lambda k: (k >> 32, k & 0xFFFFFFFF)),
                       (src_ids, lambda k: (k, np.full_like(k, -1))),
                       (tgt_ids, lambda k: (np.full_like(k, -1), k))):
        if not keys:
            continue
        uniq, n = np.unique(np.concatenate(keys), return_counts=True)
        s, t = make(uniq)
        cols.append((s, t, n))
    cols.append((np.array([-1]), np.array([-1]), np.array([len(keep)])))
    s, t, n = (np.concatenate(c) for c in zip(*cols))
    return pa.table({"src": s.astype(np.int32), "tgt": t.astype(np.int32),
                     "n": n.astype(np.int64)}, schema=COUNT_SCHEMA)


def best_targets(group: pa.Table, k: int, target_counts: np.ndarray,
                 source_counts: np.ndarray) -> pa.Table:
    """One source token's (s, t, c(s, t)) rows -> its k best targets by Dice, best first."""
    s = int(group.column("src")[0].as_py())
    t = group.column("tgt").to_numpy()
    c = group.column("sum(n)").to_numpy().astype(np.float64)
    dice = 2.0 * c / (source_counts[s] + target_counts[t])
    best = np.lexsort((t, -dice))[:k]  # ties: the smaller id first (deterministic)
    return pa.table({"src": pa.array([s], pa.int32()),
                     "targets": pa.array([t[best].astype(np.int32).tolist()],
                                         pa.list_(pa.int32()))})


def table_in_memory(src: list[list[int]], tgt: list[list[int]], vocab_size: int, k: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(table, target_order) of a small corpus counted in this process: the stage's own
    functions without Ray (benchmarks, tests)."""
    counts = cooccurrence_block(pa.table({"id": list(range(len(src))), "src": src,
                                          "tgt": tgt}))
    s, t, n = (counts.column(c).to_numpy() for c in ("src", "tgt", "n"))
    src_counts, tgt_counts = np.zeros(vocab_size), np.zeros(vocab_size)
    tgt_counts[t[(s == -1) & (t >= 0)]] = n[(s == -1) & (t >= 0)]
    src_counts[s[(t == -1) & (s >= 0)]] = n[(t == -1) & (s >= 0)]
    table = np.full((vocab_size, k), -1, dtype=np.int32)
    pairs = (s >= 0) & (t >= 0)
    by_src = np.argsort(s[pairs], kind="stable")
    g = pa.table({"src": s[pairs][by_src], "tgt": t[pairs][by_src], "sum(n)": n[pairs][by_src]})
    ids, starts = np.unique(g.column("src").to_numpy(), return_index=True)
    for src_id, a, b in zip(ids.tolist(), starts.tolist(), [*starts[1:].tolist(), len(g)]):
        row = best_targets(g.slice(a, b - a), k, tgt_counts, src_counts)
        targets = row.column("targets")[0].as_py()
        table[src_id, :len(targets)] = targets
    order = np.lexsort((np.arange(vocab_size), -tgt_counts))
    order = np.concatenate([np.arange(N_SPECIAL), order[order >= N_SPECIAL]]).astype(np.int32)
    return table, order


def build_table(encoded_train: str | Path, spm_model: str | Path, vocab_size: int, k: int,
                sample_pairs: int, rows: int, out_dir: Path) -> dict:
    """Count the encoded training split (`rows` pairs, at most `sample_pairs` of them counted)
    on Ray Data and write `out_dir/shortlist.npz`; returns the manifest fields."""
    from ray.data.expressions import col

    from preprocessing.parts import read_stage
    from preprocessing.stages import execution_settings

    stride = max(1, -(-rows // sample_pairs))  # every stride-th pair: at most sample_pairs
    ds = read_stage(encoded_train, ["id", "src", "tgt"]).map_batches(
        cooccurrence_block, batch_size=None, batch_format="pyarrow",
        fn_kwargs={"stride": stride})
    counts = execution_settings(ds.groupby(["src", "tgt"]).sum("n")).materialize()
    src_counts, tgt_counts, counted = np.zeros(vocab_size), np.zeros(vocab_size), 0
    singles = counts.filter(expr=(col("src") == -1) | (col("tgt") == -1))
    for b in singles.iter_batches(batch_size=None, batch_format="pyarrow"):
        s, t = b.column("src").to_numpy(), b.column("tgt").to_numpy()
        n = b.column("sum(n)").to_numpy()
        tgt_counts[t[(s == -1) & (t >= 0)]] = n[(s == -1) & (t >= 0)]
        src_counts[s[(t == -1) & (s >= 0)]] = n[(t == -1) & (s >= 0)]
        counted += int(n[(s == -1) & (t == -1)].sum())
    pairs = counts.filter(expr=(col("src") >= 0) & (col("tgt") >= 0))
    best = pairs.groupby("src").map_groups(
        best_targets, batch_format="pyarrow",
        fn_kwargs={"k": k, "target_counts": tgt_counts, "source_counts": src_counts})
    table = np.full((vocab_size, k), -1, dtype=np.int32)  # -1: no more candidates
    for b in execution_settings(best).iter_batches(batch_size=None, batch_format="pyarrow"):
        for s, targets in zip(b.column("src").to_pylist(), b.column("targets").to_pylist()):
            table[s, :len(targets)] = targets
    # Targets by sentence count, most frequent first (ties by id); specials first of all.
    order = np.lexsort((np.arange(vocab_size), -tgt_counts))
    order = np.concatenate([np.arange(N_SPECIAL), order[order >= N_SPECIAL]]).astype(np.int32)
    meta = {"vocab_digest": vocab_digest(spm_model), "vocab_size": vocab_size, "k": k,
            "pairs_counted": counted, "stride": stride}
    with written_locally(out_dir / TABLE_FILE) as path:
        np.savez(path, table=table, target_order=order, meta=np.array(json.dumps(meta)))
    return {**meta, "sources_with_candidates": int((table[:, 0] >= 0).sum())}
