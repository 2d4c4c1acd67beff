"""Up-front checks of a storage location: before Ray starts, a path that cannot work is one
line naming it and the fix (`StorageError`), never a failure an hour into a run.

What is checked for a bucket URI: a filesystem serves the scheme; for s3://, the standard AWS
credential chain finds credentials; the bucket exists and answers within `timeout_s`; and, for
a location the run writes to, an object can be written and deleted there.
"""

from __future__ import annotations

import os
import threading
import uuid

import pyarrow.fs as pafs

from storage.paths import ObjectPath, StorageError, location

# Values that must never reach a message (pyarrow's errors do not carry them; this makes sure).
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")

# The name of the empty object a write check puts in a folder and deletes: one whose delete
# failed (a timeout) is no file of anyone's, and a command that refuses folders holding
# others' files passes it over
WRITE_PROBE = ".convs2s-write-probe-"


def check_storage(p, what: str, write: bool = False, timeout_s: float = 30.0) -> None:
    """Raise `StorageError` (one line: `what`, the path, the fix) when `p` cannot be used."""
    where = location(p)
    if not isinstance(where, ObjectPath):
        return
    if where.scheme == "s3" and not _aws_credentials():
        raise StorageError(
            f"{what} {where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or run on nodes with an instance role), "
            "and AWS_ENDPOINT_URL for an S3-compatible server other than AWS")
    bucket = f"{where.scheme}://{where.bucket}"
    try:
        info = _within(timeout_s, where, what,
                       lambda: _timed(where, timeout_s).get_file_info(where.bucket))
    except StorageError as err:
        if "no filesystem serves" in str(err) and not str(err).startswith(what):
            raise StorageError(f"{what} {err}") from None
        raise
    if info is None or info.type == pafs.FileType.NotFound:
        raise StorageError(f"{what} {where}: the bucket {bucket} does not exist (or these "
                           "credentials cannot see it); create it first (e.g. `aws s3 mb "
                           f"{bucket}`) or fix the name")
    if write:  # (pyarrow keeps `where` as a folder marker once the probe is deleted: give a
        # folder, never the name of a file to write)
        probe = where / f"{WRITE_PROBE}{uuid.uuid4().hex[:12]}"

        def put_and_delete():
            fs = _timed(where, timeout_s)
            with fs.open_output_stream(probe.key) as out:
                out.write(b"")
            fs.delete_file(probe.key)

        _within(timeout_s, where, what, put_and_delete)


def _timed(where: ObjectPath, timeout_s: float) -> pafs.FileSystem:
    """`where`'s filesystem, for S3 one whose requests give up after `timeout_s` without an
    answer, and are not retried: a call left behind by `_within` then ends too, and with it
    the process (pyarrow's S3 client waits for its requests at exit; with its 3 attempts, a
    silent endpoint held a command's exit for about 3 x `timeout_s`)."""
    fs = where.fs
    if not isinstance(fs, pafs.S3FileSystem):
        return fs
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return pafs.S3FileSystem(region=fs.region, request_timeout=timeout_s,
                             connect_timeout=timeout_s,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
                             **({"endpoint_override": endpoint} if endpoint else {}))


def _aws_credentials() -> bool:
    """Whether the standard AWS chain (environment, profiles, SSO, web identity, container and
    instance roles) yields credentials, as boto3 and pyarrow resolve them."""
    import botocore.session

    try:
        return botocore.session.get_session().get_credentials() is not None
    except Exception:  # a broken profile file: let the bucket request say what is wrong
        return True


def _within(timeout_s: float, where: ObjectPath, what: str, fn):
    """`fn()` within `timeout_s`; a storage error as StorageError naming `what` and `where`;
    None when the bucket was not found. `fn` runs in a daemon thread: a call that never
    answers is left behind, and the command still exits (a pool's worker threads are joined
    at the interpreter's exit, which waited on the hung call)."""
    out: dict = {}
    done = threading.Event()

    def call() -> None:
        try:
            out["value"] = fn()
        except BaseException as err:  # raised again in the caller's thread
            out["error"] = err
        finally:
            done.set()

    threading.Thread(target=call, name="convs2s-storage-check", daemon=True).start()
    if not done.wait(timeout_s):
        endpoint = "AWS_ENDPOINT_URL (or the region)" if where.scheme == "s3" else "credentials"
        raise StorageError(f"{what} {where}: no answer within {timeout_s:.0f} s; check the "
                           f"network and {endpoint}")
    err = out.get("error")
    if isinstance(err, OSError):
        if _not_found(err):
            return None
        raise StorageError(f"{what} {where}: {_reason(err)}") from None
    if err is not None:
        raise err
    return out["value"]


def _not_found(err: OSError) -> bool:
    low = str(err).lower()
    return isinstance(err, FileNotFoundError) or "no_such_bucket" in low \
        or "nosuchbucket" in low or "resource_not_found" in low


def _reason(err: OSError) -> str:
    """The storage error's first line, with what to do for the common ones."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value:
            text = text.replace(value, "***")
    low = text.lower()
    if "access_denied" in low or "accessdenied" in low or "403" in low:
        return f"access denied ({text}); give these credentials read and write access there"
    if "invalidaccesskeyid" in low or "signaturedoesnotmatch" in low:
        return f"the credentials were refused ({text}); check AWS_ACCESS_KEY_ID / the profile"
    if "connect" in low or "resolve" in low or "curl" in low:
        return f"cannot reach the storage endpoint ({text}); check AWS_ENDPOINT_URL and network"
    return text


# Folders of a storage path that are not runs: the data every run shares (a workflow's
# preprocessing root) and, beside a run in a bucket, the MLflow artifacts
# (convs2s.tracking.runs)
RESERVED_RUN_NAMES = {"preprocessed": "the preprocessed data every run shares",
                      "mlartifacts": "the MLflow artifacts of runs in a bucket"}


def run_name_problem(name: str) -> str | None:
    """What is wrong with `name` as a run's folder under a storage path (a `--run-name`), or
    None. One folder directly under it: a path (`../x`, `a/b`) would put the run elsewhere
    (and its keep_last delete checkpoint folders there), "" or "." is the storage path
    itself, a hidden name hides it (and `.lease.json` is a lease), and a folder the storage
    path keeps for other things would mix a run into them."""
    if not name or name.startswith(".") \
            or not all(c.isascii() and (c.isalnum() or c in "._-") for c in name):
        return (f"--run-name {name!r}: give one folder name of letters, digits, '.', '_' and "
                "'-', not starting with '.' (the run's folder under --storage-path)")
    if name in RESERVED_RUN_NAMES:
        return (f"--run-name {name}: the storage path's {name}/ folder holds "
                f"{RESERVED_RUN_NAMES[name]}; choose another --run-name")
    return None
