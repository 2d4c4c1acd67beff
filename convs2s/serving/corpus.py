"""Translate a large corpus on Ray: a Ray Data job with a pool of translator actors, resumable,
its output in shards with a manifest (back-translation of monolingual text, paper-scale test
sets).

    python -m convs2s translate --checkpoint RUN/train/best --input mono.en.gz \\
        --output s3://bucket/bt/mono.de --actors 2 [--gpus-per-actor 0.5] [--precision int8]

    from convs2s.serving.corpus import CorpusJob, translate_corpus
    manifest = translate_corpus(CorpusJob(["RUN/train/best"], "mono.en.gz", "out/", actors=2))

How (the layout a Ray Data batch-inference job takes: stateful callable classes on an actor
pool, docs/reference.md, Ray):
1. **Split.** This process reads the input once (text, .gz, or a parquet column; a local file
   or an object: convs2s.serving.inputs) and writes it to `<output>/source/part-NNNNN.txt`,
   `--shard-lines` lines each, then `source/manifest.json`. A line that is not UTF-8 is
   counted, named by its line number, and kept as an empty line (its translation is an empty
   line): the output stays line for line with the input.
2. **Translate.** A Ray Data dataset of the shards not translated yet goes through
   `map_batches` on `actors` translator actors (each loads the model once, one torch thread
   per CPU it holds, or a GPU fraction). An actor writes `part-NNNNN.txt` (the translations of
   the shard, line for line; `nbest` lines per input with --nbest) and then `part-NNNNN.json`
   (its counts, and the `.txt`'s size and lines): a part counts as done only once its `.json`
   exists and its `.txt` holds the bytes it records, so a killed job (or a machine's crash
   before the renamed file reached the disk) leaves no half-written part that a rerun would
   trust (a local part is renamed into place; an object is one PUT); a rerun translates a part
   that does not match again, even after the manifest was written. A part whose translation
   raises fails alone: the other parts go on, and the job then names the failed parts
   (`PartsFailed`); the rerun translates them. So does a part whose actor's process died on
   it `PART_TRIES` times (Ray Data's default retried it without end). The driver reads the
   parts' state in one listing of the folder, and the actors' rows.
3. **Manifest.** When every part is done, `manifest.json` (written last) sums them: lines in
   and out, failures by reason (empty input lines, kept empty; lines that were not UTF-8, kept
   empty; lines cut to the model's positions), the model, the search, the time and the rate.

`cat <output>/part-*.txt` is the translation in input order (part numbers are as wide as the
last one's, five digits at least, so that they sort in order). A rerun with the same input,
model and settings skips the finished parts (no line lost or repeated); with another input,
model or settings it is refused (a new --output, or delete the folder). One job at a time per
output folder (`storage.lease.RunLease`). A folder this command did not write is never used.
The console shows one progress bar (sentences, sentences/s, ETA).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

from convs2s.config import SearchConfig
from convs2s.io.text_codec import checkpoint_weights
from convs2s.serving.inputs import input_lines
from storage import (ObjectPath, location, remove_tree, side_by_side, stamp, worker_path,
                     write_whole)
from storage import ray_join
from storage.checks import WRITE_PROBE
from storage.lease import RunLease
from convs2s.serving.ray_start import start_ray
from storage.signals import sigterm_as_ctrl_c

log = logging.getLogger("convs2s.serving.corpus")

JOB_FILE = "job.json"  # written first: what this folder translates (input, model, settings)
SOURCE = "source"
MANIFEST = "manifest.json"
# A file storage.write_whole was writing (`.<name>.tmp-<8 hex>`) when its process was killed:
# in this job's folders only this job's own (its lease), never read, removed by a rerun
_HALF_WRITTEN = re.compile(r"\.(part-\d+\.(txt|json)|job\.json|manifest\.json)\.tmp-[0-9a-f]{8}")
MAX_NAMED = 1000  # line numbers kept per failure reason in a manifest


class CorpusError(ValueError):
    """Bad input or output for a corpus job; the message names the file and the fix."""


@dataclass
class CorpusJob:
    """One corpus translation: the model, the input, where the shards go, the actor pool."""

    checkpoints: list[str]
    input: str
    output: str
    search: SearchConfig = field(default_factory=SearchConfig)
    actors: int = 1
    threads_per_actor: int = 1  # torch threads (CPUs reserved) per actor
    gpus_per_actor: float = 0.0  # > 0: each actor searches on a GPU (a fraction may share one)
    # 10,000: the single-process command's --buffer-size, so a part is searched in exactly the
    # batches one process would form (the same sentences sorted together): its translations
    # are the same at every precision (bf16 / int8 results move slightly with the batch)
    shard_lines: int = 10_000
    column: str | None = None  # parquet input: the text column (default: the only string one)
    spm_model: str | None = None
    progress: bool = True  # the console progress bar

    def __post_init__(self) -> None:
        if self.actors < 1 or self.threads_per_actor < 1 or self.shard_lines < 1:
            raise CorpusError("--actors, threads per actor and --shard-lines must be >= 1")
        if not 0 <= self.gpus_per_actor < math.inf:  # (nan: a CPU device, nan GPUs to Ray)
            raise CorpusError("--gpus-per-actor must be >= 0 and finite")

    @property
    def device(self) -> str:
        return "cuda" if self.gpus_per_actor > 0 else "cpu"


# --- small helpers -----------------------------------------------------------------------------


def _read_json(path, remade: bool = False) -> dict | None:
    """The JSON object in `path`, None where there is none. A damaged one (cut short where a
    disk filled or a node lost power, edited into no object): None, with a warning, where the
    job makes it again from what it checks (`remade`: the source's manifest, the job's);
    else a CorpusError naming it."""
    path = location(path)
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    if remade:
        log.warning("%s is damaged (no JSON object): made again", path)
        return None
    raise CorpusError(f"{path} is damaged (no JSON object): delete the folder {path.parent} "
                      "to start over, or give another --output")


def part_name(index: int, suffix: str, width: int = 5) -> str:
    return f"part-{index:0{width}d}.{suffix}"


def part_width(parts: int) -> int:
    """Digits of the output parts' numbers: five, or as many as the last part's number needs,
    so that `part-*.txt` sorts in input order (a folder of up to 100,000 parts keeps the names
    it always had)."""
    return max(5, len(str(parts - 1)))


# --- 1. split ---------------------------------------------------------------------------------


def split_input(job: CorpusJob, out) -> dict:
    """Cut the input into source shards under `out/source/` (manifest last); reused when a
    previous run of this job finished it."""
    out = location(out)
    done = _read_json(out / SOURCE / MANIFEST, remade=True)
    if done is not None:
        return done
    t0 = time.perf_counter()
    shards, lines, non_utf8, n_non_utf8, total = [], [], [], 0, 0

    def flush():
        index = len(shards)
        write_whole(out / SOURCE / part_name(index, "txt"),
                    "".join(f"{x}\n" for x in lines).encode())
        shards.append({"index": index, "first_line": total - len(lines) + 1,
                       "lines": len(lines)})
        lines.clear()

    for text in input_lines(job.input, job.column):
        total += 1
        if text is None:
            n_non_utf8 += 1
            if len(non_utf8) < MAX_NAMED:
                non_utf8.append(total)
            text = ""
        lines.append(text)
        if len(lines) == job.shard_lines:
            flush()
    if lines:
        flush()
    if total == 0:
        raise CorpusError(f"input {job.input} is empty: nothing to translate")
    if n_non_utf8:
        log.warning("%d line(s) of %s are not UTF-8 (first: line %d): each is kept as an empty "
                    "line, its translation an empty line (manifest: failures.non_utf8)",
                    n_non_utf8, job.input, non_utf8[0])
    manifest = {"input": str(job.input), "lines": total, "shard_lines": job.shard_lines,
                "shards": shards, "non_utf8": {"count": n_non_utf8, "lines": non_utf8},
                "seconds": round(time.perf_counter() - t0, 3)}
    write_whole(out / SOURCE / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


# --- 2. translate: the actor pool -------------------------------------------------------------


class ShardTranslator:
    """A Ray Data actor: loads the model once, then translates whole source shards, writing each
    part and then its counts."""

    def __init__(self, checkpoints: list[str], search: dict, device: str, threads: int,
                 spm_model: str | None, output: str, nbest: int, width: int = 5,
                 die_on_part: int = -1, stamps: dict | None = None):
        import torch

        from convs2s.inference.translate import load_for_inference, without_cut_line_warnings

        torch.set_num_threads(threads)
        # A cut line is counted in the part's record, not logged (one with no finite
        # translation is both)
        logging.getLogger("convs2s.inference.translate").addFilter(without_cut_line_warnings)
        _same_files(stamps or {})
        self.translator = load_for_inference(checkpoints, SearchConfig.from_dict(search),
                                             device, spm_model=spm_model)
        # (again: replaced while it loaded) An actor started late (the autoscaler's node) or
        # again (a process death) read whatever the path held then: a best/ republished
        # during the job translated its parts with another model than the job records
        _same_files(stamps or {})
        self.out, self.nbest, self.width = location(output), nbest, width  # (part_width)
        self.die_on_part = die_on_part  # (DIE_ON_PART_ENV: a test's process death)
        # What this actor translates with, decided on its node (a float32 fallback where the
        # asked precision cannot run; int8's weight range by the CPU): each part records it,
        # and the manifest says when parts differ (a mixed cluster, a resume elsewhere).
        self.precision = self.translator.search.precision
        self.batches = {k: search[k] for k in BATCHING}  # (a rerun may change them: recorded)
        # (and the device: float32 on a GPU may use other kernels than on a CPU)
        self.device = next(self.translator.models[0].parameters()).device.type
        if self.precision == "int8":
            from convs2s.inference.quantize import weight_levels

            self.precision = f"int8 (weights +-{weight_levels()})"

    def __call__(self, batch: dict) -> dict:
        """Translate the parts `batch["index"]` names. A part that fails (an error of its own:
        a damaged shard, a write refused, memory) is returned as failed, its error in one line,
        with no record written (a `.txt` without its `.json` is not done): the other parts of
        the job go on, and a rerun translates it again (Ray Data would otherwise end the whole
        job at the first part that raised, the parts other actors were translating thrown
        away)."""
        from convs2s.tracking.redact import redact_text

        rows = {"index": [], "lines": [], "record": [], "error": []}
        for index in batch["index"]:
            index = int(index)
            try:
                record, error = self._part(index), ""
            except Exception as err:  # noqa: BLE001 - the part's error, for the driver's line
                text = str(err).strip().splitlines()
                record = {"lines": 0}
                error = redact_text(f"{type(err).__name__}: {text[0] if text else ''}"
                                    .rstrip(": "))
            rows["index"].append(index)
            rows["lines"].append(record["lines"])
            rows["record"].append(json.dumps(record) if not error else "")
            rows["error"].append(error)
        return rows

    def _part(self, index: int) -> dict:
        """Translate part `index`: its `.txt`, then its record (`.json`), which it returns."""
        import torch

        from convs2s.inference.translate import format_translation

        t0 = time.perf_counter()
        if index == self.die_on_part:
            os._exit(1)  # as the out-of-memory killer or a crash in native code ends an actor
        text = (self.out / SOURCE / part_name(index, "txt")).read_bytes().decode("utf-8")
        lines = text.split("\n")[:-1]
        with torch.inference_mode():
            # (no attention kept: the parts are text)
            translations = self.translator.translate_full(lines, attention=False)
        data = "".join(format_translation(tr, 0, self.nbest, False)
                       for tr in translations).encode()
        write_whole(self.out / part_name(index, "txt", self.width), data)
        # what the .txt holds, checked before the part is trusted (a rename is not flushed
        # to disk: after a crash a part may be shorter than its record says)
        record = {"index": index, "lines": len(lines), "bytes": len(data),
                  "lines_out": data.count(b"\n"),
                  "empty": sum(1 for tr in translations if not tr.source),
                  "truncated": [i for i, tr in enumerate(translations) if tr.truncated],
                  "untranslated": [i for i, tr in enumerate(translations) if tr.untranslated],
                  "precision": self.precision, "device": self.device, "batches": self.batches,
                  "seconds": round(time.perf_counter() - t0, 3)}
        write_whole(self.out / part_name(index, "json", self.width),
                    json.dumps(record).encode())  # done
        return record


# --- the job ----------------------------------------------------------------------------------


STAMPED = ("spm_model_stamp", "shortlist_stamp", "dictionary_stamp")  # (not in older outputs)
# How sentences are batched, which a rerun may change (smaller batches after an out-of-memory):
# each part records its own, and the manifest says when parts differ (a shortlist's or int8's)
BATCHING = ("max_sentences", "max_tokens")


def _identity(job: CorpusJob) -> dict:
    """What the output's translations depend on: a rerun must match it to reuse parts. The
    files it reads by path (the checkpoints, and the sentencepiece model, shortlist table and
    dictionary when given) are recorded with their version (size, mtime): one regenerated at
    the same path is another job. (Their `*_stamp` keys only when given: an output written
    without them resumes as before.)"""
    search = {k: v for k, v in job.search.to_dict().items() if k not in BATCHING}
    identity = {"input": str(job.input), "input_stamp": list(stamp(job.input)),
                "checkpoints": [{"path": str(c), "stamp": list(stamp(checkpoint_weights(c)))}
                                for c in job.checkpoints],
                "spm_model": job.spm_model, "search": search, "shard_lines": job.shard_lines,
                "column": job.column}
    for key, path in zip(STAMPED, (job.spm_model, job.search.shortlist, job.search.dictionary)):
        if path:
            identity[key] = list(stamp(path))
    return identity


def _same_paths(identity: dict) -> dict:
    """`identity` (job.json) with its input and checkpoints as the files they name: a path
    typed another way (absolute, from the folder it was relative to; a checkpoint's folder or
    its checkpoint.pt) is the same job (it was refused as another)."""
    out = dict(identity)
    if isinstance(out.get("input"), str):
        out["input"] = str(location(out["input"]))
    if isinstance(out.get("checkpoints"), list):
        out["checkpoints"] = [{**c, "path": str(checkpoint_weights(c["path"]))}
                              if isinstance(c, dict) and isinstance(c.get("path"), str) else c
                              for c in out["checkpoints"]]
    return out


def _file_stamps(job: CorpusJob, identity: dict) -> dict[str, list]:
    """The files the actors load, by the path they load them from, with the version job.json
    records (`identity`; stamped when the pool started, a best/ republished meanwhile was
    taken as the job's)."""
    stamps = {worker_path(str(checkpoint_weights(c))): list(recorded["stamp"])
              for c, recorded in zip(job.checkpoints, identity["checkpoints"])}
    for key, path in zip(STAMPED, (job.spm_model, job.search.shortlist, job.search.dictionary)):
        if path:
            stamps[worker_path(str(path))] = list(identity[key])
    return stamps


def _same_files(stamps: dict[str, list]) -> None:
    """Refuse (CorpusError) to translate with a file another version of which the job
    records."""
    for path, recorded in stamps.items():
        if list(stamp(path)) != recorded:
            raise CorpusError(f"{path} changed since the job began (another version at its "
                              "path): its parts would mix models; translate with the new one "
                              "into a new --output, or put the job's version back")


def _worker_search(search: SearchConfig) -> dict:
    """The search's settings for an actor: its files' local paths absolute."""
    d = search.to_dict()
    for name in ("shortlist", "dictionary"):
        d[name] = worker_path(d[name])
    return d


def check_job(job: CorpusJob) -> None:
    """Before Ray or the model: the input is a readable, non-empty file; the output is a folder
    this command owns or a new one; the checkpoints exist."""
    src = location(job.input)
    if src.is_dir():
        raise CorpusError(f"input {job.input} is a directory: give a text, .gz or .parquet file")
    if not src.is_file():
        raise CorpusError(f"input file {job.input} does not exist")
    if stamp(job.input)[0] == 0:
        raise CorpusError(f"input {job.input} is empty: nothing to translate")
    for c in job.checkpoints:  # a folder or its checkpoint.pt, as the actors will load it
        if not checkpoint_weights(c).is_file():
            raise CorpusError(f"checkpoint {c} does not exist (no checkpoint.pt): give a "
                              "checkpoint directory of a training run, e.g. RUN/train/best, "
                              "or its checkpoint.pt")
    out = location(job.output)
    if out.is_file():
        raise CorpusError(f"--output {job.output} is a file: with --actors the output is a "
                          "folder of parts (give a new folder name)")
    if out.is_dir() and not (out / JOB_FILE).is_file():
        # (this command's own: its lease, and a job.json a kill cut before its rename)
        foreign = [p.name for p in out.iterdir() if p.name != ".lease.json"
                   and not p.name.startswith((f".{JOB_FILE}.tmp-", WRITE_PROBE))]
        if foreign:
            raise CorpusError(f"--output {job.output} holds files this command did not write "
                              f"({', '.join(sorted(foreign)[:3])}...): give a new or empty "
                              "folder")


def translate_corpus(job: CorpusJob) -> dict:
    """Run `job` on the Ray this process is connected to (or a local one it starts) and return
    the manifest. Raises CorpusError for bad input (InputError for an input that does not
    read), LeaseHeld when another job writes there."""
    check_job(job)
    out = location(job.output)
    with RunLease(out, command=f"translate --input {job.input}",
                  elsewhere="give another --output"):
        identity = _identity(job)
        previous = _read_json(out / JOB_FILE)
        # An output written before the files' stamps were recorded is compared without them,
        # and without the batching its search recorded (BATCHING)
        if previous is not None and isinstance(previous.get("search"), dict):
            previous["search"] = {k: v for k, v in previous["search"].items()
                                  if k not in BATCHING}
        compared = identity if previous is None else {
            k: v for k, v in identity.items() if k in previous or k not in STAMPED}
        was, now = (_same_paths(previous), _same_paths(compared)) if previous is not None \
            else (None, None)
        if previous is not None and was != now:
            changed = sorted(k for k in now if was.get(k) != now[k])
            raise CorpusError(f"--output {job.output} holds translations of another job "
                              f"(changed: {', '.join(changed)}): give a new --output, or delete "
                              "the folder to start over")
        _remove_half_written(out)
        complete = _read_json(out / MANIFEST, remade=True)
        if previous is not None and complete and (n := len(complete.get("parts", []))) and \
                all(r is not None for r in part_records(out, list(range(n)),
                                                        part_width(n)).values()):
            # (before the input is read: its parts, source/, may be deleted once complete)
            log.info("%s is complete already (%s)", job.output, MANIFEST)
            return complete
        if previous is None:
            write_whole(out / JOB_FILE, json.dumps(identity, indent=1).encode())
        try:
            source = split_input(job, out)
        except (ValueError, OSError):  # (CorpusError, InputError)
            # An input that does not read whole as its kind (a .parquet that is not parquet, a
            # .gz that is not gzip or is cut short, a missing column, nothing in it) leaves the
            # folder no job's: with job.json there, the rerun on the mended input was another
            # job's folder. What this job wrote is removed (a kill keeps it: same input, same
            # job, its split done again).
            if previous is None:
                if (out / SOURCE).exists():
                    remove_tree(out / SOURCE)
                (out / JOB_FILE).unlink(missing_ok=True)
            raise
        t0 = time.perf_counter()
        width = part_width(len(source["shards"]))
        records = part_records(out, [s["index"] for s in source["shards"]], width)
        todo = [s for s in source["shards"] if records[s["index"]] is None]
        if complete and not todo:
            log.info("%s is complete already (%s)", job.output, MANIFEST)
            return complete
        done_lines = source["lines"] - sum(s["lines"] for s in todo)
        if done_lines:
            log.info("resuming: %d of %d parts done already", len(source["shards"]) - len(todo),
                     len(source["shards"]))
        if todo:
            if complete:  # a part no longer matches its record: not complete meanwhile
                (out / MANIFEST).unlink(missing_ok=True)
            records.update(_run_pool(job, todo, source["lines"], done_lines, width,
                                     _file_stamps(job, identity)))
        seconds = time.perf_counter() - t0
        manifest = _manifest(job, out, source, identity, seconds, len(todo), records)
        write_whole(out / MANIFEST, json.dumps(manifest, indent=1).encode())  # last: complete
    return manifest


def _remove_half_written(out) -> None:
    """What a killed job's writes left beside their files (SIGKILL, a lost node: a local
    write_whole flushes to the disk before its rename, which takes a while): the rerun, which
    holds the folder's lease, removes them. (A bucket's objects are one PUT: nothing left.)"""
    if isinstance(out, ObjectPath):
        return
    for folder in (out, out / SOURCE):
        if folder.is_dir():
            for p in folder.iterdir():
                if _HALF_WRITTEN.fullmatch(p.name) and p.is_file():
                    p.unlink(missing_ok=True)


def _sizes(out) -> dict[str, int]:
    """name -> size of the files directly in the output folder, in one listing (a bucket
    answers a thousand names a request; checking each part by itself asked it five requests
    a part: 25,000 for a corpus of 5,000 parts, minutes before any actor started)."""
    import pyarrow.fs as pafs

    out = location(out)
    if isinstance(out, ObjectPath):
        infos = out.fs.get_file_info(pafs.FileSelector(out.key, allow_not_found=True))
        return {i.base_name: i.size for i in infos if i.type == pafs.FileType.File}
    try:
        with os.scandir(out) as entries:
            return {e.name: e.stat().st_size for e in entries if e.is_file()}
    except FileNotFoundError:
        return {}


def _holds(record: dict, size: int | None) -> bool:
    """Whether a part's `.txt` of `size` bytes (None: there is none) is what its record counts
    (a record written before sizes were: any `.txt`)."""
    return size is not None and size == record.get("bytes", size)


def part_records(out, indices: list[int], width: int) -> dict[int, dict | None]:
    """index -> the record of part `index` where the part is finished: its `.json` is written
    and its `.txt` holds the bytes that record counts; None where it is not (a part that does
    not match, one a crash left short, is translated again; a part recorded before sizes
    were, on its `.json` alone). One listing of the folder, then the records read side by
    side (in a bucket each read is a request)."""
    out, sizes = location(out), _sizes(out)

    def record_of(index: int) -> dict | None:
        name, txt = part_name(index, "json", width), part_name(index, "txt", width)
        if name not in sizes:
            return None
        try:
            record = json.loads((out / name).read_bytes())
        except (ValueError, FileNotFoundError):  # a record a crash left empty or cut short
            return None
        size = sizes.get(txt)
        if not _holds(record, size):
            log.warning("%s does not match its record (%s bytes, %s recorded): translated again",
                        out / txt, "no" if size is None else size, record.get("bytes", "none"))
            return None
        return record

    if isinstance(out, ObjectPath):
        return dict(zip(indices, side_by_side(record_of, indices)))
    return {index: record_of(index) for index in indices}


class PartsFailed(CorpusError):
    """Parts whose translation raised; every other part of the job was translated."""


# A part's tries on an actor whose process died translating it (the out-of-memory killer, a
# crash in native code): Ray Data's actor pool retries such a part without end by default, and
# the job hung on it. The actor itself is started again.
PART_TRIES = 3
# Test-only: the translator actors end their own process (os._exit) at the part of this index,
# every time: a process death, not an error. Read by the driver and handed to the actors.
DIE_ON_PART_ENV = "CONVS2S_TEST_CORPUS_DIE_ON_PART"


def _run_pool(job: CorpusJob, todo: list[dict], total: int, done: int,
              width: int, stamps: dict[str, list]) -> dict[int, dict]:
    """Translate the parts `todo` on the actor pool (which loads `stamps`, `_file_stamps`);
    the records of those translated. PartsFailed names the parts that failed, at the end."""
    import ray

    _same_files(stamps)  # (one line here rather than a failed part per actor)
    start_ray()
    check_room(job, ray.nodes())
    check_shared(job)
    context = ray.data.DataContext.get_current()
    allowed = context.max_errored_blocks
    # a part whose actor died PART_TRIES times is a failed part (below), not the job's end
    context.max_errored_blocks = len(todo)
    try:
        return _translate_parts(job, todo, total, done, width, stamps)
    finally:
        context.max_errored_blocks = allowed


def _translate_parts(job: CorpusJob, todo: list[dict], total: int, done: int,
                     width: int, stamps: dict[str, list]) -> dict[int, dict]:
    import ray
    from tqdm import tqdm

    ds = ray.data.from_items([{"index": s["index"]} for s in todo],
                             override_num_blocks=len(todo))
    gpus = {"num_gpus": job.gpus_per_actor} if job.gpus_per_actor else {}
    # One part in flight per actor: a part waits for a free actor rather than queueing behind
    # the first actor to start (Ray Data's default sends up to 4 to one actor)
    pool = ray.data.ActorPoolStrategy(size=min(job.actors, len(todo)),
                                      max_tasks_in_flight_per_actor=1)
    with warnings.catch_warnings():  # (Ray 2.60 takes max_task_retries only as a remote
        # argument, which it says it will stop taking in 2.64; this job's tests would see it go)
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        ds = ds.map_batches(
            ShardTranslator, batch_size=1, compute=pool, num_cpus=job.threads_per_actor,
            **gpus,
            # (local paths absolute: the actors do not run in this process's folder)
            fn_constructor_kwargs=dict(
                checkpoints=[worker_path(c) for c in job.checkpoints],
                search=_worker_search(job.search), device=job.device,
                threads=job.threads_per_actor, spm_model=worker_path(job.spm_model),
                output=worker_path(job.output), nbest=job.search.nbest, width=width,
                die_on_part=int(os.environ.get(DIE_ON_PART_ENV) or -1),
                stamps=stamps),
            max_task_retries=PART_TRIES - 1)
    # (SIGTERM as Ctrl-C once Ray, which installs its own handler, has started)
    with sigterm_as_ctrl_c(), \
            tqdm(total=total, initial=done, unit=" sentences", unit_scale=True, file=sys.stderr,
                 disable=not job.progress, dynamic_ncols=True, smoothing=0.1,
                 desc="translate") as bar:
        records, failed = {}, {}
        for row in ds.iter_rows():
            if row["error"]:
                failed[int(row["index"])] = row["error"]
                continue
            records[int(row["index"])] = json.loads(row["record"])
            bar.update(int(row["lines"]))
    for index in {s["index"] for s in todo} - set(records) - set(failed):
        failed[index] = (f"its translator's process died on it {PART_TRIES} times (killed by "
                         "the out-of-memory killer, or a crash in native code: see Ray's logs)")
    if failed:
        first = min(failed)
        raise PartsFailed(
            f"a translator failed on {len(failed)} of {len(todo)} part(s) "
            f"({part_name(first, 'txt', width)}: {failed[first]}"
            + (f"; also {', '.join(part_name(i, 'txt', width) for i in sorted(failed)[1:4])}"
               + (", ..." if len(failed) > 4 else "") if len(failed) > 1 else "")
            + f"); the finished parts are kept in {job.output}: the same command translates "
            "the rest")
    return records


def _manifest(job: CorpusJob, out, source: dict, identity: dict, seconds: float,
              translated_parts: int, records: dict[int, dict | None]) -> dict:
    """The manifest of a job whose parts are all finished: `records` (index -> record, from
    `part_records` and the actors) checked against the source shards and, in one more listing,
    against the parts' sizes."""
    width = part_width(len(source["shards"]))
    parts = [records.get(s["index"]) for s in source["shards"]]
    missing = [s["index"] for s, p in zip(source["shards"], parts) if p is None]
    if missing:
        raise CorpusError(f"{job.output}: parts {missing[:5]} were not written; rerun the "
                          "same command to finish them")
    for s, p in zip(source["shards"], parts):
        expected = s["lines"] * job.search.nbest  # (n-best lines a source line)
        if p["lines"] != s["lines"] or p.get("lines_out", expected) != expected:
            raise CorpusError(
                f"{out / part_name(s['index'], 'json', width)} counts {p['lines']} lines in and "
                f"{p.get('lines_out', expected)} out, its source shard {s['lines']} in and "
                f"{expected} out: delete the part and rerun")
    sizes = _sizes(out)
    short = [s["index"] for s, p in zip(source["shards"], parts)
             if not _holds(p, sizes.get(part_name(s["index"], "txt", width)))]
    if short:
        raise CorpusError(f"{job.output}: parts {short[:5]} do not hold what their records "
                          "count; rerun the same command to translate them again")
    lines = sum(p["lines"] for p in parts)
    truncated = [s["first_line"] + i for s, p in zip(source["shards"], parts)
                 for i in p["truncated"]]
    untranslated = [s["first_line"] + i for s, p in zip(source["shards"], parts)
                    for i in p.get("untranslated", ())]  # (parts before 2026-12-07: none)
    non_utf8 = source["non_utf8"]
    return {
        "input": str(job.input), "lines_in": source["lines"],
        "lines_out": lines * job.search.nbest, "nbest": job.search.nbest,
        "parts": [part_name(s["index"], "txt", width) for s in source["shards"]],
        "failures": {
            # empty input lines (the not-UTF-8 ones among them) give empty output lines
            "empty": sum(p["empty"] for p in parts) - non_utf8["count"],
            "non_utf8": non_utf8,
            "truncated": {"count": len(truncated), "lines": truncated[:MAX_NAMED]},
            # (lines with text but no finite translation: an empty output line each)
            "untranslated": {"count": len(untranslated), "lines": untranslated[:MAX_NAMED]}},
        "model": identity["checkpoints"], "search": identity["search"],
        # parts by the precision their actor translated in (more than one: the parts differ)
        "precision": dict(Counter(p.get("precision", "unrecorded") for p in parts)),
        "device": dict(Counter(p.get("device", "unrecorded") for p in parts)),  # (as precision)
        "batches": dict(Counter(json.dumps(p.get("batches", "unrecorded")) for p in parts)),
        "actors": job.actors, "threads_per_actor": job.threads_per_actor,
        "gpus_per_actor": job.gpus_per_actor, "parts_translated_now": translated_parts,
        "seconds": round(seconds, 3),
        # the rate of a run that translated every part (a resumed run's would mislead)
        "sentences_per_s": round(lines / max(seconds, 1e-9), 2)
        if translated_parts == len(parts) else None}


def check_shared(job: CorpusJob) -> None:
    """On a cluster of several nodes, a local --output (the source shards the actors read, the
    parts they write) and the local checkpoints, vocabulary and dictionaries must be ones every
    node sees: an actor elsewhere failed its parts, or wrote them to its own disk, at every
    rerun (`ray_join.node_not_seeing`)."""
    files = [*job.checkpoints, *(p for p in (job.spm_model, job.search.dictionary,
                                             job.search.shortlist) if p)]
    if (unseen := ray_join.node_not_seeing(job.output, also=tuple(files))) is not None:
        address, what = unseen
        raise CorpusError(f"{what} is not shared: the node at {address} does not see it, and "
                          "translator actors run there; give a folder every node mounts (NFS / "
                          "EFS / a shared volume) or a bucket URI (s3://BUCKET/PREFIX) for "
                          "--output, and the model's files on such a folder")


def check_room(job: CorpusJob, nodes: list[dict]) -> None:
    """A local Ray (started here) never grows: a translator actor that no alive node of it
    (`ray.nodes()`) can hold (--threads CPUs, --gpus-per-actor GPUs) would leave the job waiting
    without end (Ray Data: "the job may hang forever unless the cluster scales up"). A
    cluster's autoscaler may add such a node: there the job waits (`ray_join.no_room_for`)."""
    if (largest := ray_join.no_room_for(job.threads_per_actor, job.gpus_per_actor,
                                        nodes)) is None:
        return
    cpus, gpus = largest
    fix = ("give --threads %g (or fewer)" % cpus if job.threads_per_actor > cpus else
           "leave --gpus-per-actor out" if not gpus else
           "give --gpus-per-actor %g (or less)" % gpus)
    raise CorpusError(f"each translator actor asks for {job.threads_per_actor} CPU(s)"
                      + (f" and {job.gpus_per_actor:g} GPU(s)" if job.gpus_per_actor else "")
                      + f", but this machine's Ray has {cpus:g} CPU(s) and {gpus:g} GPU(s): "
                      "no actor could start (a local Ray never grows); " + fix + ", or submit "
                      "the job to a cluster (`ray job submit`)")
