"""Turn one batch row of the preprocessing shards into padded model tensors (numpy only).

A row of `<root>/<task>/batches/<split>/` (docs/design.md) is a whole training batch:
`{"id": list<int64>, "src": list<list<int32>>, "tgt": list<list<int32>>, ...}`, sentences
EOS-terminated without BOS. `collate_arrow` reads it straight from the Arrow buffers (offsets +
flat values, no per-sentence Python loop) and pads with vectorized numpy:

    batch = collate_arrow(table)          # table: pyarrow.Table holding exactly one batch row
    batch = batch.to(device)              # pinned + non_blocking on CUDA
    logits, _ = model(batch.src_tokens, batch.src_lengths, batch.prev_output_tokens)

Both sides are right-padded with PAD. The decoder input is `[EOS] + target[:-1]` (the
reference's convention: EOS doubles as BOS).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from convs2s.config import EOS, PAD


@dataclass
class Batch:
    """Padded tensors of one batch plus the counts the loss and the logs need."""

    src_tokens: torch.Tensor  # B x S int64, right-padded with PAD
    src_lengths: torch.Tensor  # B int64
    prev_output_tokens: torch.Tensor  # B x T int64: [EOS] + target[:-1], then PAD
    target: torch.Tensor  # B x T int64, PAD where there is no token
    ids: np.ndarray  # B int64 sentence ids (for error messages and tests)
    ntokens: int  # non-pad target tokens: the loss normalizer (paper §4.2 / reference)
    src_ntokens: int  # non-pad source tokens
    # ntokens int64: flat (B*T) indices of the non-pad target tokens, found on the host so the
    # fused loss never waits for the device to find them (convs2s.model.loss); or, padded to a
    # static shape (`pad_to`), a B*T bool mask of them
    target_rows: torch.Tensor | None = None
    pad_rows: int = 0  # dummy sentences appended by `pad_to` (the last rows)

    @property
    def nsentences(self) -> int:
        return int(self.src_tokens.shape[0]) - self.pad_rows

    @property
    def padded_tokens(self) -> int:
        """Token slots computed on, source plus target (B*S + B*T)."""
        return int(self.src_tokens.numel() + self.target.numel())

    def to(self, device: torch.device | str) -> Batch:
        device = torch.device(device)
        if self.src_tokens.device == device:
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            if t.device.type == "cpu" and device.type == "cuda":
                # Pinned host memory lets the copy overlap with the previous step's kernels.
                return t.pin_memory().to(device, non_blocking=True)
            return t.to(device)  # already on a GPU (another one, or back to the host)

        return Batch(move(self.src_tokens), move(self.src_lengths),
                     move(self.prev_output_tokens), move(self.target), self.ids,
                     self.ntokens, self.src_ntokens,
                     None if self.target_rows is None else move(self.target_rows),
                     self.pad_rows)


def pad_right(flat: np.ndarray, lengths: np.ndarray, pad: int = PAD) -> np.ndarray:
    """Concatenated sequences (sum(lengths)) -> B x max(lengths) int64, right-padded."""
    width = int(lengths.max()) if len(lengths) else 0
    out = np.full((len(lengths), width), pad, dtype=np.int64)
    # Row-major boolean assignment fills each row's first `length` slots in order.
    out[np.arange(width)[None, :] < lengths[:, None]] = flat
    return out


def _list_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The one row of a list<list<int>> column -> (flat token ids, per-sentence lengths)."""
    col = table.column(name)
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    sentences = col.flatten()  # ListArray: this row's sentences (respects slicing)
    offsets = sentences.offsets.to_numpy()
    lengths = np.diff(offsets).astype(np.int64)
    flat = sentences.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return flat, lengths


def _row_ids(table: pa.Table) -> np.ndarray:
    if "id" not in table.column_names:
        return np.arange(0, dtype=np.int64)
    col = table.column("id")
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return col.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def collate_arrow(table: pa.Table) -> Batch:
    """One batch row (a 1-row Arrow table with `src`, `tgt` and optionally `id`) -> Batch."""
    if table.num_rows != 1:
        raise ValueError(
            f"collate_arrow takes one batch row, got {table.num_rows}; iterate the shard with "
            "iter_batches(batch_size=1, batch_format='pyarrow')"
        )
    missing = {"src", "tgt"} - set(table.column_names)
    if missing:
        raise ValueError(
            f"batch row lacks columns {sorted(missing)} (has {table.column_names}); expected the "
            "batches format of docs/design.md: re-run preprocessing"
        )
    src_flat, src_len = _list_column(table, "src")
    tgt_flat, tgt_len = _list_column(table, "tgt")
    return _collate(src_flat, src_len, tgt_flat, tgt_len, _row_ids(table))


def collate_lists(src: list[list[int]], tgt: list[list[int]], ids=None) -> Batch:
    """Python lists of EOS-terminated token ids -> Batch (tests, small tools)."""
    src_len = np.array([len(s) for s in src], dtype=np.int64)
    tgt_len = np.array([len(t) for t in tgt], dtype=np.int64)
    src_flat = np.fromiter((x for s in src for x in s), dtype=np.int64, count=int(src_len.sum()))
    tgt_flat = np.fromiter((x for t in tgt for x in t), dtype=np.int64, count=int(tgt_len.sum()))
    ids = np.arange(len(src), dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
    return _collate(src_flat, src_len, tgt_flat, tgt_len, ids)


def _collate(src_flat, src_len, tgt_flat, tgt_len, ids) -> Batch:
    _check(src_len, tgt_len, tgt_flat, ids)
    src = pad_right(src_flat, src_len)  # B x S
    target = pad_right(tgt_flat, tgt_len)  # B x T
    prev = np.empty_like(target)
    prev[:, 0] = EOS
    prev[:, 1:] = target[:, :-1]
    prev[np.arange(target.shape[1])[None, :] >= tgt_len[:, None]] = PAD  # B x T
    return Batch(
        src_tokens=torch.from_numpy(src),
        src_lengths=torch.from_numpy(src_len),
        prev_output_tokens=torch.from_numpy(prev),
        target=torch.from_numpy(target),
        ids=ids,
        ntokens=int(tgt_len.sum()),
        src_ntokens=int(src_len.sum()),
        target_rows=torch.from_numpy(np.flatnonzero(target != PAD)),
    )


def _check(src_len: np.ndarray, tgt_len: np.ndarray, tgt_flat: np.ndarray, ids) -> None:
    """Contract checks that cost O(B): a broken shard fails loudly with the sentence ids."""
    where = f"batch with sentence ids {ids[:5].tolist()}{'...' if len(ids) > 5 else ''}"
    fix = "the batches/<split> shards do not follow docs/design.md: re-run preprocessing"
    if len(src_len) == 0:
        raise ValueError(f"empty batch row ({where}); {fix}")
    if len(src_len) != len(tgt_len):
        raise ValueError(f"{where}: {len(src_len)} source vs {len(tgt_len)} target sentences; "
                         f"{fix}")
    if len(ids) and len(ids) != len(src_len):
        raise ValueError(f"{where}: {len(ids)} ids for {len(src_len)} sentences; {fix}")
    if src_len.min() == 0 or tgt_len.min() == 0:
        raise ValueError(f"{where}: empty sentence (EOS missing); {fix}")
    if not np.all(tgt_flat[np.cumsum(tgt_len) - 1] == EOS):
        raise ValueError(f"{where}: a target sentence does not end with EOS={EOS}; {fix}")


# --- static shapes (a step captured once per shape: CUDA graphs) --------------------------------


def static_shape(batch: Batch, max_tokens: int, multiple: int = 8,
                 max_len: int | None = None) -> tuple[int, int, int]:
    """(sentences, source length, target length) to pad `batch` to: `static_dims` of its
    shape."""
    B, S = batch.src_tokens.shape
    return static_dims(B, S, batch.target.shape[1], max_tokens, multiple, max_len)


def static_dims(B: int, S: int, T: int, max_tokens: int, multiple: int = 8,
                max_len: int | None = None) -> tuple[int, int, int]:
    """(sentences, source length, target length) to pad a batch of B sentences, S source and T
    target positions to, so that the batches of one token budget come in few shapes: both
    lengths rounded up to a multiple of `multiple`; the sentence count up to a rung of a ladder
    growing by a quarter (8, 10, 12, 15, 19, 24, ...: about a quarter more sentences at most),
    or to the most a budget-respecting batch can hold at the shortest lengths that round to
    these where that is fewer (the batches stage cuts n * max(S, T) <= max_tokens,
    preprocessing/batching.py): long batches share one count. A batch over the budget (one
    sentence longer than it) keeps its own count. What the padding costs on real batches:
    `python -m benchmarks.static_shapes`. `max_len` (the model's max_positions) caps a rounded
    length, never below the batch's own. Without a batch: the shapes a budget can give
    (convs2s.train.memory_fit probes the largest)."""
    cap = max_len or max(S, T) + multiple
    src_len, tgt_len = (max(n, min(-(-n // multiple) * multiple, cap)) for n in (S, T))
    shortest = max(src_len, tgt_len) - multiple + 1  # the least max(S, T) rounding to these
    rung = 8
    while rung < B:
        rung = round(rung * 1.25)
    return max(B, min(rung, max_tokens // shortest)), src_len, tgt_len


def pad_to(batch: Batch, sentences: int, src_len: int, tgt_len: int) -> Batch:
    """`batch` padded to sentences x src_len (source) and sentences x tgt_len (target), for a
    step compiled or captured once per shape. Its loss and gradients do not change: the model
    is invariant to right padding (pad frames are zero conv inputs and get no attention; the
    decoder is causal), the appended sentences have no target tokens, and `target_rows`
    becomes a mask (the fused loss's static-shape form, convs2s.model.loss). An appended
    sentence's source is one EOS: with no token at all its attention would be a softmax over
    nothing (NaN)."""
    B, S = batch.src_tokens.shape
    T = batch.target.shape[1]
    if sentences < B or src_len < S or tgt_len < T:
        raise ValueError(f"pad_to({sentences}, {src_len}, {tgt_len}) cannot hold a batch of "
                         f"{B} sentences x {S} source x {T} target positions")

    def grown(t: torch.Tensor, width: int) -> torch.Tensor:
        out = t.new_full((sentences, width), PAD)
        out[:B, :t.shape[1]] = t
        return out

    src = grown(batch.src_tokens, src_len)
    src[B:, 0] = EOS
    lengths = torch.cat([batch.src_lengths, batch.src_lengths.new_ones(sentences - B)])
    target = grown(batch.target, tgt_len)
    return Batch(src, lengths, grown(batch.prev_output_tokens, tgt_len), target, batch.ids,
                 batch.ntokens, batch.src_ntokens, target_rows=target.reshape(-1).ne(PAD),
                 pad_rows=batch.pad_rows + sentences - B)
