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
             vocab_size: int | None = None) -> Shortlist:
        """Read `shortlist.npz` (numpy arrays, no pickle). With `spm_model`: refused unless the
        table was learned on data encoded by that very model (same sha256); with `vocab_size`:
        refused unless the table covers that vocabulary."""
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
        if vocab_size is not None and table.shape[0] != vocab_size:
            raise ShortlistError(f"{path} covers {table.shape[0]} tokens but the model has "
                                 f"{vocab_size}: use the table of the model's own data")
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
