"""Paths that are local folders or objects in a bucket, behind one small interface.

`location(p)` gives a `pathlib.Path` for a local path (absolute, `~` expanded; a `file://`
URI, or `file:/PATH`, included) and an `ObjectPath` for any other URI. `ObjectPath` offers
the subset of `pathlib.Path` the project uses (`/`, `name`, `parent`, `is_file`, `is_dir`, `exists`,
`read_*` / `write_*`, `iterdir`, `glob` of one level, `unlink`, `mkdir`), so code written for
local folders reads and writes a bucket unchanged. It deliberately has no `__fspath__`: handing
one to `open()` or `torch.load` is an error, not a local file named `s3:`. Code that needs a
real file (torch, sentencepiece) asks `local_copy(p)` (`storage.transfer`).

Object stores have no rename and no folders. What holds there instead (docs/storage.md):
- one object is written whole or not at all (a single PUT), so `write_text` / `write_bytes`
  never leave half a file for a reader;
- a folder of several objects counts as complete only once its marker object exists, and the
  marker is written last (`storage.transfer.publish_dir`); readers trust nothing without it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import functools
import io
import os
import re
import threading
import uuid
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import pyarrow.fs as pafs

from storage.redact import PATH_SCHEMES

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StorageError(ValueError):
    """A path that cannot be used as given; the message names the path and the fix."""


def is_uri(p) -> bool:
    """Whether `p` is a URI with a scheme other than file:// (served by pyarrow.fs)."""
    if isinstance(p, ObjectPath):
        return True
    m = _SCHEME.match(str(p))
    return bool(m) and m.group(1).lower() != "file"


def shown(text: str) -> str:
    """A URI (or what was given as one) as a message may show it: no query or fragment (a
    presigned URL's signature) and no user information (`user:secret@`)."""
    head, sep, rest = text.partition("://")
    if not sep:
        head, rest = "", text
    if sep and f"{head.lower()}://" not in PATH_SCHEMES:  # (s3:///KEY:SECRET@bucket: the
        # authority after the slashes; a file:/// URI or a path names a path there)
        lead = rest[:len(rest) - len(rest.lstrip("/"))]
        sep, rest = sep + lead, rest[len(lead):]
    if "@" in rest and _has_userinfo(rest):  # (never show what comes before the last "@")
        rest = "***@" + rest.rpartition("@")[2]
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    return f"{head}{sep}{rest}"


def _has_userinfo(rest: str) -> bool:
    """Whether `rest` (a URI after `scheme://`, holding an "@") starts with `KEY:SECRET@` or
    `TOKEN@`: its first part, up to "/", "?" or "#", holds the "@" or a ":" (a secret may hold
    "/", "?" or "#", which then end that part early: "KEY:SEC/RET@bucket")."""
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return "@" in authority or ":" in authority


# "s3:/bucket/x" (one slash: a typo, or a URI that went through pathlib.Path) or "s3:bucket/x"
# (none) is not a local folder named "s3:" / "s3:bucket"; refused with the fix
_MANGLED = re.compile(r"^(s3[an]?|gs|gcs|hdfs|viewfs|abfss?|az|wasbs?|oss):(/?)(?!/)",
                      re.IGNORECASE)

# "file:/PATH" (RFC 8089's form without an authority, and what pathlib makes of file:///PATH)
# is the local path /PATH, not a folder named "file:" in the working directory
_FILE_ONE_SLASH = re.compile(r"^file:/(?!/)", re.IGNORECASE)


def location(p: str | os.PathLike | ObjectPath) -> Path | ObjectPath:
    """`p` as a local absolute `Path`, or an `ObjectPath` for a bucket URI."""
    if isinstance(p, ObjectPath):
        return p
    text = str(p)
    m = _MANGLED.match(text)
    if m:
        rest = shown(text[m.end():])  # (never echo what may be a key or a signature)
        slashes = "one slash" if m[2] else "no slash"
        folder = f"{m[1]}:" if m[2] else f"{m[1]}:{rest.split('/')[0]}"
        raise StorageError(f"{m[1]}:{m[2]}{rest} has {slashes} after {m[1]}:, so it would be a "
                           f"local folder named {folder!r}; write {m[1]}://{rest} (a bucket URI "
                           "that went through pathlib.Path loses a slash: keep it a str)")
    if text.lower().startswith("file://") or _FILE_ONE_SLASH.match(text):
        return _file_uri_path(text)
    if is_uri(text):
        return ObjectPath(text)
    return Path(text).expanduser().resolve()


def worker_path(path: str | None) -> str | None:
    """A path as a Ray task, actor or replica must be given it: a local one made absolute (they
    run in the folder their node's `ray start` ran in, not this process's), a URI as it is."""
    if path is None or is_uri(path) or str(path).startswith("file:"):
        return None if path is None else str(path)
    return str(location(path))  # (~ expanded, as the driver's checks read it)


def _file_uri_path(text: str, follow: bool = True) -> Path:
    """The local path of a file:// URI (RFC 8089: an empty host or localhost, or file:/PATH
    with no authority; %-escapes, as Path.as_uri() writes them, decoded). `follow`: as
    `location`'s, `local_entry`'s when False."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise StorageError(f"{shown(text)}: a file:// URI names a file of this machine "
                           f"(file:///PATH), not of host {parts.netloc.rpartition('@')[2]!r}; "
                           "use a shared folder mounted here, or a bucket URI")
    if "?" in text or "#" in text:  # (a URI's query and fragment: no part of the path)
        raise StorageError(f"{shown(text)}: a file:// URI's path ends at its first ? or #, so "
                           "this names another folder; write ? as %3F and # as %23 (as "
                           "Path.as_uri() does), or give the plain path")
    if not parts.path:
        raise StorageError(f"{shown(text)} names no path (file:///PATH)")
    return _absolute(Path(unquote(parts.path)).expanduser(), follow)


def _absolute(path: Path, follow: bool) -> Path:
    if follow or path.name in ("", ".", ".."):
        return path.resolve()
    return path.parent.resolve() / path.name


def local_entry(p: str | os.PathLike) -> Path:
    """The local path `p` as `location` gives it, except that its last part is not followed:
    where it is a symbolic link, the link itself (`location` gives the folder it points to).
    What deletes or moves a folder of a run acts on this: a checkpoint or a weights/ folder
    linked into a run from elsewhere is the run's link, not its target (which stays)."""
    text = str(p)
    if text.lower().startswith("file://") or _FILE_ONE_SLASH.match(text):
        return _file_uri_path(text, follow=False)
    if is_uri(text) or _MANGLED.match(text):
        location(text)  # (its refusal, or an object path: not a local entry)
        raise StorageError(f"{shown(text)} is not a local path")
    return _absolute(Path(text).expanduser(), follow=False)


def _check_parts(key: str, uri: str) -> None:
    """A key with "." or ".." in it names no object plainly (a store keeps them as names, a
    local copy would leave its folder): refused."""
    if any(part in (".", "..") for part in key.split("/")):
        raise StorageError(f"{shown(uri)}: '.' and '..' name no folder in a bucket; give the "
                           "path without them")


@functools.lru_cache(maxsize=32)
def _filesystem(scheme: str, bucket: str) -> pafs.FileSystem:
    """One pyarrow filesystem per (scheme, bucket) and process; pyarrow reads the endpoint and
    the credentials from the standard environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)."""
    try:
        fs, _ = pafs.FileSystem.from_uri(f"{scheme}://{bucket}/")
    except OSError as err:
        if "unable to load" not in str(err).lower():  # e.g. HDFS without its Java libraries
            raise  # served, but not reachable (S3 resolves the bucket's region here)
        raise StorageError(f"{scheme}://{bucket}: no filesystem serves this URI here "
                           f"({_first_line(err)}); use s3:// (or gs:// where pyarrow has GCS "
                           "support), or a local / shared folder") from None
    except Exception as err:  # pyarrow's ArrowInvalid: a scheme it cannot serve here
        raise StorageError(f"{scheme}://{bucket}: no filesystem serves this URI here "
                           f"({_first_line(err)}); use s3:// (or gs:// where pyarrow has GCS "
                           "support), or a local / shared folder") from None
    return fs


def s3_client(fs: pafs.FileSystem | None = None):
    """A boto3 S3 client, its endpoint and credentials from the environment as pyarrow reads
    them (in `fs`'s region): one per process and settings, made from a session of its own
    (boto3's default session is not thread-safe), with a connection for each of the threads
    that copy a folder's files side by side, and timeouts that give up on a store that stops
    answering in about a minute rather than several."""
    import boto3

    region = getattr(fs, "region", None) or None
    settings = (os.getpid(), region, hashlib.sha256("\0".join(
        f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("AWS_")).encode())
        .hexdigest())
    with _CLIENTS_LOCK:
        if settings not in _CLIENTS:
            _CLIENTS.clear()  # (settings changed: the old client is not used again)
            _CLIENTS[settings] = boto3.session.Session().client("s3", region_name=region,
                                                                config=_client_config())
        return _CLIENTS[settings]


def _client_config():
    from botocore.config import Config

    return Config(max_pool_connections=32, connect_timeout=10, read_timeout=60,
                  retries={"max_attempts": 4, "mode": "standard"})


_CLIENTS: dict = {}
_CLIENTS_LOCK = threading.Lock()


class ObjectPath:
    """A file or a folder (a key prefix) in a bucket: `scheme://bucket/key`."""

    __slots__ = ("uri", "scheme", "bucket", "key")

    def __init__(self, uri: str):
        m = _SCHEME.match(uri)
        if not m:
            raise StorageError(f"{uri!r} is not a URI (scheme://bucket/key)")
        scheme = m.group(1).lower()
        rest = re.sub(r"/+", "/", uri[m.end():]).strip("/")
        if not rest:
            raise StorageError(f"{uri!r}: name a bucket ({scheme}://BUCKET/PREFIX)")
        bucket = rest.split("/", 1)[0]
        if "@" in rest and _has_userinfo(rest):
            # (a secret key may hold "/", "?" or "#": the message shows nothing before the
            # last "@")
            raise StorageError(
                f"{shown(uri)}: credentials do not go in a storage URI (they would be printed "
                "and logged with it); set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or "
                "AWS_PROFILE, or use an instance role) instead")
        # https://host:9000/bucket/key: an endpoint, not a bucket. Only the part before a "?" or
        # "#" is looked at and shown: up to the first "/", the bucket held the whole query (a
        # presigned URL's signature), which is refused below without being shown.
        host = re.split(r"[?#]", bucket, maxsplit=1)[0]
        if ":" in host:
            if not host.rpartition(":")[2].isdigit():  # not a port: a key and its secret
                # (s3://KEY:SECRET/bucket), shown as neither
                raise StorageError(
                    f"{scheme}://***/...: a bucket name has no ':' (is it an access key and its "
                    "secret?); credentials do not go in a storage URI: set "
                    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or use an "
                    f"instance role) and give {scheme}://BUCKET/PREFIX")
            raise StorageError(
                f"{shown(uri)}: {host!r} is a host and port, not a bucket; name the bucket "
                f"({scheme}://BUCKET/PREFIX, e.g. s3://) and set the endpoint in "
                "AWS_ENDPOINT_URL")
        if "?" in rest or "#" in rest:
            raise StorageError(
                f"{shown(uri)}: a storage URI takes no query or fragment (?endpoint_override=... "
                "would be read as part of a key); set AWS_ENDPOINT_URL / AWS_REGION in the "
                "environment instead")
        _check_parts(rest, uri)
        self.scheme, self.bucket = scheme, bucket
        self.key = rest  # the path pyarrow's filesystem takes: bucket/key
        self.uri = f"{scheme}://{rest}"

    @classmethod
    def _of(cls, scheme: str, key: str) -> ObjectPath:
        """A path in a bucket from a checked scheme and a key (`bucket/...`): a listed object's
        name may hold "?" or "#", which only a URI given by a user cannot."""
        key = re.sub(r"/+", "/", key).strip("/")
        _check_parts(key, f"{scheme}://{key}")
        p = cls.__new__(cls)
        p.scheme, p.bucket, p.key, p.uri = scheme, key.split("/", 1)[0], key, f"{scheme}://{key}"
        return p

    # -- pickling: the URI only; each process makes its own filesystem --
    def __getstate__(self):
        return self.uri

    def __setstate__(self, uri):  # (checked when it was made: a listed name may hold "#")
        m = _SCHEME.match(uri)
        other = ObjectPath._of(m.group(1).lower(), uri[m.end():])
        self.scheme, self.bucket, self.key, self.uri = other.scheme, other.bucket, other.key, \
            other.uri

    @property
    def fs(self) -> pafs.FileSystem:
        return _filesystem(self.scheme, self.bucket)

    # -- names --
    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"ObjectPath({self.uri!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectPath) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __truediv__(self, other) -> ObjectPath:
        return ObjectPath._of(self.scheme, f"{self.key}/{str(other).strip('/')}")

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    @property
    def parent(self) -> ObjectPath:
        if "/" not in self.key:
            return self
        return ObjectPath._of(self.scheme, self.key.rsplit("/", 1)[0])

    def is_relative_to(self, other) -> bool:
        return isinstance(other, ObjectPath) and (self == other
                                                  or self.uri.startswith(other.uri + "/"))

    # -- queries --
    def info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.key)

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def iterdir(self) -> list[ObjectPath]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.key, allow_not_found=True))
        return sorted(self / i.base_name for i in infos)

    def glob(self, pattern: str) -> list[ObjectPath]:
        """The entries of this folder whose names match `pattern` (one level, as fnmatch)."""
        if "/" in pattern or "**" in pattern:
            raise ValueError(f"ObjectPath.glob takes one level, not {pattern!r}")
        return [p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)]

    def rglob(self, pattern: str) -> list[ObjectPath]:
        """Every object under this prefix whose name matches `pattern` (as pathlib's rglob)."""
        return [self / name for name, _ in self.files()
                if fnmatch.fnmatchcase(name.rsplit("/", 1)[-1], pattern)]

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        if not self.is_relative_to(other):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.uri[len(other.uri) + 1:])

    def files(self) -> list[tuple[str, pafs.FileInfo]]:
        """Every object under this prefix as (relative name, info), sorted."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.key, recursive=True,
                                                        allow_not_found=True))
        out = sorted((i.path[len(self.key) + 1:], i) for i in infos
                     if i.type == pafs.FileType.File)
        for name, _ in out:  # (a key "run//x": no path names it, "run/x" is another object)
            if name.startswith("/") or "//" in name:
                raise StorageError(f"{self.uri}: the object {shown(name)!r} under it has an "
                                   "empty part in its key (//), which no path can name, so "
                                   "the folder cannot be copied whole; rename that object or "
                                   "move it out of the folder")
            if any(part in (".", "..") for part in name.split("/")):
                # (a key "m/../../x" is a name to a store; copied, it would leave the folder)
                raise StorageError(f"{self.uri}: the object {shown(name)!r} under it has a "
                                   "'.' or '..' part in its key, which a local copy would "
                                   "follow out of its folder, so the folder is not copied; "
                                   "rename that object or move it out of the folder")
        return out

    def __lt__(self, other) -> bool:  # sorted() of paths, as pathlib
        return self.uri < other.uri

    # -- reading and writing whole objects --
    def read_bytes(self) -> bytes:
        """One version of the object, whole (`copy_version`)."""
        buf = io.BytesIO()
        copy_version(self, buf)
        return buf.getvalue()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        """One PUT: readers see the old object or the new one, never a part. On S3 it is one
        PutObject request (boto3): pyarrow's output stream starts its upload when opened and
        completes it whenever it is closed, by its `with` on an error or by its destructor, so
        a Ctrl-C during the open (raised once the call returned) or an error mid-write replaced
        the object with an empty or cut-short one (a run's workflow.json among them)."""
        if self.scheme != "s3":  # (gs://: pyarrow's own filesystem; no such stream on S3)
            with self.fs.open_output_stream(self.key) as f:
                f.write(data)
            return len(data)
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3_client(self.fs).put_object(Bucket=self.bucket, Key=self.key.split("/", 1)[1],
                                          Body=data)
        except (BotoCoreError, ClientError) as err:  # as pyarrow raised them: OSError
            raise OSError(f"writing {self}: {_first_line(err)}") from None
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """Nothing to do: a folder in a bucket exists once an object is under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def upload(self, local: str | os.PathLike) -> None:
        """Copy one local file to this object."""
        pafs.copy_files(str(local), self.key, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=self.fs)



def synced(path) -> Path:
    """`path` (a local file, or a folder: its entries) flushed to the disk (fsync); returns
    it. At a power loss a rename can reach the disk before the bytes it names (an empty file
    under its final name): a file is flushed before its rename, a folder after the renames
    in it. A folder on a filesystem that cannot flush one (some FUSE and CIFS mounts: EINVAL)
    is left as it is; a file's error is raised."""
    import errno

    path = Path(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if not (path.is_dir() and err.errno in (errno.EINVAL, errno.ENOTSUP, errno.EBADF)):
            raise
    finally:
        os.close(fd)
    return path


def write_whole(p, data: bytes) -> None:
    """Write a whole file so that a reader sees the old content or the new, never a part: an
    object is one PUT; a local file is written beside, flushed to the disk (a rename that
    reached the disk before its file's bytes, at a power loss, is an empty file under the
    new name) and renamed over."""
    p = location(p)
    if isinstance(p, ObjectPath):
        p.write_bytes(data)
        return
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:  # (a full disk, a Ctrl-C: no partial copy left beside it)
        tmp.unlink(missing_ok=True)
        raise


def open_input(p):
    """A seekable binary file object reading `p` (local or an object)."""
    p = location(p)
    if isinstance(p, ObjectPath):
        return io.BufferedReader(p.fs.open_input_file(p.key), buffer_size=1 << 20)
    return open(p, "rb")


# Compressed or binary formats by their first bytes: text read from one of them was a few
# lines of bytes, "translated" (an .xz of 2,000 lines gave 7 lines, 6 not UTF-8, exit 0)
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"),
          (b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"), (b"PAR1", "parquet"))


def binary_kind(start: bytes) -> str | None:
    """The compressed or binary format a file's first bytes `start` say it is (gzip, xz,
    bzip2, zstd, zip, parquet), or None: no such format (text, as far as they tell)."""
    return next((kind for magic, kind in _MAGIC if start.startswith(magic)), None)


def cr_line_ends(start: bytes) -> str | None:
    """The fix for text whose lines end in CR alone (classic Mac OS), judged on its first bytes
    `start` (CRs there and no LF), else None. Read on LF such a file is one line: a corpus of
    a few sentences became one pair without a word, an input to translate one sentence."""
    if start.count(b"\r") > 1 and b"\n" not in start:  # (one CR: one line either way)
        return (f"its lines end in CR alone (no LF in its first {len(start):,} bytes): "
                "convert them, e.g. tr '\\r' '\\n'")
    return None


def wide_encoding(start: bytes) -> str | None:
    """UTF-16 / UTF-32 by a byte-order mark, or by NUL bytes in every second (fourth) place of
    text in Latin letters, judged on a text file's first bytes `start`; None: neither (no UTF-8
    text holds many NULs). Read as UTF-8, such text lost every line with a letter outside
    ASCII, and its last NUL made one line more."""
    for bom, name in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                      (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")):
        if start.startswith(bom):
            return name
    if len(start) >= 16 and start.count(0) >= len(start) // 4:
        return "UTF-32" if start.count(0) >= len(start) * 5 // 8 else "UTF-16"
    return None


def filesystem_of(p) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path in it) for `p`: for pq.read_table / write_table and Ray Data's
    `filesystem=` arguments."""
    p = location(p)
    if isinstance(p, ObjectPath):
        return p.fs, p.key
    return pafs.LocalFileSystem(), str(p)


def tag_of(stream) -> str | None:
    """An open object stream's ETag (from its HEAD), None where the store gives none."""
    tag = stream.metadata().get("ETag")
    return tag.decode() if isinstance(tag, bytes) else tag


def etag(p: ObjectPath) -> str | None:
    """The object's ETag now: opening a stream is pyarrow's HEAD, with no GET until a read."""
    with p.fs.open_input_stream(p.key) as f:
        return tag_of(f)


def copy_version(p: ObjectPath, out: BinaryIO) -> str | None:
    """Write one version of object `p` whole into `out` (emptied first); returns its ETag.
    pyarrow reads an object as a HEAD (size, ETag) and then ranged GETs, so an object replaced
    in between came back cut short or padded with zeros (a run's lease or metrics.jsonl read
    while being rewritten). On S3 it is one GET (boto3), which answers one version whole; on
    another store a second HEAD after the read must show the first one's ETag, else the copy
    is made again."""
    if p.scheme == "s3":
        return _get_whole(p, out)
    for attempt in range(10):
        out.seek(0)
        out.truncate()
        try:
            with p.fs.open_input_stream(p.key) as f:
                tag = tag_of(f)
                while chunk := f.read(1 << 23):
                    out.write(chunk)
        except FileNotFoundError:
            raise
        except OSError:  # a range past the end of a shorter new version (HTTP 416): again
            if attempt == 9:
                raise
            continue
        if tag is None or etag(p) == tag:  # (a store without ETags: nothing to compare)
            return tag
    raise StorageError(f"{p}: replaced while being read, ten times in a row; its writer "
                       "rewrites it faster than it can be read: try again")


def _get_whole(p: ObjectPath, out: BinaryIO) -> str | None:
    """`copy_version` on S3: one GetObject streamed into `out`; its ETag. A response cut short
    (a dropped connection) raises, as pyarrow's reads did: nothing half-read is returned."""
    from botocore.exceptions import BotoCoreError, ClientError

    out.seek(0)
    out.truncate()
    try:
        answer = s3_client(p.fs).get_object(Bucket=p.bucket, Key=p.key.split("/", 1)[1])
        for chunk in answer["Body"].iter_chunks(1 << 23):
            out.write(chunk)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            raise FileNotFoundError(f"{p}: no such object") from None
        raise OSError(f"reading {p}: {_first_line(err)}") from None
    except BotoCoreError as err:  # (IncompleteReadError among them: a response cut short)
        raise OSError(f"reading {p}: {_first_line(err)}") from None
    return answer.get("ETag")


def stamp(p) -> tuple[int, int]:
    """(size, modification time in ns) of a file, local or an object: its version, as make
    tells files apart."""
    p = location(p)
    if isinstance(p, ObjectPath):
        info = p.info()
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(f"{p}: no such object")
        return info.size, info.mtime_ns or 0
    st = p.stat()
    return st.st_size, st.st_mtime_ns


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
