"""Which process holds something, and whether it still runs: a machine's boot id, its pid
namespace and a tag of both, as leases (storage.lease), stage folders (preprocessing.stages)
and scratch folders (storage.scratch) record their writer's."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path


def pid_namespace() -> str | None:
    """This process's pid namespace ("pid:[4026531836]"), None where there is no /proc:
    containers that share a host name (host networking) number their processes apart."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def machine_id() -> str | None:
    """This machine's boot id (Linux: new at each boot, the same in all its containers), None
    where there is none. Host names repeat across machines (EC2's default ip-10-0-1-23 in two
    VPCs), and every bare host's pid namespace is the same fixed one, so neither tells whether
    a pid can be looked up here."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def place_tag(host: str, boot: str | None, pidns: str | None) -> str:
    """Where a pid can be looked up, in 8 characters for a file name: a digest of a host name,
    boot id and pid namespace (a stage's partial folder, a scratch folder)."""
    import hashlib

    blob = json.dumps([host, boot, pidns], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:8]


def pids_comparable(owner: dict, legacy: bool = True) -> bool:
    """Whether `owner`'s pid (a lease's, a stage's writer's) can be looked up here: the same
    machine (boot id), host name and pid namespace. A record without a boot id (written before
    one was recorded): where `legacy`, the host name and pid namespace alone (a record without
    either: the host name alone); else not comparable. Where this machine has no boot id, none
    is (such a holder is judged by its expiry)."""
    if "boot" in owner:
        if owner["boot"] is None or owner["boot"] != machine_id():
            return False
    elif not legacy:
        return False
    return owner.get("host") == socket.gethostname() and \
        owner.get("pidns", pid_namespace()) == pid_namespace()


def pid_gone(pid: int) -> bool:
    """Whether process `pid` of this machine and pid namespace no longer runs (one of another
    user, which cannot be signalled, runs)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
