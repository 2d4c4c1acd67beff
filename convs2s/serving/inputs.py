"""The text a translate command reads: a text file, a .gz, or one string column of a parquet
file, local or in a bucket, split into lines on \n only (as the scorer reads references), a line
that is not UTF-8 given as None. One reader for `translate` in one process and for the
`--actors` job's split (convs2s.serving.corpus), so that both give the same outputs.

    for text in input_lines("mono.en.gz"):            # str, or None where not UTF-8
        ...
"""

from __future__ import annotations

import gzip
import zlib

from storage import binary_kind, cr_line_ends, location, open_input, wide_encoding


class InputError(ValueError):
    """An input that cannot be read as lines: a .gz that is not gzip (or cut short), a parquet
    file without the string column asked (or with several and none named)."""


# Files of pairs or rows, as preprocessing reads them (and spreadsheets): not text to translate
PAIR_FORMATS = (".tsv", ".jsonl", ".csv")


def input_lines(path: str, column: str | None = None):
    """The lines of an input (text, .gz, or a parquet column; a local file or an object), split
    on \\n only: per line its text, or None where it is not UTF-8 (both modes of `translate`
    translate it as an empty line and count it). The one reader of `translate`, with or without
    --actors, so that both give the same outputs. Opened here: a parquet file without the
    column, or a .gz that is not gzip, is an InputError now, not at the first line (as is a .gz
    cut short, when it is read)."""
    name = location(path).name.lower()
    if name.removesuffix(".gz").endswith(PAIR_FORMATS):
        raise InputError(f"input {path} is a file of pairs or rows ({', '.join(PAIR_FORMATS)}), "
                         "which translate would read as text, its other fields with each "
                         "sentence: give the source side's text (e.g. `cut -f1 FILE`), or a "
                         ".parquet file and its --column")
    if name.endswith(".parquet"):
        return _parquet_lines(path, column)
    raw = open_input(path)
    kind = binary_kind(raw.peek(8)[:8]) if hasattr(raw, "peek") else None
    if not name.endswith(".gz") and kind != "gzip":  # (gzip by its bytes, whatever its name)
        if kind is not None:
            raw.close()
            raise InputError(f"input {path} is {kind} data (by its first bytes), not text: "
                             + ("give it as a .parquet file and its --column"
                                if kind == "parquet" else
                                "decompress it (or give it as .gz), then translate the text"))
        _check_line_ends(path, raw)
        return _text_lines(path, raw)
    stream = gzip.GzipFile(fileobj=raw)
    try:
        stream.peek(1)
    except (OSError, EOFError, zlib.error) as err:
        raw.close()
        raise _not_gzip(path, err) from None
    _check_line_ends(path, stream, raw)
    return _text_lines(path, stream, raw)


def _check_line_ends(path: str, stream, raw=None, head: int = 1 << 13) -> None:
    """Refuse text whose lines end in CR alone (classic Mac OS), seen in its first `head`
    bytes (CRs there and no LF): read on LF, the whole file was one line, translated as one
    sentence, and the output had one line for the input's many. And UTF-16 / UTF-32 text (a
    spreadsheet's "Unicode" export): read as UTF-8, every line with a letter outside ASCII
    was an empty translation and the last NUL one output line more, with exit 0."""
    start = stream.peek(head)[:head] if hasattr(stream, "peek") else b""
    problem = cr_line_ends(start)
    if wide := wide_encoding(start):
        problem = (f"{wide} text (by its first bytes), not UTF-8: convert it, e.g. "
                   f"`iconv -f {wide} -t UTF-8 FILE > FILE.utf8`")
    if problem:
        (raw or stream).close()
        raise InputError(f"input {path}: {problem}")


def _not_gzip(path: str, err: Exception) -> InputError:
    return InputError(f"input {path} is not a whole gzip file ({err or type(err).__name__}): "
                      "give it compressed whole, or without .gz when it is plain text")


def _text_lines(path: str, stream, raw=None):
    try:
        with stream:
            for line in stream:
                line = line.rstrip(b"\n")  # lines split on \n only, as the scorer reads them
                try:
                    yield line.decode("utf-8")
                except UnicodeDecodeError:
                    yield None
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:  # a .gz cut short or corrupt
        raise _not_gzip(path, err) from None
    finally:
        if raw is not None:
            raw.close()


def _is_text(kind) -> bool:
    """An Arrow type that holds text: string, large_string, string_view, or a dictionary of one
    of them (a pandas category column)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
        pa.types.is_string_view(kind)


def _parquet_lines(path: str, column: str | None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage import filesystem_of

    fs, key = filesystem_of(path)
    handle = fs.open_input_file(key)
    try:
        try:
            pf = pq.ParquetFile(handle)
        except (pa.ArrowException, OSError) as err:  # (pyarrow's words name no file)
            raise InputError(f"{path} is not a readable parquet file ({str(err)[:200]}): give "
                             "a whole parquet file, or plain text (one sentence a line) under "
                             "a name that does not end in .parquet") from None
        strings = [f.name for f in pf.schema_arrow if _is_text(f.type)]
        if column is None:
            if len(strings) != 1:
                raise InputError(f"{path}: {len(strings)} string columns "
                                 f"({', '.join(strings)}): name the one to translate with "
                                 "--column")
            column = strings[0]
        elif column not in strings:
            raise InputError(f"{path}: no string column {column!r} (string columns: "
                             f"{', '.join(strings) or 'none'})")
    except BaseException:
        handle.close()
        raise

    def lines():
        try:
            for batch in pf.iter_batches(columns=[column], batch_size=8192):
                # (a dictionary column's values decoded: to_pylist gives the strings)
                values = batch.column(0)
                try:
                    values = values.to_pylist()
                except UnicodeDecodeError:  # bytes another tool wrote unchecked
                    values = _utf8_or_none(values)
                for value in values:
                    # a null is an empty line; a line break inside a value would split it;
                    # False: not UTF-8 (None, as a text line's, translated empty and counted)
                    yield "" if value is None else None if value is False \
                        else value.replace("\n", " ")
        finally:
            handle.close()

    return lines()


def _utf8_or_none(values) -> list:
    """A string column's values where some are not UTF-8 (parquet readers take a string's bytes
    unchecked): str per value, None for a null, False where its bytes are not UTF-8 (its whole
    batch failed in one exception that named no row)."""
    import pyarrow as pa

    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    out = []
    kind = pa.large_binary() if pa.types.is_large_string(values.type) else \
        pa.binary_view() if pa.types.is_string_view(values.type) else pa.binary()
    for raw in values.view(kind).to_pylist():
        try:
            out.append(None if raw is None else raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(False)
    return out
