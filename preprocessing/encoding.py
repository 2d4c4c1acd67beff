"""Encoding: cleaned text -> token ids (int32, EOS-terminated), on Ray tasks.

The ids come from a *vocabulary*: the joint sentencepiece model the pipeline learned
(`SentencePieceVocabulary`), or a fixed one handed to `run_pipeline(vocabulary=)`, such as a
checkpoint's text pipeline when fine-tuning keeps a model's ids (convs2s.io.text_codec's
`CheckpointVocabulary`; this package does not import it). A vocabulary pickles to the tasks
and has `encoder() -> encode(lines, side) -> list of id lists` (side "src" or "tgt", no EOS),
`fingerprint` (a digest of its files: part of the data key), `src_size` / `tgt_size`,
`spm_model` (a sentencepiece model path, or "") and `files` (what travels with the weights).

`PartEncoder` reads a clean part, encodes it (`Encoder`) and writes it with `PartSink.write`.
The clean parts' paths stream through at most `concurrency` Ray tasks (`encode_part_paths`);
each worker process loads the vocabulary once and keeps it for the next parts.

Tasks, not an actor pool: Ray Data releases a finished pool's actors by dropping its handles,
and the blocks' lineage can keep them alive, idle but holding their CPUs, until Python's
garbage collector runs. On a 2-CPU node the next encode pool then waited for ever for CPUs
(seen in the test suite); a task gives its CPU back when it returns.

Rows `{"id": int64, "src": list<int32>, "tgt": list<int32>, "src_len": int32, "tgt_len": int32}`;
each clean part becomes the encoded part named by its first id.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from ray.data.datasource import WriteResult

from preprocessing.errors import user_errors
from preprocessing.parts import PartSink
from preprocessing.stages import execution_settings, part_paths
from preprocessing.vocab import EOS, UNK, load
from storage import stamp

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


class SentencePieceVocabulary:
    """The pipeline's own vocabulary: one joint sentencepiece model for both sides."""

    def __init__(self, model_path: str, size: int = 0):
        self.spm_model = str(model_path)
        self.src_size = self.tgt_size = size
        self.files = (self.spm_model,)

    def encoder(self):
        sp = load(self.spm_model)
        return lambda lines, side: sp.encode(lines, out_type=int, num_threads=1)


class Encoder:
    """One vocabulary's encoder, loaded once; each call encodes one block of clean rows."""

    def __init__(self, vocabulary):
        self.encode = vocabulary.encoder()

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Encoded rows sorted by id, with `part` (the block's first id) and `reason` (null)."""
        batch = batch.take(np.argsort(batch["id"].to_numpy(), kind="stable"))
        ids = batch["id"].to_numpy()
        src = self.encode(batch["src"].to_pylist(), "src")
        tgt = self.encode(batch["tgt"].to_pylist(), "tgt")
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


class PartEncoder:
    """One `Encoder` and the encoded parts' sink; each call reads the listed clean parts, encodes
    them and writes each as the encoded part named by its first id (`PartSink.write`, the write
    operator's own code), returning the write's counts.

    The tasks read and write their parts themselves rather than taking blocks from a parquet
    read and handing them to the write operator: that dataflow moves every block through the
    object store twice, whose touched pages stay resident, and at 10M pairs it raised the
    stage's peak memory from 1.2 GB to 2.8 GB (docs/benchmarks.md).
    """

    def __init__(self, vocabulary, out_dir: str):
        self.encoder = Encoder(vocabulary)
        self.sink = PartSink(out_dir, part_key="part", schema=ENCODED_SCHEMA,
                             stats_fn=encoded_stats)

    def __call__(self, batch: pa.Table) -> pa.Table:
        returns = [self.sink.write([self.encoder(pq.read_table(p, columns=["id", "src", "tgt"]))],
                                   None) for p in batch["path"].to_pylist()]
        return pa.table({"write_return": [json.dumps(r) for r in returns]})


# Per worker process: the PartEncoder of the last (vocabulary files, out_dir) it encoded for.
_PART_ENCODER: dict = {}


def encode_part_paths(batch: pa.Table, vocabulary, out_dir: str) -> pa.Table:
    """Ray Data task function: the listed clean parts encoded and written (`PartEncoder`),
    loading the vocabulary once per worker process. The key holds the files' sizes and mtimes,
    so a vocabulary rebuilt at the same path is loaded again."""
    key = (out_dir, tuple((f, *stamp(f)) for f in vocabulary.files if f))
    if key not in _PART_ENCODER:
        _PART_ENCODER.clear()
        _PART_ENCODER[key] = PartEncoder(vocabulary, out_dir)
    return _PART_ENCODER[key](batch)


def encode_parts(clean_dir: str, out_dir: str, vocabulary, concurrency: int,
                 label: str) -> dict:
    """Encode every clean part under `clean_dir` into `out_dir` on at most `concurrency` tasks
    at a time; the summed counts (PartSink.totals, checked for parts written twice)."""
    import ray.data

    paths = part_paths(clean_dir)
    ds = ray.data.from_items([{"path": p} for p in paths], override_num_blocks=len(paths))
    ds = execution_settings(ds.map_batches(
        encode_part_paths, batch_size=1, batch_format="pyarrow",
        compute=ray.data.TaskPoolStrategy(size=max(1, min(concurrency, len(paths)))),
        fn_kwargs={"vocabulary": vocabulary, "out_dir": out_dir}))
    sink = PartSink(out_dir, part_key="part", schema=ENCODED_SCHEMA, label=label)
    t0, returns = time.monotonic(), []
    with user_errors():
        for row in ds.iter_rows():
            returns.append(json.loads(row["write_return"]))
    sink.on_write_complete(WriteResult(num_rows=0, size_bytes=0, write_returns=returns))
    sink.log_done(t0)
    return sink.totals
