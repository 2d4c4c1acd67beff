"""Source readers and source resolution, without Ray: the readers are plain generators that
Ray Data runs as tasks; here they run in-process on small files written by the tests.

    .venv/bin/python -m pytest tests/test_sources.py -q
"""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from preprocessing import sources
from preprocessing.config import PreprocessConfig, wmt14_en_fr
from preprocessing.errors import PreprocessError
from preprocessing.reading import SplitDatasource
from preprocessing.sources import NO_HUB_HINT, resolve_split, select_split_files

SHAPE = ("translation", "en", "fr")


def read_all(src, cfg) -> list[dict]:
    """Run a resolved source's read tasks in-process (blocks of 3 rows); rows as dicts."""
    tasks = SplitDatasource(src, cfg.replace(block_rows=3)).get_read_tasks(1)
    return [row for task in tasks for table in task() for row in table.to_pylist()]


def local_cfg(folder, **kw) -> PreprocessConfig:
    return PreprocessConfig(task="t", source=str(folder), **kw)


def test_aligned_text_keeps_alignment_and_marks_bad_lines(tmp_path):
    en = [b"Hello world", b"", b"caf\xc3\xa9 \xff broken", b"nul \x00 byte", b"x" * 200, b"last"]
    fr = [b"Bonjour le monde", b"vide en face", b"cafe", b"nul", b"court", b"dernier"]
    (tmp_path / "d.en").write_bytes(b"\r\n".join(en) + b"\r\n")  # CRLF endings
    with gzip.open(tmp_path / "d.fr.gz", "wb") as f:  # one side compressed, no final newline
        f.write(b"\n".join(fr))
    (tmp_path / "d.fr").unlink(missing_ok=True)
    cfg = local_cfg(tmp_path, splits={"train": "x,y"}, max_line_bytes=100)
    src = resolve_split(cfg.replace(splits={"train": "d.en,d.fr.gz"}), "train")
    assert src.kind == "text"
    rows = read_all(src, cfg)
    assert [r["id"] for r in rows] == list(range(6))
    fr_side = [r["translation"]["fr"] for r in rows]
    assert fr_side[:3] == ["Bonjour le monde", "vide en face", "cafe"]
    assert rows[0]["translation"]["en"] == "Hello world" and rows[0]["error"] is None
    assert rows[1]["translation"]["en"] == "" and rows[1]["error"] is None  # empty line kept
    assert rows[2]["error"] == "invalid_utf8" and "\ufffd" in rows[2]["translation"]["en"]
    assert rows[3]["error"] is None and "\x00" in rows[3]["translation"]["en"]  # cleaning drops
    assert rows[4]["error"] == "line_too_long"
    assert rows[5]["translation"] == {"en": "last", "fr": "dernier"}


def test_unicode_line_separators_do_not_split_rows(tmp_path):
    # str.splitlines() would break these lines apart and shift every later pair.
    (tmp_path / "d.en").write_text("a\u2028b\x0bc\x1cd\nsecond\n", encoding="utf-8")
    (tmp_path / "d.fr").write_text("un\ndeux\n", encoding="utf-8")
    cfg = local_cfg(tmp_path, splits={"train": "d"})
    rows = read_all(resolve_split(cfg, "train"), cfg)
    assert [r["translation"]["fr"] for r in rows] == ["un", "deux"]


def test_mismatched_line_counts_name_both_files_and_both_counts(tmp_path):
    (tmp_path / "d.en").write_text("a\nb\nc\n")
    (tmp_path / "d.fr").write_text("a\nb\n")
    cfg = local_cfg(tmp_path, splits={"train": "d"})
    with pytest.raises(PreprocessError, match=r"d\.en has 3 lines but .*d\.fr has 2"):
        resolve_split(cfg, "train")  # counted on the driver, before any reading


def test_mismatch_past_the_driver_check_is_found_while_reading(tmp_path, monkeypatch):
    # Files too large to count up front are checked in lockstep by the reading task.
    (tmp_path / "d.en").write_text("a\nb\nc\n")
    (tmp_path / "d.fr").write_text("a\nb\n")
    monkeypatch.setattr(sources, "PAIRING_CHECK_BYTES", 0)
    cfg = local_cfg(tmp_path, splits={"train": "d"})
    with pytest.raises(PreprocessError, match=r"d\.fr ends after 2 lines but .*d\.en has more"):
        read_all(resolve_split(cfg, "train"), cfg)


def test_truncated_gzip_is_a_clear_error(tmp_path):
    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    (tmp_path / "d.en.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "d.fr.gz").write_bytes(data)
    cfg = local_cfg(tmp_path, splits={"train": "d"})
    with pytest.raises(PreprocessError) as found:  # on the driver, before any reading
        resolve_split(cfg, "train")
    assert str(found.value).startswith(f"cannot read {tmp_path / 'd.en.gz'}: ")
    assert "d.fr" not in str(found.value) and "re-download" in str(found.value)


def test_truncated_gzip_past_the_driver_check_names_only_the_broken_file(tmp_path,
                                                                        monkeypatch):
    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    (tmp_path / "d.en.gz").write_bytes(data)
    (tmp_path / "d.fr.gz").write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(sources, "PAIRING_CHECK_BYTES", 0)
    cfg = local_cfg(tmp_path, splits={"train": "d"})
    with pytest.raises(PreprocessError) as found:
        read_all(resolve_split(cfg, "train"), cfg)
    assert str(found.value).startswith(f"cannot read {tmp_path / 'd.fr.gz'} after line ")
    assert "d.en" not in str(found.value)


def test_tsv_and_jsonl_rows(tmp_path):
    (tmp_path / "t.tsv").write_text("hello\tbonjour\nno tab here\na\tb\tc\n\t\n")
    lines = [json.dumps({"translation": {"en": "hi", "fr": None}}), "{not json",
             json.dumps({"translation": {"en": "hi"}}), json.dumps({"other": 1}),
             json.dumps({"translation": {"en": ["a", "b"], "fr": "c"}}),  # a list: no sentence
             "[" * 5000]  # nested past json's recursion (well under max_line_bytes)
    with gzip.open(tmp_path / "j.jsonl.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    cfg = local_cfg(tmp_path, splits={"train": "t", "valid": "j"})
    tsv = read_all(resolve_split(cfg, "train"), cfg)
    assert [r["error"] for r in tsv] == [None, "bad_row", "bad_row", None]
    assert tsv[0]["translation"] == {"en": "hello", "fr": "bonjour"}
    src = resolve_split(cfg, "valid")
    assert src.kind == "jsonl"
    jl = read_all(src, cfg)
    assert jl[0]["translation"] == {"en": "hi", "fr": ""}  # null -> empty, dropped later
    assert [r["error"] for r in jl] == [None, "bad_row", "bad_row", "bad_row", "bad_row",
                                        "bad_row"]


def test_one_file_for_both_sides_a_dangling_link_and_cr_line_ends_are_named(tmp_path):
    """The same file as source and target (named twice, or two links to one) trained a copy
    model; a side that is a link to nothing was said to be missing; lines ending in CR alone
    (classic Mac OS) read as one line: a corpus of sentences became one pair."""
    (tmp_path / "c.en").write_text("a\nb\n")
    (tmp_path / "c.fr").symlink_to(tmp_path / "c.en")
    with pytest.raises(PreprocessError, match=r"'c': .*c\.en and .*c\.fr are the same file"):
        resolve_split(local_cfg(tmp_path, splits={"train": "c"}), "train")
    with pytest.raises(PreprocessError, match="are the same file"):
        resolve_split(local_cfg(tmp_path, splits={"train": "c.en,c.en"}), "train")
    for lang in ("en", "fr"):
        (tmp_path / f"gone.{lang}").symlink_to(tmp_path / f"nowhere.{lang}")
    with pytest.raises(PreprocessError, match=r"no input for split 'train'.*gone\.en is a link to "
                                              r".*nowhere\.en, which does not exist"):
        resolve_split(local_cfg(tmp_path, splits={"train": "gone"}), "train")
    with pytest.raises(PreprocessError, match=r"missing input file.*gone\.fr is a link to"):
        resolve_split(local_cfg(tmp_path, splits={"train": "c.en,gone.fr"}), "train")
    (tmp_path / "mac.en").write_bytes(b"a\rb\rc\r")
    (tmp_path / "mac.fr").write_bytes(b"1\r2\r3\r")
    with pytest.raises(PreprocessError, match=r"mac\.en: its lines end in CR alone .*tr '\\r' "
                                              r"'\\n'"):
        resolve_split(local_cfg(tmp_path, splits={"train": "mac"}), "train")
    (tmp_path / "dos.en").write_bytes(b"a\r\nb\r\n")  # CRLF: lines as they are
    (tmp_path / "dos.fr").write_bytes(b"1\r\n2\r\n")
    cfg = local_cfg(tmp_path, splits={"train": "dos"})
    assert [r["translation"] for r in read_all(resolve_split(cfg, "train"), cfg)] == [
        {"en": "a", "fr": "1"}, {"en": "b", "fr": "2"}]


def test_a_tsv_header_is_counted_and_a_csv_written_or_swapped_tsv_is_refused(tmp_path):
    """A .tsv is one pair a line split at its tab (csv.QUOTE_NONE). A first line naming the
    run's languages is no pair (counted as bad_row). A file a CSV writer wrote (Python's csv
    module, pandas' to_csv with sep="\\t": fields with quotes quoted, their quotes doubled, a
    line break quoted across two lines, which paired half a sentence with the other side's
    next one) and a header naming the languages the other way round are refused, naming the
    file and line."""
    import csv

    def rows_of(text: str) -> list[dict]:
        (tmp_path / "t.tsv").write_text(text)
        cfg = local_cfg(tmp_path, splits={"train": "t"})
        return read_all(resolve_split(cfg, "train"), cfg)

    got = rows_of("en\tfr\nhello\tbonjour\n\"Stop!\" he said\t\"Stop !\" dit-il\n")
    assert [r["error"] for r in got] == ["bad_row", None, None]
    assert got[2]["translation"] == {"en": '"Stop!" he said', "fr": '"Stop !" dit-il'}
    assert [r["error"] for r in rows_of("Source\tTarget\na\tb\n")] == ["bad_row", None]
    with open(tmp_path / "c.tsv", "w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows([("plain", "simple"), ("two\nlines", "deux"),
                                                 ("x", "y")])
    cfg = local_cfg(tmp_path, splits={"train": "c"})
    with pytest.raises(PreprocessError, match=rf"{tmp_path / 'c.tsv'}, lines 2-3: is written by "
                                              "a CSV writer .*QUOTE_NONE"):
        read_all(resolve_split(cfg, "train"), cfg)
    (tmp_path / "c.tsv").write_text('a\tb\n"He said ""hi"""\t"Il a dit ""salut"""\n')
    with pytest.raises(PreprocessError, match=r"c\.tsv, line 2: is written by a CSV writer"):
        read_all(resolve_split(cfg, "train"), cfg)
    with pytest.raises(PreprocessError, match=r"t\.tsv, line 1: names its columns 'fr', 'en'"
                                              r".*<src><TAB><tgt> of the run \(en -> fr\)"):
        rows_of("fr\ten\nbonjour\thello\n")
    with pytest.raises(PreprocessError, match=r"line 1: names its columns 'target', 'source'"):
        rows_of("target\tsource\nbonjour\thello\n")
    # a line break quoted in the last field: the target's half sentence was kept
    with open(tmp_path / "c.tsv", "w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows([("plain", "simple"), ("Line", "Zeile eins\nzwei"),
                                                 ("x", "y")])
    with pytest.raises(PreprocessError, match=r"c\.tsv, lines 2-3: is written by a CSV writer"):
        read_all(resolve_split(cfg, "train"), cfg)
    # a quote a sentence opens and a later line closes, or one opened on a line without its
    # tab: a counted bad_row, not a refused file (only both lines together are a CSV writer's)
    got = rows_of('"Open quote\tthe rest\nmore "text\tmore\n"no tab here\nnext\tline\n')
    assert [r["error"] for r in got] == [None, None, "bad_row", None]


@pytest.mark.parametrize("kind", ["text", "tsv", "jsonl"])
def test_a_large_line_based_input_is_read_by_a_task_per_block_with_the_same_rows(tmp_path, kind,
                                                                                monkeypatch):
    """Uncompressed line-based input past INDEX_BYTES is read by a task per block of lines,
    from byte offsets one pass on the driver finds (one task parsed 36M pairs in about 8
    minutes on one core): the same rows, ids and blocks as one task reads, whole or a line
    range, BOM, CRLF, a last line without its end and bad rows included; a text pair out of
    line is named on the driver."""
    from preprocessing import reading

    rng = __import__("random").Random(kind)
    en = [f"line {i} " + "w " * rng.randint(0, 9) for i in range(50)]
    fr = [f"ligne {i} " + "m " * rng.randint(0, 9) for i in range(50)]
    en[7], fr[9] = "", "\t\t"  # an empty side; a tsv row with too many tabs
    if kind == "text":
        (tmp_path / "c.en").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(en).encode())
        (tmp_path / "c.fr").write_text("\n".join(fr) + "\n")
    elif kind == "tsv":
        (tmp_path / "c.tsv").write_text("en\tfr\n" + "".join(f"{a}\t{b}\n"
                                                             for a, b in zip(en, fr)))
    else:
        (tmp_path / "c.jsonl").write_text("".join(json.dumps({"translation": {"en": a, "fr": b}})
                                                  + "\n" for a, b in zip(en, fr)) + "{bad\n")
    for name in ("c", "c[5:38]", "c[44:]"):
        cfg = local_cfg(tmp_path, splits={"train": name})
        src = resolve_split(cfg, "train")
        one = SplitDatasource(src, cfg.replace(block_rows=3)).get_read_tasks(1)
        monkeypatch.setattr(reading, "INDEX_BYTES", 0)
        tasks = SplitDatasource(src, cfg.replace(block_rows=3)).get_read_tasks(1)
        monkeypatch.undo()
        assert len(one) == 1 and len(tasks) > 1, name
        blocks = [t.to_pylist() for task in one for t in task()]
        assert blocks == [t.to_pylist() for task in tasks for t in task()], (kind, name)
    if kind == "text":  # out of line: named before any read task runs
        (tmp_path / "c.fr").write_text("\n".join(fr[:-1]) + "\n")
        monkeypatch.setattr(sources, "PAIRING_CHECK_BYTES", 0)  # (files this small: counted
        cfg = local_cfg(tmp_path, splits={"train": "c"})        # by resolve_split)
        src = resolve_split(cfg, "train")
        monkeypatch.setattr(reading, "INDEX_BYTES", 0)
        with pytest.raises(PreprocessError, match=r"line count mismatch: .*c\.en has 50 lines "
                                                  r"but .*c\.fr has 49"):
            SplitDatasource(src, cfg)


def test_missing_inputs_are_clear_errors(tmp_path):
    (tmp_path / "only.en").write_text("a\n")
    cfg = local_cfg(tmp_path, splits={"train": "only", "valid": "nothing", "test": "a.txt,b.txt"})
    with pytest.raises(PreprocessError, match=r"found .*only\.en but not its other .*only\.fr"):
        resolve_split(cfg, "train")
    with pytest.raises(PreprocessError, match=r"no input for split 'valid'.*nothing\.en.*--split"):
        resolve_split(cfg, "valid")
    with pytest.raises(PreprocessError, match=r"missing input file.*a\.txt"):
        resolve_split(cfg, "test")
    with pytest.raises(PreprocessError, match="does not exist"):
        resolve_split(local_cfg(tmp_path / "nope"), "train")
    # One side plain, the other .gz: named (it said the .gz side was not there)
    (tmp_path / "mixed.en").write_text("a\n")
    (tmp_path / "mixed.fr.gz").write_bytes(gzip.compress(b"a\n"))
    with pytest.raises(PreprocessError, match=r"mixed\.fr\.gz is there: give both sides plain "
                                              "or both .gz"):
        resolve_split(local_cfg(tmp_path, splits={"train": "mixed"}), "train")
    # SRC_FILE,TGT_FILE is one file per side, not a list of corpora: two .tsv files (each with
    # both sides) were read as a source and a target file
    for name in ("a.tsv", "b.tsv"):
        (tmp_path / name).write_text("x\ty\n")
    with pytest.raises(PreprocessError, match="names one file of each side's plain text, not "
                                              "two corpora.*concatenate them"):
        resolve_split(local_cfg(tmp_path, splits={"train": "a.tsv,b.tsv"}), "train")


def write_hub_parquet(folder, config: str, split: str, pairs: list[tuple[str, str]],
                      n_files: int = 1, row_group_size: int = 1000, langs=("en", "fr")):
    """Parquet files named and shaped like the hub's: <config>/<split>-0000i-of-0000n.parquet."""
    (folder / config).mkdir(parents=True, exist_ok=True)
    per = -(-len(pairs) // n_files)
    for i in range(n_files):
        chunk = pairs[i * per:(i + 1) * per]
        table = pa.table({"translation": [{langs[0]: s, langs[1]: t} for s, t in chunk]})
        pq.write_table(table, folder / config / f"{split}-{i:05d}-of-{n_files:05d}.parquet",
                       row_group_size=row_group_size)


def test_hub_shaped_parquet_folder_ids_across_files_and_row_groups(tmp_path):
    pairs = [(f"s{i}", f"t{i}") for i in range(23)]
    write_hub_parquet(tmp_path, "fr-en", "train", pairs, n_files=3, row_group_size=4)
    cfg = local_cfg(tmp_path)  # default WMT split names, hub_config fr-en
    src = resolve_split(cfg, "train")
    assert src.kind == "parquet" and len(src.files) == 3 and src.rows == 23
    rows = read_all(src, cfg)
    assert [r["id"] for r in rows] == list(range(23))
    assert [(r["translation"]["en"], r["translation"]["fr"]) for r in rows] == pairs


def test_small_row_groups_are_read_together_one_task_per_block_of_a_file(tmp_path):
    """The hub's files hold row groups of about a thousand rows: a read task takes consecutive
    groups of one file up to at least `block_rows` rows (a task per group made 40,000 tasks of
    WMT'14 En-Fr, each parsing its file's footer, and as many parts in every later stage);
    every row is read once, in order, with its id, in blocks of at most `block_rows`."""
    pairs = [(f"s{i}", f"t{i}") for i in range(70)]
    write_hub_parquet(tmp_path, "fr-en", "train", pairs, n_files=2, row_group_size=4)
    cfg = local_cfg(tmp_path, block_rows=10)
    src = resolve_split(cfg, "train")
    # per file of 35 rows (groups of 4, the last of 3): 12 + 12 + 11 rows
    assert [(t["groups"], t["rows"]) for t in src.row_groups] == \
        [([0, 1, 2], 12), ([3, 4, 5], 12), ([6, 7, 8], 11)] * 2
    tasks = SplitDatasource(src, cfg).get_read_tasks(1)
    assert len(tasks) == 6
    blocks = [table for task in tasks for table in task()]
    assert max(b.num_rows for b in blocks) <= 10
    rows = [row for b in blocks for row in b.to_pylist()]
    assert [r["id"] for r in rows] == list(range(70))
    assert [(r["translation"]["en"], r["translation"]["fr"]) for r in rows] == pairs
    # with the default 50,000-row blocks, a task per file
    assert len(resolve_split(local_cfg(tmp_path), "train").row_groups) == 2


def test_parquet_without_expected_columns_names_the_file(tmp_path):
    (tmp_path / "fr-en").mkdir()
    pq.write_table(pa.table({"en": ["a"], "fr": ["b"]}), tmp_path / "fr-en" / "train-0.parquet")
    with pytest.raises(PreprocessError, match=r"train-0\.parquet: parquet file has .*translation"):
        resolve_split(local_cfg(tmp_path), "train")
    write_hub_parquet(tmp_path / "de", "fr-en", "train", [("a", "b")], langs=("en", "de"))
    (tmp_path / "broken" / "fr-en").mkdir(parents=True)
    (tmp_path / "broken" / "fr-en" / "test-0.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(PreprocessError, match=r"test-0\.parquet: cannot read its parquet footer"):
        resolve_split(local_cfg(tmp_path / "broken"), "test")
    with pytest.raises(PreprocessError, match="fields 'en' and 'fr'"):
        resolve_split(local_cfg(tmp_path / "de"), "train")
    # the right names, but not text: named with the file, not a TypeError inside a Ray task
    (tmp_path / "ints" / "fr-en").mkdir(parents=True)
    pq.write_table(pa.table({"translation": [{"en": "a", "fr": 7}]}),
                   tmp_path / "ints" / "fr-en" / "train-0.parquet")
    with pytest.raises(PreprocessError, match=r"train-0\.parquet: its 'fr' side is int64, not "
                                              r"text"):
        resolve_split(local_cfg(tmp_path / "ints"), "train")


def test_columns_row_shape_reads_document_summary_parquet(tmp_path):
    (tmp_path / "default").mkdir()
    pq.write_table(pa.table({"document": ["a long text", "b"], "summary": ["short", "s"]}),
                   tmp_path / "default" / "test-00000-of-00001.parquet")
    cfg = local_cfg(tmp_path, src_lang="document", tgt_lang="summary", row_shape="columns",
                    hub_config="default")
    src = resolve_split(cfg, "test")
    rows = read_all(src, cfg)
    assert rows[0] == {"id": 0, "document": "a long text", "summary": "short", "error": None}


def test_unreachable_hub_says_how_to_work_offline():
    cfg = wmt14_en_fr()
    with pytest.raises(PreprocessError, match=r"cannot reach the Hugging Face hub.*--source demo"):
        resolve_split(cfg, "train", endpoint="http://127.0.0.1:9")


@pytest.mark.parametrize("code, says", [
    ("RepoNotFound", r"wmt/wmt14 does not exist \(or is private"),
    ("GatedRepo", r"wmt/wmt14 is gated: accept its terms"),
    ("RevisionNotFound", r"wmt/wmt14 has no revision"),
])
def test_a_hub_that_answers_no_says_why_not_go_offline(code, says):
    """A hub that answers (a loopback server speaking its error headers) but refuses the
    dataset is not "cannot reach the hub": the message says what to fix."""
    import http.server
    import threading

    class Refuses(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404 if code != "GatedRepo" else 401)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(PreprocessError, match=says):
            resolve_split(wmt14_en_fr(), "train",
                          endpoint=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()


HUB_SHA = "5" * 40  # the commit a loopback mirror serves


@pytest.fixture
def hub_mirror():
    """`start(files, status=200)`: a Hugging Face mirror on loopback serving `files`
    ({name in the repository: bytes}) of dataset wmt/wmt14 at HUB_SHA, by the hub's routes that
    listing a dataset and reading its files take: `/api/datasets/<repo>/revision/<rev>`,
    `/api/datasets/<repo>/tree/<sha>/<folder>`, `/datasets/<repo>/resolve/<sha>/<file>` (a
    Range of bytes). Returns (its endpoint, the paths asked for, `state`): `state["refuse"]`
    "files" answers file reads 403, "open" closes the connection unanswered when a file's
    commit is looked up; `state["busy"]` = n answers the next n file reads 503 (retried);
    `status` other than 200 answers everything with it."""
    import http.server
    import re
    import threading
    from urllib.parse import unquote, urlsplit

    servers = []

    def start(files: dict[str, bytes], status: int = 200):
        seen, state = [], {}
        api = "/api/datasets/wmt/wmt14/"

        class Mirror(http.server.BaseHTTPRequestHandler):
            def _send(self, code: int, body: bytes, headers=()):
                self.send_response(code)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = unquote(urlsplit(self.path).path)
                seen.append(path)
                if status != 200:
                    return self._send(status, b"down")
                if path == f"{api}revision/{HUB_SHA}" and state.get("refuse") == "open":
                    self.close_connection = True  # no answer at all
                    return None
                if path.startswith(f"{api}revision/"):
                    return self._send(200, json.dumps({"id": "wmt/wmt14", "sha": HUB_SHA,
                                                       "siblings": [{"rfilename": n}
                                                                    for n in files]}).encode())
                if path.startswith(f"{api}tree/{HUB_SHA}/"):
                    folder = path.removeprefix(f"{api}tree/{HUB_SHA}/")
                    return self._send(200, json.dumps([
                        {"type": "file", "path": n, "size": len(b), "oid": "0" * 40}
                        for n, b in files.items() if n.rpartition("/")[0] == folder]).encode())
                name = path.removeprefix(f"/datasets/wmt/wmt14/resolve/{HUB_SHA}/")
                if name not in files or state.get("refuse") == "files":
                    return self._send(403 if name in files else 404, b"{}")
                if state.get("busy"):
                    state["busy"] -= 1
                    return self._send(503, b"busy")
                first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)",
                                                    self.headers["Range"]).groups())
                body = files[name][first:last + 1]
                return self._send(206, body, [("Content-Range", f"bytes {first}-"
                                                f"{first + len(body) - 1}/{len(files[name])}")])

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", seen, state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def hub_parquet(rows: int) -> bytes:
    """A hub-shaped parquet file of `rows` En-Fr pairs, row groups of 3 rows."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"translation": [{"en": f"hello {i}", "fr": f"bonjour {i}"}
                                             for i in range(rows)]}), sink, row_group_size=3)
    return sink.getvalue().to_pybytes()


TRAIN_FILE = "fr-en/train-00000-of-00001.parquet"


def test_a_hub_mirror_serves_the_files_too_not_only_their_listing(hub_mirror):
    """--hub-endpoint: the footers (driver) and the row groups (read tasks, which travel
    pickled to Ray's workers) are read from the mirror, as the listing is."""
    from ray import cloudpickle

    endpoint, seen, _ = hub_mirror({TRAIN_FILE: hub_parquet(7)})
    cfg = wmt14_en_fr().replace(block_rows=3)  # a read task per row group
    src = resolve_split(cfg, "train", endpoint=endpoint)
    assert src.rows == 7 and len(src.row_groups) == 3
    assert f"/datasets/wmt/wmt14/resolve/{HUB_SHA}/{TRAIN_FILE}" in seen  # the footer
    del seen[:]
    tasks = [cloudpickle.loads(cloudpickle.dumps(t))
             for t in SplitDatasource(src, cfg).get_read_tasks(1)]
    rows = [row for task in tasks for table in task() for row in table.to_pylist()]
    assert [(r["id"], r["translation"]["fr"]) for r in rows] == [(i, f"bonjour {i}")
                                                                 for i in range(7)]
    assert f"/datasets/wmt/wmt14/resolve/{HUB_SHA}/{TRAIN_FILE}" in seen  # the row groups


def test_a_hub_mirror_that_does_not_serve_a_file_is_one_line_naming_it(hub_mirror):
    """A mirror that lists the files but does not serve them: one line naming the file and the
    endpoint, its password hidden, and the fix; on the driver (the footer: a connection closed
    unanswered, an HTTP library's error) and in a read task (the rows: 403)."""
    endpoint, _, state = hub_mirror({TRAIN_FILE: hub_parquet(7)})
    with_password = endpoint.replace("http://", "http://alice:S3CRET@")
    shown = endpoint.replace("http://", "http://alice:***@")
    state["refuse"] = "open"
    with pytest.raises(PreprocessError) as footer:
        resolve_split(wmt14_en_fr(), "train", endpoint=with_password)
    state["refuse"] = None
    src = resolve_split(wmt14_en_fr(), "train", endpoint=with_password)
    state["refuse"] = "files"
    with pytest.raises(PreprocessError) as rows:
        read_all(src, wmt14_en_fr())
    for error, what in ((footer, "its parquet footer"), (rows, "row groups 0-2")):
        text = str(error.value)
        assert text.startswith(f"hf://datasets/wmt/wmt14@{HUB_SHA}/{TRAIN_FILE}: cannot read "
                               f"{what} from the Hugging Face hub at {shown} ("), text
        assert ("check the endpoint (HF_ENDPOINT; python -m preprocessing's --hub-endpoint"
                in text)
        assert "--source demo" in text and "S3CRET" not in text and "\n" not in text
    assert "RemoteProtocolError" in str(footer.value) and "403" in str(rows.value)


def test_a_hub_error_names_the_endpoint_without_its_password(hub_mirror):
    endpoint, seen, _ = hub_mirror({}, status=500)
    with pytest.raises(PreprocessError) as found:
        resolve_split(wmt14_en_fr(), "train",
                      endpoint=endpoint.replace("http://", "http://alice:S3CRET@"))
    text = str(found.value)
    assert seen and "S3CRET" not in text and "\n" not in text, text
    assert text.startswith(f"cannot reach the Hugging Face hub at "
                           f"{endpoint.replace('http://', 'http://alice:***@')} for dataset "
                           "wmt/wmt14 (revision main): HfHubHTTPError: "), text
    assert text.endswith(NO_HUB_HINT)


def test_the_hubs_retry_warnings_never_log_the_endpoints_password(hub_mirror, caplog):
    """huggingface_hub warns of each retried read with the URL it asked, user:password@ of a
    mirror included: its loggers' records are redacted (storage.redact.redact_logs)."""
    import logging

    endpoint, seen, state = hub_mirror({TRAIN_FILE: hub_parquet(7)})
    state["busy"] = 1  # the footer read is answered 503 once, then served (after a second)
    with caplog.at_level(logging.WARNING):
        src = resolve_split(wmt14_en_fr(), "train",
                            endpoint=endpoint.replace("http://", "http://alice:S3CRET@"))
    assert src.rows == 7 and state["busy"] == 0
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")]
    assert any(f"http://alice:***@{endpoint.removeprefix('http://')}/datasets/" in w
               for w in warnings), warnings
    assert not any("S3CRET" in w for w in warnings), warnings


def test_demo_splits_get_disjoint_index_ranges():
    cfg = PreprocessConfig(task="d", demo_rows={"train": 100, "valid": 10, "test": 7},
                           splits={"train": "train", "valid": "v", "test": "t"})
    ranges = []
    for split in cfg.splits:
        src = resolve_split(cfg, split)
        ranges.append(range(src.demo_start, src.demo_start + src.rows))
    assert ranges == [range(0, 100), range(100, 110), range(110, 117)]


def test_hub_listings_select_the_split_files():
    wmt14 = ["README.md", "cs-en/train-00000-of-00001.parquet",
             "fr-en/test-00000-of-00001.parquet", "fr-en/validation-00000-of-00001.parquet",
             *[f"fr-en/train-{i:05d}-of-00030.parquet" for i in (1, 0, 29)]]
    assert select_split_files(wmt14, "fr-en", "train") == [
        "fr-en/train-00000-of-00030.parquet", "fr-en/train-00001-of-00030.parquet",
        "fr-en/train-00029-of-00030.parquet"]
    assert select_split_files(wmt14, "fr-en", "validation") == [
        "fr-en/validation-00000-of-00001.parquet"]
    assert select_split_files(wmt14, "de-en", "train") == []
    converted = [".gitattributes", "default/train/0000.parquet", "default/train/0001.parquet",
                 "default/validation/0000.parquet", "default/test/0000.parquet"]
    assert select_split_files(converted, "default", "test") == ["default/test/0000.parquet"]
    assert len(select_split_files(converted, "default", "train")) == 2


def test_a_partial_hub_conversion_is_read_with_a_warning(caplog):
    # The hub converts only the first 5 GB of a large split (partial-<split>/): the rows past
    # it are not read, and the run says so instead of taking it for the whole split.
    import logging

    names = ["default/partial-train/0000.parquet", "default/partial-train/0001.parquet",
             "default/validation/0000.parquet"]
    with caplog.at_level(logging.WARNING, logger="preprocessing"):
        assert len(select_split_files(names, "default", "train")) == 2
        assert select_split_files(names, "default", "validation") == [
            "default/validation/0000.parquet"]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "'train' is a partial parquet conversion (default/partial-train" in warning
    assert "the rest of the split is not read" in warning


def test_a_split_can_name_one_file(tmp_path):
    (tmp_path / "pairs.tsv.gz").write_bytes(gzip.compress(b"a\tb\n"))
    (tmp_path / "notes.txt").write_text("x\n")
    cfg = local_cfg(tmp_path, splits={"train": "pairs.tsv.gz", "valid": "notes.txt"})
    assert resolve_split(cfg, "train").kind == "tsv"
    with pytest.raises(PreprocessError, match="two files"):
        resolve_split(cfg, "valid")
    with pytest.raises(PreprocessError, match=r"is a file; give its folder"):
        resolve_split(local_cfg(tmp_path / "notes.txt"), "train")


def test_a_directory_where_a_corpus_file_belongs_is_named_as_such(tmp_path):
    (tmp_path / "d.en").write_text("a\nb\n")
    (tmp_path / "d.fr").mkdir()
    cfg = local_cfg(tmp_path, splits={"train": "d"})
    with pytest.raises(PreprocessError) as found:
        resolve_split(cfg, "train")
    assert str(found.value).startswith(f"{tmp_path / 'd.fr'} is a directory")
    assert "other side" not in str(found.value)


def test_splits_cut_from_one_corpus_by_line_ranges(tmp_path):
    """`NAME[a:b]` reads lines a..b-1 of NAME's files (ends optional, as in Python): train,
    valid and test cut from one file pair, disjoint, each keyed by its own range."""
    (tmp_path / "c.en").write_text("".join(f"e{i}\n" for i in range(10)))
    (tmp_path / "c.fr").write_text("".join(f"f{i}\n" for i in range(10)))
    cfg = local_cfg(tmp_path, splits={"train": "c[:6]", "valid": "c[6:8]", "test": "c[8:]"})
    got = {s: [(r["id"], r["translation"]["fr"]) for r in read_all(resolve_split(cfg, s), cfg)]
           for s in ("train", "valid", "test")}
    assert got["train"] == [(i, f"f{i}") for i in range(6)]
    assert got["valid"] == [(6, "f6"), (7, "f7")] and got["test"] == [(8, "f8"), (9, "f9")]
    prints = [resolve_split(cfg, s).fingerprint for s in ("train", "valid", "test")]
    assert [p["lines"] for p in prints] == [[0, 6], [6, 8], [8, None]]
    with pytest.raises(PreprocessError, match=r"the range starts at line 12 but .*c.en has 10"):
        resolve_split(cfg.replace(splits={"train": "c[12:]"}), "train")
    with pytest.raises(PreprocessError, match="the range holds no line"):
        resolve_split(cfg.replace(splits={"train": "c[5:5]"}), "train")


def test_an_evaluation_split_reading_training_lines_is_refused_before_anything_runs(tmp_path):
    """`train=c[:6]` beside `valid=c[4:8]` (or a split mapped to the training files) put
    training lines into the validation loss, the checkpoint choice and the scores without a
    word, in `python -m preprocessing` (the workflows refused it); a negative range end (as
    Python's) was "no input for split". Both are refused before Ray starts, naming the fix."""
    from preprocessing.pipeline import run_pipeline

    (tmp_path / "c.en").write_text("".join(f"e{i}\n" for i in range(10)))
    (tmp_path / "c.fr").write_text("".join(f"f{i}\n" for i in range(10)))
    (tmp_path / "d.en").write_text("e\n")
    (tmp_path / "d.fr").write_text("f\n")
    cfg = local_cfg(tmp_path, root=str(tmp_path / "out"))
    for splits, says in (
            ({"train": "c[:6]", "valid": "c[4:8]"}, r"split 'valid' \(c\[4:8\]\) reads lines 4 "
                                                    r"to 5 of the training split's files"),
            ({"train": "c[:6]", "valid": "d", "test": "c[2:]"}, r"split 'test' \(c\[2:\]\) "
                                                                r"reads lines 2 to 5"),
            ({"train": "c", "valid": "c[8:]"}, r"reads lines 8 to the end"),
            ({"train": "c[6:]", "valid": "c"}, r"reads lines 6 to the end")):
        with pytest.raises(PreprocessError, match=says + r".*give it other lines"):
            run_pipeline(cfg.replace(splits=splits))
    assert not (tmp_path / "out").exists()
    from preprocessing.sources import shared_training_lines

    apart = {s: resolve_split(cfg.replace(splits={"train": "c[:6]", "valid": "c[6:8]",
                                                  "test": "d"}), s)
             for s in ("train", "valid", "test")}
    assert shared_training_lines(apart) is None
    with pytest.raises(PreprocessError, match=r"split source 'c\[-2:\]': a line range counts "
                                              r"lines from 0 .*e\.g\. c\[4750:\]"):
        resolve_split(cfg.replace(splits={"train": "c[-2:]"}), "train")


@pytest.mark.parametrize("name", ["u.tsv", "u.jsonl", "u.en"])
def test_text_in_utf16_or_with_cr_line_ends_is_refused_naming_the_conversion(tmp_path, name):
    """Text saved as UTF-16 (Windows' "Unicode") had every row dropped as invalid_utf8 /
    nul_byte, one side of a pair a line count mismatch; a .tsv or .jsonl whose lines end in CR
    alone was one bad_row (the text pair's check ran for pairs only)."""
    stem, ext = name.split(".")
    line = {"tsv": "hello\tbonjour", "jsonl": '{"translation": {"en": "a", "fr": "b"}}',
            "en": "hello"}[ext]
    files = [tmp_path / name] + ([tmp_path / "u.fr"] if ext == "en" else [])
    for f in files:
        f.write_bytes(("\n".join([line] * 5) + "\n").encode("utf-16"))
    cfg = local_cfg(tmp_path, splits={"train": stem})
    with pytest.raises(PreprocessError, match=r"u\.\w+ is UTF-16 text \(by its first bytes\), "
                                              r"not UTF-8: convert it, e\.g\. `iconv -f UTF-16"):
        resolve_split(cfg, "train")
    for f in files:
        f.write_bytes(("\r".join([line] * 5) + "\r").encode())
    with pytest.raises(PreprocessError, match=r"its lines end in CR alone"):
        resolve_split(cfg, "train")


def unchecked_strings(values: list[bytes | None]) -> pa.Array:
    """A string array holding these bytes as they are, UTF-8 or not (as a parquet file written
    by another tool may: readers take them without a check)."""
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + len(v or b""))
    validity = pa.array([v is not None for v in values]).buffers()[1]
    return pa.Array.from_buffers(pa.string(), len(values), [
        validity, pa.py_buffer(pa.array(offsets, pa.int32()).buffers()[1]),
        pa.py_buffer(b"".join(v or b"" for v in values))])


def test_parquet_text_that_is_not_utf8_is_read_as_invalid_utf8_rows_like_text_lines(tmp_path):
    from preprocessing.cleaning import clean_block

    en = unchecked_strings([b"caf\xc3\xa9", b"caf\xff", b"ok", None])
    fr = unchecked_strings([b"un", b"deux", b"tr\xe8s", b"quatre"])
    de = pa.array(["eins", "zwei", "drei", "vier"])  # a third language, kept as it is
    (tmp_path / "fr-en").mkdir()
    pq.write_table(pa.table({"translation": pa.StructArray.from_arrays(
        [en, fr, de], names=["en", "fr", "de"])}), tmp_path / "fr-en" / "train-0.parquet")
    cfg = local_cfg(tmp_path)
    rows = read_all(resolve_split(cfg, "train"), cfg)
    assert [r["error"] for r in rows] == [None, "invalid_utf8", "invalid_utf8", None]
    assert [r["translation"] for r in rows] == [
        {"en": "caf\u00e9", "fr": "un", "de": "eins"},
        {"en": "caf\ufffd", "fr": "deux", "de": "zwei"},
        {"en": "ok", "fr": "tr\ufffds", "de": "drei"},
        {"en": None, "fr": "quatre", "de": "vier"}]
    # cleaning takes the block (it failed there, naming no file) and drops those rows by reason
    blocks = [t for task in SplitDatasource(resolve_split(cfg, "train"), cfg).get_read_tasks(1)
              for t in task()]
    cleaned = clean_block(blocks[0], src_lang="en", tgt_lang="fr", row_shape="translation",
                          max_len=175, max_len_ratio=1.5, max_line_bytes=1000)
    assert cleaned["reason"].to_pylist() == [None, "invalid_utf8", "invalid_utf8", "empty"]
    # the columns row shape (Gigaword's) likewise
    (tmp_path / "cols" / "default").mkdir(parents=True)
    pq.write_table(pa.table({"document": unchecked_strings([b"a \xff b", b"fine"]),
                             "summary": pa.array(["s", "t"], pa.large_string())}),
                   tmp_path / "cols" / "default" / "test-0.parquet")
    cfg = local_cfg(tmp_path / "cols", src_lang="document", tgt_lang="summary",
                    row_shape="columns", hub_config="default")
    rows = read_all(resolve_split(cfg, "test"), cfg)
    assert rows == [{"id": 0, "document": "a \ufffd b", "summary": "s", "error": "invalid_utf8"},
                    {"id": 1, "document": "fine", "summary": "t", "error": None}]


def test_a_jsonl_escaped_lone_surrogate_is_an_invalid_utf8_row(tmp_path):
    # JSON can escape a surrogate that no UTF-8 text holds; a pair ("\ud83d\ude00") is one
    # character and fine. The row is read like undecodable bytes, not a stop naming nothing.
    (tmp_path / "j.jsonl").write_text(
        '{"translation": {"en": "a\\ud800b", "fr": "x"}}\n'
        '{"translation": {"en": "smile \\ud83d\\ude00", "fr": "y\\udfff"}}\n'
        '{"translation": {"en": "fine", "fr": "bien"}}\n')
    cfg = local_cfg(tmp_path, splits={"train": "j"})
    rows = read_all(resolve_split(cfg, "train"), cfg)
    assert [r["error"] for r in rows] == ["invalid_utf8", "invalid_utf8", None]
    assert [r["translation"] for r in rows] == [
        {"en": "a\ufffdb", "fr": "x"}, {"en": "smile \U0001f600", "fr": "y\ufffd"},
        {"en": "fine", "fr": "bien"}]


def test_a_byte_order_mark_opening_a_file_is_not_part_of_its_first_row(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "j.jsonl").write_bytes(bom + b'{"translation": {"en": "a", "fr": "b"}}\n'
                                       + bom + b'{"translation": {"en": "c", "fr": "d"}}\n')
    (tmp_path / "t.tsv").write_bytes(bom + b"hello\tbonjour\n")
    (tmp_path / "d.en").write_bytes(bom + b"x" * 10 + b"\n")  # at the limit without the mark
    (tmp_path / "d.fr").write_bytes(bom + b"y\n")
    cfg = local_cfg(tmp_path, splits={"train": "j", "valid": "t", "test": "j[1:]"})
    jl = read_all(resolve_split(cfg, "train"), cfg)
    assert [(r["translation"], r["error"]) for r in jl] == [
        ({"en": "a", "fr": "b"}, None), ({"en": "", "fr": ""}, "bad_row")]  # mid-file: a char
    assert read_all(resolve_split(cfg, "valid"), cfg)[0]["translation"] == {
        "en": "hello", "fr": "bonjour"}
    # a range's first line is not its file's: line 1 keeps what it holds
    assert read_all(resolve_split(cfg, "test"), cfg)[0]["error"] == "bad_row"
    cfg = local_cfg(tmp_path, max_line_bytes=10, splits={"train": "d"})
    text = read_all(resolve_split(cfg, "train"), cfg)
    assert text[0]["translation"] == {"en": "x" * 10, "fr": "y"} and text[0]["error"] is None


def test_a_line_range_ending_early_still_finds_a_pair_out_of_line_past_it(tmp_path,
                                                                          monkeypatch):
    # Too large to count on the driver: the reading task counts on past the range's end.
    (tmp_path / "c.en").write_text("".join(f"e{i}\n" for i in range(10)))
    (tmp_path / "c.fr").write_text("".join(f"f{i}\n" for i in range(9)))
    with gzip.open(tmp_path / "ok.en.gz", "wb") as f:
        f.write(b"".join(b"e%d\n" % i for i in range(10)))
    (tmp_path / "ok.fr").write_text("\n".join(f"f{i}" for i in range(10)))  # no final newline
    monkeypatch.setattr(sources, "PAIRING_CHECK_BYTES", 0)
    cfg = local_cfg(tmp_path, splits={"train": "c[:5]", "valid": "c[2:9]",
                                      "test": "ok.en.gz,ok.fr[:3]"})
    for split in ("train", "valid"):
        with pytest.raises(PreprocessError, match=r"line count mismatch: .*c\.en has 10 lines "
                                                  r"but .*c\.fr has 9"):
            read_all(resolve_split(cfg, split), cfg)
    rows = read_all(resolve_split(cfg, "test"), cfg)
    assert [r["translation"]["fr"] for r in rows] == ["f0", "f1", "f2"]


def test_a_file_uri_source_is_its_local_folder(tmp_path):
    (tmp_path / "d.en").write_text("a\n")
    (tmp_path / "d.fr").write_text("b\n")
    cfg = local_cfg(f"file://{tmp_path}", splits={"train": "d"})
    rows = read_all(resolve_split(cfg, "train"), cfg)
    assert rows == [{"id": 0, "translation": {"en": "a", "fr": "b"}, "error": None}]


def test_a_hub_file_of_another_pair_names_the_configuration_to_choose():
    """--src de --tgt en on the hub's fr-en files: the fix is the dataset's configuration
    (data.hub_config), not converting a file or setting the row shape."""
    from preprocessing.sources import _check_columns

    cfg = PreprocessConfig(task="t", src_lang="de", tgt_lang="en", hub_config="fr-en")
    schema = pa.schema([("translation", pa.struct([("en", pa.string()), ("fr", pa.string())]))])
    with pytest.raises(PreprocessError, match=r"choose the dataset's configuration of this pair "
                                              r"\(--set data.hub_config=, now 'fr-en'\)"):
        _check_columns("hf://datasets/wmt/wmt14@abc/fr-en/train/0000.parquet", schema, cfg)
    with pytest.raises(PreprocessError, match="convert the file or set src_lang"):
        _check_columns("/data/fr-en/train/0000.parquet", schema, cfg)


def test_a_compressed_file_given_as_text_is_refused_by_its_first_bytes(tmp_path):
    """An .xz, .bz2 or .zst corpus (or one renamed) was read as text: a few lines of bytes,
    trained on or translated (an .xz of 2,000 lines gave 7 lines, 6 not UTF-8, exit 0)."""
    import bz2
    import lzma

    from convs2s.serving.inputs import InputError, input_lines
    from preprocessing.sources import check_text_pair

    text = ("a sentence .\n" * 2000).encode()
    (tmp_path / "train.fr").write_bytes(text)
    for name, data, kind in (("train.en", lzma.compress(text), "xz"),
                             ("mono.en.bz2", bz2.compress(text), "bzip2")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(PreprocessError, match=rf"{name} is {kind} data \(by its first "
                                                  r"bytes\), not text: decompress it"):
            check_text_pair([str(tmp_path / name), str(tmp_path / "train.fr")])
        with pytest.raises(InputError, match=rf"{name} is {kind} data \(by its first bytes\), "
                                             "not text: decompress it"):
            input_lines(str(tmp_path / name))
    (tmp_path / "mono.en.gzip").write_bytes(gzip.compress(text))  # gzip by its bytes: read
    assert sum(1 for _ in input_lines(str(tmp_path / "mono.en.gzip"))) == 2000
