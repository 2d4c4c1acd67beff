"""A large corpus translated on Ray (`convs2s.serving.corpus`, `python -m convs2s translate
--actors N`): parts in input order, line for line with the input and with one process's
translation; failures counted by reason; a killed job resumes without losing or repeating a
line; bad input is one error line and nothing half-written.

    .venv/bin/python -m pytest tests/test_corpus.py -q
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from convs2s.config import SearchConfig
from conftest import kill_when, sigterm_once
from convs2s.serving.corpus import CorpusError, CorpusJob, translate_corpus

REPO = Path(__file__).resolve().parents[1]
# A random tiny model writes to its length limit: short outputs keep these tests fast
SEARCH = SearchConfig(beam=2, max_len_a=0, max_len_b=12)


def corpus_lines(pairs, n: int) -> list[str]:
    lines = [s for s, _ in pairs[:n]]
    lines[3] = ""  # an empty line: an empty translation
    lines[7] = "   "  # blank once normalized
    return lines


def one_process(checkpoint: str, lines: list[str]) -> list[str]:
    """What `translate` without --actors gives: one Translator, all lines at once."""
    from convs2s.inference.translate import load_for_inference

    return load_for_inference([checkpoint], SEARCH, "cpu").translate(lines)


def parts_text(out: Path) -> list[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    text = "".join((out / name).read_text() for name in manifest["parts"])
    return text.split("\n")[:-1]


def test_a_corpus_job_translates_line_for_line_in_input_order(tiny_checkpoints, ray_session,
                                                              tmp_path):
    lines = corpus_lines(tiny_checkpoints["pairs"], 230)
    lines[20] = " ".join(["the cat"] * 300)  # over the model's 256 positions: cut, counted
    raw = [x.encode() for x in lines]
    raw[11] = b"caf\xe9 au lait"  # Latin-1, not UTF-8: kept as an empty line, counted
    src = tmp_path / "mono.en.gz"
    src.write_bytes(gzip.compress(b"\n".join(raw) + b"\n"))
    out = tmp_path / "out"
    job = CorpusJob([tiny_checkpoints["a"]], str(src), str(out), search=SEARCH, actors=2,
                    shard_lines=50, progress=False)
    manifest = translate_corpus(job)

    expected = one_process(tiny_checkpoints["a"], lines[:11] + [""] + lines[12:])
    assert parts_text(out) == expected  # the same translations, in input order
    # and those of `translate` without --actors, the line that is not UTF-8 included (an empty
    # line either way)
    from convs2s.cli import translate

    assert translate(["--checkpoint", tiny_checkpoints["a"], "--beam", "2", "--max-len-a", "0",
                      "--max-len-b", "12", "--input", str(src), "--output",
                      str(tmp_path / "one.de")]) == 0
    assert (tmp_path / "one.de").read_text().split("\n")[:-1] == expected
    assert manifest["lines_in"] == manifest["lines_out"] == 230
    assert manifest["parts"] == [f"part-{i:05d}.txt" for i in range(5)]
    assert manifest["failures"]["empty"] == 2
    assert manifest["failures"]["non_utf8"] == {"count": 1, "lines": [12]}
    assert manifest["failures"]["truncated"] == {"count": 1, "lines": [21]}
    assert manifest["parts_translated_now"] == 5 and manifest["sentences_per_s"] > 0
    assert manifest["precision"] == {SEARCH.precision: 5}  # each part says what made it
    assert manifest["device"] == {"cpu": 5}  # and where
    # Complete: the same command again translates nothing and returns the same manifest
    assert translate_corpus(job) == manifest


def test_a_corpus_job_reads_a_parquet_column_and_writes_nbest(tiny_checkpoints, ray_session,
                                                             tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = [s for s, _ in tiny_checkpoints["pairs"][:40]]
    pq.write_table(pa.table({"id": list(range(40)), "text": lines[:5] + [None] + lines[6:]}),
                   tmp_path / "mono.parquet")
    search = SEARCH.replace(nbest=2)
    manifest = translate_corpus(CorpusJob(
        [tiny_checkpoints["a"]], str(tmp_path / "mono.parquet"), str(tmp_path / "out"),
        search=search, actors=1, shard_lines=16, progress=False))
    assert manifest["lines_in"] == 40 and manifest["lines_out"] == 80
    assert manifest["failures"]["empty"] == 1  # the null
    got = parts_text(tmp_path / "out")
    from convs2s.inference.translate import load_for_inference

    full = load_for_inference([tiny_checkpoints["a"]], search, "cpu").translate_full(
        lines[:5] + [""] + lines[6:])
    assert got == [h for tr in full for h in
                   ([x.text for x in tr.hypotheses] or ["", ""])]


KILLED = [sys.executable, "-m", "convs2s", "translate", "--beam", "2", "--max-len-b", "12",
          "--actors", "2", "--shard-lines", "40", "--no-progress"]


def _wait_until_the_jobs_translators_end(driver_pid: int, timeout_s: float = 60) -> None:
    """Ray ends a dead driver's actors on its own, a moment after the driver: until then one of
    its translators (Ray Data's map workers) may still commit a part, and this test counts the
    parts there are before the rerun. (Ray Data's own singletons, its stats actor and the
    like, outlive the job: they are not looked at.)"""
    import time

    from ray.util.state import list_actors, list_jobs

    (job,) = [j for j in list_jobs() if j.driver_info and j.driver_info.pid == str(driver_pid)]
    deadline = time.monotonic() + timeout_s
    while [a for a in list_actors(filters=[("job_id", "=", job.job_id), ("state", "=", "ALIVE")])
           if "MapWorker" in a.class_name]:
        assert time.monotonic() < deadline, f"its translators outlived the job {timeout_s} s"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_killed_corpus_job_resumes_without_losing_or_repeating_a_line(
        tiny_checkpoints, ray_session, tmp_path):
    lines = corpus_lines(tiny_checkpoints["pairs"], 800)
    (tmp_path / "mono.en").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    proc = subprocess.Popen(KILLED + ["--checkpoint", tiny_checkpoints["a"], "--input",
                                      str(tmp_path / "mono.en"), "--output", str(out)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    # SIGKILL the job once its first part is done
    kill_when(proc, lambda: list(out.glob("part-*.json")), "no part was ever written")
    _wait_until_the_jobs_translators_end(proc.pid)
    done_before = {p.name for p in out.glob("part-*.json")}
    assert not (out / "manifest.json").exists() and len(done_before) < 20
    mtimes = {n: (out / n).stat().st_mtime_ns for n in done_before}
    # what a kill in the middle of a write leaves (a write is flushed to the disk before its
    # rename: the kill can land there), beside the parts and the source's parts
    (out / ".part-00019.json.tmp-0123abcd").write_text('{"lines": 4')
    (out / "source" / ".part-00002.txt.tmp-0123abcd").write_text("half a")

    manifest = translate_corpus(CorpusJob(  # the same job again, in this process
        [tiny_checkpoints["a"]], str(tmp_path / "mono.en"), str(out), search=SEARCH, actors=2,
        shard_lines=40, progress=False))
    assert parts_text(out) == one_process(tiny_checkpoints["a"], lines)  # none lost or repeated
    assert manifest["lines_in"] == manifest["lines_out"] == 800
    assert manifest["parts_translated_now"] == 20 - len(done_before)
    assert all((out / n).stat().st_mtime_ns == t for n, t in mtimes.items())  # not redone
    assert not list(out.glob(".*.tmp-*")) and not list(out.glob("source/.*.tmp-*"))  # removed


def test_an_input_cut_short_leaves_no_job_and_its_mended_file_is_translated(
        tiny_checkpoints, ray_session, tmp_path):
    """A .gz cut short fails as its parts are cut, after the folder was made the job's: the
    rerun on the whole file was refused as another job's folder, with nothing translated. A
    finished folder whose source parts were deleted is complete without reading the input."""
    from convs2s.serving.inputs import InputError

    lines = corpus_lines(tiny_checkpoints["pairs"], 120)
    whole = gzip.compress(("\n".join(lines) + "\n").encode() * 40)  # 4,800 lines
    src, out = tmp_path / "mono.en.gz", tmp_path / "out"
    src.write_bytes(whole[:len(whole) // 2])
    job = CorpusJob([tiny_checkpoints["a"]], str(src), str(out), search=SEARCH, actors=1,
                    shard_lines=2400, progress=False)
    with pytest.raises(InputError, match="not a whole gzip file"):
        translate_corpus(job)
    assert not (out / "job.json").exists() and not (out / "source").exists()
    src.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))  # mended
    job = CorpusJob([tiny_checkpoints["a"]], str(src), str(out), search=SEARCH, actors=1,
                    shard_lines=60, progress=False)
    assert translate_corpus(job)["lines_out"] == 120
    import shutil

    shutil.rmtree(out / "source")  # the input's copy, cut into parts: not needed once complete
    assert translate_corpus(job)["lines_out"] == 120 and not (out / "source").exists()


def test_an_actor_refuses_a_checkpoint_replaced_since_the_job_began(tiny_checkpoints,
                                                                     tmp_path):
    """An actor that starts late (a node the autoscaler adds) or again (a process death)
    loaded whatever the checkpoint's path held then: a best/ republished by a training run
    during the job translated its parts with another model than the job records."""
    import shutil

    from convs2s.serving.corpus import ShardTranslator, _file_stamps, _identity

    ckpt = tmp_path / "best"
    shutil.copytree(tiny_checkpoints["a"], ckpt)
    (tmp_path / "mono.en").write_text("a\n")
    job = CorpusJob([str(ckpt)], str(tmp_path / "mono.en"), str(tmp_path / "out"),
                    search=SEARCH, actors=1)
    kw = dict(checkpoints=[str(ckpt)], search=SEARCH.to_dict(), device="cpu", threads=1,
              spm_model=None, output=str(tmp_path / "out"), nbest=1,
              stamps=_file_stamps(job, _identity(job)))
    ShardTranslator(**kw)  # the job's version: loads
    weights = ckpt / "checkpoint.pt"
    os.utime(weights, (weights.stat().st_atime, weights.stat().st_mtime + 60))  # republished
    with pytest.raises(CorpusError, match=r"checkpoint.pt changed since the job began \(another "
                                          r"version at its path\): its parts would mix models"):
        ShardTranslator(**kw)


def test_a_checkpoint_replaced_while_the_input_is_split_is_refused_before_the_actors(
        tiny_checkpoints, tmp_path, monkeypatch):
    """The actors check the files against the version job.json records, not one read again
    when the pool starts: a best/ republished while the input was split (minutes for a large
    .gz) was loaded by every actor while job.json and the manifest named the old one."""
    import shutil

    import convs2s.serving.corpus as corpus

    ckpt = tmp_path / "best"
    shutil.copytree(tiny_checkpoints["a"], ckpt)
    (tmp_path / "mono.en").write_text("ein Haus\nzwei Hunde\n")
    split = corpus.split_input

    def split_then_republish(job, out):
        source = split(job, out)
        shutil.copy(Path(tiny_checkpoints["b"]) / "checkpoint.pt", ckpt / "checkpoint.pt")
        return source

    monkeypatch.setattr(corpus, "split_input", split_then_republish)
    monkeypatch.setattr(corpus, "start_ray", lambda: pytest.fail("the pool started"))
    job = CorpusJob([str(ckpt)], str(tmp_path / "mono.en"), str(tmp_path / "out"),
                    search=SEARCH, actors=1)
    with pytest.raises(CorpusError, match="checkpoint.pt changed since the job began"):
        translate_corpus(job)


def test_sigterm_stops_a_corpus_job_as_ctrl_c_and_the_rerun_finishes_it(
        tiny_checkpoints, ray_session, tmp_path, capsys):
    """SIGTERM (`ray job stop`, a machine's shutdown) once a part is done: exit 130 and the line
    that resumes, no traceback (Ray's own handler exited mid-job, and the process then ended in
    an abort), the caller's handler back after; the same command then translates the rest."""
    import signal
    import time

    from convs2s.cli import main

    lines = corpus_lines(tiny_checkpoints["pairs"], 800)
    (tmp_path / "mono.en").write_text("\n".join(lines) + "\n")
    out, before = tmp_path / "out", signal.getsignal(signal.SIGTERM)
    argv = KILLED[4:] + ["--checkpoint", tiny_checkpoints["a"], "--input",
                         str(tmp_path / "mono.en"), "--output", str(out)]
    with sigterm_once(lambda: list(out.glob("part-*.json"))) as sent:  # once a part is done
        rc = main(["translate", *argv])
    err = capsys.readouterr().err
    assert sent and rc == 130, err[-2000:]
    assert f"interrupted: the finished parts are kept in {out}; the same command translates " \
        "the rest" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) is before
    assert not (out / "manifest.json").exists()
    # the stopped job's translators end with it (in this process too: they held the CPUs the
    # rerun's pool waits for)
    deadline = time.monotonic() + 30
    while left := _translators():
        assert time.monotonic() < deadline, f"translators {left} outlived the stopped job"
        time.sleep(0.2)
    assert main(["translate", *argv]) == 0
    assert parts_text(out) == one_process(tiny_checkpoints["a"], lines)  # none lost or repeated


def test_sigterm_while_the_input_is_cut_into_parts_is_ctrl_c_too(tiny_checkpoints, ray_session,
                                                                  tmp_path, capsys):
    """Before the translators start (the model's load, the input cut into parts: minutes for
    a large corpus) a SIGTERM killed the command with its default action: no line, exit 143,
    its temporary files left. Now the same one line and exit 130 as later."""
    from convs2s.cli import main

    lines = corpus_lines(tiny_checkpoints["pairs"], 800) * 250  # 200,000 lines to cut
    (tmp_path / "mono.en").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = [*KILLED[4:6], "--actors", "1", "--shard-lines", "100", "--no-progress",
            "--checkpoint", tiny_checkpoints["a"], "--input", str(tmp_path / "mono.en"),
            "--output", str(out)]
    with sigterm_once(lambda: len(list((out / "source").glob("part-*.txt"))) > 5) as sent:
        rc = main(["translate", *argv])
    err = capsys.readouterr().err
    assert sent and rc == 130, err[-2000:]
    assert f"interrupted: the finished parts are kept in {out}" in err and "Traceback" not in err
    assert not (out / "source" / "manifest.json").exists() and not list(out.glob("part-*"))


def _translators() -> list[int]:
    """The pids of this machine's corpus-job translators (Ray Data's map actors)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0]
        except (OSError, ValueError):
            continue
        if title.startswith(b"ray::MapWorker(MapBatches(ShardTranslator))"):
            pids.append(int(proc.name))
    return pids


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "convs2s", "translate", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_bad_corpus_inputs_are_one_error_line_and_write_nothing(tiny_checkpoints, tmp_path):
    ck = tiny_checkpoints["a"]
    (tmp_path / "empty.en").write_text("")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    (tmp_path / "a.en").write_text("one\n")
    (tmp_path / "text.parquet").write_text("one\n")  # (no parquet: refused before job.json)
    cases = [
        (["--input", str(tmp_path / "missing.en")], "missing.en does not exist"),
        (["--input", str(tmp_path / "text.parquet")], "is not a readable parquet file"),
        (["--input", str(tmp_path / "empty.en")], "empty.en is empty"),
        (["--input", str(tmp_path / "a.en"), "--output", str(tmp_path / "other")],
         "holds files this command did not write"),
        (["--input", str(tmp_path / "a.en"), "--output", str(tmp_path / "a.en")], "is a file"),
    ]
    for extra, message in cases:
        args = ["--checkpoint", ck, "--actors", "2", "--output", str(tmp_path / "out"), *extra]
        proc = run_cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    proc = run_cli("--checkpoint", str(tmp_path / "nope"), "--actors", "2", "--input",
                   str(tmp_path / "a.en"), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2 and "nope does not exist" in proc.stderr
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    # a folder holding only a job.json a kill cut before its rename is this command's
    from convs2s.serving.corpus import check_job

    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / ".job.json.tmp-0f3a9b2c").write_text('{"inp')
    check_job(CorpusJob([ck], str(tmp_path / "a.en"), str(tmp_path / "cut")))
    # and so is one holding the empty probe of a write check whose delete failed (a timeout)
    (tmp_path / "probed").mkdir()
    (tmp_path / "probed" / ".convs2s-write-probe-0123456789ab").write_bytes(b"")
    check_job(CorpusJob([ck], str(tmp_path / "a.en"), str(tmp_path / "probed")))


def test_a_rerun_with_other_settings_is_refused(tiny_checkpoints, ray_session, tmp_path,
                                                monkeypatch):
    (tmp_path / "a.en").write_text("one two\nthree\n")
    job = CorpusJob([tiny_checkpoints["a"]], str(tmp_path / "a.en"), str(tmp_path / "out"),
                    search=SEARCH, actors=1, progress=False)
    translate_corpus(job)
    with pytest.raises(CorpusError, match=r"another job \(changed: search\)"):
        translate_corpus(CorpusJob(job.checkpoints, job.input, job.output,
                                   search=SEARCH.replace(beam=3), progress=False))
    # smaller batches (the fix for a part that ran out of memory) are the same job: each part
    # records its own, and the manifest says when parts differ (it was refused as another
    # job, the whole corpus to translate again)
    smaller = SEARCH.replace(max_sentences=1, max_tokens=64)
    for part in (tmp_path / "out").glob("part-*"):
        part.unlink()  # (as if they had failed)
    manifest = translate_corpus(CorpusJob(job.checkpoints, job.input, job.output,
                                          search=smaller, actors=1, progress=False))
    assert manifest["batches"] == {'{"max_sentences": 1, "max_tokens": 64}': 1}
    # the same files named another way (relative, the checkpoint's checkpoint.pt): the same
    # job, complete (it was refused as another)
    monkeypatch.chdir(tmp_path)
    same = translate_corpus(CorpusJob([str(Path(job.checkpoints[0]) / "checkpoint.pt")], "a.en",
                                      "out", search=smaller, actors=1, progress=False))
    assert same == manifest
    (tmp_path / "a.en").write_text("one two\nthree\nfour\n")
    with pytest.raises(CorpusError, match=r"changed: input_stamp"):
        translate_corpus(job)


def test_a_damaged_record_is_made_again_or_named(tiny_checkpoints, ray_session, tmp_path):
    """A record cut short (a disk that filled, a node that lost power before the rename
    reached the disk): the source's and the job's manifests are made again from what the job
    checks, the job's identity (job.json) is named with the way out; each was a
    JSONDecodeError naming no file, on every rerun."""
    out = tmp_path / "out"
    (tmp_path / "a.en").write_text("one two\nthree\n")
    job = CorpusJob([tiny_checkpoints["a"]], str(tmp_path / "a.en"), str(out),
                    search=SEARCH, actors=1, progress=False)
    first = translate_corpus(job)
    parts = {name: (out / name).read_text() for name in first["parts"]}
    (out / "manifest.json").write_text("")
    (out / "source" / "manifest.json").write_text('{"shards": [')
    again = translate_corpus(job)  # the parts stand: nothing translated again
    assert again["lines_in"] == first["lines_in"] == 2 and again["parts_translated_now"] == 0
    assert json.loads((out / "manifest.json").read_text())["lines_in"] == 2
    assert {name: (out / name).read_text() for name in again["parts"]} == parts
    (out / "job.json").write_text("[]")
    with pytest.raises(CorpusError, match=rf"{out / 'job.json'} is damaged \(no JSON object\): "
                                          rf"delete the folder {out} to start over"):
        translate_corpus(job)


def test_a_checkpoint_given_by_its_file_is_checked_stamped_and_translated_as_its_folder(
        tiny_checkpoints, ray_session, tmp_path):
    """`--checkpoint RUN/best/checkpoint.pt` loads as RUN/best does (load_for_inference), so
    the corpus job's checks and job.json name that very file, not .../checkpoint.pt/checkpoint.pt
    (which refused the job as a checkpoint that does not exist)."""
    from convs2s.serving.corpus import check_job

    lines = [s for s, _ in tiny_checkpoints["pairs"][:4]]
    (tmp_path / "a.en").write_text("\n".join(lines) + "\n")
    weights = Path(tiny_checkpoints["a"]) / "checkpoint.pt"
    job = CorpusJob([str(weights)], str(tmp_path / "a.en"), str(tmp_path / "out"),
                    search=SEARCH, actors=1, progress=False)
    check_job(job)
    translate_corpus(job)
    assert parts_text(tmp_path / "out") == one_process(tiny_checkpoints["a"], lines)
    recorded = json.loads((tmp_path / "out" / "job.json").read_text())["checkpoints"]
    assert recorded == [{"path": str(weights),
                         "stamp": [weights.stat().st_size, weights.stat().st_mtime_ns]}]
    # a file that is not there is still refused before Ray, in one line
    with pytest.raises(CorpusError, match="checkpoint.pt does not exist"):
        check_job(CorpusJob([str(tmp_path / "gone" / "checkpoint.pt")], job.input,
                            str(tmp_path / "out2")))


def test_a_bucket_checkpoint_given_by_its_file_passes_the_corpus_checks(s3, tiny_checkpoints,
                                                                       tmp_path):
    from convs2s.serving.corpus import check_job
    from storage import location, publish_dir

    bucket = "s3://convs2s-test/corpus-ckfile"
    publish_dir(tiny_checkpoints["a"], location(f"{bucket}/model"), marker="meta.json")
    (tmp_path / "a.en").write_text("one\n")
    for given in (f"{bucket}/model", f"{bucket}/model/checkpoint.pt"):
        check_job(CorpusJob([given], str(tmp_path / "a.en"), str(tmp_path / "out")))
    with pytest.raises(CorpusError, match="does not exist"):
        check_job(CorpusJob([f"{bucket}/nope/checkpoint.pt"], str(tmp_path / "a.en"),
                            str(tmp_path / "out")))


def test_an_output_written_before_file_stamps_were_recorded_still_resumes(
        tiny_checkpoints, ray_session, tmp_path):
    # job.json records the version of the sentencepiece model (shortlist, dictionary) it read;
    # an output from before those stamps resumes as it did then; a regenerated model is refused
    (tmp_path / "a.en").write_text("one two\nthree\n")
    spm = tmp_path / "spm.model"
    spm.write_bytes(Path(tiny_checkpoints["spm"]).read_bytes())
    job = CorpusJob([tiny_checkpoints["a"]], str(tmp_path / "a.en"), str(tmp_path / "out"),
                    search=SEARCH, actors=1, spm_model=str(spm), progress=False)
    manifest = translate_corpus(job)
    record = json.loads((tmp_path / "out" / "job.json").read_text())
    assert "spm_model_stamp" in record
    del record["spm_model_stamp"]
    (tmp_path / "out" / "job.json").write_text(json.dumps(record))
    assert translate_corpus(job) == manifest  # complete already: nothing translated again
    record["spm_model_stamp"] = [1, 1]  # as written by another version of the model
    (tmp_path / "out" / "job.json").write_text(json.dumps(record))
    with pytest.raises(CorpusError, match=r"changed: spm_model_stamp\)"):
        translate_corpus(job)


def test_a_corpus_job_reads_and_writes_a_bucket(s3, tiny_checkpoints, ray_session,
                                                monkeypatch):
    """In a bucket, and without a request of the driver's per part: its parts are checked in
    one listing (a corpus of 5,000 parts asked 70,000 requests one after another, 5 a part
    before any actor started and 9 for the manifest); a rerun reads each record once."""
    from storage import ObjectPath, location, publish_dir

    bucket = "s3://convs2s-test/corpus"
    publish_dir(tiny_checkpoints["a"], location(f"{bucket}/model"), marker="meta.json")
    lines = [s for s, _ in tiny_checkpoints["pairs"][:60]]
    location(f"{bucket}/mono.en").write_text("\n".join(lines) + "\n")
    asked = []  # (request, object) of the driver's requests on the parts
    for name in ("info", "read_bytes"):
        def counted(self, *a, _name=name, _real=getattr(ObjectPath, name), **kw):
            if self.name.startswith("part-") and self.parent.name == "out":
                asked.append((_name, self.name))
            return _real(self, *a, **kw)
        monkeypatch.setattr(ObjectPath, name, counted)
    job = CorpusJob([f"{bucket}/model"], f"{bucket}/mono.en", f"{bucket}/out", search=SEARCH,
                    actors=2, shard_lines=25, progress=False)
    manifest = translate_corpus(job)
    assert asked == []  # the actors' records came back with their rows
    assert translate_corpus(job) == manifest  # complete: each record read once, nothing more
    assert sorted(asked) == [("read_bytes", f"part-0000{i}.json") for i in range(3)]
    out = location(f"{bucket}/out")
    text = "".join((out / name).read_text() for name in manifest["parts"])
    assert text.split("\n")[:-1] == one_process(tiny_checkpoints["a"], lines)
    assert sorted(p.name for p in out.iterdir()) == [
        "job.json", "manifest.json", "part-00000.json", "part-00000.txt", "part-00001.json",
        "part-00001.txt", "part-00002.json", "part-00002.txt", "source"]


@pytest.mark.gpu
def test_a_corpus_job_on_gpu_actors_translates_as_the_cpu_does(tiny_checkpoints, ray_session,
                                                               tmp_path):
    """Two actors sharing one GPU (--gpus-per-actor 0.5): every part done, empty lines kept,
    (near-)identical translations (a random model's near-ties may flip under other kernels)."""
    lines = corpus_lines(tiny_checkpoints["pairs"], 120)
    (tmp_path / "mono.en").write_text("\n".join(lines) + "\n")
    manifest = translate_corpus(CorpusJob(
        [tiny_checkpoints["a"]], str(tmp_path / "mono.en"), str(tmp_path / "out"),
        search=SEARCH, actors=2, gpus_per_actor=0.5, shard_lines=40, progress=False))
    assert manifest["lines_in"] == manifest["lines_out"] == 120
    got, cpu = parts_text(tmp_path / "out"), one_process(tiny_checkpoints["a"], lines)
    assert got[3] == "" and sum(a == b for a, b in zip(got, cpu)) >= 0.8 * len(lines)


def test_a_folder_another_job_holds_is_refused_before_any_work(tiny_checkpoints, tmp_path):
    from storage.lease import LeaseHeld, RunLease

    (tmp_path / "a.en").write_text("one two\n")
    out = tmp_path / "out"
    with RunLease(out, command="translate (another job)"):
        with pytest.raises(LeaseHeld, match=r"translate \(another job\).*give another --output"):
            translate_corpus(CorpusJob([tiny_checkpoints["a"]], str(tmp_path / "a.en"),
                                       str(out), search=SEARCH, progress=False))
    assert not out.exists()  # nothing written; the lease is gone, and the folder it made


def test_a_part_that_fails_is_returned_as_failed_and_the_actors_other_parts_are_written(
        tiny_checkpoints, tmp_path):
    """A translator actor (here built in this process, without Ray) given three parts, the
    middle one's source shard damaged: the other two are translated and recorded, the damaged
    one comes back failed with its error in one line and nothing of it written (Ray Data
    would end the whole job at the first part that raised)."""
    from convs2s.serving.corpus import ShardTranslator

    out = tmp_path / "out"
    lines = corpus_lines(tiny_checkpoints["pairs"], 30)
    for i in range(3):
        (out / "source").mkdir(parents=True, exist_ok=True)
        (out / "source" / f"part-{i:05d}.txt").write_text(
            "".join(f"{x}\n" for x in lines[10 * i:10 * i + 10]))
    (out / "source" / "part-00001.txt").write_bytes(b"caf\xe9\n" * 10)  # not UTF-8
    actor = ShardTranslator([tiny_checkpoints["a"]], SEARCH.to_dict(), "cpu", 1, None,
                            str(out), nbest=1)
    rows = actor({"index": [0, 1, 2]})
    assert rows["index"] == [0, 1, 2] and rows["lines"] == [10, 0, 10]
    assert rows["error"][0] == rows["error"][2] == ""
    assert rows["error"][1].startswith("UnicodeDecodeError: 'utf-8' codec can't decode byte "
                                       "0xe9") and "\n" not in rows["error"][1]
    assert rows["record"][1] == ""
    for i in (0, 2):
        assert json.loads(rows["record"][i]) == json.loads(
            (out / f"part-{i:05d}.json").read_text())
    assert not (out / "part-00001.txt").exists() and not (out / "part-00001.json").exists()
    expected = one_process(tiny_checkpoints["a"], lines)
    assert (out / "part-00002.txt").read_text().split("\n")[:-1] == expected[20:]


def test_a_failing_translator_is_one_error_line_and_the_finished_parts_are_kept(
        tiny_checkpoints, ray_session, tmp_path):
    """An error inside a translator actor (here a source shard damaged on disk after the split,
    its bytes no longer UTF-8) fails that part only, and so does a part whose actor's process
    dies on it each time (the out-of-memory killer, a crash in native code: here the test
    hook's os._exit; Ray Data retried such a part without end, and the job hung): the job
    translates every other part, then says in one line which parts failed and why, exit 2, no
    traceback; the finished parts are kept, and the same command resumes once the cause is
    mended."""
    from convs2s.cli import main
    from convs2s.serving.corpus import DIE_ON_PART_ENV

    lines = corpus_lines(tiny_checkpoints["pairs"], 160)
    (tmp_path / "mono.en").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = KILLED[4:] + ["--checkpoint", tiny_checkpoints["a"], "--input",
                         str(tmp_path / "mono.en"), "--output", str(out)]
    assert main(["translate", *argv]) == 0
    shard = out / "source" / "part-00003.txt"
    good = shard.read_bytes()
    for name in ("manifest.json", *(f"part-0000{i}.{x}" for i in (1, 2, 3) for x in ("json",
                                                                                 "txt"))):
        (out / name).unlink()
    shard.write_bytes(b"caf\xe9\n" * 40)  # a byte the split never writes: not UTF-8
    # The failing run as a command of its own on the session's Ray (a process that goes on,
    # as this one, would hold the failed job until a garbage collection; pytest keeps Ray
    # Data's log records of the error, which hold it, for the whole test)
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
           DIE_ON_PART_ENV: "1"}
    proc = subprocess.Popen([*KILLED[:4], *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    _wait_until_the_jobs_translators_end(proc.pid)
    assert proc.returncode == 2, err[-3000:]
    (line,) = [x for x in err.splitlines() if "convs2s-translate: error:" in x]
    assert "a translator failed on 2 of 3 part(s) (part-00001.txt: its translator's process " \
        "died on it 3 times (killed by the out-of-memory killer, or a crash in native code: " \
        "see Ray's logs); also part-00003.txt)" in line and \
        f"the finished parts are kept in {out}: the same command translates the rest" in line, \
        err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # the part between the failed ones was translated all the same
    assert (out / "part-00000.json").is_file() and (out / "part-00002.json").is_file()
    assert not (out / "part-00001.json").exists() and not (out / "part-00003.json").exists()
    assert not (out / "manifest.json").exists()
    shard.write_bytes(good)
    assert main(["translate", *argv]) == 0
    assert parts_text(out) == one_process(tiny_checkpoints["a"], lines)


def test_a_part_whose_text_does_not_match_its_record_is_translated_again(
        tiny_checkpoints, ray_session, tmp_path):
    """A part's `.json` records its `.txt`'s size: a `.txt` left short (a crash before the
    renamed file reached the disk) is not trusted on its record, even in a complete output;
    the rerun translates that part again and no other."""
    lines = corpus_lines(tiny_checkpoints["pairs"], 60)
    (tmp_path / "mono.en").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    job = CorpusJob([tiny_checkpoints["a"]], str(tmp_path / "mono.en"), str(out),
                    search=SEARCH, actors=1, shard_lines=40, progress=False)
    translate_corpus(job)
    record = json.loads((out / "part-00000.json").read_text())
    assert record["bytes"] == (out / "part-00000.txt").stat().st_size
    assert record["lines_out"] == 40
    kept = (out / "part-00000.txt").stat().st_mtime_ns
    (out / "part-00001.txt").write_bytes(b"")  # as a crash may leave it
    manifest = translate_corpus(job)
    assert manifest["parts_translated_now"] == 1
    assert (out / "part-00000.txt").stat().st_mtime_ns == kept
    assert parts_text(out) == one_process(tiny_checkpoints["a"], lines)
    # While such a part is translated again the folder is not complete: a rerun that fails
    # (here its source shard damaged too; in a process of its own, whose end ends its
    # translators) leaves no manifest saying it is.
    (out / "part-00001.txt").write_bytes(b"")
    (out / "source" / "part-00001.txt").write_bytes(b"caf\xe9\n" * 20)  # not UTF-8
    code = (f"import sys; sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'tests')!r}]; "
            "from test_corpus import SEARCH; "
            "from convs2s.serving.corpus import CorpusJob, translate_corpus; "
            f"translate_corpus(CorpusJob([{tiny_checkpoints['a']!r}], "
            f"{str(tmp_path / 'mono.en')!r}, {str(out)!r}, search=SEARCH, actors=1, "
            "shard_lines=40, progress=False))")
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    _wait_until_the_jobs_translators_end(proc.pid)
    assert proc.returncode != 0 and "UnicodeDecodeError" in err, err[-3000:]
    assert not (out / "manifest.json").exists() and (out / "part-00000.json").is_file()


def test_a_line_without_a_finite_translation_is_counted_in_its_part_and_logged(
        tiny_checkpoints, tmp_path, caplog):
    """Weights that give NaN or infinite log-probabilities leave a line with text but no
    translation: its part's record lists it ("untranslated", which the manifest sums) and the
    translator logs it, where the actors wrote an empty line silently (their log was set to
    errors only, to keep cut lines out of it: those are still counted, not logged). The
    translator's class in this process, without Ray."""
    import logging

    import torch

    from convs2s.serving.corpus import SOURCE, ShardTranslator

    out = tmp_path / "out"
    (out / SOURCE).mkdir(parents=True)
    long = " ".join(["a small house"] * 250)  # past the tiny model's positions: cut
    (out / SOURCE / "part-00000.txt").write_text("a man sleeps .\n\n" + long + "\n")
    tr = ShardTranslator([tiny_checkpoints["a"]], SEARCH.to_dict(), "cpu", 1, None, str(out), 1)
    with caplog.at_level(logging.WARNING, logger="convs2s.inference.translate"):
        record = tr._part(0)
    assert (record["untranslated"], record["truncated"], record["empty"]) == ([], [2], 1)
    assert caplog.text == ""  # the cut line is the record's, not a warning
    with torch.no_grad():
        tr.translator.models[0].decoder.fc3.bias[10] = float("inf")
    with caplog.at_level(logging.WARNING, logger="convs2s.inference.translate"):
        record = tr._part(0)
    assert record["untranslated"] == [0, 2] and record["empty"] == 1
    assert "lines 1, 3: no finite translation" in caplog.text


def test_a_parquet_text_column_may_be_a_category_a_large_string_or_a_string_view(tmp_path):
    """Text columns as pandas and Arrow write them: a category (dictionary of strings, decoded),
    large_string and string_view are read as text; the only text column is found without
    --column."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from convs2s.serving.inputs import input_lines

    pd.DataFrame({"id": [1, 2, 3], "text": pd.Categorical(["a cat", "a dog", None])}) \
        .to_parquet(tmp_path / "category.parquet")
    assert list(input_lines(str(tmp_path / "category.parquet"))) == ["a cat", "a dog", ""]
    for kind in (pa.large_string(), pa.string_view()):
        path = tmp_path / f"{kind}.parquet"
        pq.write_table(pa.table({"id": [1, 2], "text": pa.array(["one", "two"], kind)}), path)
        assert list(input_lines(str(path))) == ["one", "two"], kind


def test_parquet_text_that_is_not_utf8_is_a_counted_line_as_in_a_text_file(tmp_path):
    """Parquet readers take a string's bytes unchecked (another tool may have written any): a
    value that is not UTF-8 is None, as a text line's is (translated empty and counted), not a
    UnicodeDecodeError that named no row and ended the job (a traceback without --actors)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_sources import unchecked_strings

    from convs2s.serving.inputs import input_lines

    text = unchecked_strings([b"caf\xc3\xa9", b"hello\xffworld", None, b"a\nb"])
    pq.write_table(pa.table({"text": text}), tmp_path / "bad.parquet")
    pq.write_table(pa.table({"text": text.dictionary_encode()}), tmp_path / "category.parquet")
    for name in ("bad.parquet", "category.parquet"):
        assert list(input_lines(str(tmp_path / name))) == ["caf\u00e9", None, "", "a b"], name


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_utf16_or_utf32_text_is_refused_as_an_input_naming_the_conversion(tmp_path, encoding):
    """Read as UTF-8, a "Unicode" export's lines with a letter outside ASCII were empty
    translations and its last NUL one output line more, with exit 0."""
    import gzip

    from convs2s.serving.inputs import InputError, input_lines

    data = "un caf\u00e9\nna\u00efve et seul\nok\n".encode(encoding)
    (tmp_path / "wide.en").write_bytes(data)
    (tmp_path / "wide.en.gz").write_bytes(gzip.compress(data))
    wide = encoding.upper()[:6]  # UTF-16, UTF-32
    for name in ("wide.en", "wide.en.gz"):
        with pytest.raises(InputError, match=rf"{wide} text .*not UTF-8.*iconv -f {wide}"):
            input_lines(str(tmp_path / name))


def test_a_file_of_pairs_is_refused_as_an_input_to_translate(tmp_path):
    """A .tsv / .jsonl / .csv (also .gz) holds pairs or rows, as preprocessing reads them: read
    as text, each line's other fields (a reference, its keys) would be translated with the
    sentence. Refused when opened, before a model loads (both modes of translate read here)."""
    from convs2s.serving.inputs import InputError, input_lines

    for name in ("pairs.tsv", "rows.JSONL", "sheet.csv", "pairs.tsv.gz"):
        (tmp_path / name).write_bytes(b"hello\tbonjour\n")
        with pytest.raises(InputError, match=rf"input .*{re.escape(name)} is a file of pairs "
                                             r"or rows .*cut -f1 FILE.*--column"):
            input_lines(str(tmp_path / name))
    (tmp_path / "notes.txt").write_text("hello\tbonjour\n")  # text: its tab is text
    assert list(input_lines(str(tmp_path / "notes.txt"))) == ["hello\tbonjour"]


def test_text_whose_lines_end_in_cr_alone_is_refused_as_an_input_to_translate(tmp_path):
    """Lines ending in CR alone (classic Mac OS) read as one line: translated as one sentence,
    one output line for the input's many. Refused when opened (also as .gz); CRLF is read."""
    import gzip

    from convs2s.serving.inputs import InputError, input_lines

    (tmp_path / "mac.en").write_bytes(b"one\rtwo\rthree\r")
    (tmp_path / "mac.en.gz").write_bytes(gzip.compress(b"one\rtwo\rthree\r"))
    for name in ("mac.en", "mac.en.gz"):
        with pytest.raises(InputError, match=r"its lines end in CR alone .*tr '\\r' '\\n'"):
            input_lines(str(tmp_path / name))
    (tmp_path / "dos.en").write_bytes(b"one\r\ntwo\r\n")
    assert [x.rstrip("\r") for x in input_lines(str(tmp_path / "dos.en"))] == ["one", "two"]


def test_the_actor_flags_without_actors_are_refused_in_one_line(tiny_checkpoints, tmp_path,
                                                                capsys):
    """--gpus-per-actor, --shard-lines and --no-progress are the --actors job's: given to one
    process (which would ignore them) they are one line, exit 2, before anything is loaded or
    written, as --device and --buffer-size are with --actors."""
    from convs2s.cli import translate

    (tmp_path / "a.en").write_text("one\n")
    for extra, says in [
        (["--gpus-per-actor", "0.5"], "--gpus-per-actor: only the --actors job uses it"),
        (["--shard-lines", "10"], "--shard-lines: only the --actors job uses it"),
        (["--no-progress"], "--no-progress: only the --actors job uses it"),
        (["--shard-lines", "10", "--no-progress"],
         "--shard-lines and --no-progress: only the --actors job uses them"),
    ]:
        rc = translate(["--checkpoint", tiny_checkpoints["a"], "--input",
                        str(tmp_path / "a.en"), "--output", str(tmp_path / "a.de"), *extra])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(f"convs2s-translate: error: {says}; give --actors "
                                          "N") and err.count("\n") == 1, (extra, err)
    assert not (tmp_path / "a.de").exists()


def test_int8_for_actors_on_gpus_is_refused_in_one_line_before_ray_starts(tiny_checkpoints,
                                                                           tmp_path):
    """int8 runs on CPUs and an actor holding a GPU searches on it: without
    --precision-fallback fp32 the job is one line, exit 2, before Ray starts or the output is
    made (it failed in every actor's constructor after Ray had reserved their GPUs), as
    `serve --gpus-per-replica 1 --precision int8` is. The check needs no GPU."""
    (tmp_path / "a.en").write_text("one\n")
    proc = run_cli("--checkpoint", tiny_checkpoints["a"], "--input", str(tmp_path / "a.en"),
                   "--output", str(tmp_path / "out"), "--actors", "1", "--gpus-per-actor", "1",
                   "--precision", "int8")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("convs2s-translate: error: int8 inference runs on CPUs")
    assert "--precision-fallback fp32" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["translate", "serve"])
def test_a_ray_address_these_commands_cannot_join_is_one_line_naming_it_and_the_fix(
        tiny_checkpoints, tmp_path, command):
    """The corpus job and `serve` join RAY_ADDRESS as the workflows do (`storage.ray_join`):
    the dashboard's http:// address or a head where nothing answers is one `error:` line that
    hides the password and names the command to submit, exit 2, not Ray's traceback (which
    printed the password) nor minutes of Ray's retries; nothing is translated."""
    from workflows.cluster import free_port

    (tmp_path / "a.en").write_text("one\n")
    args = {"translate": ["--actors", "2", "--input", str(tmp_path / "a.en"), "--output",
                          str(tmp_path / "out")],
            "serve": ["--port", str(free_port())]}[command]
    port = free_port()  # nothing listens there
    # (one address each: the refusal is one piece of code, `ray_join`, for both commands)
    cases = {"translate": (f"http://admin:s3cret@127.0.0.1:{port}",
                           f"RAY_ADDRESS=http://admin:***@127.0.0.1:{port} is a Ray dashboard"),
             "serve": (f"ray://admin:s3cret@127.0.0.1:{port}",
                       f"RAY_ADDRESS=ray://admin:***@127.0.0.1:{port}: nothing answers at")}
    address, said = cases[command]
    env = {**os.environ, "RAY_ADDRESS": address, "CONVS2S_RAY_JOIN_WAIT_S": "1"}
    proc = subprocess.run([sys.executable, "-m", "convs2s", command, "--checkpoint",
                           tiny_checkpoints["a"], *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert said in lines[0] and "s3cret" not in lines[0], lines[0]
    assert "unset RAY_ADDRESS to run on this machine" in lines[0]
    if "dashboard" in said:
        assert f"ray job submit --working-dir . -- python -m convs2s {command} " in lines[0]
    # (the corpus job has split its input, which a rerun reuses; nothing is translated)
    assert not list(tmp_path.glob("out/part-*")) and not list(tmp_path.glob("out/manifest*"))


def test_a_part_whose_record_counts_other_output_lines_names_both_counts(tmp_path):
    """The manifest is written only over parts whose records count the lines their source
    shard gives: one that counts the right lines in but other n-best lines out is refused
    with both counts (it used to say only the lines in, which matched)."""
    from convs2s.serving.corpus import _manifest, part_name, part_records

    job = CorpusJob(["unused"], "in.txt", str(tmp_path),
                    search=SearchConfig(beam=2, nbest=2))
    (tmp_path / part_name(0, "json")).write_text(json.dumps(
        {"lines": 3, "lines_out": 3, "truncated": [], "bytes": 0}))
    (tmp_path / part_name(0, "txt")).write_bytes(b"")
    source = {"shards": [{"index": 0, "lines": 3, "first_line": 0}], "lines": 3,
              "non_utf8": []}
    with pytest.raises(CorpusError, match=r"part-00000\.json counts 3 lines in and 3 out, its "
                                          r"source shard 3 in and 6 out: delete the part"):
        _manifest(job, tmp_path, source, {}, 1.0, 1, part_records(tmp_path, [0], 5))


def test_an_actor_no_node_of_a_local_ray_holds_is_one_line_with_the_fix(ray_session,
                                                                         monkeypatch):
    """A local Ray (no RAY_ADDRESS) never grows: an actor asking for more CPUs or GPUs than any
    of its nodes has left the job waiting without end (Ray Data: "may hang forever"; measured:
    --gpus-per-actor 1 on this CPU machine, nothing for 2 minutes). One line, with the fix; on a
    cluster its autoscaler may add the node, and the job waits. The session's Ray: 2 CPUs."""
    from convs2s.serving.corpus import check_room

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    nodes = ray_session.nodes()

    def job(**resources):
        return CorpusJob(["ck"], "in.txt", "out", actors=4, **resources)

    check_room(job(threads_per_actor=2), nodes)  # one actor fits: the pool starts
    with pytest.raises(CorpusError) as err:
        check_room(job(gpus_per_actor=1), nodes)
    assert str(err.value) == (
        "each translator actor asks for 1 CPU(s) and 1 GPU(s), but this machine's Ray has 2 "
        "CPU(s) and 0 GPU(s): no actor could start (a local Ray never grows); leave "
        "--gpus-per-actor out, or submit the job to a cluster (`ray job submit`)")
    with pytest.raises(CorpusError, match=r"asks for 3 CPU\(s\), .*; give --threads 2 \(or"):
        check_room(job(threads_per_actor=3), nodes)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    check_room(job(threads_per_actor=3, gpus_per_actor=1), nodes)
    from storage import ray_join  # a cluster joined without RAY_ADDRESS: may grow

    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(ray_join, "started_here", lambda: False)
    check_room(job(threads_per_actor=3, gpus_per_actor=1), nodes)
