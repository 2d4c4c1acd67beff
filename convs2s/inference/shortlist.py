"""Vocabulary selection (the paper's §5.4 setup, after L'Hostis et al. 2016): per search batch,
the output layer fc3 is cut to a shortlist of target tokens, the `frequent` most frequent ones
plus, for each source token of the batch, its best candidates in the lexical table that
preprocessing learned from the training pairs (`preprocessing/lexical.py`). The special
tokens (ids 0-3: BOS, PAD, EOS, UNK) are always in, at the same positions, so the search's
constraints index them as in the full vocabulary.

    table = Shortlist.load("shortlist.npz", spm_model="spm.model")  # refuses other data
    ids = table.for_batch(src_tokens, frequent=2000)   # sorted LongTensor C, C << V
    hyps = generate([model], src_tokens, src_lengths, vocab=ids)

Imports only torch and numpy.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

N_SPECIAL = 4  # BOS, PAD, EOS, UNK


class ShortlistError(ValueError):
    """A lexical table that does not fit the model or its vocabulary."""


class Shortlist:
    """A lexical table: `table` V x k candidate targets per source token (-1: none),
    `target_order` V target ids, most frequent first (the specials first of all)."""

    def __init__(self, table: torch.Tensor, target_order: torch.Tensor, meta: dict,
                 path: str = ""):
        self.table, self.target_order, self.meta, self.path = table, target_order, meta, path
        self._frequent = target_order[target_order >= N_SPECIAL]  # most frequent first

    @classmethod
    def load(cls, path: str | Path, spm_model: str | Path | None = None,
             vocab_size: int | None = None,
             target_vocab_size: int | None = None) -> Shortlist:
        """Read `shortlist.npz` (numpy arrays, no pickle). With `spm_model`: refused unless the
        table was learned on data encoded by that very model (same sha256); with `vocab_size`
        (the source vocabulary: the table has a row per source id): refused unless the table
        has those rows; with `target_vocab_size` (default `vocab_size`: one joint
        sentencepiece model): refused unless its candidates (or -1) and `target_order`
        (distinct ids) are ids of that vocabulary. Always refused: candidates below -1, or
        `target_order` ids below 0, which would index the model's output from its end."""
        from storage import local_copy, location

        if not location(path).is_file():
            raise ShortlistError(f"shortlist table {path} does not exist: make one with the "
                                 "preprocessing setting shortlist_per_source (the shortlist/ "
                                 "stage beside the data's spm/)")
        path = local_copy(path)  # a bucket's: fetched once (a file:// URI: its local path)
        try:
            with np.load(path, allow_pickle=False) as z:
                table, order = z["table"], z["target_order"]
                meta = json.loads(str(z["meta"]))
        except (OSError, KeyError, ValueError) as err:
            raise ShortlistError(f"{path} is not a shortlist table ({err})") from None
        if spm_model is not None:
            digest = hashlib.sha256(Path(spm_model).read_bytes()).hexdigest()
            if meta.get("vocab_digest") != digest:
                raise ShortlistError(
                    f"{path} was learned on data with another vocabulary (sentencepiece digest "
                    f"{str(meta.get('vocab_digest'))[:12]}, the model's {spm_model} is "
                    f"{digest[:12]}): use the shortlist/ table of the data this model was "
                    "trained on")
        _check_arrays(path, table, order, vocab_size,
                      vocab_size if target_vocab_size is None else target_vocab_size)
        return cls(torch.from_numpy(table.astype(np.int64)),
                   torch.from_numpy(order.astype(np.int64)), meta, str(path))

    @property
    def vocab_size(self) -> int:
        return self.table.shape[0]

    def for_batch(self, src_tokens: torch.Tensor, frequent: int,
                  per_source: int | None = None) -> torch.Tensor:
        """The sorted target ids a batch may emit: the specials, the `frequent` most frequent
        targets and the first `per_source` candidates (default: all k) of every source token
        of `src_tokens` (any shape; padding and specials are skipped)."""
        src = src_tokens.reshape(-1).cpu()
        src = torch.unique(src[src >= N_SPECIAL])
        cand = self.table[src, :per_source] if per_source is not None else self.table[src]
        ids = torch.cat([torch.arange(N_SPECIAL), self._frequent[:frequent], cand.reshape(-1)])
        return torch.unique(ids[ids >= 0])  # sorted: ids 0-3 at positions 0-3


def _check_arrays(path, table: np.ndarray, order: np.ndarray, src_vocab: int | None,
                  tgt_vocab: int | None) -> None:
    """The table's shape and ids fit the vocabularies (`Shortlist.load`): an id out of range
    would fail only later, as an IndexError inside a search."""
    fix = "use the shortlist/ table of the model's own data"
    if table.ndim != 2 or order.ndim != 1 or not (np.issubdtype(table.dtype, np.integer)
                                                  and np.issubdtype(order.dtype, np.integer)):
        raise ShortlistError(f"{path}: table must be 2-D and target_order 1-D integer arrays, "
                             f"got {table.dtype} {table.shape} and {order.dtype} {order.shape}; "
                             f"{fix}")
    if src_vocab is not None and table.shape[0] != src_vocab:
        raise ShortlistError(f"{path} covers {table.shape[0]} source tokens but the model has "
                             f"{src_vocab}: {fix}")
    below = "" if tgt_vocab is None else f" below {tgt_vocab}"
    bad = (table < -1) if tgt_vocab is None else (table < -1) | (table >= tgt_vocab)
    if bad.any():
        row, k = (int(i) for i in np.argwhere(bad)[0])
        raise ShortlistError(f"{path}: candidate {int(table[row, k])} of source token {row} "
                             f"is not -1 (none) or a target id{below}: {fix}")
    bad = (order < 0) if tgt_vocab is None else (order < 0) | (order >= tgt_vocab)
    if bad.any() or np.unique(order).size != order.size:
        what = f"id {int(order[bad][0])}" if bad.any() else "an id twice"
        raise ShortlistError(f"{path}: target_order holds {what}; it must list distinct target "
                             f"ids{below}: {fix}")
