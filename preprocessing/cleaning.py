"""Cleaning and filtering of sentence pairs: Unicode NFC, control characters, whitespace, and
the paper's length / ratio filters (§4.1), as Ray Data map functions that count every drop.

Reasons a row is dropped, checked in this order (first match wins), see `REASONS`:
line_too_long / bad_row / invalid_utf8 (from the reader), nul_byte, empty, too_long (a side over
`max_len` words; in a language written without spaces, its characters), ratio (word-count
ratio over `max_len_ratio`; not for a pair with such a side), duplicate (optional dedupe),
over_max_positions (batching: a side of more pieces than the model's positions,
`max_positions`; checked before the budget, since no budget lets the model take it),
over_max_tokens (batching: one sentence larger than the token budget).

Pure functions (`normalize`, `drop_reason`) are tested without Ray; `clean_block` (or, with
dedupe, `clean_rows` grouped by bucket into `dedupe_group`, see exchange.py) is the stage's Ray
Data function, and `PartSink` (parts.py) writes the kept rows and counts the drops by reason.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.stages import mix64

REASONS = ("line_too_long", "bad_row", "invalid_utf8", "nul_byte", "empty", "too_long", "ratio",
           "duplicate", "over_max_positions", "over_max_tokens")


# Format characters that are part of a word's spelling, kept: the zero-width non-joiner and
# joiner (Persian, the Indic scripts; emoji sequences), which text of any pair may hold (the
# `translation` workflow takes any; deleted, its words and its references were misspelled)
_SPELLING = frozenset("\u200c\u200d")
_WORD_MARK = "\u2581"  # sentencepiece's space (`normalize`)


def normalize(text: str | None, token_map: dict[str, str] | None = None) -> str:
    """Delete control / non-printing characters, NFC, collapse all whitespace to single spaces.

    Deleted: Unicode categories Cc, Cf, Co, Cs, Cn (controls, zero-width / format characters,
    private use, surrogates, unassigned) except whitespace, which becomes a space, and the
    zero-width (non-)joiner, which spell words (`_SPELLING`, kept since 2026-12-07; folders made
    before keep theirs). That is what `str.isprintable()` rejects, minus the spaces, so clean
    text takes a fast path. U+2581, sentencepiece's word mark, is a space too: the model reads
    it as one, so a side of nothing else encoded to no pieces and trained as a sentence of EOS
    alone (now `empty`; since 2026-12-07, folders made before keep theirs).
    Deleting comes first: a deleted character between a letter and its combining mark would
    otherwise leave them uncomposed, not NFC (output for such text changed on 2026-12-04;
    folders made before keep theirs). `token_map` (PreprocessConfig.token_map) replaces whole
    words last.
    """
    if not text:
        return ""
    if not text.isprintable():
        text = "".join(c if c.isprintable() or c in _SPELLING else (" " if c.isspace() else "")
                       for c in text)
    if _WORD_MARK in text:
        text = text.replace(_WORD_MARK, " ")
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    words = text.split()  # str.split() splits on every Unicode space (NBSP, U+3000, ...)
    if token_map:  # whole words spelled another way in some split (Gigaword's test `UNK`)
        words = [token_map.get(w, w) for w in words]
    return " ".join(words)


# Languages written without spaces between words: a sentence is one whitespace "word", so
# the word filters cannot judge it. Their side's length counts each character of those scripts
# as a word (`length`), and a pair with such a side skips the ratio filter: characters against
# words would drop most good pairs (en-zh news: about 1.5 characters a word).
UNSPACED_LANGS = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo"})
_UNSPACED_CHARS = ("\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u2e80-\u2fdf"
                   "\u3005-\u3007\u3040-\u30ff\u3100-\u312f\u31f0-\u31ff\u3400-\u4dbf"
                   "\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f")
_UNITS = re.compile(f"[{_UNSPACED_CHARS}]|[^\\s{_UNSPACED_CHARS}]+")


def unspaced(lang: str | None) -> bool:
    """Whether `lang` (a code: zh, zh-Hant, ja, ...) is written without spaces between words."""
    return (lang or "").replace("_", "-").split("-")[0].lower() in UNSPACED_LANGS


def length(text: str, unspaced_side: bool = False) -> int:
    """A normalized side's length in words: its whitespace words; on a side in an unspaced
    language, each character of an unspaced script one word, and each run of other letters
    (Latin names, numbers) one."""
    if unspaced_side:
        return len(_UNITS.findall(text))
    return text.count(" ") + 1  # text is normalized: one space per gap


def drop_reason(src: str, tgt: str, max_len: int | None, max_len_ratio: float | None,
                unspaced_sides: tuple[bool, bool] = (False, False)) -> str | None:
    """Why a cleaned pair is dropped (None: kept). Lengths are whitespace words (the paper's
    "words", §4.1, which it does not define further); a side in a language written without
    spaces (`unspaced_sides`: source, target) counts its characters (`length`), and such a pair
    has no ratio filter."""
    if not src or not tgt:
        return "empty"
    ls, lt = length(src, unspaced_sides[0]), length(tgt, unspaced_sides[1])
    if max_len is not None and (ls > max_len or lt > max_len):
        return "too_long"
    if max_len_ratio is not None and not any(unspaced_sides) \
            and max(ls, lt) > max_len_ratio * min(ls, lt):
        return "ratio"
    return None


def _clean_batch(table: pa.Table, src_lang: str, tgt_lang: str, row_shape: str,
                 max_len, max_len_ratio, max_line_bytes: int, filters: bool = True,
                 token_map: dict[str, str] | None = None):
    """(ids, src, tgt, reasons) of a source batch; text of dropped rows is blanked."""
    ids = table["id"].to_numpy()
    if row_shape == "translation":
        pairs = table["translation"].combine_chunks()
        raw_src, raw_tgt = pairs.field(src_lang).to_pylist(), pairs.field(tgt_lang).to_pylist()
    else:
        raw_src, raw_tgt = table[src_lang].to_pylist(), table[tgt_lang].to_pylist()
    errors = table["error"].to_pylist()
    sides = (unspaced(src_lang), unspaced(tgt_lang))
    out_src, out_tgt, reasons = [], [], []
    for s, t, err in zip(raw_src, raw_tgt, errors):
        s, t = s or "", t or ""
        if err is None and "\x00" in s + t:
            err = "nul_byte"  # NUL marks binary garbage: drop the row rather than strip it
        if err is None and (len(s) > max_line_bytes // 4 or len(t) > max_line_bytes // 4):
            if max(len(s.encode()), len(t.encode())) > max_line_bytes:
                err = "line_too_long"  # parquet / jsonl cells get the same bound as text lines
        if err is None:
            s, t = normalize(s, token_map), normalize(t, token_map)
            err = drop_reason(s, t, max_len if filters else None,
                              max_len_ratio if filters else None, sides)
        if err is not None:
            s = t = ""
        out_src.append(s)
        out_tgt.append(t)
        reasons.append(err)
    return ids, out_src, out_tgt, reasons


CLEAN_SCHEMA = pa.schema([("id", pa.int64()), ("src", pa.string()), ("tgt", pa.string())])


def clean_block(table: pa.Table, **opts) -> pa.Table:
    """Ray Data function: one block cleaned and filtered, sorted by id; `reason` says why a row
    is dropped (null: kept; its text is blanked) and `part` (the block's first id) names the
    part its kept rows go to."""
    ids, src, tgt, reasons = _clean_batch(table, **opts)
    order = np.argsort(ids, kind="stable")
    first = int(ids[order[0]]) if len(ids) else 0
    return pa.table({"id": pa.array(ids[order], pa.int64()),
                     "src": pa.array([src[i] for i in order], pa.string()),
                     "tgt": pa.array([tgt[i] for i in order], pa.string()),
                     "reason": pa.array([reasons[i] for i in order], pa.string()),
                     "part": pa.array(np.full(len(ids), first, dtype=np.int64))})


def clean_stats(kept: pa.Table) -> dict[str, int]:
    """PartSink counts of kept clean rows: whitespace words per side (text is normalized)."""
    words = lambda col: int(pc.sum(pc.count_substring(kept[col], " ")).as_py() or 0)  # noqa: E731
    return {"src_words": words("src") + kept.num_rows, "tgt_words": words("tgt") + kept.num_rows}


def clean_rows(table: pa.Table, *, n_buckets: int, seed: int, **opts) -> pa.Table:
    """Ray Data function for dedupe runs: cleaned rows with their drop reason and a bucket.

    Equal pairs share a bucket (hash of the text), so a group-by on it brings duplicates
    together; dropped rows are spread by id so they do not pile into one bucket.
    """
    ids, src, tgt, reasons = _clean_batch(table, **opts)
    keyed = np.array([int.from_bytes(hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=8)
                                     .digest(), "little") >> 1 if r is None else 0
                      for s, t, r in zip(src, tgt, reasons)], dtype=np.int64)
    spread = mix64(ids, seed) % np.uint64(n_buckets)
    bucket = np.where(np.array([r is None for r in reasons]), keyed % n_buckets,
                      spread.astype(np.int64))
    return pa.table({"id": pa.array(ids, pa.int64()), "src": src, "tgt": tgt,
                     "reason": pa.array(reasons, pa.string()),
                     "bucket": pa.array(bucket, pa.int64())})


def dedupe_group(group: pa.Table) -> pa.Table:
    """Ray Data group function: in one bucket, keep the lowest id of each exact duplicate pair
    (the others get reason `duplicate`); rows sorted by id, `bucket` names their part."""
    group = group.take(np.argsort(group["id"].to_numpy(), kind="stable"))
    src, tgt = group["src"].to_pylist(), group["tgt"].to_pylist()
    reasons = group["reason"].to_pylist()
    seen = set()
    for i, (s, t, r) in enumerate(zip(src, tgt, reasons)):
        if r is None:
            if (s, t) in seen:
                reasons[i], src[i], tgt[i] = "duplicate", "", ""
            else:
                seen.add((s, t))
    return pa.table({"id": group["id"], "src": pa.array(src, pa.string()),
                     "tgt": pa.array(tgt, pa.string()), "reason": pa.array(reasons, pa.string()),
                     "bucket": group["bucket"]})


# Rows the reader could not take as a pair: no source and reference to score, so the
# evaluation text leaves them out (counted by reason). A row that is not UTF-8 is a pair,
# U+FFFD for its undecodable bytes: the evaluation text keeps it (counted).
UNREADABLE = ("line_too_long", "bad_row")


def normalize_block(table: pa.Table, *, src_lang: str, tgt_lang: str, row_shape: str,
                    token_map: dict[str, str] | None = None,
                    max_line_bytes: int | None = None) -> pa.Table:
    """Ray Data function for the text export: every row, Unicode-cleaned only, never filtered
    by length or content; `reason` names the rows the export leaves out (`UNREADABLE`, their
    text blanked), `error` is the reader's. A parquet / jsonl cell past `max_line_bytes` is
    left out as a text file's line past it is (`line_too_long`, as cleaning drops it): the
    same test set gives the same references in any format."""
    if row_shape == "translation":
        pairs = table["translation"].combine_chunks()
        src, tgt = pairs.field(src_lang).to_pylist(), pairs.field(tgt_lang).to_pylist()
    else:
        src, tgt = table[src_lang].to_pylist(), table[tgt_lang].to_pylist()
    reasons = [e if e in UNREADABLE else None for e in table["error"].to_pylist()]
    if max_line_bytes is not None:
        reasons = [r or ("line_too_long" if (len(s or "") > max_line_bytes // 4
                                             or len(t or "") > max_line_bytes // 4)
                         and max(len((s or "").encode()), len((t or "").encode()))
                         > max_line_bytes else None)
                   for s, t, r in zip(src, tgt, reasons)]
    return pa.table({"id": table["id"], "error": table["error"],
                     "reason": pa.array(reasons, pa.string()),
                     "src": ["" if r else normalize(s, token_map) for s, r in zip(src, reasons)],
                     "tgt": ["" if r else normalize(t, token_map) for t, r in zip(tgt, reasons)]})
