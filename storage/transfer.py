"""Copying between local folders and buckets, on top of `storage.paths`: a local copy of an
object or a folder (`local_copy`, once per node and version), a folder published with its marker
last (`publish_dir`), a file written locally and uploaded whole (`written_locally`), folders
moved or removed (`move_tree`, `remove_tree`), and the requests to a bucket made side by side
(`side_by_side`). What holds in a bucket instead of renames: docs/storage.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

import pyarrow.fs as pafs

from storage.paths import (ObjectPath, StorageError, copy_version, etag, local_entry, s3_client,
                           location, synced)
from storage.scratch import scratch_dir


def cache_root() -> Path:
    """Where objects are copied to be read as local files (CONVS2S_CACHE, else
    ~/.cache/convs2s): one copy per node, shared by its processes."""
    return Path(os.environ.get("CONVS2S_CACHE", "~/.cache/convs2s")).expanduser() / "objects"


def local_copy(p) -> Path:
    """A local file or folder with the content of `p`: `p` itself when local; else a copy in
    `cache_root()`, fetched once per version of the object (its ETag; size and modification
    time where the store gives none). A folder is copied whole (every object under the prefix,
    copied again if its listing changed meanwhile)."""
    p = location(p)
    if not isinstance(p, ObjectPath):
        return p
    info = p.info()
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{p}: no such object")
    root = cache_root() / hashlib.sha256(p.uri.encode()).hexdigest()[:16]
    if info.type == pafs.FileType.File:
        def version(tag):  # the ETag names a version exactly; size + time where there is none
            return hashlib.sha256((tag or f"{info.size}-{info.mtime_ns}").encode()).hexdigest()
        dest = root / version(etag(p))[:16] / p.name
        if not dest.is_file():
            root.mkdir(parents=True, exist_ok=True)
            tmp = root / f".{p.name}.{uuid.uuid4().hex[:8]}"
            try:
                with open(tmp, "w+b") as out:
                    tag = copy_version(p, out)  # (replaced since the HEAD: a newer version)
                dest = root / version(tag)[:16] / p.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, dest)  # a concurrent reader on this node sees all or nothing
            except BaseException:  # a network error, a Ctrl-C: no partial copy left in the
                tmp.unlink(missing_ok=True)  # cache (a checkpoint's: gigabytes, each time)
                raise
        return dest

    def listing():
        return [(n, i.size, i.mtime_ns) for n, i in p.files()]

    for _ in range(10):  # a folder changed while being copied is copied again
        files = listing()
        version = hashlib.sha256(repr(files).encode())
        dest = root / version.hexdigest()[:16] / p.name
        if dest.is_dir():
            return dest
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
        try:
            for name, _, _ in files:
                if not (tmp / name).resolve().is_relative_to(tmp.resolve()):  # (files() refuses
                    raise StorageError(f"{p}: the object {name!r} would be copied out of its "
                                       "folder; rename it")  # such names; a second guard)
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                with open(tmp / name, "wb") as out:
                    copy_version(p / name, out)
        except FileNotFoundError:  # deleted since the listing: the folder changed
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        except BaseException:  # a network error, a Ctrl-C: no partial copy left behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if listing() != files:
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process on this node finished the same copy first
            shutil.rmtree(tmp, ignore_errors=True)
        return dest
    raise StorageError(f"{p}: its objects changed while being copied, ten times in a row; "
                       "try again once its writer is done")


def publish_dir(src, dest, marker: str, leave: tuple[str, ...] = (),
                keep: tuple[str, ...] = ()) -> None:
    """Make folder `dest` hold exactly the files of folder `src`, with `marker` (a file in
    `src`) the proof that it is complete. `src` is a local folder, or a folder in the same
    bucket (its objects are copied by the server). `leave`: names in `src` not published (a
    writer's owner object, kept in `src` until the copy is done).

    Local: copied beside `dest`, flushed to the disk, and renamed into place (two renames: the
    folder is old-complete or new-complete, and absent for the instant between the renames;
    at a power loss never a folder of empty files). Bucket: the
    old marker is deleted first (from then on readers take `dest` as incomplete), every other
    file copied, objects of the old version that the new one lacks deleted, and the marker
    copied last. A local `dest` that is a symbolic link is replaced as the link (a folder
    linked into a run from elsewhere): the folder it points to stays whole. `keep`: names in a
    bucket's `dest` that the publish leaves (a writer's record of the publish, which it
    removes once the marker is in)."""
    given = dest
    src, dest = location(src), location(dest)
    if not isinstance(dest, ObjectPath):
        dest = local_entry(given)  # (location follows a link in its last part)
    sizes = ({n: i.size for n, i in src.files()} if isinstance(src, ObjectPath)
             else {str(f.relative_to(src)): None for f in sorted(src.rglob("*")) if f.is_file()})
    names = sorted(sizes)
    names = [n for n in names if n not in leave]
    if marker not in names:
        raise FileNotFoundError(f"{src}: no {marker} to publish it with")
    if not isinstance(dest, ObjectPath):
        if leave:
            raise ValueError("publish_dir(leave=...) is for a bucket's destination")
        if isinstance(src, ObjectPath):
            src = local_copy(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
        old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
        try:
            shutil.copytree(src, tmp)
            for f in sorted(tmp.rglob("*"), reverse=True):  # on the disk before the renames
                synced(f)  # (files, then the folders holding them)
            synced(tmp)
        except BaseException:  # (a Ctrl-C in a checkpoint's copy: gigabytes, never read)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if dest.is_symlink():
            dest.unlink()  # the link, never the folder it points to
        elif dest.exists():
            dest.rename(old)
        tmp.rename(dest)
        synced(dest.parent)  # the renames
        shutil.rmtree(old, ignore_errors=True)
        return
    (dest / marker).unlink(missing_ok=True)
    side_by_side(lambda name: _copy(src / name, dest / name, sizes[name]),
                 [n for n in names if n != marker])
    side_by_side(lambda name: (dest / name).unlink(missing_ok=True),
                 [name for name, _ in dest.files() if name not in names and name not in keep])
    _copy(src / marker, dest / marker, sizes[marker])


def side_by_side(fn, items: list) -> list:
    """[fn(item) for item in items], 16 calls at a time: in a bucket each call is a request of
    tens of ms, and hundreds of them took minutes one after another. The first error is
    raised once the calls that started have ended; none starts after it."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        finally:  # (an error, or Ctrl-C here: what has not started never starts)
            for future in futures:
                future.cancel()
        for future in done:
            if future.exception() is not None:
                raise future.exception()
    return [future.result() for future in futures]


# One CopyObject copies at most 5 GiB on S3 (AWS's limit; pyarrow's copy_file is one
# CopyObject, refused above it): a larger object is copied by the server in parts of 1 GiB
COPY_OBJECT_MAX = 5 * 1024 ** 3
COPY_PART_BYTES = 1024 ** 3


def _copy(src, dest: ObjectPath, size: int | None = None) -> None:
    """Copy file `src` (local, or an object of size `size` when known) to object `dest`."""
    if isinstance(src, ObjectPath) and (src.scheme, src.bucket) == (dest.scheme, dest.bucket):
        if src.scheme == "s3" and (src.info().size if size is None else size) > COPY_OBJECT_MAX:
            _copy_in_parts(src, dest)
            return
        dest.fs.copy_file(src.key, dest.key)  # server-side: the bytes do not travel here
    elif isinstance(src, ObjectPath):
        dest.write_bytes(src.read_bytes())
    else:
        dest.upload(src)


def _copy_in_parts(src: ObjectPath, dest: ObjectPath) -> None:
    """A server-side copy of an object larger than one CopyObject takes: boto3's managed copy
    (a multipart upload of UploadPartCopy ranges), each part from the version the copy began
    with (its ETag). The object appears whole at the upload's completion; an error before it
    aborts the upload, and nothing is written."""
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    tag = etag(src)
    client = s3_client(dest.fs)
    config = TransferConfig(multipart_threshold=COPY_OBJECT_MAX,
                            multipart_chunksize=COPY_PART_BYTES, max_concurrency=8)
    extra = {"CopySourceIfMatch": tag} if tag else None
    try:
        client.copy({"Bucket": src.bucket, "Key": src.key.split("/", 1)[1]}, dest.bucket,
                    dest.key.split("/", 1)[1], ExtraArgs=extra, Config=config)
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code in ("PreconditionFailed", "412"):
            raise StorageError(f"{src}: replaced while being copied to {dest}; try again once "
                               "its writer is done") from None
        raise StorageError(f"copying {src} to {dest} in parts failed: {code or err}") from None


@contextlib.contextmanager
def written_locally(dest) -> Iterator[Path]:
    """A local path to write the file `dest` at: `dest` itself when local; else a scratch file,
    uploaded to `dest` (one PUT) when the block ends without an error."""
    dest = location(dest)
    if not isinstance(dest, ObjectPath):
        yield dest
        return
    scratch = scratch_dir("convs2s-upload-")
    try:
        yield scratch / dest.name
        dest.upload(scratch / dest.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def move_tree(src, dest) -> None:
    """Move folder `src` to `dest` (both local, or both in one bucket: each object copied by
    the server, then the source deleted)."""
    given, src, dest = src, location(src), location(dest)
    if isinstance(src, ObjectPath) != isinstance(dest, ObjectPath):
        raise StorageError(f"move_tree({src}, {dest}): both local, or both in one bucket")
    if not isinstance(src, ObjectPath):
        # (a link moves as the link: what it points to is not the run's to move)
        shutil.move(str(local_entry(given)), str(dest))
        return
    for name, info in (moved := src.files()):
        _copy(src / name, dest / name, info.size)
    for name, _ in moved:  # only what was copied: an object written meanwhile stays
        (src / name).unlink(missing_ok=True)


def remove_tree(p) -> None:
    """Delete folder `p` and everything under it (nothing when it does not exist). Never a
    whole bucket: pyarrow would delete the bucket itself with its objects. A local `p` that is
    a symbolic link is removed as the link: the folder it points to was not written there."""
    given, p = p, location(p)
    if isinstance(p, ObjectPath):
        if "/" not in p.key:
            raise StorageError(f"{p.uri} is a whole bucket: refusing to delete it (a folder "
                               "of the project is a prefix in it)")
        if p.exists():
            p.fs.delete_dir(p.key)
    elif (entry := local_entry(given)).is_symlink():
        entry.unlink()
    else:
        shutil.rmtree(entry, ignore_errors=True)
