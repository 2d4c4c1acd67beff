"""Unknown-word replacement from attention (Jean et al. 2015; fairseq's --replace-unk).

Each `<unk>` in a hypothesis is replaced by the source word it attends to most (the layer- and
model-averaged attention that `convs2s.inference.search.generate` returns), translated through an
optional dictionary, else copied as is.

    from convs2s.inference.unk_replace import replace_unknowns
    words = replace_unknowns(hyp_words, src_words, hyp["attention"], dictionary={"Haus": "house"})
"""

from __future__ import annotations

import torch


def load_dictionary(path: str) -> dict[str, str]:
    """A word-translation table: one `source target` pair per line (whitespace separated); a
    local path or an object's URI (fetched once per node)."""
    from storage import local_copy

    table: dict[str, str] = {}
    with open(local_copy(path), encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise ValueError(f"{path}:{i}: expected 'source target', got {line.strip()!r}")
            table.setdefault(parts[0], parts[1])  # the first entry of a word wins
    return table


def replace_unknowns(hyp_words: list[str], src_words: list[str], attention: torch.Tensor,
                     unk: str = "<unk>", dictionary: dict[str, str] | None = None) -> list[str]:
    """Replace every `unk` of `hyp_words` by its most attended source word (or its entry in
    `dictionary`).

    attention: S x L with rows = the source positions of `src_words` (extra trailing rows, such
    as the source EOS, are ignored) and columns = the hypothesis positions of `hyp_words`
    (extra trailing columns, such as the EOS, are ignored).
    """
    if attention.dim() != 2 or attention.shape[0] < len(src_words) or \
            attention.shape[1] < len(hyp_words):
        raise ValueError(f"attention of shape {tuple(attention.shape)} does not cover "
                         f"{len(src_words)} source x {len(hyp_words)} hypothesis words")
    if not src_words:
        return list(hyp_words)
    best = attention[: len(src_words), : len(hyp_words)].argmax(dim=0).tolist()  # per hyp word
    out = []
    for j, word in enumerate(hyp_words):
        if word == unk:
            src = src_words[best[j]]
            word = dictionary.get(src, src) if dictionary else src
        out.append(word)
    return out
