"""The filesystem layer (storage/) as a specification, against a real S3-protocol server on
loopback (moto's server mode, its own process: benchmarks/s3_server.py): local paths stay
`pathlib.Path`; bucket URIs read and write through pyarrow.fs; a folder of objects counts as
complete only with its marker, written last; bad locations are one line before anything runs.

    .venv/bin/python -m pytest tests/test_storage.py -q
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from storage import (
    ObjectPath,
    StorageError,
    check_storage,
    local_copy,
    location,
    publish_dir,
    remove_tree,
)

BUCKET = "s3://convs2s-test"


def test_local_paths_stay_pathlib_and_uris_become_object_paths(tmp_path):
    assert location(str(tmp_path)) == tmp_path and isinstance(location("runs"), Path)
    assert location(f"file://{tmp_path}") == tmp_path
    obj = location("s3://bucket//runs/demo/")
    assert isinstance(obj, ObjectPath) and str(obj) == "s3://bucket/runs/demo"
    assert str(obj / "best" / "meta.json") == "s3://bucket/runs/demo/best/meta.json"
    assert obj.name == "demo" and str(obj.parent) == "s3://bucket/runs"


def test_a_uri_with_credentials_options_or_one_slash_is_refused_without_its_secret():
    for uri in ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/runs",
                "s3://AKIAEXAMPLE:wJalrXUtn/FEMI@bucket/runs",  # a secret key may hold "/"
                "s3://AKIAEXAMPLE:wJalrXUtn@FEMI@bucket/runs"):
        with pytest.raises(StorageError, match=r"s3://\*\*\*@bucket/runs: credentials do not "
                                               r"go in a storage URI") as err:
            location(uri)
        assert "wJalrXUtn" not in str(err.value) and "FEMI" not in str(err.value)
        assert "AKIAEXAMPLE" not in str(err.value)
    # slashes after s3:// (the key was found, the message quoted the URI whole)
    with pytest.raises(StorageError, match=r"s3:///\*\*\*@bucket/runs: credentials") as err:
        location("s3:///AKIAEXAMPLE:wJalrXUtn@bucket/runs")
    assert "wJalrXUtn" not in str(err.value) and "AKIAEXAMPLE" not in str(err.value)
    from storage.paths import shown

    assert shown("/alice@corp/data") == "/alice@corp/data"  # a path's "@" is no credential
    assert shown("file:///a@b/c") == "file:///a@b/c"
    with pytest.raises(StorageError, match=r"write s3://\*\*\*@bucket/x") as err:
        location("s3:/AKIAEXAMPLE:wJalrXUtn@bucket/x")
    assert "wJalrXUtn" not in str(err.value)
    with pytest.raises(StorageError, match=r"s3://bucket/runs: a storage URI takes no query"):
        location("s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http")
    for typo in ("s3:/bucket/runs", str(Path("s3://bucket/runs"))):  # pathlib drops a slash
        with pytest.raises(StorageError, match=r"write s3://bucket/runs"):
            location(typo)
    # no slash at all (a folder "s3:bucket" in the working directory), and the other schemes
    with pytest.raises(StorageError, match=r"no slash after s3:, so it would be a local folder "
                                           r"named 's3:bucket'; write s3://bucket/runs"):
        location("s3:bucket/runs")
    with pytest.raises(StorageError, match=r"write s3://\*\*\*@bucket/x") as err:
        location("s3:AKIAEXAMPLE:wJalrXUtn@bucket/x")
    assert "wJalrXUtn" not in str(err.value)
    for typo in ("wasbs:/c/x", "oss:/b/x", "s3a:/b/x", "s3n:/b/x"):
        with pytest.raises(StorageError, match="one slash after"):
            location(typo)
    assert location("runs/s3:/x") == Path("runs/s3:/x").resolve()  # only at the start


def test_a_signed_url_or_an_endpoint_in_a_uri_is_refused_without_its_signature():
    # A presigned URL's query is a credential: no message shows it, and a host:port is no
    # bucket (the endpoint goes in AWS_ENDPOINT_URL), not "credentials".
    for uri, says in (("https://minio:9000/b/k?X-Amz-Signature=SECRETSIG",
                       "https://minio:9000/b/k: 'minio:9000' is a host and port, not a bucket"),
                      ("s3://b/k?X-Amz-Signature=SECRETSIG", "s3://b/k: a storage URI takes no "
                       "query"),
                      ("s3:/b/k?X-Amz-Signature=SECRETSIG", "write s3://b/k ")):
        with pytest.raises(StorageError) as err:
            location(uri)
        assert says in str(err.value) and "SECRETSIG" not in str(err.value), str(err.value)


def test_a_signed_uri_whose_credential_holds_a_colon_is_refused_for_its_query_unseen():
    """A query or fragment is refused before the host:port check: with a ":" after the "?" (an
    X-Amz-Credential, an Azure SAS time) the bucket taken up to the first "/" held the whole
    query, and the "is a host and port" message printed it, signature included."""
    for uri, bare in (("s3://team-runs?X-Amz-Date=20250101T000000Z&X-Amz-Signature="
                       "SECRETSIGVALUE&X-Amz-Credential=AKIAEXAMPLE:x", "s3://team-runs"),
                      ("az://corpus?se=2025-01-01T00:00:00Z&sig=SECRETSIGVALUE", "az://corpus"),
                      ("s3://bkt#SECRETSIGVALUE:1", "s3://bkt")):
        with pytest.raises(StorageError) as err:
            location(uri)
        message = str(err.value)
        assert message.startswith(f"{bare}: a storage URI takes no query or fragment"), message
        assert "SECRETSIGVALUE" not in message and "AKIAEXAMPLE" not in message, message
        assert "host and port" not in message
    with pytest.raises(StorageError, match="'minio:9000' is a host and port"):
        location("s3://minio:9000/bucket/runs")  # (a real endpoint is still told so)


def test_a_message_shows_a_uri_without_its_secrets_and_with_the_rest_of_it():
    from storage.paths import shown

    assert shown("s3://bucket/run@2/x") == "s3://bucket/run@2/x"  # a key's own "@"
    assert shown("s3://KEY:SEC/RET@bucket/x") == "s3://***@bucket/x"  # a secret with "/"
    assert shown("s3://KEY:SECRET@bucket/x?X-Amz-Signature=S") == "s3://***@bucket/x"
    # a secret holding "#" or "?" (cut there, the "@" was missed: the key and the secret's
    # start were shown), as a message and as the refusal
    for uri in ("s3://AKIAKEY:wJalr#XUtn@bucket/runs", "s3://AKIAKEY:wJalr?XUtn@bucket/runs"):
        assert shown(uri) == "s3://***@bucket/runs"
        with pytest.raises(StorageError, match="credentials do not go in a storage URI") as err:
            location(uri)
        assert "AKIAKEY" not in str(err.value) and "wJalr" not in str(err.value), str(err.value)
    # a key and its secret where the bucket goes, no "@" (a typo): both were shown twice, as
    # a "host and port"
    with pytest.raises(StorageError, match="credentials do not go in a storage URI") as err:
        location("s3://AKIAKEY:wJalrXUtn/bucket/runs")
    assert "AKIAKEY" not in str(err.value) and "wJalr" not in str(err.value), str(err.value)


def test_the_workflow_record_is_flushed_to_the_disk_before_its_rename(tmp_path, monkeypatch):
    """workflow.json, which every rerun of a run name reads (a damaged one refuses the run),
    is written as every record that must survive a power loss: beside, flushed, renamed over
    (an unflushed rename can leave an empty file under the new name)."""
    import json
    from types import SimpleNamespace

    from workflows.run_state import StageContext

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    ctx = StageContext(tree=SimpleNamespace(run_dir=tmp_path / "run"))
    ctx.save_state({"train": {}})
    assert synced and json.loads((tmp_path / "run" / "workflow.json").read_text()) == \
        {"train": {}}
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["workflow.json"]


def test_file_uris_are_local_paths_as_rfc_8089_writes_them(tmp_path):
    (tmp_path / "a b").mkdir()
    assert location((tmp_path / "a b").as_uri()) == tmp_path / "a b"  # %20 decoded
    assert location(f"file://localhost{tmp_path}") == tmp_path
    with pytest.raises(StorageError, match="not of host 'elsewhere'"):
        location(f"file://elsewhere{tmp_path}")
    assert local_copy(f"file://{tmp_path}") == tmp_path  # what the loaders call
    # ? and # begin a URI's query and fragment: written raw they cut the path short, which
    # would name (and write, and prune) another folder; %3F / %23, as as_uri() writes them
    (tmp_path / "run#1?").mkdir()
    assert location((tmp_path / "run#1?").as_uri()) == tmp_path / "run#1?"
    for raw in (f"file://{tmp_path}/run#1", f"file://{tmp_path}/what?.txt"):
        with pytest.raises(StorageError, match="write \\? as %3F and # as %23"):
            location(raw)
    for empty in ("file://", "file://localhost"):  # (it was the working directory)
        with pytest.raises(StorageError, match="names no path"):
            location(empty)


def test_a_file_uri_with_one_slash_is_its_local_path_not_a_folder_named_file(tmp_path,
                                                                            monkeypatch):
    """`file:/PATH` (RFC 8089 without a host, and what pathlib makes of file:///PATH) is the
    local path /PATH, as file:///PATH is: it was `<cwd>/file:/PATH`, a folder named "file:"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a b").mkdir()
    mangled = str(Path((tmp_path / "a b").as_uri()))  # pathlib drops a slash
    assert mangled.startswith("file:/") and not mangled.startswith("file://")
    assert location(mangled) == tmp_path / "a b"  # (%20 decoded)
    assert location(f"FILE:{tmp_path}") == tmp_path
    assert local_copy(f"file:{tmp_path}") == tmp_path
    assert not (tmp_path / "file:").exists()


def test_a_model_named_by_a_file_uri_loads_and_translates(tiny_checkpoints):
    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference
    from convs2s.io.checkpoint import load_checkpoint

    uri = Path(tiny_checkpoints["a"]).as_uri()
    assert load_checkpoint(uri)["update"] == 10
    search = SearchConfig(beam=1, max_len_a=0, max_len_b=2)
    assert len(load_for_inference([uri], search).translate(["The cat sleeps ."])) == 1


def test_a_sentencepiece_model_given_by_a_bucket_or_file_uri_is_read_there(s3, tiny_checkpoints,
                                                                           tmp_path):
    """--spm-model names a file as --checkpoint does: a bucket's object (its local copy) or a
    file:// URI; a bucket URI was taken for a local path that "does not exist"."""
    import shutil

    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference
    from convs2s.io.checkpoint import CheckpointError

    no_bpe = tmp_path / "no_bpe"  # a checkpoint without its own sentencepiece model
    no_bpe.mkdir()
    shutil.copy(Path(tiny_checkpoints["a"]) / "checkpoint.pt", no_bpe)
    spm = Path(tiny_checkpoints["spm"])
    obj = location(BUCKET) / "spec-spm" / "spm.model"
    obj.write_bytes(spm.read_bytes())
    search = SearchConfig(beam=1, max_len_a=0, max_len_b=2)
    for given in (obj.uri, spm.as_uri()):
        assert len(load_for_inference([no_bpe], search, spm_model=given)
                   .translate(["The cat sleeps ."])) == 1
    with pytest.raises(CheckpointError, match="no such object"):
        load_for_inference([no_bpe], search, spm_model=f"{BUCKET}/spec-spm/none.model")


def test_a_listed_object_may_hold_any_name_but_no_path_leaves_its_folder(s3):
    run = location(BUCKET) / "spec-names"
    (run / "notes#1?.txt").write_text("x")  # legal key characters, not a URI's query
    assert [p.name for p in run.iterdir()] == ["notes#1?.txt"]
    assert (run / "notes#1?.txt").read_text() == "x"
    for bad in (f"{BUCKET}/spec-names/../x", f"{BUCKET}/./x"):
        with pytest.raises(StorageError, match="'.' and '..' name no folder"):
            location(bad)
    with pytest.raises(StorageError, match="'.' and '..' name no folder"):
        run / ".." / "other"
    with pytest.raises(StorageError, match="is a whole bucket: refusing to delete it"):
        remove_tree(BUCKET)
    remove_tree(run)
    assert s3.keys("convs2s-test", "spec-names/") == []


def test_a_folder_holding_a_key_with_an_empty_part_is_refused_naming_it(s3):
    """A key "run//x" (another tool wrote it) names no path: "run/x" is another object, so a
    copy of the folder read a missing object and said the folder "changed while being copied,
    try again", ten times over. Now the object is named, and why."""
    import boto3

    boto3.client("s3").put_object(Bucket="convs2s-test", Key="spec-slashes/run//x", Body=b"x")
    (location(BUCKET) / "spec-slashes" / "run" / "y").write_text("y")
    with pytest.raises(StorageError, match=r"the object '/x' under it has an empty part"):
        local_copy(f"{BUCKET}/spec-slashes/run")


def test_a_folder_holding_a_key_that_climbs_out_is_refused_and_nothing_outside_is_touched(
        s3, tmp_path, monkeypatch):
    """A key "m/../../x" is a plain name to a store (another tool wrote it); a local copy of
    the folder opened it as a path, creating and emptying a file outside the cache before it
    refused."""
    import boto3

    monkeypatch.setenv("CONVS2S_CACHE", str(tmp_path / "cache"))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    client = boto3.client("s3")
    client.put_object(Bucket="convs2s-test", Key="spec-climb/m1/checkpoint.pt", Body=b"w")
    # the copy's folder is cache/objects/<version>/.m1.<tmp>/: four levels under tmp_path
    client.put_object(Bucket="convs2s-test", Key="spec-climb/m1/../../../../victim.txt",
                      Body=b"")
    with pytest.raises(StorageError, match=r"a '\.' or '\.\.' part in its key"):
        local_copy(f"{BUCKET}/spec-climb/m1")
    assert victim.read_text() == "precious"


def test_an_object_path_is_never_taken_for_a_local_file():
    # No __fspath__: open() of a URI fails instead of writing a local folder named "s3:".
    with pytest.raises(TypeError):
        open(location("s3://bucket/x.txt"), "w")  # noqa: SIM115


def test_objects_read_write_list_and_delete(s3):
    run = location(BUCKET) / "spec-objects"
    (run / "a.txt").write_text("é")
    (run / "sub" / "b.bin").write_bytes(b"\x00\x01")
    assert (run / "a.txt").read_text() == "é" and (run / "a.txt").is_file()
    assert run.is_dir() and (run / "sub").is_dir() and not (run / "nope").exists()
    assert [p.name for p in run.iterdir()] == ["a.txt", "sub"]
    assert [p.name for p in run.glob("*.txt")] == ["a.txt"]
    assert [name for name, _ in run.files()] == ["a.txt", "sub/b.bin"]
    (run / "a.txt").unlink()
    assert not (run / "a.txt").exists()
    remove_tree(run)
    assert s3.keys("convs2s-test", "spec-objects/") == []


def test_an_object_replaced_while_it_is_read_is_read_whole(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("CONVS2S_CACHE", str(tmp_path / "cache"))
    # pyarrow reads an object as a HEAD (its size) and then ranged GETs: one replaced in
    # between came back cut short or padded with zeros (a run's lease, renewed every few
    # seconds, read by another command). A read returns one version whole, old or new.
    # Each version is new, as a renewal's time is (on a store without one-GET reads the check
    # compares ETags, which are the content's digest)
    obj = location(BUCKET) / "spec-replaced" / "state.json"
    versions = [b'{"renewed": 1}'] + [
        b'{"renewed": %d.25, "host": "worker-7"}' % i if i % 2 else b'{"renewed": %d}' % i
        for i in range(1, 100_000)]
    obj.write_bytes(versions[0])
    stop, writes = threading.Event(), [0]

    def rewrite():
        while not stop.is_set():
            writes[0] += 1
            obj.write_bytes(versions[writes[0]])

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        reads = [obj.read_bytes() for _ in range(150)]
        reads += [local_copy(obj).read_bytes() for _ in range(30)]  # a copy for torch.load
    finally:
        stop.set()
        writer.join()
    assert writes[0] > 50  # the reads did overlap the rewrites
    assert {r for r in reads if r not in set(versions)} == set()


def test_a_move_deletes_only_what_it_copied(s3, monkeypatch, tmp_path):
    from storage import transfer

    src, dest = location(BUCKET) / "spec-move" / "a", location(BUCKET) / "spec-move" / "b"
    (src / "x.txt").write_text("x")
    (src / "sub" / "y.txt").write_text("y")
    copy = transfer._copy

    def a_writer_adds_one_meanwhile(a, b, size=None):
        (src / "late.txt").write_text("written after the listing")
        copy(a, b, size)

    monkeypatch.setattr(transfer, "_copy", a_writer_adds_one_meanwhile)
    transfer.move_tree(src, dest)
    assert [n for n, _ in dest.files()] == ["sub/y.txt", "x.txt"]
    assert [n for n, _ in src.files()] == ["late.txt"]  # not this move's to delete
    with pytest.raises(StorageError, match="both local, or both in one bucket"):
        transfer.move_tree(tmp_path, dest)


def test_an_object_larger_than_one_copy_request_takes_is_copied_in_parts_by_the_server(
        s3, monkeypatch):
    """S3's CopyObject copies at most 5 GiB (pyarrow's copy_file is one such request): a larger
    object (a checkpoint with its optimizer state, a shard) is copied by the server as a
    multipart upload of ranges, whose ETag says how many parts it has; below the limit one
    request copies it. (The limits made small here: the server is real, the objects MiBs.)"""
    import hashlib

    from storage import transfer

    monkeypatch.setattr(transfer, "COPY_OBJECT_MAX", 6 << 20)
    monkeypatch.setattr(transfer, "COPY_PART_BYTES", 5 << 20)
    src, dest = location(BUCKET) / "spec-big" / "a", location(BUCKET) / "spec-big" / "b"
    big = os.urandom(12 << 20)
    (src / "checkpoint.pt").write_bytes(big)
    (src / "meta.json").write_text("{}")
    transfer.move_tree(src, dest)
    assert (dest / "checkpoint.pt").read_bytes() == big
    assert transfer.etag(dest / "checkpoint.pt").strip('"').endswith("-3")  # 5 + 5 + 2 MiB
    assert "-" not in transfer.etag(dest / "meta.json")  # one CopyObject
    assert src.files() == []
    # a folder published from the same bucket, its marker last
    publish_dir(dest, location(BUCKET) / "spec-big" / "c", marker="meta.json")
    c = location(BUCKET) / "spec-big" / "c"
    assert hashlib.sha256((c / "checkpoint.pt").read_bytes()).digest() == \
        hashlib.sha256(big).digest()
    assert transfer.etag(c / "checkpoint.pt").strip('"').endswith("-3")
    # each part comes from the version the copy began with: a source replaced meanwhile (the
    # ETag read first is no longer its) is one error, and nothing is written
    stale = transfer.etag(c / "checkpoint.pt")
    (c / "checkpoint.pt").write_bytes(os.urandom(12 << 20))
    monkeypatch.setattr(transfer, "etag", lambda p: stale)
    with pytest.raises(StorageError, match=r"checkpoint.pt: replaced while being copied"):
        transfer._copy(c / "checkpoint.pt", location(BUCKET) / "spec-big" / "d" / "x.pt")
    assert not (location(BUCKET) / "spec-big" / "d" / "x.pt").exists()


@pytest.mark.parametrize("given", ["path", "file_uri"])
def test_a_folder_linked_into_a_run_is_removed_or_moved_as_the_link_never_its_target(
        tmp_path, given):
    """A checkpoint or a weights/ folder linked into a run from elsewhere (an archive, another
    disk): keep_last's removal and --restart's move act on the run's link; the folder it points
    to was not written by the run and stays where it is, whole."""
    from storage import move_tree

    archive = tmp_path / "archive" / "ckpt"
    archive.mkdir(parents=True)
    (archive / "checkpoint.pt").write_text("weights kept elsewhere")
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "checkpoint_00000001").symlink_to(archive, target_is_directory=True)
    (run / "weights").symlink_to(archive, target_is_directory=True)
    name = (lambda p: p.as_uri()) if given == "file_uri" else str
    remove_tree(name(run / "checkpoint_00000001"))
    assert not os.path.lexists(run / "checkpoint_00000001")
    assert (archive / "checkpoint.pt").read_text() == "weights kept elsewhere"
    (run / "replaced").mkdir()
    move_tree(name(run / "weights"), name(run / "replaced" / "weights"))
    assert (run / "replaced" / "weights").is_symlink() and not os.path.lexists(run / "weights")
    assert (archive / "checkpoint.pt").is_file() and archive.is_dir()
    remove_tree(run)  # a run folder itself (no link): deleted; the links in it, not followed
    assert not run.exists() and (archive / "checkpoint.pt").is_file()


def test_a_folder_linked_into_a_run_is_replaced_as_the_link_when_published_or_staged(
        tmp_path, tiny_checkpoints):
    """Publishing a checkpoint onto a run's best/, or staging weights onto its weights folder,
    where that folder is a link to another run's: the run's link is replaced by a folder of its
    own; the folder it pointed to, which this run did not write, keeps its files."""
    from convs2s.io.staging import STAGED_FILE, stage_models

    other = tmp_path / "other"
    (other / "best").mkdir(parents=True)
    (other / "best" / "meta.json").write_text("theirs")
    (other / "best" / "checkpoint.pt").write_text("their weights")
    (other / "avg").mkdir()
    (other / "avg" / STAGED_FILE).write_text("{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "best").symlink_to(other / "best", target_is_directory=True)
    (run / "avg").symlink_to(other / "avg", target_is_directory=True)
    new = _folder(tmp_path, {"meta.json": "ours"})
    publish_dir(new, run / "best", marker="meta.json")
    assert not (run / "best").is_symlink() and (run / "best" / "meta.json").read_text() == "ours"
    assert sorted(p.name for p in (other / "best").iterdir()) == ["checkpoint.pt", "meta.json"]
    assert (other / "best" / "meta.json").read_text() == "theirs"
    staged = stage_models([str(tiny_checkpoints["a"])], False, run / "avg")
    assert staged == (str(run / "avg" / "model_00"),) and not (run / "avg").is_symlink()
    assert sorted(p.name for p in (other / "avg").iterdir()) == [STAGED_FILE]


def test_local_copy_fetches_each_version_once(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("CONVS2S_CACHE", str(tmp_path / "cache"))
    obj = location(BUCKET) / "spec-copy" / "model.bin"
    obj.write_bytes(b"v1")
    first = local_copy(obj)
    assert first.read_bytes() == b"v1"
    stamp = (first.stat().st_ino, first.stat().st_mtime_ns)
    assert local_copy(obj) == first  # the same version: not fetched again (the file untouched)
    assert (first.stat().st_ino, first.stat().st_mtime_ns) == stamp
    obj.write_bytes(b"v2")  # the same size, likely within the same second: a new version
    assert local_copy(obj).read_bytes() == b"v2"
    obj.write_bytes(b"version 2")
    assert local_copy(obj).read_bytes() == b"version 2"
    folder = local_copy(obj.parent)
    assert (folder / "model.bin").read_bytes() == b"version 2"


def test_a_copy_cut_short_by_an_error_leaves_nothing_in_the_cache(s3, tmp_path, monkeypatch):
    """A download that fails midway (the network, a Ctrl-C) removes its partial file: the
    cache kept each one for good, a checkpoint's gigabytes at every failed try."""
    from storage import transfer

    monkeypatch.setenv("CONVS2S_CACHE", str(tmp_path / "cache"))
    obj = location(BUCKET) / "spec-cut" / "model.bin"
    obj.write_bytes(b"weights" * 1000)
    (obj.parent / "meta.json").write_text("{}")

    def cut(p, out):
        out.write(b"part of it")
        raise ConnectionError("the connection was reset")

    monkeypatch.setattr(transfer, "copy_version", cut)
    for what in (obj, obj.parent):  # a file, and a folder
        with pytest.raises(ConnectionError):
            local_copy(what)
    left = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert left == [], left


def _folder(tmp_path, files: dict) -> Path:
    d = tmp_path / f"src{len(list(tmp_path.iterdir()))}"
    for name, text in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    return d


@pytest.mark.parametrize("where", ["bucket", "local"])
def test_publish_replaces_a_folder_whole_with_its_marker_last(s3, tmp_path, where):
    dest = (location(BUCKET) / "spec-publish" if where == "bucket"
            else tmp_path / "dest" / "best")
    publish_dir(_folder(tmp_path, {"w.pt": "1", "old.txt": "x", "meta.json": "{}"}), dest,
                marker="meta.json")
    publish_dir(_folder(tmp_path, {"w.pt": "2", "meta.json": '{"v": 2}'}), dest,
                marker="meta.json")
    assert (dest / "w.pt").read_text() == "2" and (dest / "meta.json").read_text() == '{"v": 2}'
    assert not (dest / "old.txt").exists()  # the old version's extra file is gone


def test_a_folder_is_published_to_a_bucket_several_objects_at_once_and_its_marker_last(
        s3, tmp_path, monkeypatch):
    """In a bucket each object is a request of tens of ms: a folder's objects are copied side by
    side (a stage of hundreds of parts took minutes one after another), the marker once every
    other object is there."""
    import threading
    import time

    events, lock, in_flight, most = [], threading.Lock(), [0], [0]
    real = ObjectPath.upload

    def upload(self, local):
        with lock:
            if self.name == "meta.json":  # the marker starts once every part has ended
                events.append(f"marker started, {in_flight[0]} in flight")
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.05)  # a request's round trip
        real(self, local)
        with lock:
            in_flight[0] -= 1
            events.append(self.name)

    monkeypatch.setattr(ObjectPath, "upload", upload)
    files = {f"part-{i}.parquet": str(i) for i in range(8)} | {"meta.json": "{}"}
    dest = location(BUCKET) / "spec-side-by-side"
    publish_dir(_folder(tmp_path, files), dest, marker="meta.json")
    assert events[-2:] == ["marker started, 0 in flight", "meta.json"]
    assert most[0] > 1 and sorted(events[:-2] + ["meta.json"]) == sorted(files)
    assert {name: (dest / name).read_text() for name in files} == files
    # An object that fails: no copy starts after it, the error is raised, no marker
    started = []

    def fails_on_the_first(self, local):
        started.append(self.name)
        if self.name == "part-000.parquet":
            raise OSError("refused")
        time.sleep(0.05)

    monkeypatch.setattr(ObjectPath, "upload", fails_on_the_first)
    many = {f"part-{i:03d}.parquet": str(i) for i in range(100)} | {"meta.json": "{}"}
    with pytest.raises(OSError, match="refused"):
        publish_dir(_folder(tmp_path, many), location(BUCKET) / "spec-fails", marker="meta.json")
    assert len(started) < 40 and "meta.json" not in started, len(started)


def test_a_writer_killed_mid_publish_leaves_no_marker(s3, tmp_path, monkeypatch):
    dest = location(BUCKET) / "spec-killed"
    publish_dir(_folder(tmp_path, {"w.pt": "1", "meta.json": "{}"}), dest, marker="meta.json")
    uploaded = []

    def dies_on_the_second_file(self, local):
        if uploaded:
            raise KeyboardInterrupt  # the writer killed mid-publish
        uploaded.append(self)
        ObjectPath.write_bytes(self, Path(local).read_bytes())

    monkeypatch.setattr(ObjectPath, "upload", dies_on_the_second_file)
    with pytest.raises(KeyboardInterrupt):
        publish_dir(_folder(tmp_path, {"a.pt": "2", "b.pt": "2", "meta.json": "{}"}), dest,
                    marker="meta.json")
    assert not (dest / "meta.json").exists()  # readers take the folder as incomplete


def test_a_storage_endpoint_that_never_answers_is_one_line_and_the_command_exits(tmp_path):
    # A server that takes the connection and never answers: the check gives up after its
    # timeout, says so, and the process ends then (the hung call is left behind), not when
    # the storage client's own retries give up minutes later.
    import socket
    import subprocess
    import sys
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}",
           "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    code = ("from storage import check_storage, StorageError\n"
            "try:\n    check_storage('s3://nobody-answers/x', '--storage-path', timeout_s=2)\n"
            "except StorageError as err:\n    print(err)\n")
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    finally:
        silent.close()
    assert "s3://nobody-answers/x: no answer within 2 s" in proc.stdout, proc.stderr[-2000:]
    # (the process itself starts in a few seconds; the check's call left behind ends after one
    # timeout, not after pyarrow's 3 attempts: 6 s here, 90 s at the default 30 s)
    assert time.monotonic() - start < 20


def test_bad_locations_are_one_line_before_anything_runs(s3, monkeypatch, tmp_path):
    check_storage(f"{BUCKET}/runs", "--storage-path", write=True)  # the good one passes
    with pytest.raises(StorageError, match=r"^--storage-path s3://convs2s-missing/runs: the "
                                           r"bucket s3://convs2s-missing does not exist"):
        check_storage("s3://convs2s-missing/runs", "--storage-path")
    with pytest.raises(StorageError, match=r"^--data foo://b.*no filesystem serves"):
        check_storage("foo://b/corpus", "--data")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StorageError, match=r"^--storage-path s3://convs2s-test/runs: no AWS "
                                           r"credentials found; set AWS_ACCESS_KEY_ID"):
        check_storage(f"{BUCKET}/runs", "--storage-path")


def test_a_local_publish_interrupted_in_its_copy_leaves_no_partial_folder(tmp_path,
                                                                          monkeypatch):
    """Ctrl-C while a checkpoint is copied into the run folder: the partial copy (a whole
    checkpoint at real sizes) goes with the interrupt; it was never read, and never removed."""
    import shutil

    src = tmp_path / "src"
    src.mkdir()
    (src / "checkpoint.pt").write_bytes(b"w" * 1000)
    (src / "meta.json").write_text("{}")
    copy = shutil.copytree

    def interrupted(a, b, **kw):
        copy(a, b, **kw)  # (the files copied, then the key pressed)
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copytree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        publish_dir(src, tmp_path / "run" / "checkpoint_00000036", marker="meta.json")
    assert list((tmp_path / "run").iterdir()) == []


def test_scratch_folders_that_ended_processes_left_behind_are_removed_and_no_others(
        tmp_path, monkeypatch):
    """A scratch folder (a checkpoint before it is published, a bucket's metrics.jsonl) of a
    process killed meanwhile: the next one made with its prefix removes it, once its process
    provably no longer runs here; a live process's, this process's own, another machine's (or
    container's) and one named before these names are left alone."""
    import subprocess
    import sys
    import tempfile

    from storage import scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    owner = scratch.place()
    names = {"left": f"convs2s-ckpt-{owner}-{ended.pid}-x1", "live": f"convs2s-ckpt-{owner}-1-x2",
             "mine": f"convs2s-ckpt-{owner}-{os.getpid()}-x3",
             "elsewhere": f"convs2s-ckpt-0badc0de-{ended.pid}-x4",
             "older": "convs2s-ckpt-k2j3h4l5", "other prefix": f"convs2s-metrics-{owner}-"
                                                              f"{ended.pid}-x5"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "checkpoint.pt").write_bytes(b"w")
    made = scratch.scratch_dir("convs2s-ckpt-")
    assert made.parent == tmp_path and made.name.startswith(f"convs2s-ckpt-{owner}-"
                                                            f"{os.getpid()}-")
    assert not (tmp_path / names["left"]).exists()
    assert all((tmp_path / n).is_dir() for k, n in names.items() if k != "left")


def test_a_whole_file_write_that_fails_leaves_no_partial_file_beside_it(tmp_path, monkeypatch):
    """A write cut by a full disk (or a Ctrl-C) removes its file beside the target: each was
    left, a part's size, in the output folder for good; the target keeps its old content."""
    from storage import paths
    from storage.paths import write_whole

    write_whole(tmp_path / "manifest.json", b"old")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_whole(tmp_path / "manifest.json", b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
    assert (tmp_path / "manifest.json").read_bytes() == b"old"


def test_an_object_write_cut_by_ctrl_c_or_an_error_keeps_the_old_object(s3):
    """An object is written in one PutObject: a Ctrl-C as its request goes out, or an error
    it meets, leaves the old object. (pyarrow's output stream completed its upload whenever it
    was closed: an empty workflow.json refused the run, and a bucket keeps no copy.)"""
    from storage.paths import s3_client, write_whole

    record = location(BUCKET) / "spec-cut-write" / "workflow.json"
    write_whole(record, b'{"train": "done"}')
    events = s3_client(record.fs).meta.events

    def interrupt(**_):
        raise KeyboardInterrupt

    def refused(**_):
        raise OSError("connection reset")

    for cut, raised in ((interrupt, KeyboardInterrupt), (refused, OSError)):
        events.register_first("before-send.s3.PutObject", cut)
        try:
            with pytest.raises(raised):
                write_whole(record, b'{"train": "done", "evaluate": "done"}')
        finally:
            events.unregister("before-send.s3.PutObject", cut)
        assert record.read_bytes() == b'{"train": "done"}', cut
    write_whole(record, b"new")
    assert record.read_bytes() == b"new"
    remove_tree(record.parent)


@pytest.mark.parametrize("variable", ["CONVS2S_RAY_JOIN_WAIT_S", "CONVS2S_RAY_SILENT_S"])
def test_a_wait_in_the_environment_that_is_no_number_is_named_before_joining(variable,
                                                                             monkeypatch):
    """CONVS2S_RAY_JOIN_WAIT_S=1m: a ValueError's traceback from deep inside the command,
    naming no variable; now the join's one-line refusal names it and the fix."""
    from storage import ray_join

    monkeypatch.setenv(variable, "1m")
    with pytest.raises(ray_join.RayAddressError, match=rf"{variable}='1m': give a number of "
                                                       r"seconds >= 0 \(default \d+\), or "
                                                       "unset it"):
        ray_join.join("127.0.0.1:1", submit="python -m workflows.translation")


def test_a_sigterm_whose_exit_was_swallowed_while_ray_started_still_stops_the_command():
    """Ray's SIGTERM handler exits (SystemExit 15); run inside a fork callback while Ray starts
    its processes, that exit was swallowed ("Exception ignored in ... _releaseLock") and the
    command ran on (the suite's SIGTERM-while-Ray-starts test caught it). The signal module's
    wakeup fd still says a SIGTERM came: Ctrl-C's KeyboardInterrupt once the start returns."""
    import os
    import signal
    import time

    from storage.ray_join import sigterm_while_starting_as_ctrl_c

    before = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # its effect lost
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with sigterm_while_starting_as_ctrl_c():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
        with sigterm_while_starting_as_ctrl_c():  # no signal: nothing raised
            pass
        assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd put back as it was
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_exit_swallowed_in_a_fork_callback_while_ray_starts_is_not_printed():
    """The same swallowed exit, as it happens (Ray's handler run inside a fork callback, in a
    process of its own: a fork callback stays registered): Python printed "Exception ignored
    in ... SystemExit: 15" with its traceback before the command's `interrupted` line (a
    suite run, 2026-12-07). The command stops as Ctrl-C, and prints nothing of it."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys\n"
        "from storage.ray_join import sigterm_while_starting_as_ctrl_c\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # Ray's\n"
        "fired = []\n"
        "def callback():\n"
        "    if not fired:\n"
        "        fired.append(1)\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        fired.append(2)  # the handler runs here, inside the callback\n"
        "os.register_at_fork(after_in_parent=callback)\n"
        "try:\n"
        "    with sigterm_while_starting_as_ctrl_c():\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            os._exit(0)\n"
        "        os.waitpid(pid, 0)\n"
        "    print('ran on')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout.strip() == "interrupted" and proc.stderr == "", proc.stderr


def test_a_local_ray_gets_the_cpus_this_process_may_run_on():
    """Ray counts the machine's CPUs, not the process's cpuset (Slurm, `taskset`): a local Ray
    started under one CPU of two placed actors for two, and its room checks approved them."""
    import subprocess
    import sys

    # (as where no Ray runs on the machine: the suite's own would be joined, with no resources)
    code = ("import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "from storage import ray_join\nray_join.running_here = lambda: False\n"
            "print(ray_join.local_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[1], check=True)
    assert out.stdout.strip() == "{'num_cpus': 1}", out.stdout


def test_a_path_a_ray_worker_is_given_is_the_one_the_driver_checked(tmp_path, monkeypatch):
    """`~` was expanded by the driver's checks and not for the actors, which read and wrote
    <cwd>/~/... and failed every part."""
    from storage import worker_path

    monkeypatch.setenv("HOME", str(tmp_path))
    assert worker_path("~/out") == str(tmp_path / "out") == str(location("~/out"))
    assert worker_path("s3://b/k") == "s3://b/k" and worker_path(None) is None
