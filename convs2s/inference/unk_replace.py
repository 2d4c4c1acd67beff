"""Unknown-word replacement from attention (Jean et al. 2015; fairseq's --replace-unk).

Each `<unk>` piece of a hypothesis is replaced by the source piece it attends to most (the
layer- and model-averaged attention that `convs2s.inference.search.generate` returns), copied
with the codec's word marks (Moses BPE's `@@` continues a word, sentencepiece's `▁` opens one),
as fairseq's --replace-unk copies the attended source token: unks that attend the successive
pieces of a source word spell that word once, and an unk that continues a word adds only its
piece to it. Where the attended piece alone spells a whole source word, that word is copied,
or its entry in an optional dictionary (a word table: it never translates a piece of a word).
A byte piece (sentencepiece's byte fallback) is copied with the other bytes of its character,
those the hypothesis has not just emitted, so that one unk never copies half a character.

    from convs2s.inference.unk_replace import replace_unknowns, unk_replaced_text
    pieces = replace_unknowns(hyp_pieces, src_pieces, hyp["attention"])
    text = unk_replaced_text(codec, ids, source, src_pieces, hyp["attention"], {"Haus": "house"})
"""

from __future__ import annotations

from typing import Callable

import torch

from convs2s.config import UNK
from convs2s.io.text_codec import byte_pieces


def load_dictionary(path: str) -> dict[str, str]:
    """A word-translation table: one `source target` pair per line (whitespace separated); a
    local path or an object's URI (fetched once per node)."""
    from storage import local_copy

    table: dict[str, str] = {}
    try:
        with open(local_copy(path), encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                parts = line.split()
                if not parts:
                    continue
                if len(parts) != 2:
                    raise ValueError(f"dictionary {path}:{i}: expected 'source target', got "
                                     f"{line.strip()!r}")
                table.setdefault(parts[0], parts[1])  # the first entry of a word wins
    except (OSError, UnicodeDecodeError) as err:  # (the flag and file named, not errno alone)
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ValueError(f"dictionary {path}: cannot be read as UTF-8 text of 'source target' "
                         f"lines ({why})") from None
    return table


def replace_unknowns(hyp_pieces: list[str], src_pieces: list[str], attention: torch.Tensor,
                     unk: str = "<unk>", dictionary: dict[str, str] | None = None,
                     words: list[str | None] | None = None,
                     word_piece: Callable[[str], str] = str,
                     characters: list[tuple[int, int] | None] | None = None) -> list[str]:
    """Replace every `unk` of `hyp_pieces` by its most attended source piece.

    attention: S x L with rows = the source positions of `src_pieces` (extra trailing rows, such
    as the source EOS, are ignored) and columns = the hypothesis positions of `hyp_pieces`
    (extra trailing columns, such as the EOS, are ignored).
    words: per source piece, the source word it spells alone, or None for a piece of a longer
    word (default: every piece is a word). A whole word is copied as `word_piece(word)`, through
    `dictionary` when that has it; any other piece is copied as it is.
    characters: per source piece, for a byte piece the span [a, b) of the source pieces that
    hold its character's bytes (the codec's `byte_characters`), else None. An unk attending
    byte s copies the bytes s..b-1 when the hypothesis has just emitted a..s-1, nothing when
    the position before it copied that character, else all of a..b-1: the copied bytes
    joined into one string (`<0xC3><0xBC>`), which the codec decodes with its neighbours.
    """
    if attention.dim() != 2 or attention.shape[0] < len(src_pieces) or \
            attention.shape[1] < len(hyp_pieces):
        raise ValueError(f"attention of shape {tuple(attention.shape)} does not cover "
                         f"{len(src_pieces)} source x {len(hyp_pieces)} hypothesis pieces")
    if words is not None and len(words) != len(src_pieces):
        raise ValueError(f"{len(words)} source words given for {len(src_pieces)} source pieces")
    if not src_pieces:
        return list(hyp_pieces)
    words = list(src_pieces) if words is None else words
    best = attention[: len(src_pieces), : len(hyp_pieces)].argmax(dim=0).tolist()  # per piece
    out, emitted, copied = [], [], None  # emitted: the pieces so far, byte runs split
    for j, piece in enumerate(hyp_pieces):
        char = None
        if piece == unk:
            s, word = best[j], words[best[j]]
            if word is not None and src_pieces[s] != word_piece(word) and j + 1 < len(best) \
                    and hyp_pieces[j + 1] == unk and best[j + 1] == s + 1 \
                    and s + 1 < len(words) and words[s + 1] is None:
                word = None  # (a bare word mark: the next unk goes on spelling its word
                # piece by piece, so this one copies the mark only)
            char = characters[s] if characters and word is None else None
            if char is not None:
                a, b = char
                if s > a and emitted[len(emitted) - (s - a):] == src_pieces[a:s]:
                    piece = "".join(src_pieces[s:b])  # the rest of the character
                elif copied == char:
                    piece = ""  # the position before copied this character whole
                else:
                    piece = "".join(src_pieces[a:b])
            else:
                piece = src_pieces[s] if word is None else \
                    word_piece(dictionary.get(word, word) if dictionary else word)
        copied = char
        out.append(piece)
        emitted += byte_pieces(piece) if char is not None else [piece]
    return out


def unk_replaced_text(codec, ids: list[int], source: str, src_pieces: list[str],
                      attention: torch.Tensor, dictionary: dict[str, str] | None = None) -> str:
    """The text of target `ids` (no EOS) with each <unk> replaced (the module docstring):
    `codec` is the checkpoint's (`convs2s.io.text_codec`), `source` the normalized line and
    `src_pieces` its pieces as encoded, `attention` the hypothesis's (source pieces + EOS) x
    (target pieces + EOS) matrix."""
    replaced = replace_unknowns([codec.target_piece(i) for i in ids], src_pieces, attention,
                                unk=codec.target_piece(UNK), dictionary=dictionary,
                                words=codec.source_words(source, src_pieces),
                                word_piece=codec.word_piece,
                                characters=codec.byte_characters(src_pieces))
    return codec.join_with_words(ids, replaced)
