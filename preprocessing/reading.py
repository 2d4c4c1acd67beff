"""Reading a resolved split (`sources.SplitSource`) as a Ray Dataset: `SplitDatasource`.

Rows `{"id": int64, <hub row shape>, "error": str|None}` (see sources.py). One read task per
run of consecutive parquet row groups of one file of at least `block_rows` rows (row ids from
the footers' row counts; `sources._parquet_row_groups`), per `block_rows` demo pairs, per
`block_rows` lines of uncompressed line-based files (text pairs read in lockstep, .tsv,
.jsonl: from byte offsets that one pass on the driver finds, `line_index`), or one task that
streams a .gz or a small file. Each task yields blocks of at most `block_rows` rows.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from preprocessing.config import PreprocessConfig
from preprocessing.errors import PreprocessError
from preprocessing.sources import (SplitSource, count_lines_from, hub_errors, hub_read_error,
                                   line_count_mismatch, open_binary)
from storage import stamp


def _pairs_table(ids, src, tgt, errors, cfg_shape: tuple[str, str, str]) -> pa.Table:
    shape, s_lang, t_lang = cfg_shape
    s_arr, t_arr = pa.array(src, pa.string()), pa.array(tgt, pa.string())
    cols = {"id": pa.array(ids, pa.int64())}
    if shape == "translation":
        cols["translation"] = pa.StructArray.from_arrays([s_arr, t_arr], names=[s_lang, t_lang])
    else:
        cols[s_lang], cols[t_lang] = s_arr, t_arr
    cols["error"] = pa.array(errors, pa.string())
    return pa.table(cols)


class _TooLong(bytes):
    """Marks a line longer than the limit (distinct from any real line's bytes)."""


TOO_LONG = _TooLong()


def _readline(f, limit: int) -> bytes | None:
    """Next line without its ending; None at end of file; TOO_LONG past `limit` bytes
    (the rest of that line is skipped in bounded chunks, never held whole)."""
    line = f.readline(limit + 2)
    if not line:
        return None
    if not line.endswith(b"\n") and len(line) > limit:
        while line and not line.endswith(b"\n"):
            line = f.readline(1 << 20)
        return TOO_LONG
    line = line[:-1] if line.endswith(b"\n") else line
    line = line[:-1] if line.endswith(b"\r") else line
    if len(line) > limit:
        return TOO_LONG
    return line


BOM = b"\xef\xbb\xbf"


def _first_line(f, limit: int) -> bytes | None:
    """A file's first line (as `_readline`) less a leading UTF-8 byte order mark: editors
    write one, json.loads refuses it, and it is no part of the first sentence (before
    2026-12-04 a jsonl file's row 0 was then a bad_row; folders made before keep theirs)."""
    line = _readline(f, limit + len(BOM))
    if line is None or isinstance(line, _TooLong):
        return line
    line = line[len(BOM):] if line.startswith(BOM) else line
    return TOO_LONG if len(line) > limit else line


def _decode(raw: bytes) -> tuple[str, str | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), "invalid_utf8"  # kept for text export only


# JSON may escape a lone surrogate ("\ud800"), which no UTF-8 text holds: Arrow cannot store it
_SURROGATE = re.compile("[\ud800-\udfff]")


def _parse(kind: str, lines: list[bytes], shape: tuple[str, str, str]):
    """(src, tgt, error) of one input row from its raw line(s). A row whose pair cannot be
    read (line_too_long, bad_row) has no text; one that is not UTF-8 is read as a pair all the
    same, U+FFFD for the bytes that are not (invalid_utf8: cleaning drops it from training,
    the evaluation text keeps it, pipeline._text)."""
    if any(isinstance(x, _TooLong) for x in lines):
        return "", "", "line_too_long"
    texts, errs = zip(*(_decode(x) for x in lines))
    err = next((e for e in errs if e), None)
    if kind == "text":
        return texts[0], texts[1], err
    if kind == "tsv":
        cols = texts[0].split("\t")
        return (cols[0], cols[1], err) if len(cols) == 2 else ("", "", "bad_row")
    try:  # jsonl: one hub-shaped row per line
        row = json.loads(texts[0])
        pair = row["translation"] if shape[0] == "translation" else row
        s, t = pair[shape[1]], pair[shape[2]]
        if not all(x is None or isinstance(x, str) for x in (s, t)):
            return "", "", "bad_row"  # a list or a number is no sentence: counted
        s, t = s or "", t or ""
        if _SURROGATE.search(s) or _SURROGATE.search(t):  # as undecodable bytes: U+FFFD
            s, t = _SURROGATE.sub("\ufffd", s), _SURROGATE.sub("\ufffd", t)
            err = err or "invalid_utf8"
        return s, t, err
    except (ValueError, KeyError, TypeError, RecursionError):  # (a line of 5,000 "[": json's
        return "", "", "bad_row"  # recursion, well under max_line_bytes, stopped the split)


# A field as a CSV writer quotes one holding a quote (Python's csv module, pandas' to_csv with
# sep="\t"): wrapped in quotes, each quote inside doubled. This reader splits a line at its tab
# (csv.QUOTE_NONE), so such a file's text would keep the escapes, and a field holding a line
# break, which such a writer quotes across two lines, would pair half a sentence with the
# other side's next one.
_CSV_QUOTED = re.compile(r'^"(?:[^"]|"")*""(?:[^"]|"")*"$')
_CSV_WRITTEN = ("is written by a CSV writer (a field in quotes, its own quotes doubled, or a "
                "quoted line break): this reader takes one pair a line, split at its tab, as "
                "quoting=csv.QUOTE_NONE writes it; re-export it so, or as .jsonl")
# A TSV's first line naming its columns, in the run's order: source / target (or its two
# languages, `_tsv_header`)
_HEADERS = (["source", "target"], ["src", "tgt"])


def _tsv_problem(cols: list[str], row: int, shape) -> str | None:
    """Why a TSV line's fields (row `row`, 0-based) stop the read, or None: a field quoted as
    a CSV writer quotes one holding a quote, or a header naming the columns the other way
    round (the file's columns would be read swapped)."""
    if any(_CSV_QUOTED.match(c) for c in cols):
        return _CSV_WRITTEN
    names = [c.strip().lower() for c in cols]
    if row == 0 and len(cols) == 2 and (names == [shape[2], shape[1]]
                                        or names[::-1] in _HEADERS):
        return (f"names its columns {cols[0].strip()!r}, {cols[1].strip()!r}: a .tsv is read as "
                f"<src><TAB><tgt> of the run ({shape[1]} -> {shape[2]}); swap its columns, or "
                "run the other direction")
    return None


def _tsv_header(cols: list[str], shape) -> bool:
    """Whether a TSV's first line's fields name its columns in the run's order (its two
    languages, or source / target): counted as a bad_row, not trained on or scored."""
    names = [c.strip().lower() for c in cols]
    return len(cols) == 2 and (names == [shape[1], shape[2]] or names in _HEADERS)


def _odd(field: str) -> bool:
    return field.count('"') % 2 == 1


def _tsv_opens(cols: list[str]) -> str | None:
    """Which field of a TSV line opens a quote it does not close ("first": the line's only
    field, "last": its last one), or None. A CSV writer's quoted line break starts so, and
    ends on the next line (`_tsv_closes`); a sentence may open a quote another one closes,
    so the two lines together are the sign, not one."""
    if len(cols) == 1 and cols[0].startswith('"') and _odd(cols[0]):
        return "first"
    if len(cols) >= 2 and cols[-1].startswith('"') and _odd(cols[-1]):
        return "last"
    return None


def _tsv_closes(cols: list[str], opened: str) -> bool:
    """Whether a TSV line ends the quoted field its previous line opened (`_tsv_opens`): its
    first field closes a quote it did not open, and the line holds the rest of that row (the
    other fields after a first field's break; nothing after a last field's)."""
    head = cols[0]
    if not (head.endswith('"') and not head.startswith('"') and _odd(head)):
        return False
    return len(cols) >= 2 if opened == "first" else len(cols) == 1


# Uncompressed line-based input larger than this (all its files together) is read by a task per
# `block_rows` lines, from byte offsets a pass on the driver finds (`line_index`), not by one
# task: one task parsed 36M pairs at about 13 us a pair, some 8 minutes on one core whatever
# the cluster, and Ray Data merged its blocks into parts of up to 128 MiB (1M demo pairs: one
# part, cleaned and encoded by one task); 1M pairs on 2 CPUs: the cleaning stage in 6.2-6.8 s
# instead of 14.2-15.8 (benchmarks.text_read). A .gz cannot be entered midway: one task.
INDEX_BYTES = 1 << 20


def _line_starts(path: str, first: int, every: int, end: int | None,
                 chunk_bytes: int = 1 << 22) -> tuple[list[int], int]:
    """(byte offsets of lines first, first + every, ... before `end` and the file's end,
    the file's line count): one pass over an uncompressed file, counting its line ends
    4 MiB at a time (numpy finds their places only in the chunks where a wanted line starts).
    Lines as the reader counts them: b"\\n"-terminated, a last unterminated one included."""
    offsets, targets = [], iter(range(first, end if end is not None else 1 << 62, every))
    t = next(targets, None)
    if t == 0:
        offsets.append(0)
        t = next(targets, None)
    n = base = 0  # line ends before this chunk; its first byte's offset
    last = b"\n"
    try:
        with open_binary(path) as f:
            for chunk in iter(lambda: f.read(chunk_bytes), b""):
                c = chunk.count(b"\n")
                if t is not None and n + c >= t:  # line t starts after the t-th line end
                    ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
                    while t is not None and n + c >= t:
                        offsets.append(base + int(ends[t - n - 1]) + 1)
                        t = next(targets, None)
                n, base, last = n + c, base + len(chunk), chunk[-1:]
    except OSError as e:
        raise PreprocessError(f"cannot read {path}: {type(e).__name__}: {e}; re-download or "
                              "re-export this file") from None
    total = n + (last != b"\n")
    while offsets and offsets[-1] >= base:  # a line start at the file's very end: no line
        offsets.pop()
    return offsets, total


def line_index(files: list[str], block_rows: int,
               span: tuple[int, int | None] | None) -> list[tuple[int, list[int]]]:
    """The read tasks of uncompressed line-based files: [(first line, [its byte offset in each
    file])], one per `block_rows` lines of the span (default: all lines), found in one pass
    over each file on the driver; the files' line counts are compared there (a text pair out
    of line is named before any task reads it)."""
    first, end = span or (0, None)
    starts, counts = zip(*(_line_starts(f, first, block_rows, end) for f in files))
    if len(files) == 2 and counts[0] != counts[1]:
        raise line_count_mismatch(files, list(counts))
    if first >= counts[0]:
        raise PreprocessError(f"{files[0]}: the range starts at line {first:,} but the file "
                              f"has {counts[0]:,} lines")
    return [(first + i * block_rows, [s[i] for s in starts]) for i in range(len(starts[0]))]


def _read_lines(kind: str, files: list[str], shape, limit: int, block_rows: int,
                span: tuple[int, int | None] | None = None, pair_counted: bool = False,
                seek: list[int] | None = None):
    """One read task: the file(s) in lockstep, as blocks of `block_rows` rows (only lines
    [first, end) with `span`; row ids stay line numbers). A text pair whose range ends before
    the files do is still counted to its ends unless the driver did (`pair_counted`): a pair
    that is out of line past the range is out of line within it too. `seek`: each file's byte
    offset of line `first` (`line_index`), where reading starts (else from the file's start,
    reading past the lines before `first`)."""
    first, end = span or (0, None)
    handles = [gzip.open(open_binary(p), "rb") if p.endswith(".gz") else open_binary(p)
               for p in files]
    try:
        n = 0
        if seek is not None:
            for h, offset in zip(handles, seek):
                h.seek(offset)
            n = first
        ids, src, tgt, errors = [], [], [], []
        opened = None  # (a TSV line's field that opened a quote: `_tsv_opens`)
        while True:
            lines = []
            for h, path in zip(handles, files):
                try:
                    lines.append(_first_line(h, limit) if n == 0 else _readline(h, limit))
                except (OSError, EOFError, zlib.error) as e:  # truncated / corrupt gzip, I/O
                    raise PreprocessError(f"cannot read {path} after line {n}: "
                                          f"{type(e).__name__}: {e}; re-download or re-export "
                                          "this file") from None
            if all(x is None for x in lines) or (end is not None and n >= end):
                break
            if any(x is None for x in lines):
                short = files[lines.index(None)]
                other = files[1 - lines.index(None)]
                raise PreprocessError(
                    f"line count mismatch: {short} ends after {n} lines but {other} has more. "
                    "Line-aligned files must have the same number of lines (empty lines "
                    "included); fix or re-export the pair")
            if n < first:  # before the range: read past, never kept
                n += 1
                continue
            s, t, e = _parse(kind, lines, shape)
            if kind == "tsv" and not isinstance(lines[0], _TooLong):
                cols = lines[0].decode("utf-8", "replace").split("\t")
                if opened and _tsv_closes(cols, opened):
                    raise PreprocessError(f"{files[0]}, lines {n}-{n + 1}: {_CSV_WRITTEN}")
                if problem := _tsv_problem(cols, n, shape):
                    raise PreprocessError(f"{files[0]}, line {n + 1}: {problem}")
                if n == 0 and _tsv_header(cols, shape):
                    s, t, e = "", "", "bad_row"
                opened = _tsv_opens(cols)
            ids.append(n), src.append(s), tgt.append(t), errors.append(e)
            n += 1
            if len(ids) == block_rows:
                yield _pairs_table(ids, src, tgt, errors, shape)
                ids, src, tgt, errors = [], [], [], []
        opened = None  # (a TSV line's field that opened a quote: `_tsv_opens`)
        if kind == "text" and end is not None and not pair_counted:
            counts = []
            for h, path, line in zip(handles, files, lines):
                try:  # the line read last (at `end`, or None at the file's end) and the rest
                    counts.append(n + (line is not None) + count_lines_from(h))
                except (OSError, EOFError, zlib.error) as e:
                    raise PreprocessError(f"cannot read {path} after line {n}: "
                                          f"{type(e).__name__}: {e}; re-download or re-export "
                                          "this file") from None
            if counts[0] != counts[1]:
                raise line_count_mismatch(files, counts)
        if ids:
            yield _pairs_table(ids, src, tgt, errors, shape)
    finally:
        for h in handles:
            h.close()


def _sides(table: pa.Table, shape) -> list[pa.Array]:
    """The source and target arrays of a read parquet table (either row shape)."""
    if shape[0] == "translation":
        pairs = table["translation"].combine_chunks()
        return [pairs.field(shape[1]), pairs.field(shape[2])]
    return [table[shape[1]].combine_chunks(), table[shape[2]].combine_chunks()]


def _valid(side: pa.Array) -> bool:
    """Whether a string array holds UTF-8 only: parquet readers take any bytes as a string,
    and `.to_pylist()` would fail on them later, in cleaning, naming no file or row."""
    try:
        side.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


_AS_BYTES = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}
if hasattr(pa, "string_view"):  # pyarrow >= 16
    _AS_BYTES[pa.string_view()] = pa.binary_view()


def _decoded(table: pa.Table, shape) -> tuple[pa.Table, pa.Array]:
    """`table` with both sides decoded row by row as text lines are (`_decode`: U+FFFD for
    bytes that are not UTF-8, error invalid_utf8), and the rows' errors. Types, other struct
    fields and nulls are kept, so that these blocks match the row group's others."""
    sides, errors = [], [None] * table.num_rows
    for side in _sides(table, shape):
        texts = []
        for i, raw in enumerate(side.view(_AS_BYTES[side.type]).to_pylist()):
            text, err = _decode(raw) if raw is not None else (None, None)
            texts.append(text)
            errors[i] = errors[i] or err
        sides.append(pa.array(texts, pa.string()).cast(side.type))
    if shape[0] == "translation":
        pairs = table["translation"].combine_chunks()
        fields = list(pairs.type)
        children = [sides[[shape[1], shape[2]].index(f.name)] if f.name in shape[1:]
                    else pairs.field(j) for j, f in enumerate(fields)]
        pairs = pa.StructArray.from_arrays(children, fields=fields,
                                           mask=pairs.is_null() if pairs.null_count else None)
        table = table.set_column(table.schema.get_field_index("translation"), "translation",
                                 pairs)
    else:
        for name, side in zip(shape[1:], sides):
            table = table.set_column(table.schema.get_field_index(name), name, side)
    return table, pa.array(errors, pa.string())


def _read_row_groups(item: dict, shape, block_rows: int,
                     endpoint: str | None = None) -> Iterator[pa.Table]:
    """One read task: consecutive row groups of one parquet file (its footer parsed once), with
    row ids and an error column (invalid_utf8 for a row with bytes that are not UTF-8, as in
    text files; such input stopped the run in cleaning, naming no file, before 2026-12-04).
    A hub file is read from `endpoint` (the split's: where the driver listed it)."""
    columns = ["translation"] if shape[0] == "translation" else [shape[1], shape[2]]
    groups = item["groups"]
    try:
        with open_binary(item["file"], endpoint) as f:
            table = pq.ParquetFile(f).read_row_groups(groups, columns=columns)
    except (OSError, pa.ArrowException, *hub_errors()) as e:  # a damaged page, or a hub gone
        which = (f"row group {groups[0]}" if len(groups) == 1 else
                 f"row groups {groups[0]}-{groups[-1]}")
        if unserved := hub_read_error(item["file"], endpoint, which, e):
            raise unserved from None
        raise PreprocessError(f"{item['file']}: cannot read {which} "
                              f"({type(e).__name__}: {e}); re-download or re-export this "
                              "file") from None
    errors = pa.nulls(table.num_rows, pa.string())
    # checked in C++; only a group with bytes that are not UTF-8 is decoded row by row
    if not all(_valid(side) for side in _sides(table, shape)):
        table, errors = _decoded(table, shape)
    ids = np.arange(item["first_id"], item["first_id"] + table.num_rows, dtype=np.int64)
    table = table.add_column(0, "id", pa.array(ids))
    table = table.append_column("error", errors)
    for start in range(0, table.num_rows, block_rows):
        yield table.slice(start, block_rows)


def _demo_rows(first: int, count: int, seed: int, start: int, shape) -> Iterator[pa.Table]:
    """One read task: demo pairs first .. first + count - 1 of the split."""
    from preprocessing import demo

    make = demo.translation_pairs if shape[0] == "translation" else demo.summarization_pairs
    pairs = make(seed, start + first, count)
    yield _pairs_table(np.arange(first, first + count, dtype=np.int64),
                       [p[0] for p in pairs], [p[1] for p in pairs], [None] * count, shape)


class SplitDatasource(Datasource):
    """A split as Ray Data read tasks (see the module docstring)."""

    def __init__(self, src: SplitSource, cfg: PreprocessConfig):
        super().__init__()
        self.src, self.block_rows = src, cfg.block_rows
        self.shape = (cfg.row_shape, cfg.src_lang, cfg.tgt_lang)
        self.seed, self.limit = cfg.seed, cfg.max_line_bytes
        self.index = None  # (indexed: line_index's read tasks)
        if src.kind in ("text", "tsv", "jsonl") and not any(f.endswith(".gz") for f in src.files) \
                and sum(stamp(f)[0] for f in src.files) > INDEX_BYTES:
            self.index = line_index(src.files, cfg.block_rows, src.lines)

    def get_name(self) -> str:
        return f"Read{self.src.kind.capitalize()}"

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def _task(self, read_fn, rows: int | None, files: list[str]) -> ReadTask:
        meta = BlockMetadata(num_rows=rows, size_bytes=None, exec_stats=None,
                             input_files=files)
        return ReadTask(read_fn, meta)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context=None) -> list[ReadTask]:
        src, shape, n = self.src, self.shape, self.block_rows
        if src.kind == "parquet":
            where = src.endpoint
            return [self._task(lambda g=g: _read_row_groups(g, shape, n, where), g["rows"],
                               [g["file"]]) for g in src.row_groups]
        if src.kind == "demo":
            seed, start = self.seed, src.demo_start
            return [self._task(lambda a=a: _demo_rows(a, min(n, src.rows - a), seed, start,
                                                      shape), min(n, src.rows - a), [])
                    for a in range(0, src.rows, n)]
        kind, files, limit, span, counted = (src.kind, src.files, self.limit, src.lines,
                                             src.pair_counted)
        if self.index is not None:  # a task per block of lines, each from its byte offsets
            end = (span or (0, None))[1]
            bounds = [t for t, _ in self.index[1:]] + [end]
            return [self._task(lambda t=t, b=b, o=o: _read_lines(kind, files, shape, limit, n,
                                                                 (t, b), True, o), None, files)
                    for (t, o), b in zip(self.index, bounds)]
        return [self._task(lambda: _read_lines(kind, files, shape, limit, n, span, counted),
                           None, files)]


def read_split(src: SplitSource, cfg: PreprocessConfig) -> ray.data.Dataset:
    """The split as a Ray Dataset in the hub row shape (+ id, error); nothing read yet."""
    if src.kind == "demo" and not src.rows:
        raise PreprocessError(f"demo split has no rows: set demo_rows (got {cfg.demo_rows})")
    if src.unreadable:  # (known from its recorded stages only: reading it needs the hub)
        raise PreprocessError(src.unreadable)
    # One task streams text files (.gz, or small ones): it asks for half a CPU, so that Ray
    # does not fuse the (parallel) cleaning into that single task.
    source = SplitDatasource(src, cfg)
    args = {"num_cpus": 0.5} if src.kind not in ("parquet", "demo") and source.index is None \
        else {}
    n_tasks = len(source.get_read_tasks(1))  # as many blocks as tasks: Ray splits none
    return ray.data.read_datasource(source, override_num_blocks=n_tasks, **args)
