"""Stage mechanics shared by every preprocessing stage: manifests, skip-on-rerun, atomic output.

A stage writes `<root>/<task>/<data key>/<stage>/` = parquet parts + `manifest.json`. It first
writes into a hidden sibling `.<name>.partial-<run>/` (created with its owner: host, pid) and
renames it into place only once the manifest is written, so a killed run never leaves a folder
that a rerun takes as complete; a rerun removes the partial folder once its writer is provably
gone (`remove_stale_leftovers`) and recomputes the stage. A stage whose manifest records the
same config hash and input fingerprint is skipped; one that another run of the same stage
finished while this one ran is kept (`_publish`).

Also here: deterministic hashing (`config_hash`, `mix64`) so that output never depends on Ray's
block scheduling, writing one parquet part, and `collect_stats`, which drains small statistics
rows on the driver (one per block, never the data itself) while printing progress.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.errors import PreprocessError, user_errors
from storage import (ObjectPath, filesystem_of, is_uri, location, publish_dir, remove_tree,
                     stamp)
from storage.processes import machine_id, pid_gone, pid_namespace, pids_comparable, place_tag

log = logging.getLogger("preprocessing")

# Bump when a stage's output for the same config would change (cleaning rules, row format, ...):
# manifests from older code then no longer match and the stage reruns.
PIPELINE_VERSION = 1
MANIFEST = "manifest.json"


# --- hashing -----------------------------------------------------------------------------------


def config_hash(obj) -> str:
    """Stable short hash of a JSON-able object (sorted keys)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def file_fingerprint(paths: list[str]) -> list[dict]:
    """Identity of input files (local or objects) without reading them: path, size, mtime (as
    make does)."""
    out = []
    for p in paths:
        size, mtime_ns = stamp(p)
        out.append({"path": str(p), "size": size, "mtime_ns": mtime_ns})
    return out


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(ids: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64 of (id, seed): a fixed pseudo-random uint64 per row id.

    Sampling, shuffle windows and tie-breaking all key on this, so they depend only on the row
    ids and the seed, never on how Ray happened to split or schedule blocks.
    """
    with np.errstate(over="ignore"):
        z = np.asarray(ids, dtype=np.int64).astype(np.uint64)
        z = z + np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & _M64


# --- manifests and atomic stage folders --------------------------------------------------------


def read_manifest(stage_dir) -> dict | None:
    """A stage folder's manifest; None where it has none (or one that is not JSON: not this
    code's finished stage). A manifest that cannot be read (a 403 once credentials rotated, a
    timeout, a shared folder's permissions) is an error naming it: taken for none, it ran
    hours of preprocessing again and replaced a stage other runs read."""
    path = location(stage_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    except OSError as err:
        raise PreprocessError(f"cannot read {path} ({type(err).__name__}: "
                              f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}):"
                              " check the storage's credentials and permissions, then run "
                              "again") from None


def finished(stage_dir: Path, cfg_hash: str, input_fp: str) -> dict | None:
    """The manifest of a finished stage with this config and input, else None (must run)."""
    m = read_manifest(stage_dir)
    if m and m.get("config_hash") == cfg_hash and m.get("input_fingerprint") == input_fp:
        return m
    return None


OWNER_FILE = ".owner.json"  # in a partial folder: who is writing it (host, pid)


@contextlib.contextmanager
def stage_output(stage_dir: Path) -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces `stage_dir` by rename.

    The caller writes parts and, last, the manifest into the yielded folder. The folder name is
    unique per run, so a task of a killed run that is still finishing cannot write into it.
    The folder is created with an owner file (host, pid) already inside, so other runs can tell
    a live partial folder from a crash leftover: only provably stale leftovers are removed.
    The owner file stays until the folder is renamed into place (`_publish`).
    """
    if is_uri(stage_dir):
        with _object_stage_output(location(stage_dir)) as tmp:
            yield tmp
        return
    stage_dir = Path(stage_dir)
    stage_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_leftovers(stage_dir)
    run = uuid.uuid4().hex[:12]
    tmp = stage_dir.parent / f".{stage_dir.name}.partial-{run}"
    # Made under a name that itself names its owner, so that a crash before the owner file is
    # written leaves a folder another run can still prove stale (remove_stale_leftovers).
    staging = stage_dir.parent / f".{stage_dir.name}.new-{run}-{_owner_tag(_owner())}"
    staging.mkdir()
    (staging / OWNER_FILE).write_text(json.dumps(_owner()))
    staging.rename(tmp)  # appears with its owner named
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not (tmp / MANIFEST).is_file():
        raise RuntimeError(f"stage {stage_dir} finished without writing its manifest")
    _publish(tmp, stage_dir)


def _publish(tmp: Path, stage_dir: Path) -> None:
    """Rename the finished partial folder `tmp` into `stage_dir`, then drop its owner file.

    The owner file goes only after the rename: a partial folder without one is another run's
    to remove, and a run of the same stage may start at any moment. A finished folder that
    still holds it (a crash between the rename and the unlink) is finished all the same: the
    manifest decides, and readers list `part-*.parquet` (or named files), never dot files.
    The rename into place is atomic and fails while another folder is there: an earlier output
    of other settings is moved aside (`.old-*`) and replaced; one that another run of this
    same stage (same config and input) finished meanwhile is kept, and ours dropped.
    """
    ours = read_manifest(tmp)
    for _ in range(5):
        try:
            tmp.rename(stage_dir)
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        else:
            (stage_dir / OWNER_FILE).unlink(missing_ok=True)
            for old in stage_dir.parent.glob(f".{stage_dir.name}.old-*"):
                shutil.rmtree(old, ignore_errors=True)
            return
        theirs = read_manifest(stage_dir)
        if theirs and ours and all(theirs.get(k) == ours.get(k)
                                   for k in ("stage", "config_hash", "input_fingerprint")):
            log.info("%s was finished by another run meanwhile: its output is kept", stage_dir)
            shutil.rmtree(tmp, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):  # (another run moved it first)
            stage_dir.rename(stage_dir.parent / f".{stage_dir.name}.old-{uuid.uuid4().hex[:12]}")
    shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"{stage_dir} kept being replaced by other runs while this one renamed "
                       "its output into place: rerun once they are done")


@contextlib.contextmanager
def _object_stage_output(stage_dir: ObjectPath) -> Iterator[ObjectPath]:
    """`stage_output` in a bucket, where nothing renames: the stage writes into a sibling
    prefix `.<name>.partial-<run>/` (its owner object first); on success its objects are copied
    (by the server) into `stage_dir` with the manifest last, after the old manifest was
    deleted (`storage.publish_dir`), so a reader sees a complete stage or none."""
    remove_stale_leftovers(stage_dir)
    tmp = stage_dir.parent / f".{stage_dir.name}.partial-{uuid.uuid4().hex[:12]}"
    (tmp / OWNER_FILE).write_text(json.dumps(_owner()))
    try:
        yield tmp
        if not (tmp / MANIFEST).is_file():
            raise RuntimeError(f"stage {stage_dir} finished without writing its manifest")
        # The owner object stays until the copy is done: a publish takes minutes in a bucket,
        # and a partial prefix without one is another run's to remove.
        publish_dir(tmp, stage_dir, marker=MANIFEST, leave=(OWNER_FILE,))
    finally:
        remove_tree(tmp)


def remove_stale_leftovers(stage_dir) -> list:
    """Remove the crash leftovers of `stage_dir` that are provably stale: `.old-*` folders
    (never read: a finished stage's previous output), `.partial-*` folders whose writer is
    gone (this host and a process that no longer runs, or this process itself: its stages run
    one at a time), or that name no writer (written by an older version, or emptied by a
    failed run while a late write task recreated it), and `.new-*` folders (a partial folder
    being made, its owner in its name) whose writer is gone. A folder of a live run, or of
    another host, is left alone. Returns what was removed."""
    removed = []
    stage_dir = location(stage_dir)
    if isinstance(stage_dir, ObjectPath):  # no .old-* in a bucket (nothing is renamed)
        for p in stage_dir.parent.glob(f".{stage_dir.name}.partial-*"):
            if _writer_gone(p):
                remove_tree(p)
                removed.append(p)
        return removed
    for p in stage_dir.parent.glob(f".{stage_dir.name}.old-*"):
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    for p in stage_dir.parent.glob(f".{stage_dir.name}.new-*"):
        # .new-<run>-<owner tag>: gone when the tag is this host's and its pid no longer runs
        tag = p.name[len(f".{stage_dir.name}.new-"):].partition("-")[2]
        pid = tag.rpartition("-")[2]
        if pid.isdigit() and tag == _owner_tag({**_owner(), "pid": int(pid)}) and \
                _pid_gone(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    for p in stage_dir.parent.glob(f".{stage_dir.name}.partial-*"):
        if _writer_gone(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
        else:
            log.info("%s is being written by another run: left alone", p)
    return removed


def _owner() -> dict:
    """What a partial folder's owner file names: this process, where it can be looked up."""
    # (the boot id: two machines may share a host name, and every bare host the pid namespace)
    return {"host": socket.gethostname(), "boot": machine_id(), "pidns": pid_namespace(),
            "pid": os.getpid()}


def _owner_tag(owner: dict) -> str:
    """An owner in a folder name: a digest of its host, boot id and pid namespace, and its pid."""
    return f"{place_tag(owner['host'], owner.get('boot'), owner['pidns'])}-{owner['pid']}"


def _writer_gone(partial: Path) -> bool:
    try:
        owner = json.loads((partial / OWNER_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return True  # no owner: an older version's, or a failed run's emptied folder
    except OSError as err:  # the store not answering is no proof: left alone
        log.warning("%s: its owner could not be read (%s); left alone", partial, err)
        return False
    if not pids_comparable(owner):
        return False  # another machine's (or container's) process: not provably gone here
    return _pid_gone(int(owner.get("pid", -1)))


def _pid_gone(pid: int) -> bool:
    """Whether this host's process `pid` provably no longer writes: it does not run, or it is
    this process (which runs one stage at a time: an earlier failed attempt's)."""
    return pid == os.getpid() or pid_gone(pid)


def write_manifest(folder: Path, manifest: dict) -> None:
    rows_in, kept = manifest.get("rows_in"), manifest.get("rows_kept")
    if rows_in is not None:
        dropped = sum(manifest.get("dropped", {}).values())
        if rows_in != kept + dropped:  # the accounting invariant every stage must keep
            raise RuntimeError(
                f"{manifest['stage']}: rows_in {rows_in} != kept {kept} + dropped {dropped}"
            )
    (location(folder) / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True)
                                             + "\n")


def no_space(path: str | Path, exc: OSError) -> PreprocessError | None:
    """The user-facing error for a full disk while writing `path` (None: another OSError)."""
    if exc.errno != errno.ENOSPC:
        return None
    return PreprocessError(f"no space left on the device writing {path}: free disk space under "
                           f"{Path(path).parent} (or give another --out) and rerun; finished "
                           "stages are kept and the unfinished one is redone")


def write_part(table: pa.Table, folder: str, name: str) -> None:
    """Write one parquet part; same table -> same bytes (no timestamps in parquet metadata).
    In a bucket: one object, which appears whole (no temporary name needed)."""
    if is_uri(folder):
        fs, key = filesystem_of(location(folder) / name)
        pq.write_table(table, key, filesystem=fs, compression="zstd")
        return
    path = os.path.join(folder, name)
    try:
        pq.write_table(table, path + ".tmp", compression="zstd")
        os.replace(path + ".tmp", path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        raise (no_space(path, e) or e) from None


def part_paths(folder: str | Path) -> list[str]:
    """The parquet parts of a stage folder (local paths or object URIs), sorted by name."""
    return sorted(str(p) for p in location(folder).glob("part-*.parquet"))


# --- draining per-part statistics ----------------------------------------------------------------


def execution_settings(ds):
    """`ds` with the pipeline's Ray Data execution settings (on its own context, not the
    process-wide one): no per-operator resource reservation. Ray Data reserves half of the
    cluster's CPUs for its operators in equal shares and lets an operator exceed its share only
    slowly; on a small node (2 CPUs) a stage then mostly runs one task at a time. Each stage's
    bulk data stays inside fused tasks (or actors), so there is little to reserve for."""
    ds.context.op_resource_reservation_enabled = False
    _wait_for_a_free_cpu()
    return ds


class _RayCpuCheckToLogFile(logging.Filter):
    """Ray Data warns that a dataset "will hang" whenever the cluster shows no free CPU as it
    starts executing. `write_datasink` runs through `materialize()`, which checks a second
    time right after the write ran, before the write tasks' CPUs show as released: a false
    alarm on a small machine. The stages check for a free CPU themselves
    (`_wait_for_a_free_cpu`, with a warning of their own), so Ray's check is demoted to INFO:
    it stays in ray-data.log, off the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "does not have any available CPUs" in record.getMessage():
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def _wait_for_a_free_cpu(timeout_s: float = 10.0) -> None:
    """Ray releases a finished stage's task and actor CPUs asynchronously, so the next stage,
    started at once, can find no free CPU for a moment. Start it once a CPU is free again, or
    after `timeout_s` with a warning: then other work (training workers, other jobs' actors)
    holds every CPU, and the stage waits for Ray to schedule it."""
    import ray

    ray_check = logging.getLogger("ray.data.dataset")
    if not any(isinstance(f, _RayCpuCheckToLogFile) for f in ray_check.filters):
        ray_check.addFilter(_RayCpuCheckToLogFile())
    deadline = time.monotonic() + timeout_s
    while not ray.available_resources().get("CPU"):
        if time.monotonic() >= deadline:
            log.warning("no free CPU on the Ray cluster for %.0f s: the stage starts and waits "
                        "until other work (training workers, other jobs) releases one",
                        timeout_s)
            return
        time.sleep(0.05)


def collect_stats(ds, label: str, count_key: str = "rows_in", every_s: float = 10.0,
                  rows: list | None = None) -> dict:
    """Run a stage's Ray Data pipeline, whose output is one stats row per part; sum the rows
    (and, with `rows`, append each row to it).

    Only these small rows reach the driver. Prints progress every `every_s` seconds.
    """
    ds = execution_settings(ds)
    totals: dict[str, int] = {}
    t0 = last = time.monotonic()
    with user_errors():
        for row in ds.iter_rows():
            if rows is not None:
                rows.append(dict(row))
            for k, v in row.items():  # stats columns are integer counts; others are labels
                if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
                    totals[k] = totals.get(k, 0) + int(v)
            now = time.monotonic()
            if now - last >= every_s:
                last = now
                log.info("  %s: %s rows so far (%.0f s)", label,
                         f"{int(totals.get(count_key, 0)):,}", now - t0)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: Ray Data stats\n%s", label, ds.stats())
    return totals


def dropped_counts(totals: dict, prefix: str = "drop_") -> dict[str, int]:
    """{reason: n} from summed stats columns named drop_<reason> (zero counts left out)."""
    return {k[len(prefix):]: int(v) for k, v in sorted(totals.items())
            if k.startswith(prefix) and v}
