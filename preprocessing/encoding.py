"""Encoding: cleaned text -> sentencepiece ids (int32, EOS-terminated), on an actor pool.

`Encoder` is a callable class: Ray Data starts a pool of `concurrency` actors, each loads the
model once, and the clean parts stream through them (`read_parquet` -> `map_batches(Encoder)`
-> `PartSink`). Rows `{"id": int64, "src": list<int32>, "tgt": list<int32>, "src_len": int32,
"tgt_len": int32}`; each clean part becomes the encoded part named by its first id.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.parts import read_stage
from preprocessing.vocab import EOS, UNK, load

ENCODED_SCHEMA = pa.schema([("id", pa.int64()), ("src", pa.list_(pa.int32())),
                            ("tgt", pa.list_(pa.int32())), ("src_len", pa.int32()),
                            ("tgt_len", pa.int32())])


def ids_array(seqs: list[list[int]]) -> tuple[pa.ListArray, np.ndarray]:
    """list<int32> of the sequences with EOS appended, and their lengths (EOS included)."""
    lengths = np.fromiter((len(s) + 1 for s in seqs), dtype=np.int32, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.full(int(offsets[-1]), EOS, dtype=np.int32)
    for seq, start in zip(seqs, offsets[:-1]):  # the last slot of each sentence keeps EOS
        values[start:start + len(seq)] = seq
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)), lengths


class Encoder:
    """Ray Data callable class: one sentencepiece model per actor, one block per call."""

    def __init__(self, model_path: str):
        self.sp = load(model_path)

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Encoded rows sorted by id, with `part` (the block's first id) and `reason` (null)."""
        batch = batch.take(np.argsort(batch["id"].to_numpy(), kind="stable"))
        ids = batch["id"].to_numpy()
        src = self.sp.encode(batch["src"].to_pylist(), out_type=int, num_threads=1)
        tgt = self.sp.encode(batch["tgt"].to_pylist(), out_type=int, num_threads=1)
        src_arr, src_len = ids_array(src)
        tgt_arr, tgt_len = ids_array(tgt)
        first = int(ids[0]) if len(ids) else 0
        return pa.Table.from_arrays(
            [pa.array(ids, pa.int64()), src_arr, tgt_arr, pa.array(src_len), pa.array(tgt_len),
             pa.array(np.full(len(ids), first, dtype=np.int64)), pa.nulls(len(ids), pa.string())],
            names=ENCODED_SCHEMA.names + ["part", "reason"])


def encoded_stats(kept: pa.Table) -> dict[str, int]:
    """PartSink counts of encoded rows: tokens (EOS included) and unknown pieces per side."""
    out = {}
    for side in ("src", "tgt"):
        out[f"{side}_tokens"] = int(pc.sum(kept[f"{side}_len"]).as_py() or 0)
        flat = pc.list_flatten(kept[side])
        out[f"{side}_unk"] = int(pc.sum(pc.equal(flat, UNK)).as_py() or 0)
    return out


def encode_dataset(clean_dir: str, model_path: str, concurrency: int):
    """Encoded rows of the clean parts under `clean_dir` (lazy), on `concurrency` actors.

    The actors ask for half a CPU each: a pool as large as the node's CPUs then leaves room for
    read_parquet's file listing and reads (one CPU each), which otherwise wait forever.
    """
    import ray.data

    return read_stage(clean_dir, ["id", "src", "tgt"]).map_batches(
        Encoder, batch_size=None, batch_format="pyarrow", num_cpus=0.5,
        compute=ray.data.ActorPoolStrategy(size=max(1, concurrency)),
        fn_constructor_kwargs={"model_path": model_path})
