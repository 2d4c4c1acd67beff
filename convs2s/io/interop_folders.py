"""The folders `import-fairseq` and `export-fairseq` write (convs2s.io.fairseq): whose each is
(a record of the command and the files it wrote, `WRITTEN_BY`), refused where it holds what
another command or a person put there, filled whole beside it and renamed (a local folder) or
published with its record last (a bucket, `storage.publish_dir`), never read as complete
half-written."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from storage import ObjectPath, StorageError, location, publish_dir
from storage.scratch import scratch_dir

WRITTEN_BY = ".convs2s-interop"  # in every folder import / export wrote: who, and which files
# In a bucket's --out while a run publishes there (its old WRITTEN_BY deleted first): who, and
# every file of the old and the new version; the publish removes it. A publish cut short
# leaves it, and the same command may then replace the folder (it was refused as another's).
PUBLISHING = ".convs2s-interop.publishing"
COMMANDS = ("import-fairseq", "export-fairseq")


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _entries(out) -> list[str]:
    """What folder `out` holds: its files and folders by name (a folder with "/"), or a
    bucket prefix's objects by their names under it."""
    if isinstance(out, ObjectPath):
        return [name for name, _ in out.files()]
    return sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())


def _check_out(out, command: str) -> None:
    """Refuse (FileExistsError, nothing changed) an `out` that `command` may not replace: one
    that holds anything but the files an earlier run of this very command wrote there (its
    WRITTEN_BY record lists them). New, or an empty folder: nothing to lose."""
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"--out {out} is a file: give a folder; nothing was changed")
    there = _entries(out)
    if not there:
        return
    # (a publish to a bucket cut short: its record of the old and the new files)
    record_name = PUBLISHING if WRITTEN_BY not in there and PUBLISHING in there else WRITTEN_BY
    if record_name not in there:
        raise FileExistsError(f"--out {out} exists and was not written by import-fairseq / "
                              f"export-fairseq (no {WRITTEN_BY} file in it): give a new --out, "
                              "or move it away yourself; nothing was changed")
    try:
        record = json.loads((out / record_name).read_text())
        by, listed = record["command"], record["files"]
        if by not in COMMANDS or not isinstance(listed, list) or not all(
                isinstance(n, str) and n == Path(n).name and n not in ("", ".", "..")
                for n in listed):  # plain names of files in the folder
            raise ValueError("not a command and a list of file names")
    except (OSError, ValueError, KeyError, TypeError) as err:
        # (an older version's record held no file list: what it wrote is not known either)
        why = f"no {err} in it" if isinstance(err, KeyError) else err
        raise FileExistsError(f"--out {out}: its {WRITTEN_BY} does not say which command wrote "
                              f"the folder and which files ({why}), so its files may be "
                              "someone else's: give another --out, or move the folder away "
                              "yourself; nothing was changed") from None
    if by != command:  # the other command's output (a checkpoint, or an archive) is kept
        theirs = [n for n in there if n != WRITTEN_BY]
        raise FileExistsError(f"--out {out} was written by {by}, not {command} ({_shown(theirs)}"
                              f"): give another --out, or move it away yourself; nothing was "
                              "changed")
    theirs = [n for n in there if n not in (WRITTEN_BY, PUBLISHING) and n not in listed]
    if theirs:
        raise FileExistsError(f"--out {out} holds files {command} did not write "
                              f"({_shown(theirs)}): give another --out, or move those files "
                              "away; nothing was changed")


def _record(folder: Path, command: str) -> None:
    """WRITTEN_BY in `folder` (filled): the command and every file it wrote there."""
    files = sorted(p.name for p in folder.iterdir() if p.name != WRITTEN_BY)
    (folder / WRITTEN_BY).write_text(json.dumps({"command": command, "files": files,
                                                 "pid": os.getpid(), "time": time.time()}))


@contextlib.contextmanager
def _whole_folder(out: Path, command: str):
    """A temporary folder beside `out` for the block to fill; it replaces `out` only when the
    block succeeds (nothing half written is ever `out`), else it is removed. An existing `out`
    is replaced only when it is empty or holds nothing but the files an earlier run of this
    `command` wrote (its `WRITTEN_BY` record), and then by renames (set aside, then removed):
    a folder with any other file, or the other command's, is refused before anything is
    written and again just before the swap (FileExistsError)."""
    _check_out(out, command)
    if isinstance(out, ObjectPath):  # a bucket: filled locally, then published with the
        # WRITTEN_BY object last (storage.publish_dir): whole, or not complete
        scratch = scratch_dir("convs2s-interop-")
        try:
            yield scratch
            _record(scratch, command)
            _check_out(out, command)  # (what was written there meanwhile is kept)
            old = [n for n in _entries(out) if n not in (WRITTEN_BY, PUBLISHING)] \
                if out.exists() else []
            new = json.loads((scratch / WRITTEN_BY).read_text())
            (out / PUBLISHING).write_text(json.dumps(
                {**new, "files": sorted(set(new["files"]) | set(old))}))
            # (PUBLISHING kept until the marker is in: a cut between the old files' removal
            # and the marker left neither record)
            publish_dir(scratch, out, marker=WRITTEN_BY, keep=(PUBLISHING,))
            (out / PUBLISHING).unlink(missing_ok=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    # The writer's own temporary names, never another command's: its machine, pid and a
    # random part (a pid alone repeats across containers sharing the folder, and each writer
    # removed the other's folder as it began); those of a writer that died are removed
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch_dir(f"{out.name}.writing-", out.parent)
    old = out.with_name(f"{out.name}.old-{tmp.name.rpartition('.writing-')[2]}")
    try:
        yield tmp
        _record(tmp, command)
        _check_out(out, command)  # (what was written there meanwhile is kept)
        if out.exists():
            out.rename(old)  # ours (or empty): set aside whole, removed once the new is in
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _input_and_out(source, out, what: str) -> tuple[Path | ObjectPath, Path | ObjectPath]:
    """(`source`'s location, `--out`'s location) for a command that reads folder `source` and
    writes folder `out`. `--out` goes through `storage.location` whatever it looks like: a
    bucket URI that lost a slash ("s3:/bucket/x") is a StorageError, never a local folder
    "s3:". An `--out` that is the input, holds it or lies inside it is refused
    (FileExistsError) before anything is written: `--out` is replaced whole, which would
    delete or change the input."""
    source = location(source)  # (local ones absolute, links resolved)
    try:
        out = location(out)
    except StorageError as err:
        raise StorageError(f"--out {err}") from None
    how, local = None, isinstance(source, Path)
    if local == isinstance(out, Path):  # (a bucket's and a local folder: never the same)
        if source == out:
            how = "is"
        elif out.is_relative_to(source):
            how = "lies inside"
        elif source.is_relative_to(out):
            how = "holds"
        elif local:
            with contextlib.suppress(OSError):  # (another name for the same folder)
                if os.path.samefile(source, out):
                    how = "is"
    if how:
        raise FileExistsError(f"--out {out} {how} the {what} {source} that this command reads: "
                              "writing there would replace or change its own input; give "
                              "another --out (a new folder); nothing was changed")
    return source, out
