"""Encoding: cleaned text -> sentencepiece ids (int32, EOS-terminated), one Ray task per part.

Each task reads one part of `clean/<split>/` and writes it, encoded, as the part of the same
name in `encoded/<split>/`: rows
`{"id": int64, "src": list<int32>, "tgt": list<int32>, "src_len": int32, "tgt_len": int32}`.
A worker process loads the model from the spm stage folder (the output root is storage every
worker shares: they write the stage parts there too) once and keeps it for the next parts
(cached by the model file's content, so a retrained model at the same path is reloaded).
Plain tasks rather than an actor pool: no actor start-up, and the read fuses into the task.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from preprocessing.stages import part_name, parts_dataset, write_part
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
    """One sentencepiece model; called on a block of clean rows, writes it as one part."""

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


_ENCODERS: dict[tuple[str, str], Encoder] = {}  # this worker's model: (content hash, out_dir)


def _encoder(model_path: str, out_dir: str) -> Encoder:
    key = (hashlib.sha256(Path(model_path).read_bytes()).hexdigest(), out_dir)
    if key not in _ENCODERS:
        _ENCODERS.clear()  # one model per worker process at a time
        _ENCODERS[key] = Encoder(model_path, out_dir)
    return _ENCODERS[key]


def encode_part(row: dict, *, model_path: str, out_dir: str) -> dict:
    """Ray Data row function: encode the clean part `row["path"]`, return its stats row."""
    table = pq.read_table(row["path"], columns=["id", "src", "tgt"])
    stats = _encoder(model_path, out_dir)(table)
    return {k: int(v[0]) for k, v in stats.items()}


def encode_dataset(clean_dir: str, out_dir: str, model_path: str,
                   concurrency: int | None = None) -> ray.data.Dataset:
    """Stats rows (one per part) of encoding `clean_dir` into parts under `out_dir` (lazy)."""
    return parts_dataset(clean_dir).map(
        encode_part, fn_kwargs={"model_path": model_path, "out_dir": out_dir},
        concurrency=concurrency or None)
