"""A run lease: one writer per run folder, on a POSIX path and on S3 alike.

The first command to use a run folder writes `<folder>/.lease.json` with an exclusive create
(O_CREAT | O_EXCL on a POSIX path; a conditional PUT, `If-None-Match: *`, on S3) naming its
owner (host, boot id, pid, a random id, the command) and an expiry; a heartbeat thread renews it
every `heartbeat_s` (a compare-and-set on S3: `If-Match` the lease's own ETag; on a POSIX path
the file is touched, its mtime the renewal, so that there is never a moment without a lease that
a newcomer could take; where a filesystem ignores the touch, the record is written again, as a
warning says). A second command finds the lease and stops with one line naming the holder
(`LeaseHeld`); a command whose lease was taken while it ran fails as its `with` block ends
(`LeaseLost`), and so does one that finds at its end that the lease is no longer its own. A
lease whose holder is gone is taken over, and the taker says so: the same machine (boot id, host
name, pid namespace) and a pid that no longer runs, or an expiry in the past (its heartbeat
stopped more than `ttl_s` ago: on S3 by the store's clock, the object's last PUT against the
answer's Date, whatever the hosts' clocks say; on a shared POSIX folder by the file's mtime
against this host's clock, so there the hosts' clocks are assumed to agree within a few
seconds). Taking over is itself exclusive: the stale lease is renamed away (POSIX) or
overwritten with `If-Match` its ETag (S3), so of two takers one wins. A renewal and a release
change the lease only if it is still this command's: on a POSIX path a release renames the lease
aside and looks at it there (put back when it is another's) and a renewal reads it again after
touching it (a touch of a taker's fresh lease changes nothing of it), on S3 the PUT or DELETE
carries `If-Match` its ETag.

    with RunLease(run_dir, command="wmt14_en_fr smoke") as lease:
        ...                                   # lease.taken_over: the message, or None
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from storage.paths import ObjectPath, StorageError, location, s3_client
from storage.processes import machine_id, pid_gone, pid_namespace, pids_comparable

log = logging.getLogger("storage")

LEASE_FILE = ".lease.json"
# The first botocore whose S3 model takes IfNoneMatch / IfMatch on PutObject and IfMatch on
# DeleteObject (read in its S3 service model: 1.35.68 lacks IfMatch on PutObject; 1.35.69 has all)
BOTOCORE_CONDITIONS = (1, 35, 69)
_CONDITIONS_HONOURED: set[str] = set()  # buckets whose store refused the probes' conditions


class LeaseHeld(RuntimeError):
    """The folder is held by another live command; the message names it and the fix."""


class LeaseLost(LeaseHeld):
    """The command's lease was taken while it ran (raised as its `with` block ends)."""


def _subfolders(folder) -> list:
    """The folders directly in `folder` (none where it is no folder): in a bucket one listing,
    each entry's type in it (a request per entry to ask each whether it is a folder made a
    sweep's start, two levels of 20 trials' folders, hundreds of requests)."""
    if isinstance(folder, ObjectPath):
        import pyarrow.fs as pafs

        infos = folder.fs.get_file_info(pafs.FileSelector(folder.key, allow_not_found=True))
        return [folder / i.base_name for i in infos if i.type == pafs.FileType.Directory]
    return [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []


class RunLease:
    """An exclusive, renewed hold on `folder` (see the module's docstring)."""

    def __init__(self, folder, command: str = "", ttl_s: float = 120.0,
                 heartbeat_s: float = 20.0, elsewhere: str = "give another --run-name",
                 outer=None, inner: bool | int = False):
        self.folder = location(folder)
        # A folder `folder` lies in that another command may hold as its run (a workflow's run
        # folder, whose training runs in <run>/<name>), and the folder that one lies in (a
        # sweep's, whose trials are <sweep>/<trial>/, each training in <trial>/train):
        # refused while one of those leases is live
        self.outer = [] if outer is None else list(dict.fromkeys(
            p / LEASE_FILE for p in (location(outer), location(outer).parent)))
        # `inner`: the folders in `folder`, to that depth (True: those directly in it; 2: and
        # those in them, a sweep's trials' train/), that other commands may hold as theirs (a
        # `convs2s train` in a workflow run's train/): refused while one of those is live
        self.inner = int(inner)
        self.path = self.folder / LEASE_FILE
        self.command, self.ttl_s, self.heartbeat_s = command, ttl_s, heartbeat_s
        self.elsewhere = elsewhere  # the refusal's way to another folder
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(),
                      "boot": machine_id(), "pidns": pid_namespace(),
                      "id": uuid.uuid4().hex[:12], "command": command}
        self.taken_over: str | None = None
        self.lost = False  # set when a renewal or the release finds the lease no longer ours
        self._released = False
        self._made_folder = False  # (a local folder this lease made: removed on release if empty)
        self._lock = threading.Lock()  # renewal / release one at a time (not each other's
        # rename taken for a takeover)
        self._etag: str | None = None
        self._seen_etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = None  # one S3 client a lease
        self._renewed = time.monotonic()  # the last renewal that reached the store
        self._warned_rewrite = False  # (a filesystem that ignores a touch, said once)
        self._expired_said = False  # (renewals unanswered past the ttl, said once)

    # -- the record --
    def _record(self) -> dict:
        now = time.time()
        return {**self.owner, "renewed": now, "expires": now + self.ttl_s}

    def _stale(self, held: dict) -> str | None:
        """Why a held lease is stale (its holder gone), or None (live)."""
        if pids_comparable(held, legacy=False) and isinstance(held.get("pid"), int) \
                and held["pid"] != os.getpid() and pid_gone(held["pid"]):
            return f"its holder (pid {held['pid']} on this host) is gone"
        if float(held.get("expires", 0)) < time.time():
            renewed = float(held.get("renewed", 0))
            ttl = float(held.get("expires", 0)) - renewed  # the holder's own bound, not ours
            return (f"its heartbeat stopped {time.time() - renewed:.0f} s ago (its lease "
                    f"lasted {ttl:.0f} s)")
        return None

    def _refusal(self, held: dict, where: str = "", holds: str = "") -> LeaseHeld:
        """`where`: the folder in use, when it is the one this lease's lies in (`outer`);
        `holds`: a folder in this one, in use (`inner`)."""
        since = time.strftime("%H:%M:%S", time.localtime(float(held.get("renewed", 0))))
        what = f" ({held['command']})" if held.get("command") else ""
        inside = f" is inside {where}, which" if where else ""
        inside = f" holds {holds}, which" if holds else inside
        return LeaseHeld(
            f"{self.folder}{inside} is in use by another command{what}: pid {held.get('pid')} on "
            f"{held.get('host')}, lease renewed at {since}; wait for it to finish, stop it, or "
            f"{self.elsewhere} (a holder that died is taken over after "
            f"{self.ttl_s:.0f} s, at once on its own host)")

    def ref(self) -> LeaseRef:
        """What the processes this command starts carry to check the lease before they write
        (`LeaseRef.check`)."""
        return LeaseRef(str(self.path), self.owner["id"])

    # -- acquire / renew / release --
    def _nested_refusal(self) -> LeaseHeld | None:
        """The refusal of a live lease on the folder this one lies in (`outer`) or on one in
        it (`inner`), other than this very process's (its own run), or None."""
        def live(held) -> bool:
            return held is not None and self._stale(held) is None and not (
                pids_comparable(held, legacy=False) and held.get("pid") == os.getpid())

        for outer in self.outer:
            if live(held := read_lease(outer)[0]):
                return self._refusal(held, where=str(outer.parent))
        level = [self.folder]
        for _ in range(self.inner):
            level = [p for d in level for p in _subfolders(d)]
            for sub in level:
                if live(held := read_lease(sub / LEASE_FILE)[0]):
                    return self._refusal(held, holds=str(sub))
        return None

    def acquire(self) -> RunLease:
        """Take the lease (LeaseHeld where another command holds it, or the folder this one
        lies in, or one in it). The nested leases are looked at again once this one is held:
        of two commands starting at once on a folder and one in it, each then sees the
        other's, and neither goes on writing beside the other."""
        if refusal := self._nested_refusal():
            raise refusal
        self._take()
        if refusal := self._nested_refusal():
            self.release()
            raise refusal
        return self

    def _take(self) -> None:
        for _ in range(5):  # a lost race with another taker: look again
            if self._create():
                self._start_heartbeat()
                return
            held = self._read()
            if held is None:
                continue  # released between our create and our read
            if self._ours(held):  # our own create, sent twice (botocore resends a PUT whose
                self._etag = self._seen_etag  # answer was lost; the second finds the first's)
                self._start_heartbeat()
                return
            why = self._stale(held)
            if why is None:
                raise self._refusal(held)
            if self._take_over(held):
                self.taken_over = (f"took over the lease of {self.folder} from pid "
                                   f"{held.get('pid')} on {held.get('host')}: {why}")
                log.warning("%s", self.taken_over)
                self._start_heartbeat()
                return
        if self.path.exists() and self._read() is None:
            raise LeaseHeld(f"{self.path} cannot be read as a lease (written by a command that "
                            "died while writing it?): delete it once no command uses "
                            f"{self.folder}")
        raise LeaseHeld(f"{self.folder}: could not take its lease (other commands keep "
                        "taking it); try again")

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still this command's; `lost` is
        set when it is not (another command took it over, and may have released it since)."""
        if self._released or self._thread is None:  # (released already, or never held)
            return
        self._released = True
        self._stop.set()
        with self._lock:  # (a renewal under way ends first; its verdict counts)
            if not self.lost and not self._remove():
                self.lost = True
                log.warning("the lease of %s was no longer this command's as it ended (another "
                            "command took it over)", self.folder)
        self._thread.join(5)
        if self._made_folder and not self.lost:  # a command refused before it wrote anything
            # leaves no empty run folder; rmdir removes only an empty one
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()

    def __enter__(self) -> RunLease:
        return self if self._thread is not None else self.acquire()  # (acquired already)

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.release()
        else:
            try:
                self.release()
            except Exception as err:  # noqa: BLE001 - never in place of the error under way
                log.warning("releasing the lease of %s failed (%s)", self.folder, err)
        if self.lost and exc_type is None:  # (an error already on its way says more)
            raise LeaseLost(
                f"{self.folder}: this command lost its lease while it ran (another command took "
                "it over, or the store refused its renewals, e.g. credentials that expired); "
                "what both wrote there may be mixed: check the folder, or rerun under another "
                "name")

    def _start_heartbeat(self) -> None:
        def beat():
            while not self._stop.wait(self.heartbeat_s):
                with self._lock:
                    if self._stop.is_set():
                        return  # released meanwhile: the release looked at the lease
                    try:
                        ours = self._renew()
                    except OSError as err:  # a local store's error: as a network one on S3
                        ours = self._unanswered(err)
                    if not ours:  # (proof only: another command's lease, or none there)
                        self.lost = True
                        log.warning("the lease of %s was taken by another command; this "
                                    "command no longer holds it", self.folder)
                        return

        self._thread = threading.Thread(target=beat, name="run-lease", daemon=True)
        self._thread.start()

    def _unanswered(self, err: Exception) -> bool:
        """A renewal the store did not answer: retried at every beat. Past the ttl another
        command may take the lease over; the lease is lost only once one did (the heartbeat
        gave up after one ttl, and the command wrote on; workflows check before each record),
        or when the store refuses it for good (403, expired credentials, no such bucket)."""
        if time.monotonic() - self._renewed > self.ttl_s:
            if _code(err) in _REFUSED:
                log.warning("the lease of %s could not be renewed for %.0f s: the store "
                            "refuses it (%s)", self.folder, self.ttl_s, err)
                return False
            if not self._expired_said:
                self._expired_said = True
                log.warning("the lease of %s could not be renewed for %.0f s (%s): another "
                            "command may take it over; this command goes on renewing it, and "
                            "its records and checkpoints stop if one did", self.folder,
                            self.ttl_s, err)
        else:
            log.warning("renewing the lease of %s failed (%s); retrying", self.folder, err)
        return True

    # -- per filesystem --
    def _s3(self):
        # boto3's clients are thread-safe; the heartbeat shares the acquiring thread's. A
        # client per call spent most of a renewal making the client (a loaded host took longer
        # than a short ttl, tests/test_lease.py).
        if self._client is None:
            import boto3

            self._client = boto3.client("s3")
        return self._client

    def _key(self) -> tuple[str, str]:
        return self.path.bucket, self.path.key.split("/", 1)[1]

    def _read(self) -> dict | None:
        s3 = isinstance(self.path, ObjectPath) and self.path.scheme == "s3"
        record, etag = read_lease(self.path, self._s3() if s3 else None)
        if etag is not None:
            self._seen_etag = etag
        return record

    def _check_conditions(self) -> None:
        """Refuse (StorageError) a store that ignores the conditions a lease rests on (some
        S3-compatible servers, older versions of others): there two commands would both create
        the lease, or both take over a stale one. Probed once per bucket and process with an
        object of its own beside the lease: a second create (If-None-Match: *) and a PUT with a
        wrong If-Match must each be refused (412). (A DELETE's If-Match, which a release
        carries, is not probed: MinIO has been reported to ignore it, and a store that does
        can let a release delete a lease taken over at that moment.)"""
        if self.path.bucket in _CONDITIONS_HONOURED:
            return
        import botocore

        have = tuple(int(x) for x in re.findall(r"\d+", botocore.__version__)[:3])
        if have < BOTOCORE_CONDITIONS:  # (its S3 model lacks the parameters: a traceback)
            wanted = ".".join(map(str, BOTOCORE_CONDITIONS))
            raise StorageError(f"this botocore ({botocore.__version__}) cannot send the "
                               f"conditional writes a lease in {self.path.bucket!r} rests on "
                               f"(If-Match on PUT and DELETE): pip install 'boto3>={wanted}'")
        bucket, key = self._key()
        probe = f"{key}.probe-{self.owner['id']}"
        client, ignored = self._s3(), []
        try:
            client.put_object(Bucket=bucket, Key=probe, Body=b"", IfNoneMatch="*")
            for what, call in (
                    ("If-None-Match on PUT", lambda: client.put_object(
                        Bucket=bucket, Key=probe, Body=b"", IfNoneMatch="*")),
                    ("If-Match on PUT", lambda: client.put_object(
                        Bucket=bucket, Key=probe, Body=b"", IfMatch='"0"'))):
                try:
                    call()
                    ignored.append(what)
                except Exception as err:  # noqa: BLE001 - botocore's ClientError
                    if not _unmet(err, {"IfMatch": True} if "If-Match" in what else {}):
                        raise
        finally:
            try:
                client.delete_object(Bucket=bucket, Key=probe)
            except Exception as err:  # noqa: BLE001 - botocore's: the probe stays, said once
                log.warning("the lease's probe object s3://%s/%s could not be deleted (%s): "
                            "delete it by hand", bucket, probe, _code(err) or type(err).__name__)
        if ignored:
            raise StorageError(
                f"{self.folder}: this S3 store ignores {', '.join(ignored)} (a conditional "
                "write was carried out, not refused), so a run lease cannot keep a second "
                "command out; use a store that honours conditional writes (AWS S3, or a "
                "release of yours that does) or a shared folder for --storage-path")
        _CONDITIONS_HONOURED.add(self.path.bucket)

    def _put_if(self, **condition) -> bool:
        """A conditional PUT of a fresh record (If-None-Match / If-Match); False when the
        condition does not hold (another command's lease is there, or with If-Match none)."""
        bucket, key = self._key()
        try:
            self._etag = self._s3().put_object(Bucket=bucket, Key=key, Body=json.dumps(
                self._record()).encode(), **condition)["ETag"]
            return True
        except Exception as err:  # noqa: BLE001 - botocore's ClientError
            if _unmet(err, condition):
                return False
            raise

    def _create(self) -> bool:
        if isinstance(self.path, ObjectPath):
            if self.path.scheme != "s3":
                raise StorageError(f"{self.folder}: a run lease needs a local / shared folder or "
                                   "s3:// (conditional writes); this scheme has none through "
                                   "pyarrow")
            self._check_conditions()
            return self._put_if(IfNoneMatch="*")
        if not self.path.parent.is_dir():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._made_folder = True
        record = self._record()
        try:
            return self._place(json.dumps(record).encode(), record["renewed"])
        except FileNotFoundError:  # the folder went in between: another command's release
            # removed the empty folder it had made; made again, by this lease
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._made_folder = True
            return self._place(json.dumps(record).encode(), record["renewed"])

    def _place(self, body: bytes, mtime: float) -> bool:
        """Write `body` as the local lease, modified at `mtime` (its renewal, by this host's
        clock, not a file server's), unless one is there (False then)."""
        # Written whole under a name of its own, then linked into place: a link fails when the
        # lease exists (as O_EXCL), and a crash never leaves an empty lease that no one could
        # judge stale (an O_EXCL create and then a write could).
        tmp = self.path.with_name(f"{LEASE_FILE}.new-{self.owner['id']}")
        tmp.write_bytes(body)
        os.utime(tmp, (mtime, mtime))
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links (some FUSE mounts): O_EXCL
            pass
        finally:
            tmp.unlink(missing_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.utime(self.path, (mtime, mtime))
        return True

    def _aside(self, expected, why: str) -> Path | None:
        """Rename the local lease aside and return where it went, when what was moved is what
        `expected(record)` accepts; None when there was none, or it was another's. Of two
        commands renaming it, one gets it; the other finds none."""
        aside = self.path.with_name(f"{LEASE_FILE}.{why}-{self.owner['id']}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return None
        try:
            moved = _local_record(aside)
        except (FileNotFoundError, json.JSONDecodeError):
            moved = None
        if expected(moved):
            return aside
        # Not the record this command looked at: another command's lease, made between the
        # look and the rename. Put it back (an exclusive create: never over a lease made
        # meanwhile) and leave it to that command.
        try:  # (as it was: the same file linked back, its owner and renewal time kept, where
            # this user may link it; made again by this command, it is this user's, and its
            # holder, another user on a shared folder, renews it by writing it again)
            os.link(aside, self.path)
        except FileExistsError:
            pass
        except OSError:  # no hard links, or none to another user's file this user cannot
            # write (the kernel's protected_hardlinks): written again, as it was
            self._place(aside.read_bytes(), os.stat(aside).st_mtime)
        finally:
            aside.unlink(missing_ok=True)
        return None

    def _ours(self, record: dict | None) -> bool:
        return bool(record) and record.get("id") == self.owner["id"]

    def _take_over(self, held: dict) -> bool:
        if isinstance(self.path, ObjectPath):
            return self._put_if(IfMatch=self._seen_etag)
        # (a record other than the stale one judged: the other taker had already moved that
        # one and created its own lease, which this rename took; this taker lost the race)
        aside = self._aside(lambda moved: moved == held, "stale")
        if aside is None:
            return False
        aside.unlink()
        return self._create()

    def _remove(self) -> bool:
        """Delete the lease if it is this command's; False when it is not (or is gone)."""
        if isinstance(self.path, ObjectPath):
            bucket, key = self._key()
            for _ in range(2):  # (a second time when our own renewal was sent twice)
                try:
                    self._s3().delete_object(Bucket=bucket, Key=key, IfMatch=self._etag)
                    return True
                except Exception as err:  # noqa: BLE001 - botocore's ClientError
                    if not _unmet(err, {"IfMatch": self._etag}):
                        raise
                held = self._read()
                if not self._ours(held):
                    return False
                self._etag = self._seen_etag
            return False
        if not self._ours(self._read()):  # (another's lease is not even moved)
            return False
        aside = self._aside(self._ours, "released")
        if aside is None:
            return False
        aside.unlink()
        return True

    def _renew(self) -> bool:
        """Extend the expiry; False when the lease is no longer ours."""
        if isinstance(self.path, ObjectPath):
            try:
                if self._put_if(IfMatch=self._etag):
                    self._renewed = time.monotonic()
                    return True
                # 412: another command's lease, or our own PUT sent twice (botocore resends a
                # request whose answer was lost; the second finds the first's new ETag)
                held = self._read()
                if held is None or held.get("id") != self.owner["id"]:
                    return False
                self._etag, self._renewed = self._seen_etag, time.monotonic()
                return True
            except Exception as err:  # noqa: BLE001 - a network error: the next beat retries
                return self._unanswered(err)
        # Touched in place, never moved nor rewritten: a newcomer always finds the lease (a
        # renewal that renamed it aside for a moment let one take it). A takeover between the
        # read and the touch: the touch freshens the taker's lease, and the read after it says
        # the lease is no longer ours. The time is this host's (the hosts' clocks agree; a
        # file server's need not).
        for _ in range(3):  # (again when a taker had it aside to look at it, and put it back)
            held = self._read()
            if held is None:  # (aside for that moment: a lost lease only if it stays away)
                time.sleep(0.05)
                continue
            if not self._ours(held):
                return False
            now = time.time()
            try:
                os.utime(self.path, (now, now))
            except FileNotFoundError:
                time.sleep(0.05)
                continue
            except PermissionError:  # a file another user made (setting a time needs its
                # owner): written again, this command's own
                return self._rewrite("is another user's file")
            held = self._read()
            if not self._ours(held):
                return False
            if held["renewed"] < now - 3:  # (a coarse mtime is at most 2 s off)
                # a filesystem that keeps no mtime (some FUSE mounts)
                return self._rewrite("is on a filesystem that keeps no modification time")
            self._renewed = time.monotonic()
            return True
        return False

    def _rewrite(self, why: str) -> bool:
        """Renew a local lease by writing its record again, where a touch cannot (the lease
        `why`): renamed aside and looked at (a takeover since the read: not ours), the fresh
        record created in its place (a command that found no lease meanwhile took it, and this
        one has lost it: the moment a touch avoids)."""
        if not self._warned_rewrite:
            self._warned_rewrite = True
            log.warning("the lease of %s %s: it is renewed by writing it again (another "
                        "command starting at that moment could take it)", self.folder, why)
        aside = self._aside(self._ours, "renewing")
        if aside is None:
            return False
        try:
            record = self._record()
            if not self._place(json.dumps(record).encode(), record["renewed"]):
                return False
        except OSError:
            with contextlib.suppress(OSError):  # not renewed: the lease as it was
                self._place(aside.read_bytes(), os.stat(aside).st_mtime)
            raise
        finally:
            aside.unlink(missing_ok=True)
        self._renewed = time.monotonic()
        return True


def read_lease(path, client=None) -> tuple[dict | None, str | None]:
    """The lease record at `path` (a lease file: local, or an s3:// object read with boto3's
    `client`, one made when None) and its ETag (None locally); (None, None) where there is
    none, or it is not a whole record."""
    path = location(path)
    try:
        if isinstance(path, ObjectPath) and path.scheme == "s3":
            if client is None:  # (the process's: a session made per read cost ~0.1 s of
                client = s3_client(path.fs)  # CPU, and a workflow reads it at each record)
            obj = client.get_object(Bucket=path.bucket, Key=path.key.split("/", 1)[1])
            return _bucket_record(json.loads(obj["Body"].read()), obj), obj["ETag"]
        return _local_record(path), None
    except (FileNotFoundError, json.JSONDecodeError):
        return None, None
    except Exception as err:  # noqa: BLE001 - botocore's NoSuchKey
        if _code(err) in ("NoSuchKey", "404"):
            return None, None
        raise


@dataclass(frozen=True)
class LeaseRef:
    """A run folder's lease as its holder and the processes it starts carry it (training
    workers, a sweep's trials): before they write, they check that it is still that command's
    (`check`); a suspended or stalled driver learns of a takeover late, and its workers would
    write checkpoints beside the taker's, each one's keep_last deleting the other's."""

    path: str  # the lease file
    id: str  # its holder's random id (RunLease.owner["id"])

    def check(self, before: str = "writing") -> None:
        """Return when the lease is still its holder's; else raise LeaseLost, naming who holds
        it now."""
        held = None
        for attempt in range(3):  # (a local taker has it aside for a moment to look at it)
            if (held := read_lease(self.path)[0]) is not None:
                break
            time.sleep(0.2 * (attempt + 1))
        if held is not None and held.get("id") == self.id:
            return
        now = "no command holds it now" if held is None else (
            f"pid {held.get('pid')} on {held.get('host')} holds it now"
            + (f" ({held['command']})" if held.get("command") else ""))
        raise LeaseLost(
            f"{location(self.path).parent}: the command that started this one no longer holds "
            f"the run folder's lease ({now}), so this stops before {before}: two commands "
            "never write one run. Check what the other command wrote; resume the run with one "
            "command at a time")


def _local_record(path: Path) -> dict:
    """The local lease at `path`, renewed as late as the file's mtime: its heartbeat touches
    it (`RunLease._renew`), so the record's `renewed` / `expires` are moved on by the time since
    it was written. FileNotFoundError / JSONDecodeError as `json.loads(path.read_text())`."""
    with open(path, "rb") as f:
        mtime, record = os.fstat(f.fileno()).st_mtime, json.loads(f.read())
    if not isinstance(record, dict):
        raise json.JSONDecodeError("a lease is a JSON object", "", 0)
    renewed = float(record.get("renewed", 0))
    if mtime > renewed:
        record["expires"] = float(record.get("expires", 0)) + mtime - renewed
        record["renewed"] = mtime
    return record


def _bucket_record(record, obj: dict) -> dict:
    """The bucket lease `record` (read with the GET answer `obj`), timed by the store's clock:
    its age is the answer's `Date` less its `Last-Modified` (each renewal is a PUT, so the
    object's time is the last renewal's, by the store's clock), and `renewed` / `expires` are
    moved to this host's clock by that age, the holder's ttl (`expires - renewed`, a length of
    time, whichever clock wrote it) kept. A holder whose clock runs minutes behind is then not
    taken for gone while it renews, nor one whose clock runs ahead kept after its heartbeat
    stopped. Both headers count whole seconds: the age is right within one. Where the store
    sends no `Date`, the record is read as written (the holder's clock)."""
    if not isinstance(record, dict):
        raise json.JSONDecodeError("a lease is a JSON object", "", 0)
    date = (obj.get("ResponseMetadata") or {}).get("HTTPHeaders", {}).get("date")
    modified = obj.get("LastModified")
    try:
        store_now = email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return record
    if modified is None:
        return record
    age = max(0.0, store_now - modified.timestamp())
    ttl = float(record.get("expires", 0)) - float(record.get("renewed", 0))
    record["renewed"] = time.time() - age
    record["expires"] = record["renewed"] + ttl
    return record


# S3 answers that no retry changes (a renewal refused by them past the ttl: the lease lost)
_REFUSED = ("AccessDenied", "403", "ExpiredToken", "InvalidAccessKeyId",
            "SignatureDoesNotMatch", "NoSuchBucket", "AllAccessDisabled")


def _code(err: Exception) -> str:
    response = getattr(err, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _unmet(err: Exception, condition: dict) -> bool:
    """Whether `err` says a conditional request's condition did not hold: 412 (another
    object there), or with If-Match a 404 (no object there: the lease was deleted)."""
    code = _code(err)
    return code in ("PreconditionFailed", "412", "ConditionalRequestConflict") or \
        ("IfMatch" in condition and code in ("NoSuchKey", "404"))
