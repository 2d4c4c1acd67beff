"""Encoding: cleaned text -> sentencepiece ids (int32, EOS-terminated) in a pool of Ray actors.

Each actor loads the model once from the spm stage folder (the output root is storage every
worker shares: they write the stage parts there too); then it encodes whole blocks and writes
each as one part of `encoded/<split>/`: rows
`{"id": int64, "src": list<int32>, "tgt": list<int32>, "src_len": int32, "tgt_len": int32}`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import ray

from preprocessing.stages import part_name, write_part
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
    """Ray Data callable class: one sentencepiece model per actor, one part per block."""

    def __init__(self, model_path: str, out_dir: str):
        self.sp = load(model_path)
        self.out_dir = out_dir

    def __call__(self, batch: pa.Table) -> dict:
        ids = batch["id"].to_numpy()
        src = self.sp.encode(batch["src"].to_pylist(), out_type=int, num_threads=1)
        tgt = self.sp.encode(batch["tgt"].to_pylist(), out_type=int, num_threads=1)
        src_arr, src_len = ids_array(src)
        tgt_arr, tgt_len = ids_array(tgt)
        table = pa.Table.from_arrays([pa.array(ids, pa.int64()), src_arr, tgt_arr,
                                      pa.array(src_len), pa.array(tgt_len)],
                                     schema=ENCODED_SCHEMA)
        table = table.take(np.argsort(ids, kind="stable"))
        if table.num_rows:
            write_part(table, self.out_dir, part_name(int(ids.min())))
        unk = lambda seqs: sum(s.count(UNK) for s in seqs)  # noqa: E731
        return {"rows_in": np.array([len(ids)]), "rows_kept": np.array([len(ids)]),
                "src_tokens": np.array([int(src_len.sum())]),
                "tgt_tokens": np.array([int(tgt_len.sum())]),
                "src_unk": np.array([unk(src)]), "tgt_unk": np.array([unk(tgt)])}


def encode_dataset(clean_dir: str, out_dir: str, model_path: str, actors: int,
                   block_rows: int) -> ray.data.Dataset:
    """Stats rows of encoding `clean_dir` into parts under `out_dir` (lazy until drained)."""
    ds = ray.data.read_parquet(clean_dir).select_columns(["id", "src", "tgt"])
    return ds.map_batches(Encoder, batch_size=block_rows, batch_format="pyarrow",
                          compute=ray.data.ActorPoolStrategy(size=actors),
                          fn_constructor_kwargs={"model_path": model_path,
                                                 "out_dir": out_dir})
