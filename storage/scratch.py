"""Scratch folders in this machine's temporary directory that a killed process does not leave
behind for good.

A checkpoint is written into a scratch folder before it is published (`best/`, Ray Train's
copy), a bucket's `metrics.jsonl` is kept in one, uploads and staged weights pass through them.
Each is removed when its work ends, but a process killed meanwhile (Ray Train restarting a
worker group after one worker's failure, a node's OOM killer) cannot remove it: a killed
worker left a whole checkpoint in /tmp (9.7 MB for the demo model; the paper's En-Fr model
with its optimizer state, gigabytes), and a run preempted again and again fills the disk.

So each folder's name says whose it is, `<prefix><owner>-<pid>-<random>`, the owner a digest
of this machine's host name, boot id and pid namespace (`storage.lease`: where a pid can be
looked up). Making a folder first removes those of the same prefix whose process, on this
machine and in this pid namespace, no longer runs. Folders of a live process, of another
machine or container sharing the directory, and folders named otherwise (made before this
module) are left alone: none is removed without proof that its writer is gone.

    tmp = scratch_dir("convs2s-ckpt-")    # /tmp/convs2s-ckpt-1a2b3c4d-4242-k2j3h4
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from storage.processes import machine_id, pid_gone, pid_namespace, place_tag

log = logging.getLogger(__name__)


def scratch_dir(prefix: str, parent: str | os.PathLike | None = None) -> Path:
    """A new, private folder named `<prefix><owner>-<pid>-<random>` in the temporary directory
    (or in `parent`: a folder beside the one it will be renamed to, on its filesystem), made
    after removing the folders of `prefix` there that ended processes of this machine left."""
    owner = place()
    removed = remove_left_behind(prefix, owner, parent)
    if removed:
        log.info("removed %d scratch folder(s) %s* that ended processes left behind",
                 len(removed), Path(parent or tempfile.gettempdir()) / prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owner}-{os.getpid()}-", dir=parent))


def remove_left_behind(prefix: str, owner: str | None = None,
                       parent: str | os.PathLike | None = None) -> list[Path]:
    """Remove the scratch folders of `prefix` (in the temporary directory, or `parent`) whose
    process (same owner: this machine and pid namespace) no longer runs; returns them. This
    process's own are never removed (another thread may be writing one)."""
    owner = owner or place()
    name = re.compile(rf"{re.escape(prefix)}(?P<owner>[0-9a-f]{{8}})-(?P<pid>\d+)-[^/]+")
    removed = []
    for p in Path(parent or tempfile.gettempdir()).glob(f"{glob.escape(prefix)}*"):
        m = name.fullmatch(p.name)
        if not m or m["owner"] != owner or int(m["pid"]) == os.getpid():
            continue
        if pid_gone(int(m["pid"])) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def place() -> str:
    """Where this process's pid can be looked up (`storage.lease.place_tag`)."""
    return place_tag(socket.gethostname(), machine_id(), pid_namespace())
