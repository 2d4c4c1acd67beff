"""Sentence-pair sources as Ray Datasets in the Hugging Face row shape, plus a row id.

Every source yields rows `{"id": int64, "translation": {src: str, tgt: str}, "error": str|None}`
(or `{"id", "document", "summary", "error"}` for row_shape "columns", Gigaword's shape).
`id` is the row's position in its split (0, 1, ...): everything downstream that needs an order
(sampling, shuffle windows, text export) keys on it, never on Ray's block order. `error` marks
a row the reader could not take (invalid_utf8, line_too_long, bad_row); cleaning counts it.

Kinds (`resolve_split` picks one per split; driver-side checks raise `PreprocessError`):
- hub: parquet files of a Hugging Face dataset (`wmt/wmt14` `fr-en/train-*.parquet`, Gigaword's
  `refs/convert/parquet`), listed with huggingface_hub and read over `hf://` by Ray tasks, both
  from one endpoint (`SplitSource.endpoint`: a mirror, HF_ENDPOINT or the hub).
- parquet: a local folder laid out like the hub (`<config>/<split>-*.parquet`, ...).
  Parquet is read one row group per Ray task; row ids come from the footers' row counts.
- text: two line-aligned files `<name>.<src>` / `<name>.<tgt>` (optionally .gz), read in
  lockstep as bytes (a line is what ends in b"\\n": no other Unicode line breaks, empty lines
  kept); tsv (`src<TAB>tgt`) and jsonl (one hub-shaped row per line) likewise.
- demo: the embedded synthetic corpus (`preprocessing.demo`), generated inside Ray tasks;
  fingerprinted by its `DEMO_VERSION`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import zlib
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.config import PreprocessConfig
from preprocessing.errors import PreprocessError
from preprocessing.stages import file_fingerprint
from storage import binary_kind, cr_line_ends, location, open_input, stamp, wide_encoding
from storage.redact import redact_logs, redact_text, redact_uri

NO_HUB_HINT = ("Without network access use `--source demo` (the embedded corpus) or a local "
               "folder: `--source DIR` with line-aligned text files (DIR/<name>.<lang>[.gz]), "
               "<name>.tsv / <name>.jsonl, or parquet files laid out like the hub's "
               "(DIR/<config>/<split>-*.parquet).")


@dataclass
class SplitSource:
    """A resolved split: what to read and how, and the input's fingerprint."""

    kind: str  # "demo" | "text" | "tsv" | "jsonl" | "parquet"
    files: list[str] = field(default_factory=list)
    # parquet: one read task each: a file, consecutive row groups of it, their first row id
    # and rows (`_parquet_row_groups`)
    row_groups: list[dict] = field(default_factory=list)
    demo_start: int = 0
    rows: int | None = None  # known row count (parquet, demo), else None
    fingerprint: dict = field(default_factory=dict)
    # Line-based files: only lines [first, end) (a split cut from one corpus: `NAME[a:b]`).
    lines: tuple[int, int | None] | None = None
    # Text: the two files' line counts were compared on the driver (`check_text_pair`); if not,
    # the reader compares them, also past the end of a line range.
    pair_counted: bool = False
    # Hub: the endpoint the files were listed from, which the driver and the read tasks read
    # them from too (`open_binary`). It may hold credentials (user:password@): never shown
    # (`hub_shown`), never in the fingerprint (a mirror serves the same commit).
    endpoint: str | None = field(default=None, repr=False)
    # A hub split known from its recorded stages while the hub does not answer
    # (`recorded_hub_source`): why it cannot be read again, said if a stage must read it.
    unreadable: str | None = None

    def estimated_rows(self) -> int:
        if self.rows is not None:
            return self.rows
        return max(1, sum(stamp(f)[0] for f in self.files) // 100)


# --- resolution (driver) -----------------------------------------------------------------------


def _split_patterns(config: str, name: str) -> list[str]:
    """Where the hub (and a local copy of it) keeps a split's parquet files."""
    return [f"{config}/{name}-*.parquet", f"{config}/{name}/*.parquet",
            f"{config}/partial-{name}/*.parquet", f"{name}-*.parquet", f"{name}/*.parquet",
            f"{name}.parquet"]


def select_split_files(names: list[str], config: str, name: str) -> list[str]:
    """A split's parquet files among a repository's (or folder's) relative file names: the
    first pattern that matches wins, e.g. `fr-en/train-*.parquet` (wmt/wmt14) or
    `default/train/*.parquet` (a `refs/convert/parquet` conversion)."""
    for pattern in _split_patterns(config, name):
        found = sorted(n for n in names if fnmatch(n, pattern))
        if found and "/partial-" in pattern:  # read, but never silently taken for the split
            logging.getLogger("preprocessing").warning(
                "split %r is a partial parquet conversion (%s: the hub converts only the first "
                "5 GB of a large split): the rest of the split is not read; point at the "
                "dataset's own files (another revision or config) for all of it",
                name, pattern.rsplit("/", 1)[0])
        if found:
            return found
    return []


class HubUnreachable(PreprocessError):
    """The hub (or a mirror) did not answer a dataset's listing: offline, DNS, HTTP errors,
    a rate limit."""


def hub_parquet_files(cfg: PreprocessConfig, name: str,
                      endpoint: str | None = None) -> tuple[list[str], str]:
    """hf:// paths of a split's parquet files and the resolved commit, or a clear error."""
    from huggingface_hub import HfApi

    from huggingface_hub.errors import (GatedRepoError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    redact_logs("huggingface_hub")  # (its retry warnings quote the URL, password included)
    try:
        info = HfApi(endpoint=endpoint).dataset_info(cfg.hub_repo, revision=cfg.hub_revision)
    except GatedRepoError:  # (before RepositoryNotFoundError: it is one)
        raise PreprocessError(
            f"hub dataset {cfg.hub_repo} is gated: accept its terms on the hub and log in "
            "(`huggingface-cli login`, or HF_TOKEN) on every node") from None
    except RevisionNotFoundError:
        raise PreprocessError(f"hub dataset {cfg.hub_repo} has no revision "
                              f"{cfg.hub_revision!r}; check hub_revision") from None
    except RepositoryNotFoundError:
        raise PreprocessError(f"hub dataset {cfg.hub_repo} does not exist (or is private: log in "
                              "with a token that can see it); check hub_repo") from None
    except Exception as e:  # noqa: BLE001 - offline, DNS, HTTP: all mean "no hub here"
        raise HubUnreachable(
            f"cannot reach the Hugging Face hub at {hub_shown(endpoint)} for dataset "
            f"{cfg.hub_repo} (revision {cfg.hub_revision}): {_brief(e)}; check the endpoint "
            f"(HF_ENDPOINT; python -m preprocessing's --hub-endpoint) and the network. "
            f"{NO_HUB_HINT}") from None
    found = select_split_files([s.rfilename for s in info.siblings or []], cfg.hub_config, name)
    if not found:
        # (one fix for both commands: the workflows read only the fact, and take --split
        # only with --data DIR; both take --set data.splits)
        raise PreprocessError(f"hub dataset {cfg.hub_repo}@{cfg.hub_revision} has no parquet "
                              f"files for config {cfg.hub_config!r} split {name!r}: check "
                              "hub_config, and map each split to a split of the hub's, e.g. "
                              "--set 'data.splits={train: train, valid: validation, test: "
                              "test}'")
    rev = quote(info.sha or cfg.hub_revision, safe="")
    return [f"hf://datasets/{cfg.hub_repo}@{rev}/{n}" for n in found], info.sha or ""


def recorded_hub_source(cfg: PreprocessConfig, split: str) -> dict | None:
    """What the clean stage of this hub split recorded (its manifest's source: the commit and
    files it read, rows_in, and its folder), found under `<root>/<task>/*/clean/`: the same
    dataset, configuration and hub split, and the revision asked for (a full commit: that
    commit; a branch or tag: the commit its stages read, when only one did). None when no
    folder holds one; a PreprocessError when several commits do and none is named."""
    name = cfg.splits[split]
    found: dict[str, dict] = {}
    task = location(cfg.root) / cfg.task

    def manifests():  # (a level at a time: a bucket's glob takes one)
        for data in sorted(task.iterdir()) if task.is_dir() else []:
            clean = data / "clean"
            for stage in sorted(clean.iterdir()) if clean.is_dir() else []:
                if stage.name == split or stage.name.startswith(f"{split}."):
                    yield stage / "manifest.json"

    for manifest in manifests():
        try:
            m = json.loads(manifest.read_text())
            conf, source = m["config"], m["source"]
            if (conf["hub_repo"], conf["hub_config"], conf["split"], source.get("hub")) != \
                    (cfg.hub_repo, cfg.hub_config, name, cfg.hub_repo):
                continue
            commit = source["commit"]
        except (OSError, ValueError, KeyError, TypeError):  # (another stage's, damaged)
            continue
        pinned = re.fullmatch(r"[0-9a-f]{40}", cfg.hub_revision or "")
        # (a folder keyed by its commit records no revision name: its commit is the data)
        if (commit == cfg.hub_revision) if pinned else \
                conf.get("hub_revision") in (None, cfg.hub_revision):
            found.setdefault(commit, {"source": source, "rows_in": m["rows_in"],
                                      "folder": str(manifest.parent.parent.parent)})
    if len(found) > 1:
        raise PreprocessError(
            f"the hub does not answer, and split {split!r} of {cfg.hub_repo} "
            f"{cfg.hub_config}@{cfg.hub_revision} was cleaned at several commits "
            f"({', '.join(c[:12] for c in sorted(found))}): name the run's "
            "(--set data.hub_revision=COMMIT, the full commit its workflow.json records)")
    return next(iter(found.values()), None)


def hub_shown(endpoint: str | None) -> str:
    """The hub endpoint (None: HF_ENDPOINT or the hub) as a message may show it: without the
    credentials its URL may hold."""
    from huggingface_hub import constants

    return redact_uri(endpoint or constants.ENDPOINT)


def _brief(e: BaseException) -> str:
    """An error's type and the first line of its text, credentials redacted (an HTTP error
    quotes its URL, `user:password@` included, and a page of advice after it)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {redact_text(lines[0]) if lines else ''}"[:240]


def hub_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises when the hub (or a mirror) does not serve a read: an
    OSError (HfHubHTTPError for an error status, FileNotFoundError for a file it does not
    list) or an error of its HTTP library (refused, DNS, timeout: not OSErrors)."""
    try:  # (httpx2 where it is one, exported under this name)
        from huggingface_hub.utils import httpx
    except ImportError:
        try:
            import httpx
        except ImportError:  # huggingface_hub before 1.0: requests, whose errors are OSErrors
            return (OSError,)
    return (OSError, httpx.HTTPError)


def hub_read_error(path: str, endpoint: str | None, what: str,
                   e: BaseException) -> PreprocessError | None:
    """The error for `what` of a hub file (`hf://`) that the endpoint did not serve: one
    line naming the file and the endpoint (no credentials) and the fix. None for another
    path or error (a damaged file: pyarrow's errors)."""
    if not path.startswith("hf://") or isinstance(e, pa.ArrowException) \
            or not isinstance(e, hub_errors()):
        return None
    return PreprocessError(
        f"{path}: cannot read {what} from the Hugging Face hub at {hub_shown(endpoint)} "
        f"({_brief(e)}); check the endpoint (HF_ENDPOINT; python -m preprocessing's "
        "--hub-endpoint: a mirror must serve the hub's files, not only its listings) and the "
        f"network. {NO_HUB_HINT}")


def open_binary(path: str, endpoint: str | None = None):
    """A binary file object: an `hf://` path read from `endpoint` (a mirror; None: HF_ENDPOINT
    or the hub), else a local file or an object in a bucket (storage/)."""
    if path.startswith("hf://"):
        from huggingface_hub import HfFileSystem

        redact_logs("huggingface_hub")  # (also in a read task: a process of its own)
        return HfFileSystem(endpoint=endpoint).open(path, "rb")
    return open_input(path)


def _parquet_row_groups(files: list[str], cfg: PreprocessConfig,
                        endpoint: str | None = None) -> tuple[list[dict], int]:
    """The read tasks of all files (`{"file", "groups", "first_id", "rows"}`) and the rows in
    all; checks every file's columns. A task reads consecutive row groups of one file, at
    least `block_rows` rows together (or the file's rest): the hub's files hold row groups of
    about a thousand rows (what the `datasets` library writes), and a task per group made
    40,000 tasks of WMT'14 En-Fr, each opening its file and parsing its ~1 MB footer, and
    40,000 parts in every stage after. Hub files are read from `endpoint`."""
    groups, offset = [], 0
    for path in files:
        try:
            with open_binary(path, endpoint) as f:
                meta = pq.ParquetFile(f)
                schema, counts = meta.schema_arrow, [meta.metadata.row_group(g).num_rows
                                                     for g in range(meta.metadata.num_row_groups)]
        except (OSError, pa.ArrowException, *hub_errors()) as e:  # unreachable, damaged
            if unserved := hub_read_error(path, endpoint, "its parquet footer", e):
                raise unserved from None
            raise PreprocessError(f"{path}: cannot read its parquet footer ({_brief(e)}); "
                                  "re-download or re-export it") from None
        _check_columns(path, schema, cfg)
        task = None
        for g, n in enumerate(counts):
            if task is None or task["rows"] >= cfg.block_rows:
                task = {"file": path, "groups": [], "first_id": offset, "rows": 0}
                groups.append(task)
            task["groups"].append(g)
            task["rows"] += n
            offset += n
    return groups, offset


def _check_columns(path: str, schema: pa.Schema, cfg: PreprocessConfig) -> None:
    if cfg.row_shape == "translation":
        t = schema.field("translation").type if "translation" in schema.names else None
        ok = (t is not None and pa.types.is_struct(t)
              and {cfg.src_lang, cfg.tgt_lang} <= {t.field(i).name for i in range(t.num_fields)})
        want = f"a struct column 'translation' with fields {cfg.src_lang!r} and {cfg.tgt_lang!r}"
    else:
        ok = {cfg.src_lang, cfg.tgt_lang} <= set(schema.names)
        want = f"columns {cfg.src_lang!r} and {cfg.tgt_lang!r}"
    if not ok:
        has = ", ".join(f"{f.name}: {f.type}" for f in schema)
        # a hub file of another configuration (fr-en's rows for --src de --tgt en): its name
        fix = (f"choose the dataset's configuration of this pair (--set data.hub_config=, "
               f"now {cfg.hub_config!r}) or the languages its rows hold (--src / --tgt)"
               if str(path).startswith("hf://") else
               "convert the file or set src_lang / tgt_lang / row_shape to match it")
        raise PreprocessError(f"{path}: parquet file has columns ({has}) but the task needs {want} "
                              f"(the hub's row shape); {fix}")
    # ... of text: an int or binary column failed inside a Ray task without naming the file
    sides = (schema.field("translation").type if cfg.row_shape == "translation" else schema)
    for lang in (cfg.src_lang, cfg.tgt_lang):
        kind = sides.field(lang).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_string_view(kind)):
            raise PreprocessError(f"{path}: its {lang!r} side is {kind}, not text (string); "
                                  "convert the file so that both sides hold strings")


def _not_a_directory(path: Path) -> None:
    if path.is_dir():
        raise PreprocessError(f"{path} is a directory, but a corpus file (one sentence per "
                              "line) is expected there; move the folder away or point --data / "
                              "--source at the folder that holds the files")


LINE_RANGE = re.compile(r"(.+)\[(\d*):(\d*)\]")  # NAME[a:b]: lines a to b-1 of NAME
_SIGNED_RANGE = re.compile(r"(.+)\[(-?\d*):(-?\d*)\]")  # (Python's negative ends: refused)


def shared_training_lines(sources: dict[str, SplitSource]) -> tuple[str, int, int | None] | None:
    """(split, first, end) where an evaluation split reads lines [first, end) that the
    training split reads too (the same files, ranges that meet: `c[:4500]` and `c[4400:4750]`,
    or a split mapped to the training split's files), else None: its loss and scores would be
    on text the model and its BPE learned."""
    train = sources.get("train")
    if train is None or train.kind == "demo":
        return None
    a0, a1 = train.lines or (0, None)
    for split, src in sources.items():
        if split == "train" or src.kind != train.kind or sorted(map(str, src.files)) != \
                sorted(map(str, train.files)):
            continue
        b0, b1 = src.lines or (0, None)
        first, end = max(a0, b0), min((e for e in (a1, b1) if e is not None), default=None)
        if end is None or first < end:
            return split, first, end
    return None


def _text_pair(name: str, files: list) -> SplitSource:
    """Two line-aligned text files, one a side; the same file for both (named twice, or two
    links to one) is refused: it trained a copy model without a word."""
    a, b = files
    same = str(a) == str(b)
    if not same and isinstance(a, Path) and isinstance(b, Path):
        try:
            same = os.path.samefile(a, b)
        except OSError:
            same = False
    if same:
        raise PreprocessError(f"split source {name!r}: {a} and {b} are the same file; give one "
                              "file of each side's text")
    return SplitSource("text", [str(f) for f in files])


def _dangling(files: list) -> str:
    """Where an input that looks missing is a link to nothing: said (its name is there)."""
    links = [f for f in files if isinstance(f, Path) and f.is_symlink() and not f.exists()]
    return "".join(f" ({f} is a link to {os.readlink(f)}, which does not exist)" for f in links)


def _local_candidates(base: Path, name: str, cfg: PreprocessConfig) -> SplitSource | None:
    """The first local layout that exists for split name `name` under folder `base`;
    `NAME[a:b]` is lines a (from 0) to b - 1 of NAME's line-based files (either end may be
    left out, as in Python): splits cut from one corpus, such as train / valid / test."""
    if not LINE_RANGE.fullmatch(name) and (m := _SIGNED_RANGE.fullmatch(name)):
        raise PreprocessError(f"split source {name!r}: a line range counts lines from 0 "
                              "(NAME[first:end], no negative ends); give the line numbers "
                              f"(`wc -l` counts the file's lines), e.g. {m[1]}[4750:]")
    if m := LINE_RANGE.fullmatch(name):
        src = _local_candidates(base, m[1], cfg)
        if src is None:
            return None
        if src.kind not in ("text", "tsv", "jsonl"):
            raise PreprocessError(f"split source {name!r}: a line range cuts line-based files "
                                  f"(text pairs, .tsv, .jsonl), not {src.kind}")
        first, end = int(m[2] or 0), int(m[3]) if m[3] else None
        if end is not None and end <= first:
            raise PreprocessError(f"split source {name!r}: the range holds no line; give "
                                  "NAME[first:end] with first < end")
        src.lines = (first, end)
        return src
    if "," in name:  # two explicit line-aligned files: the source side's, the target side's
        files = [base / p.strip() for p in name.split(",")]
        if len(files) != 2:
            raise PreprocessError(f"split source {name!r}: give exactly two files 'src,tgt'")
        if any(f.name.endswith(tuple(f".{k}{gz}" for k in ("tsv", "jsonl", "parquet")
                                     for gz in ("", ".gz"))) for f in files):
            raise PreprocessError(
                f"split source {name!r}: SRC_FILE,TGT_FILE names one file of each side's plain "
                "text, not two corpora (a .tsv, .jsonl or .parquet file holds both sides: name "
                "it alone); to train on several corpora, concatenate them into one file per "
                "side (cat a.en b.en > train.en; .gz files concatenate the same way)")
        for f in files:
            _not_a_directory(f)
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise PreprocessError(f"missing input file(s) {missing}{_dangling(files)}",
                                  "check --source / --split")
        return _text_pair(name, files)
    if (base / name).is_file():  # a file named outright: kind from its suffix
        kind = next((k for k in ("tsv", "jsonl", "parquet")
                     if name.endswith((f".{k}", f".{k}.gz"))), None)
        if kind is None or name.endswith(".parquet.gz"):
            raise PreprocessError(f"{base / name}: a single input file must be .tsv, .jsonl "
                                  "(optionally .gz) or .parquet", "give line-aligned text as "
                                  "two files: --split SPLIT=SRC_FILE,TGT_FILE")
        return SplitSource(kind, [str(base / name)])
    for gz in ("", ".gz"):
        pair = [base / f"{name}.{cfg.src_lang}{gz}", base / f"{name}.{cfg.tgt_lang}{gz}"]
        for f in pair:
            _not_a_directory(f)
        if pair[0].is_file() or pair[1].is_file():
            missing = [str(f) for f in pair if not f.is_file()]
            if missing:
                lang = cfg.tgt_lang if pair[0].is_file() else cfg.src_lang
                zipped = base / f"{name}.{lang}.gz"  # the other side compressed, this one not
                hint = (f" ({zipped.name} is there: give both sides plain or both .gz)"
                        if not gz and zipped.is_file() else "")
                raise PreprocessError(f"found {pair[0] if pair[0].is_file() else pair[1]} but "
                                      f"not its other side {missing[0]}{hint}{_dangling(pair)}: "
                                      "line-aligned text needs both files")
            return _text_pair(name, pair)
    for kind in ("tsv", "jsonl"):
        for gz in ("", ".gz"):
            p = base / f"{name}.{kind}{gz}"
            if p.is_file():
                return SplitSource(kind, [str(p)])
    names = [str(p.relative_to(base)) for p in base.rglob("*.parquet") if p.is_file()]
    found = select_split_files(names, cfg.hub_config, name)
    return SplitSource("parquet", [str(base / f) for f in found]) if found else None


# Line-aligned text up to this size (both files) is counted on the driver before Ray starts:
# evaluation sets and small corpora fail in a second, not after Ray has read them.
PAIRING_CHECK_BYTES = 64 << 20


def count_lines_from(f) -> int:
    """Lines of an open binary file from where it stands (at a line's start) to its end, as the
    reader sees them (b"\\n"-terminated, a last unterminated one included), 1 MiB at a time."""
    n, last = 0, b"\n"
    for chunk in iter(lambda: f.read(1 << 20), b""):
        n += chunk.count(b"\n")
        last = chunk[-1:]
    return n + (last != b"\n")


def _count_lines(path: str) -> int:
    """A whole file's lines (`count_lines_from`), or a clear error naming it."""
    try:
        with (gzip.open(open_binary(path), "rb") if path.endswith(".gz")
              else open_binary(path)) as f:
            return count_lines_from(f)
    except (OSError, EOFError, zlib.error) as e:  # truncated / corrupt gzip, unreadable file
        raise PreprocessError(f"cannot read {path}: {type(e).__name__}: {e}; re-download or "
                              "re-export this file") from None


def line_count_mismatch(files: list[str], counts: list[int]) -> PreprocessError:
    """The error for a text pair with unequal line counts (found on the driver or by the reader)."""
    return PreprocessError(
        f"line count mismatch: {files[0]} has {counts[0]:,} lines but {files[1]} has "
        f"{counts[1]:,}; line-aligned files need the same number of lines (empty lines "
        "included): fix or re-export the pair")


def _check_line_ends(path: str, head: int = 1 << 13) -> None:
    """Refuse a text file whose lines end in CR alone (`storage.cr_line_ends`), looked at in
    its first `head` bytes."""
    try:
        with (gzip.open(open_binary(path), "rb") if path.endswith(".gz")
              else open_binary(path)) as f:
            start = f.read(head)
    except (OSError, EOFError, zlib.error) as e:
        raise PreprocessError(f"cannot read {path}: {type(e).__name__}: {e}; re-download or "
                              "re-export this file") from None
    if not path.endswith(".gz") and (kind := binary_kind(start)):  # (read as text: bytes)
        raise PreprocessError(f"{path} is {kind} data (by its first bytes), not text: "
                              "decompress it (a .gz is read as it is), or give a parquet file "
                              "its .parquet name")
    if problem := cr_line_ends(start):
        raise PreprocessError(f"{path}: {problem}")
    if wide := wide_encoding(start):  # (every row was dropped as invalid_utf8 / nul_byte)
        raise PreprocessError(f"{path} is {wide} text (by its first bytes), not UTF-8: convert "
                              f"it, e.g. `iconv -f {wide} -t UTF-8 FILE > FILE.utf8`")


def bad_rows_hint(src: SplitSource, cfg: PreprocessConfig) -> str:
    """Why a split's rows could not be read as pairs (every one a bad_row), from its first
    file's first line: the fields a .tsv line has, the keys a .jsonl object has, and the
    shape this configuration reads; "" where it cannot tell."""
    if src.kind not in ("tsv", "jsonl") or not src.files:
        return ""
    path = src.files[0]
    try:
        with (gzip.open(open_binary(path), "rb") if path.endswith(".gz")
              else open_binary(path)) as f:
            first = f.readline(1 << 16).decode("utf-8", "replace").rstrip("\r\n")
    except (OSError, EOFError, zlib.error):
        return ""
    a, b = cfg.src_lang, cfg.tgt_lang
    if src.kind == "tsv":
        n = len(first.split("\t"))
        return (f"{path}'s first line has {n} tab-separated field{'s' * (n != 1)}; a .tsv "
                f"pair is {a}<TAB>{b}, two fields (keep those two columns, e.g. "
                "`cut -f2,3`)") if n != 2 else ""
    try:
        row = json.loads(first)
    except ValueError:
        return f"{path}'s first line is not a JSON object (a .jsonl file holds one a line)"
    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
    wants = {"translation": f'{{"translation": {{"{a}": ..., "{b}": ...}}}}',
             "columns": f'{{"{a}": ..., "{b}": ...}}'}
    other = "columns" if cfg.row_shape == "translation" else "translation"
    return (f"{path}'s first line has keys {keys}; row_shape {cfg.row_shape} reads "
            f"{wants[cfg.row_shape]}, row_shape {other} (--set data.row_shape={other}) "
            f"{wants[other]}")


def check_text_pair(files: list[str]) -> bool:
    """Fail fast on line-aligned text: an empty file, or (for files small enough to count on
    the driver) two sides with different line counts or an unreadable .gz. True when it
    compared the line counts (else the reader does)."""
    for f in files:
        if stamp(f)[0] == 0:
            raise PreprocessError(f"{f} is empty; a corpus file needs one sentence per line")
        _check_line_ends(f)
    if len(files) != 2 or sum(stamp(f)[0] for f in files) > PAIRING_CHECK_BYTES:
        return False
    counts = [_count_lines(f) for f in files]
    if counts == [0, 0]:
        raise PreprocessError(f"{files[0]} and {files[1]} hold no lines; a corpus file needs "
                              "one sentence per line")
    if counts[0] != counts[1]:
        raise line_count_mismatch(files, counts)
    return True


def resolve_split(cfg: PreprocessConfig, split: str, endpoint: str | None = None) -> SplitSource:
    """Find and check a split's input (files exist, columns right); no data is read."""
    name = cfg.splits[split]
    if cfg.source == "demo":
        from preprocessing.demo import DEMO_VERSION  # the pairs change only with the version

        start = 0
        order = ["train"] + cfg.eval_splits  # disjoint index ranges, train first
        for s in order[: order.index(split)]:
            start += cfg.demo_rows.get(s, 0)
        n = cfg.demo_rows.get(split, 0)
        return SplitSource("demo", demo_start=start, rows=n, fingerprint={
            "demo": DEMO_VERSION, "seed": cfg.seed, "start": start, "rows": n,
            "shape": cfg.row_shape})
    if cfg.source == "hub":
        from huggingface_hub import constants

        try:
            files, sha = hub_parquet_files(cfg, name, endpoint)
        except HubUnreachable as unreachable:
            # A split whose data this project cleaned already is what its stages recorded:
            # a run goes on (resumed, continued, scored again) while the hub does not answer
            # (offline, a rate limit); reading it again would need the hub
            recorded = recorded_hub_source(cfg, split)
            if recorded is None:
                raise
            src = SplitSource("parquet", list(recorded["source"]["files"]),
                              rows=recorded["rows_in"],
                              endpoint=endpoint or constants.ENDPOINT)
            src.fingerprint = {k: v for k, v in recorded["source"].items() if k != "kind"}
            src.unreadable = unreachable.fact
            logging.getLogger("preprocessing").warning(
                "%s; split %r is the one cleaned at %s (commit %s)", unreachable.fact.split(
                    "; check")[0], split, recorded["folder"], src.fingerprint["commit"][:12])
            src.fingerprint["kind"] = src.kind
            return src
        # (HF_ENDPOINT's value where no endpoint is given: the read tasks, on other nodes,
        # read from where the driver listed)
        src = SplitSource("parquet", files, endpoint=endpoint or constants.ENDPOINT)
        src.fingerprint = {"hub": cfg.hub_repo, "commit": sha, "files": files}
    else:
        base = location(cfg.source)  # (a file:// URI too: Path() would make it "file:/...")
        if base.is_file():
            raise PreprocessError(f"{base} is a file",
                                  f"give its folder and name the file per split: --source "
                                  f"{base.parent} --split train={base.name}")
        if not base.is_dir():
            raise PreprocessError(f"source folder {base} does not exist; give an existing "
                                  "folder (the workflows' --data, preprocessing's --source), "
                                  "or hub / demo")
        src = _local_candidates(base, name, cfg)
        if src is None:
            raise PreprocessError(
                f"no input for split {split!r} (source name {name!r}) in {base}: looked for "
                f"{name}.{cfg.src_lang} + {name}.{cfg.tgt_lang} (or .gz), {name}.tsv, "
                f"{name}.jsonl and parquet ({', '.join(_split_patterns(cfg.hub_config, name))})"
                + _dangling([base / f"{name}.{lang}{gz}" for lang in (cfg.src_lang, cfg.tgt_lang)
                             for gz in ("", ".gz")] if isinstance(base, Path) else []),
                f"set the name with --split {split}=NAME or --split {split}=SRC_FILE,TGT_FILE")
        src.fingerprint = {"files": file_fingerprint(src.files)}
        if src.lines is not None:
            src.fingerprint["lines"] = list(src.lines)
        if src.kind == "text":
            src.pair_counted = check_text_pair(src.files)
        if src.lines is not None and \
                sum(stamp(f)[0] for f in src.files) <= PAIRING_CHECK_BYTES:
            total = _count_lines(src.files[0])
            if src.lines[0] >= total:
                raise PreprocessError(f"split {split!r} ({name}): the range starts at line "
                                      f"{src.lines[0]:,} but {src.files[0]} has {total:,} lines")
        elif src.kind in ("tsv", "jsonl"):
            for f in src.files:
                if stamp(f)[0] == 0:
                    raise PreprocessError(f"{f} is empty; a corpus file needs one pair per line")
        if src.kind in ("tsv", "jsonl"):  # (a text pair's are checked with its line counts)
            for f in src.files:
                _check_line_ends(f)
    if src.kind == "parquet":
        src.row_groups, src.rows = _parquet_row_groups(src.files, cfg, src.endpoint)
        if not src.rows:  # known from the footers: fail before any reading
            raise PreprocessError(f"split {split!r}: its parquet files ({', '.join(src.files[:3])}"
                                  f"{', ...' if len(src.files) > 3 else ''}) hold no rows; "
                                  "check the input files")
    src.fingerprint["kind"] = src.kind
    return src
