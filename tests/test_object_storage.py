"""Runs and data on object storage, as a specification, against a real S3-protocol server on
loopback (moto's server mode, its own process: benchmarks/s3_server.py): a workflow with
`--storage-path s3://…` and `--data s3://…` writes every output as an object in the bucket
and nothing local but its tracking database, and translates exactly as the same run on local
disk; a stage commits with its manifest last, so a killed writer's objects are never read;
a location that cannot work is one line before Ray starts.

(The training run on a bucket, killed mid-epoch and resumed from the bucket with the planned
rows trained once: tests/test_train.py, its `crashed_run` and the worker-death test.)

    .venv/bin/python -m pytest tests/test_object_storage.py -q
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import REPO, SHORT_OUTPUTS, mlflow_store

from storage import location

BUCKET = "s3://convs2s-test"


SECRET = "pw-8d1f3c-never-printed"


def _fr_en(data: str, storage: str, tracking_uri: str) -> list:
    """[exit code, stdout] of workflows/translation.py, French -> English from the one file pair
    of news-commentary-5k cut into train / valid / test by line ranges, a 2000-piece BPE, 20
    updates, run name "fr-en"."""
    from workflows import translation

    argv = ["--preset", "cpu", "--src", "fr", "--tgt", "en", "--data", data,
            "--split", "train=nc-5k[:4500]", "--split", "valid=nc-5k[4500:4750]",
            "--split", "test=nc-5k[4750:]", "--set", "data.vocab_size=2000",
            "--set", "ensemble.average_last=0", "--max-updates", "20", *SHORT_OUTPUTS,
            "--storage-path", storage, "--tracking-uri", tracking_uri, "--run-name", "fr-en"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = translation.main(translation.PRESETS, translation.__doc__, argv)
    return [rc, buf.getvalue()]


def fr_en_in_this_process(spec_file: str) -> None:
    """The background run's process (`_fr_en_on_a_bucket_and_on_disk`), in an empty working
    folder, with a local Ray of its own. When the spec names a team server: the corpus uploaded
    to the bucket, the user alice added on the team server, then the fr-en run on the bucket,
    tracked by the team server as alice (the user and password in the tracking URI). Then the
    same run on local disk. Writes {"bucket": [rc, stdout] or None, "local": [rc, stdout]} to
    the spec's `result`."""
    from conftest import add_team_user

    spec = json.loads(Path(spec_file).read_text())
    out = {"bucket": None}
    if spec["team_url"] is not None:
        corpus = location(f"{BUCKET}/nc-corpus")
        for name in ("nc-5k.en", "nc-5k.fr"):
            (corpus / name).upload(Path(spec["data"]) / name)
        add_team_user(spec["team_url"], "alice", SECRET)
        uri = spec["team_url"].replace("http://", f"http://alice:{SECRET}@")
        out["bucket"] = _fr_en(str(corpus), f"{BUCKET}/nc-runs", uri)
    out["local"] = _fr_en(spec["data"], spec["local_runs"], spec["local_uri"])
    Path(spec["result"]).write_text(json.dumps(out))


# The background run's command: this module's function in a Python of its own.
FR_EN_PROCESS = ("import sys; sys.path[:0] = [{repo!r}, {tests!r}]; "
                 "from test_object_storage import fr_en_in_this_process as run; run(sys.argv[1])")


def _fr_en_on_a_bucket_and_on_disk(ctx):
    """The fr-en run on the bucket and on local disk, one after the other in one process of
    their own (`fr_en_in_this_process`; its own local Ray, so it runs in the background,
    tests/conftest.py `Background`), beside the session's loopback S3 server and its team
    tracking server. The bucket run is left out when no selected test uses the bucket (the
    server is started only for those: `s3_running`); tests/test_workflows.py takes the local
    run. Returns bucket and local ([exit code, stdout] each; bucket None when left out), the
    process's stderr (both runs'), its working folder, and the local run's storage path and
    tracking URI."""
    from types import SimpleNamespace

    from conftest import SHARED_DATA, s3_running, team_server_of

    data = SHARED_DATA / "news-commentary-5k"
    if not data.is_dir():
        pytest.skip(f"real corpora not found at {SHARED_DATA} (../shared/data beside the "
                    "checkout)")
    team_url = team_server_of(ctx.tmp_path_factory, ctx.env).url if s3_running() else None
    root = ctx.tmp_path_factory.mktemp("fr_en")
    cwd = root / "cwd"  # nothing may appear here
    cwd.mkdir()
    spec = {"data": str(data), "team_url": team_url, "local_runs": str(root / "runs"),
            "local_uri": mlflow_store(root), "result": str(root / "result.json")}
    (root / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in ctx.env.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    code = FR_EN_PROCESS.format(repo=str(REPO), tests=str(REPO / "tests"))
    proc = ctx.run([sys.executable, "-c", code, str(root / "spec.json")], cwd=cwd, env=env,
                   timeout=900)
    assert proc.returncode == 0 and Path(spec["result"]).is_file(), \
        (proc.stdout + proc.stderr)[-4000:]
    runs = json.loads(Path(spec["result"]).read_text())
    return SimpleNamespace(bucket=runs["bucket"], local=runs["local"], stderr=proc.stderr,
                           cwd=cwd, local_runs=Path(spec["local_runs"]),
                           local_uri=spec["local_uri"])


BACKGROUND_RUNS = {"fr_en_runs": _fr_en_on_a_bucket_and_on_disk}


@pytest.mark.slow
def test_a_workflow_on_a_bucket_translates_as_the_same_run_on_local_disk(s3, fr_en_runs):
    """The fr-en workflow with --data and --storage-path in the bucket, tracked by the team
    server of infra/mlflow (basic-auth; its artifacts in the same bucket), logged in with the
    user and password in the tracking URI; run as a command with its own Ray, in the background
    (`fr_en_runs`)."""
    assert fr_en_runs.bucket is not None  # (this test uses `s3`: the server ran before it)
    rc, out = fr_en_runs.bucket
    console = out + fr_en_runs.stderr
    assert rc == 0, console[-3000:]
    assert "outputs: s3://convs2s-test/nc-runs/fr-en" in out
    # (registered by alice)
    assert "models:/translation_fr_en-nc-5k_4750-end@champion (version 1)" in out

    keys = set(s3.keys("convs2s-test"))
    run = "nc-runs/fr-en/"
    for name in ("workflow.json", "preprocess_manifests.json", "train/best/meta.json",
                 "train/best/checkpoint.pt", "train/metrics.jsonl",
                 "weights/best/staged.json", "weights/best/model_00/checkpoint.pt",
                 "eval/best/nc-5k_4750-end.en"):
        assert run + name in keys, name
    stages = {json.loads(location(f"{BUCKET}/{k}").read_text())["stage"] for k in keys
              if k.startswith("nc-runs/preprocessed/") and k.endswith("/manifest.json")}
    assert {"clean/train", "encoded/train", "batches/train", "batches/valid"} <= stages
    assert not [k for k in keys if ".partial-" in k]  # committed stages leave no partials
    # The MLflow artifacts went through the server to the bucket: the hypotheses, the best
    # checkpoint and the logged model.
    artifacts = [k for k in keys if k.startswith("mlflow/")]
    assert any(k.endswith("hypotheses/nc-5k_4750-end.en") for k in artifacts)
    assert any(k.endswith("best_checkpoint/checkpoint.pt") for k in artifacts)
    assert any(k.endswith("/MLmodel") for k in artifacts)
    # nothing in the working folder: not even a folder named "s3:"
    assert list(fr_en_runs.cwd.iterdir()) == []
    # The password is in no console line and in no object the run wrote.
    assert SECRET not in console
    leaked = [k for k in keys if not k.endswith((".pt", ".parquet", ".arrow", "/"))
              and SECRET.encode() in location(f"{BUCKET}/{k}").read_bytes()]
    assert not leaked, leaked

    # The same settings on local disk: the same data, the same training, the same output.
    local_rc, local_out = fr_en_runs.local
    assert local_rc == 0, local_out
    local = fr_en_runs.local_runs / "fr-en"
    assert location(f"{BUCKET}/{run}eval/best/nc-5k_4750-end.en").read_text() == \
        (local / "eval" / "best" / "nc-5k_4750-end.en").read_text()
    bucket_state = json.loads(location(f"{BUCKET}/{run}workflow.json").read_text())
    local_state = json.loads((local / "workflow.json").read_text())
    assert bucket_state["eval"]["best/nc-5k_4750-end"]["metrics"]["bleu"] == \
        local_state["eval"]["best/nc-5k_4750-end"]["metrics"]["bleu"]


def test_a_local_tracking_store_keeps_a_bucket_runs_artifacts_in_the_bucket(s3, tmp_path):
    """sqlite tracking (the default) with a bucket storage path: the experiment is created
    with its artifacts under <storage>/mlartifacts/, so logged files are objects too."""
    from convs2s.tracking.runs import artifacts_beside, find_or_create_run, log_artifacts

    uri = mlflow_store(tmp_path)
    storage = f"{BUCKET}/local-store-runs"
    where = artifacts_beside(uri, "bucket_runs", storage)
    assert where == f"{storage}/mlartifacts/bucket_runs"
    run_id = find_or_create_run(uri, "bucket_runs", run_key=f"{storage}/demo", run_name="demo")
    (tmp_path / "notes.txt").write_text("hello")
    assert log_artifacts(uri, run_id, str(tmp_path / "notes.txt"), "notes")
    assert f"local-store-runs/mlartifacts/bucket_runs/{run_id}/artifacts/notes/notes.txt" in \
        s3.keys("convs2s-test", "local-store-runs/")


def _refused(argv: list[str], capsys) -> str:
    from workflows import translation

    with contextlib.redirect_stdout(io.StringIO()):
        rc = translation.main(translation.PRESETS, translation.__doc__, argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("flags, says", [
    (["--storage-path", "s3://convs2s-missing/runs"],
     "error: --storage-path s3://convs2s-missing/runs: the bucket s3://convs2s-missing does "
     "not exist"),
    (["--data", "hdfs://namenode/corpus"],
     "error: --data hdfs://namenode: no filesystem serves this URI here"),
])
def test_a_location_that_cannot_work_is_one_line_before_ray_starts(s3, flags, says, capsys,
                                                                   tmp_path):
    # (the last --storage-path given wins, as argparse reads flags)
    argv = ["--preset", "cpu", "--storage-path", f"{BUCKET}/runs",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", *flags]
    assert _refused(argv, capsys).startswith(says)


def test_a_bucket_without_credentials_is_one_line_naming_the_variables(s3, capsys, tmp_path,
                                                                       monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    err = _refused(["--preset", "smoke", "--storage-path", f"{BUCKET}/runs",
                    "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"], capsys)
    assert "no AWS credentials found; set AWS_ACCESS_KEY_ID" in err


def test_the_exchange_reads_a_bucket_once_a_spill_file_for_each_group_of_keys(s3, ray_session):
    """The batches stage's exchange with its spill folder in a bucket, its requests counted by
    the server (benchmarks.exchange): 4 blocks x 10 windows are 3 gather tasks of up to four
    windows, each reading every spill file once (the object's size, then one ranged GET):
    24 reads. Each window's task read every file's footer and record batch before (160)."""
    from benchmarks.exchange import blocks, one_round

    from benchmarks.s3_server import _json_stream

    run = one_round(s3, "convs2s-test", blocks(4000, 4, 10, seed=1), 10, "spec")
    assert run["read_requests"] == 24 and run["by_method"]["GET object"] == 12, run
    assert not any(k.endswith("list") for k in run["by_method"]), run  # (no listing either)
    # The recording, as moto writes it from several threads: an entry's line end may follow
    # another entry
    assert _json_stream('{"a": 1}{"b": 2}\n\n {"c": "x\\ny"}\n') == [{"a": 1}, {"b": 2},
                                                                      {"c": "x\ny"}]


def test_a_text_pair_in_a_bucket_is_read_by_a_task_per_block_as_on_local_disk(s3, tmp_path,
                                                                              monkeypatch):
    """Uncompressed text in a bucket is indexed (one pass over each object on the driver) and
    read by a task per block of lines, each seeking to its byte offsets in the objects: the
    same rows as one task reading the local files."""
    from preprocessing import reading
    from preprocessing.config import PreprocessConfig
    from preprocessing.reading import SplitDatasource
    from preprocessing.sources import resolve_split

    for lang, word in (("en", "cat"), ("fr", "chat")):
        (tmp_path / f"c.{lang}").write_bytes("".join(f"{word} {i} " + "x " * (i % 7) + "\r\n"
                                                     for i in range(40)).encode())
        location(f"{BUCKET}/text-pair/c.{lang}").upload(tmp_path / f"c.{lang}")

    def rows(source: str, index_bytes: int) -> tuple[int, list[dict]]:
        cfg = PreprocessConfig(task="t", source=source, splits={"train": "c[3:]"},
                               block_rows=6)
        monkeypatch.setattr(reading, "INDEX_BYTES", index_bytes)
        tasks = SplitDatasource(resolve_split(cfg, "train"), cfg).get_read_tasks(1)
        return len(tasks), [r for task in tasks for t in task() for r in t.to_pylist()]

    one, local = rows(str(tmp_path), 1 << 40)
    many, bucket = rows(f"{BUCKET}/text-pair", 0)
    assert (one, many) == (1, 7) and bucket == local and len(local) == 37


def test_a_stage_killed_mid_write_in_a_bucket_is_never_read_and_a_rerun_completes_it(s3):
    import pyarrow as pa

    from preprocessing.stages import (MANIFEST, part_paths, read_manifest, stage_output,
                                      write_manifest, write_part)

    stage = location(f"{BUCKET}/stages/batches/train")
    with pytest.raises(KeyboardInterrupt), stage_output(stage) as tmp:
        write_part(pa.table({"id": [1, 2]}), str(tmp), "part-000000.parquet")
        raise KeyboardInterrupt  # the writer is killed before its manifest
    assert read_manifest(stage) is None and part_paths(stage) == []
    assert not stage.parent.glob(".train.partial-*")  # its own leftovers removed on the way out
    # A leftover of a writer on this host that is gone (a dead pid) is removed by the next run.
    dead = stage.parent / ".train.partial-deadbeef0000"
    (dead / ".owner.json").write_text(json.dumps({"host": os.uname().nodename, "pid": 2**22}))
    (dead / "part-000000.parquet").write_bytes(b"half")
    with stage_output(stage) as tmp:
        write_part(pa.table({"id": [1, 2, 3]}), str(tmp), "part-000000.parquet")
        write_manifest(tmp, {"stage": "batches/train", "rows_kept": 3})
    assert read_manifest(stage)["rows_kept"] == 3 and len(part_paths(stage)) == 1
    assert stage.parent.glob(".train.partial-*") == []
    assert (stage / MANIFEST).is_file()


def test_training_refuses_bucket_data_whose_stage_has_no_manifest(s3, demo_batches, tmp_path):
    from convs2s.config import PRESETS, TrainConfig
    from convs2s.train.job import TrainJob
    from convs2s.train.launch import fit

    train = location(f"{BUCKET}/unfinished/batches/train")
    for part in sorted(Path(demo_batches.batches["train"]).glob("*.parquet")):
        (train / part.name).upload(part)  # the parts, but the writer died before the manifest
    job = TrainJob(model=PRESETS["tiny"](), train=TrainConfig(max_updates=1),
                   train_data=str(train), valid_data=demo_batches.batches["valid"],
                   spm_model=demo_batches.spm_model, vocab_size=demo_batches.vocab_size,
                   storage_path=f"{BUCKET}/unfinished/runs", run_name="never",
                   num_workers=1, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(FileNotFoundError, match=r"batches/train \(train split\) has no "
                                                r"manifest.json: the preprocessing stage"):
        fit(job)
    assert not location(f"{BUCKET}/unfinished/runs").exists()  # nothing started


def test_translate_reads_its_model_and_input_from_a_bucket_and_writes_its_output_there(
        s3, tiny_checkpoints, tmp_path):
    from convs2s.cli import translate as main
    from storage import publish_dir

    folder = location(f"{BUCKET}/models/a")
    publish_dir(tiny_checkpoints["a"], folder, marker="meta.json")
    src = location(f"{BUCKET}/text/in.en")
    src.write_text("The cat sleeps .\n\nA dog runs .\n")
    (tmp_path / "in.en").write_text(src.read_text())
    args = ["--beam", "3", "--max-len-a", "0", "--max-len-b", "4", "--threads", "1"]
    assert main(["--checkpoint", str(folder), "--input", str(src),
                 "--output", f"{BUCKET}/text/out.fr", *args]) == 0
    assert main(["--checkpoint", tiny_checkpoints["a"], "--input", str(tmp_path / "in.en"),
                 "--output", str(tmp_path / "out.fr"), *args]) == 0
    assert location(f"{BUCKET}/text/out.fr").read_text() == (tmp_path / "out.fr").read_text()
    assert [p.name for p in location(f"{BUCKET}/text").iterdir()] == ["in.en", "out.fr"]


def test_a_shortlist_and_a_dictionary_in_a_bucket_serve_as_local_files(s3, tmp_path):
    # `--set search.shortlist=s3://...` passes the workflow's check (the object exists): the
    # evaluation's translator and the logged model read the same objects.
    import numpy as np

    from convs2s.config import SearchConfig
    from convs2s.inference.shortlist import Shortlist, ShortlistError
    from convs2s.inference.unk_replace import load_dictionary
    from convs2s.serving.pyfunc import stage_artifacts

    table = np.array([[4, 5, -1], [6, -1, -1]] + [[-1] * 3] * 6, dtype=np.int32)
    np.savez(tmp_path / "shortlist.npz", table=table, target_order=np.arange(8),
             meta=np.array(json.dumps({"k": 3})))
    (tmp_path / "dict.txt").write_text("Haus house\nKatze cat\n")
    for name in ("shortlist.npz", "dict.txt"):
        location(f"{BUCKET}/search/{name}").upload(tmp_path / name)
    shortlist = Shortlist.load(f"{BUCKET}/search/shortlist.npz", vocab_size=8)
    assert shortlist.table.tolist() == table.tolist()
    assert load_dictionary(f"{BUCKET}/search/dict.txt") == {"Haus": "house", "Katze": "cat"}
    # (a file:// URI is its local file)
    assert load_dictionary(f"file://{tmp_path}/dict.txt") == {"Haus": "house", "Katze": "cat"}
    assert Shortlist.load(f"file://{tmp_path}/shortlist.npz").table.tolist() == table.tolist()
    with pytest.raises(ShortlistError, match="does not exist"):
        Shortlist.load(f"{BUCKET}/search/none.npz")
    search = SearchConfig(shortlist=f"{BUCKET}/search/shortlist.npz",
                          dictionary=f"{BUCKET}/search/dict.txt", replace_unk=True)
    out = tmp_path / "artifacts"
    out.mkdir()
    artifacts = stage_artifacts([], search, out, as_is=True)
    assert Path(artifacts["shortlist"]).read_bytes() == (tmp_path / "shortlist.npz").read_bytes()
    assert Path(artifacts["dictionary"]).read_text() == "Haus house\nKatze cat\n"


def test_a_spill_file_that_fails_while_written_to_a_bucket_leaves_no_object(s3, monkeypatch):
    # The batches stage's exchange files are whole or absent: closing an object's stream
    # stores what was written (the writer's footer too), so a file that fails halfway must
    # never reach the bucket, where a retried task's readers would take it as whole.
    import pyarrow as pa

    from preprocessing.exchange import read_spill, write_spill

    table = pa.table({"id": [4, 1, 9, 6], "k": [2, 0, 2, 1]})
    path = f"{BUCKET}/spill-spec/0.arrow"
    real = pa.ipc.new_stream
    made = []

    class FailsOnTheThirdKey:  # (one stream a key: keys 0, 1 and 2 hold rows)
        def __init__(self, *args, **kwargs):
            self.writer = real(*args, **kwargs)
            made.append(self)

        def write_batch(self, batch):
            if len(made) == 3:
                raise OSError("the task's node went away")
            self.writer.write_batch(batch)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.writer.__exit__(*exc)

    monkeypatch.setattr(pa.ipc, "new_stream", FailsOnTheThirdKey)
    with pytest.raises(OSError, match="went away"):
        write_spill(table, "k", 4, path)
    assert not location(path).exists()
    monkeypatch.undo()
    offsets = write_spill(table, "k", 4, path)
    assert read_spill([(path, offsets)], 2)["id"].to_pylist() == [4, 9]


@pytest.mark.slow
def test_the_lexical_table_counted_in_a_bucket_is_the_local_table_and_leaves_no_spill(
        s3, ray_session, tmp_path):
    # The shortlist stage's pair rows go through spill files in the stage's folder: in a
    # bucket when the data root is one. They are gone after, and the table is the local one.
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from preprocessing.lexical import TABLE_FILE, build_table
    from storage import filesystem_of

    parts = [([4, 5, 2], [10, 11, 2]), ([4, 6, 2], [10, 12, 2]), ([5, 5, 2], [11, 13, 2]),
             ([7, 2], [14, 2])]
    local, remote = tmp_path / "encoded", f"{BUCKET}/lexical-spec/encoded"
    local.mkdir()
    for i in (0, 1):
        rows = parts[2 * i:2 * i + 2]
        table = pa.table({"id": [2 * i, 2 * i + 1], "src": [s for s, _ in rows],
                          "tgt": [t for _, t in rows]})
        pq.write_table(table, local / f"part-{i:06d}.parquet")
        fs, key = filesystem_of(f"{remote}/part-{i:06d}.parquet")
        pq.write_table(table, key, filesystem=fs)
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"pretend sentencepiece bytes")
    (tmp_path / "out").mkdir()
    out = location(f"{BUCKET}/lexical-spec/shortlist")
    here = build_table(local, spm, 20, 2, 100, 4, tmp_path / "out")
    there = build_table(remote, spm, 20, 2, 100, 4, out)
    assert there == here and there["pair_rows"] == 10
    assert [p.name for p in out.iterdir()] == [TABLE_FILE]  # .pairs/ removed
    with np.load(tmp_path / "out" / TABLE_FILE) as a, np.load(io.BytesIO(
            (out / TABLE_FILE).read_bytes())) as b:
        assert (a["table"] == b["table"]).all() and a["table"][4].tolist() == [10, 12]


def test_a_checkpoint_file_in_a_bucket_is_averaged_with_its_folders_text_pipeline(
        s3, tiny_checkpoints, tmp_path):
    from convs2s.io.averaging import average_checkpoints
    from storage import publish_dir

    folder = location(f"{BUCKET}/models/avg-a")
    publish_dir(tiny_checkpoints["a"], folder, marker="meta.json")
    out = average_checkpoints([f"{folder}/checkpoint.pt"], tmp_path / "avg")
    assert (out / "checkpoint.pt").is_file() and (out / "sentencepiece.model").is_file()


def test_a_checkpoint_file_in_a_bucket_is_checked_and_translates_as_its_folder(
        s3, tiny_checkpoints):
    """`s3://…/CKPT/checkpoint.pt` is fetched with its folder: it translates with the folder's
    sentencepiece model, as the local folder does, and a folder whose sentencepiece model was
    cut short is refused as the folder itself is."""
    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference
    from convs2s.io.checkpoint import CheckpointError
    from storage import publish_dir

    search, lines = SearchConfig(beam=2, max_len_a=0, max_len_b=3), ["The cat sleeps ."]
    folder = location(f"{BUCKET}/models/file-a")
    publish_dir(tiny_checkpoints["a"], folder, marker="meta.json")
    assert load_for_inference([f"{folder}/checkpoint.pt"], search).translate(lines) == \
        load_for_inference([tiny_checkpoints["a"]], search).translate(lines)
    half = location(f"{BUCKET}/models/file-half")
    publish_dir(tiny_checkpoints["a"], half, marker="meta.json")
    (half / "sentencepiece.model").write_bytes((half / "sentencepiece.model").read_bytes()[:1000])
    for given in (str(half), f"{half}/checkpoint.pt"):
        with pytest.raises(CheckpointError, match="is not a whole checkpoint"):
            load_for_inference([given], search)


def test_export_to_and_import_from_a_bucket_round_trip_the_weights(s3, tmp_path):
    import torch

    from convs2s.io.checkpoint import load_model
    from convs2s.io.fairseq import WRITTEN_BY, export_fairseq, import_fairseq

    fixture = Path(__file__).resolve().parent / "fixtures" / "fairseq" / "iwslt"
    imported = import_fairseq(fixture, tmp_path / "imported")
    archive = location(f"{BUCKET}/interop/archive")
    export_fairseq(imported, archive)  # published with its WRITTEN_BY object last
    assert (archive / WRITTEN_BY).is_file() and (archive / "model.pt").is_file()
    again = import_fairseq(archive, f"{BUCKET}/interop/again")
    first, _ = load_model(imported)
    second, _ = load_model(again)  # read back from the bucket
    for (k, a), (k2, b) in zip(first.state_dict().items(), second.state_dict().items(),
                               strict=True):
        assert k == k2 and torch.equal(a, b), k
    someone_elses = location(f"{BUCKET}/interop/theirs")
    (someone_elses / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="was not written by import-fairseq"):
        export_fairseq(imported, someone_elses)
    assert [p.name for p in someone_elses.iterdir()] == ["notes.txt"]
    # the export's own prefix: replaced by the export alone, and only while it holds
    # nothing but the objects it wrote
    with pytest.raises(FileExistsError, match="was written by export-fairseq, not import-"):
        import_fairseq(fixture, archive)
    (archive / "eval" / "bleu.json").write_text("{}")
    with pytest.raises(FileExistsError, match=r"holds files export-fairseq did not write "
                                              r"\(eval/bleu.json\)"):
        export_fairseq(imported, archive)
    assert (archive / "eval" / "bleu.json").read_text() == "{}"
    assert (archive / WRITTEN_BY).is_file() and (archive / "model.pt").is_file()


def test_fine_tuning_starts_from_a_checkpoint_in_a_bucket(s3, tmp_path):
    """--init-from s3://…: the run takes the checkpoint's architecture and its text pipeline
    exactly as from the same folder on local disk (the workers load it from their node's
    copy, storage.local_copy)."""
    from convs2s.io.fairseq import import_fairseq
    from convs2s.io.text_codec import CheckpointVocabulary
    from storage import publish_dir
    from workflows import multi30k_en_de
    from workflows.run_spec import resolve
    from workflows.workflow_config import RunOptions

    fixture = Path(__file__).resolve().parent / "fixtures" / "fairseq" / "iwslt"
    local = import_fairseq(fixture, tmp_path / "iwslt")
    remote = f"{BUCKET}/init/iwslt"
    publish_dir(local, remote, marker="meta.json")
    from_bucket = resolve(multi30k_en_de.cpu(), RunOptions(preset="cpu", init_from=remote))
    from_disk = resolve(multi30k_en_de.cpu(), RunOptions(preset="cpu", init_from=str(local)))
    assert from_bucket.init_from == remote and from_bucket.model == from_disk.model
    assert CheckpointVocabulary(remote).fingerprint == CheckpointVocabulary(local).fingerprint
