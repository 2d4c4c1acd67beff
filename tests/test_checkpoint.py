"""Tests of convs2s.io.checkpoint: weights-only round trip, model restore without Ray, RNG state,
listing / picking a run's checkpoints, and the atomic directory replacement used for best/.

Run: .venv/bin/python -m pytest tests/test_checkpoint.py -q
"""

from __future__ import annotations

import dataclasses

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from convs2s.io.checkpoint import (
    BEST_DIR,
    CHECKPOINT_FILE,
    META_FILE,
    SPM_FILE,
    CheckpointError,
    best_checkpoint,
    capture_rng_state,
    checkpoint_dir_name,
    list_checkpoints,
    load_checkpoint,
    load_model,
    pick_checkpoints,
    restore_rng_state,
    save_checkpoint,
)
from convs2s.config import PRESETS, TrainConfig
from convs2s.model.network import ConvS2S
from convs2s.train.optim import LRSchedule, build_optimizer
from storage import publish_dir

TINY = PRESETS["tiny"]()
V = 50


def _state(model, opt, epoch=1, update=10, val_loss=3.5) -> dict:
    return {"model": model.state_dict(), "model_config": TINY.to_dict(), "src_vocab_size": V,
            "tgt_vocab_size": V, "train_config": TrainConfig().to_dict(), "epoch": epoch,
            "update": update, "batches_in_epoch": 0, "world_size": 1,
            "optimizer": opt.state_dict(), "scheduler": LRSchedule(TrainConfig()).state_dict(),
            "rng": {"world_size": 1, "states": [capture_rng_state()]}, "val_loss": val_loss}


def _trained_model():
    torch.manual_seed(0)
    model = ConvS2S(TINY, V, V)
    opt = build_optimizer(model.parameters(), TrainConfig())
    src = torch.randint(4, V, (3, 6))
    prev = torch.randint(4, V, (3, 5))
    logits, _ = model(src, torch.full((3,), 6), prev)
    logits.sum().backward()
    opt.step()  # creates momentum buffers in the optimizer state
    return model, opt, (src, prev)


def test_round_trip_is_weights_only_and_restores_the_model(tmp_path):
    model, opt, (src, prev) = _trained_model()
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"not really a model")
    d = save_checkpoint(tmp_path / checkpoint_dir_name(10), _state(model, opt), spm_model=str(spm),
                        end_of_epoch=True)
    raw = torch.load(d / CHECKPOINT_FILE, weights_only=True)  # must not raise
    assert raw["update"] == 10 and raw["model_config"] == TINY.to_dict()
    assert (d / SPM_FILE).read_bytes() == b"not really a model"
    restored, meta = load_model(d)
    assert not restored.training and meta["spm_model"] == str(d / SPM_FILE)
    assert "model" not in meta and "optimizer" not in meta and meta["val_loss"] == 3.5
    model.eval()
    with torch.no_grad():
        a, _ = model(src, torch.full((3,), 6), prev)
        b, _ = restored(src, torch.full((3,), 6), prev)
    assert torch.equal(a, b)
    opt2 = build_optimizer(restored.parameters(), TrainConfig())
    opt2.load_state_dict(load_checkpoint(d)["optimizer"])  # momentum buffers come back too
    saved, loaded = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert saved.keys() == loaded.keys() and saved
    assert all(torch.equal(loaded[i]["momentum_buffer"], saved[i]["momentum_buffer"])
               for i in saved)


def test_load_model_works_in_a_process_without_ray(tmp_path):
    model, opt, _ = _trained_model()
    d = save_checkpoint(tmp_path / "ck", _state(model, opt))
    code = ("import sys; from convs2s.io.checkpoint import load_model; "
            "m, meta = load_model(sys.argv[1]);"
            "assert 'ray' not in sys.modules, 'checkpoint loading imported ray'; "
            "print(meta['update'])")
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "10"


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint.pt"):
        load_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="lacks"):
        save_checkpoint(tmp_path / "x", {"model": {}})


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    state = capture_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(99), random.seed(99), np.random.seed(99)
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], again[0]) and expected[1:] == again[1:]


def test_a_rank_finds_its_cuda_rng_state_whatever_the_gpu_count():
    """A checkpoint holds the saving rank's own CUDA state (one entry); an older one held every
    visible GPU's. Restored onto a node with more or fewer GPUs: the device's own entry, or
    none, never an IndexError."""
    from convs2s.io.checkpoint import cuda_state_for_device

    states = [torch.full((4,), i, dtype=torch.uint8) for i in range(8)]
    assert cuda_state_for_device([], 0) is None  # saved on CPU
    assert cuda_state_for_device(states[:1], 3) is states[0]  # this project's format
    assert cuda_state_for_device(states, 5) is states[5]  # an 8-GPU node's list
    assert cuda_state_for_device(states[:4], 6) is None  # saved on 4 GPUs, resumed on 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
def test_cuda_rng_state_round_trips_for_this_device():
    torch.cuda.manual_seed(3)
    state = capture_rng_state()
    assert len(state["cuda"]) == 1
    expected = torch.rand(3, device="cuda")
    torch.cuda.manual_seed(99)
    restore_rng_state(state)
    assert torch.equal(torch.rand(3, device="cuda"), expected)


def _fake_run(tmp_path, specs):
    model, opt, _ = _trained_model()
    for epoch, update, val, eoe in specs:
        save_checkpoint(tmp_path / checkpoint_dir_name(update),
                        _state(model, opt, epoch, update, val), end_of_epoch=eoe)
    return tmp_path


def test_best_is_repaired_from_what_the_resumed_checkpoint_says(tmp_path):
    """A kill between reporting a checkpoint and copying it to best/ leaves best/ stale; one
    after copying a checkpoint that was never reported leaves best/ ahead of the resumed run.
    The resumed run makes best/ the kept checkpoint with the loss its checkpoint calls best."""
    from convs2s.io.checkpoint import BEST_DIR, read_info, reconcile_best

    run = _fake_run(tmp_path, [(1, 120, 3.0, True), (2, 240, 2.5, True), (3, 360, 2.7, True)])
    # died before copying 240
    publish_dir(run / checkpoint_dir_name(120), run / BEST_DIR, marker=META_FILE)
    assert reconcile_best(run, 2.5, 360) == f"repaired from {checkpoint_dir_name(240)}"
    assert read_info(run / BEST_DIR).update == 240
    assert reconcile_best(run, 2.5, 360) == "ok"  # consistent: nothing to do
    # a power loss cut best/'s checkpoint.pt short beside a whole meta.json (local copies are
    # not flushed): repaired, not taken as whole
    weights = run / BEST_DIR / "checkpoint.pt"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert reconcile_best(run, 2.5, 360) == f"repaired from {checkpoint_dir_name(240)}"
    assert reconcile_best(run, 2.5, 360) == "ok"
    # best/ from an update the resumed run never reached (copied, then killed before report)
    assert reconcile_best(run, 3.0, 120) == f"repaired from {checkpoint_dir_name(120)}"
    assert read_info(run / BEST_DIR).update == 120
    # The best was pruned by keep_last and best/ holds another loss: left, and said so.
    assert reconcile_best(run, 1.9, 360) == "no kept checkpoint has validation loss 1.9"
    assert reconcile_best(run, None, 360) == "ok"  # nothing validated yet


@pytest.mark.parametrize("leftovers", ["new and old", "old only"])
def test_a_crash_between_the_two_renames_of_best_is_recovered(tmp_path, leftovers):
    """publish_dir sets best/ aside (.best.old-*) and renames its complete replacement
    (.best.tmp-*) into place; killed in between, best/ is missing. The resumed run puts the
    replacement in place (or, without one, the old best/ back, then repairs it as usual)."""
    import shutil

    from convs2s.io.checkpoint import BEST_DIR, read_info, reconcile_best

    run = _fake_run(tmp_path, [(1, 120, 3.0, True), (2, 240, 2.5, True)])
    shutil.copytree(run / checkpoint_dir_name(120), run / f".{BEST_DIR}.old-aaaa")
    if leftovers == "new and old":
        shutil.copytree(run / checkpoint_dir_name(240), run / f".{BEST_DIR}.tmp-bbbb")
        # the new best's own checkpoint was pruned since (keep_last): only the leftover has it
        shutil.rmtree(run / checkpoint_dir_name(240))
        assert reconcile_best(run, 2.5, 240).startswith("recovered from the interrupted swap")
    else:
        assert reconcile_best(run, 2.5, 240) == f"repaired from {checkpoint_dir_name(240)}"
    assert read_info(run / BEST_DIR).update == 240
    assert not list(run.glob(f".{BEST_DIR}.*"))  # the leftovers are gone


def test_what_a_killed_publish_left_beside_a_whole_best_is_removed_at_resume(tmp_path):
    """A publish of best/ killed outright (SIGKILL) in its copy, or after its renames, leaves
    .best.tmp-* / .best.old-* beside a whole best/: kept for good before (a checkpoint's size
    each time), removed now when the resumed run finds best/ as it should be."""
    import shutil

    from convs2s.io.checkpoint import BEST_DIR, reconcile_best

    run = _fake_run(tmp_path, [(1, 120, 3.0, True), (2, 240, 2.5, True)])
    publish_dir(run / checkpoint_dir_name(240), run / BEST_DIR, marker=META_FILE)
    shutil.copytree(run / checkpoint_dir_name(120), run / f".{BEST_DIR}.old-aaaa")
    shutil.copytree(run / checkpoint_dir_name(240), run / f".{BEST_DIR}.tmp-bbbb")
    assert reconcile_best(run, 2.5, 240) == "ok"
    assert not list(run.glob(f".{BEST_DIR}.*"))


def test_a_best_replacement_cut_short_is_never_put_in_place(tmp_path):
    """Killed while publish_dir copied best/'s replacement (.best.tmp-*), the copy can hold
    meta.json beside a checkpoint.pt cut short: not put in place; the old best/ goes back and
    is repaired from the kept checkpoint as usual."""
    import shutil

    from convs2s.io.checkpoint import BEST_DIR, read_info, reconcile_best

    run = _fake_run(tmp_path, [(1, 120, 3.0, True), (2, 240, 2.5, True)])
    shutil.copytree(run / checkpoint_dir_name(120), run / f".{BEST_DIR}.old-aaaa")
    cut = run / f".{BEST_DIR}.tmp-bbbb"
    shutil.copytree(run / checkpoint_dir_name(240), cut)
    whole = (cut / CHECKPOINT_FILE).read_bytes()
    (cut / CHECKPOINT_FILE).write_bytes(whole[: len(whole) // 3])
    assert reconcile_best(run, 2.5, 240) == f"repaired from {checkpoint_dir_name(240)}"
    assert read_info(run / BEST_DIR).update == 240
    assert load_checkpoint(run / BEST_DIR)["update"] == 240  # whole


def test_meta_json_is_written_last_and_whole(tmp_path, monkeypatch):
    """A checkpoint is listed only once whole: meta.json comes last, after checkpoint.pt and
    the files beside it; a write cut short leaves no checkpoint.pt (only its .tmp)."""
    run = _fake_run(tmp_path, [(1, 120, 3.0, True)])
    d = run / checkpoint_dir_name(120)
    assert sorted(p.name for p in d.iterdir()) == ["checkpoint.pt", "meta.json"]  # no .tmp
    assert json.loads((d / "meta.json").read_text())["update"] == 120
    model, opt, _ = _trained_model()
    # dies after checkpoint.pt, copying the sentencepiece model beside it: no meta.json
    late = run / checkpoint_dir_name(240)
    with pytest.raises(FileNotFoundError):
        save_checkpoint(late, _state(model, opt, 2, 240, 2.5), spm_model=str(tmp_path / "no"))
    assert (late / "checkpoint.pt").is_file() and not (late / "meta.json").exists()
    assert [i.update for i in list_checkpoints(run)] == [120]

    # dies while writing checkpoint.pt: nothing under the final name
    def cut_short(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", cut_short)
    early = run / checkpoint_dir_name(360)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(early, _state(model, opt, 3, 360, 2.4))
    assert sorted(p.name for p in early.iterdir()) == ["checkpoint.pt.tmp"]
    assert [i.update for i in list_checkpoints(run)] == [120]


def test_each_file_reaches_the_disk_before_its_rename_and_the_folder_after_meta(tmp_path,
                                                                               monkeypatch):
    """At a power loss a rename can reach the disk before the bytes it names (an empty
    checkpoint.pt under its final name beside a whole meta.json): each file is flushed (fsync)
    before it is renamed or listed, and the folder's entries after meta.json's rename. The
    real os.fsync and os.replace run; the order of their calls is recorded."""
    model, opt, _ = _trained_model()
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"a sentencepiece model's bytes")
    calls, real_fsync, real_replace, real_rename = [], os.fsync, os.replace, os.rename

    def fsync(fd):
        calls.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", os.path.basename(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    d = save_checkpoint(tmp_path / checkpoint_dir_name(10), _state(model, opt),
                        spm_model=str(spm))
    assert calls == [("fsync", "checkpoint.pt.tmp"), ("replace", "checkpoint.pt.tmp"),
                     ("fsync", "sentencepiece.model"),
                     ("fsync", "meta.json.tmp"), ("replace", "meta.json.tmp"),
                     ("fsync", "checkpoint_00000010")]
    assert [i.update for i in list_checkpoints(tmp_path)] == [10]
    assert d == tmp_path / checkpoint_dir_name(10)
    # the trainer's scratch copy (copied elsewhere, then deleted): not flushed
    calls.clear()
    save_checkpoint(tmp_path / "scratch", _state(model, opt), spm_model=str(spm), durable=False)
    assert [c for c in calls if c[0] == "fsync"] == []
    # the run folder's copy (LocalRuntime's checkpoints, best/): every file, then the
    # folder, flushed before the renames put it in place, and the run folder after them
    renames = []
    monkeypatch.setattr(os, "rename", lambda a, b: (renames.append(os.path.basename(b)),
                                                    real_rename(a, b)))
    calls.clear()
    publish_dir(tmp_path / "scratch", tmp_path / "run" / "best", marker="meta.json")
    flushed = [name for kind, name in calls if kind == "fsync"]
    assert renames == ["best"] and set(flushed[:3]) == {"checkpoint.pt", "meta.json",
                                                         "sentencepiece.model"}
    assert flushed[3].startswith(".best.tmp-") and flushed[4:] == ["run"], flushed


def test_a_folder_on_a_filesystem_that_cannot_flush_one_is_left_as_it_is(tmp_path,
                                                                          monkeypatch):
    """Some FUSE and CIFS mounts refuse a folder's fsync (EINVAL): the checkpoint is written
    all the same; a file's fsync error is not passed over."""
    import errno

    model, opt, _ = _trained_model()
    real_fsync = os.fsync

    def no_folders(fd):
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_folders)
    save_checkpoint(tmp_path / checkpoint_dir_name(10), _state(model, opt))
    assert [i.update for i in list_checkpoints(tmp_path)] == [10]

    def full(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="Input/output error"):
        save_checkpoint(tmp_path / checkpoint_dir_name(20), _state(model, opt, update=20))
    assert [i.update for i in list_checkpoints(tmp_path)] == [10]


def test_a_validation_after_an_interval_checkpoint_of_its_update_is_listed_after_it(tmp_path,
                                                                                     monkeypatch):
    """A run resumed at its limit from an interval checkpoint validates at that update:
    `checkpoint_<U>_validated`, of the same update and epoch, is the newer of the two whatever
    order the folder lists them in (a resume took the unvalidated one, and validated again)."""
    from pathlib import Path as P

    model, opt, _ = _trained_model()
    run = tmp_path / "run"
    save_checkpoint(run / checkpoint_dir_name(100), _state(model, opt, 0, 100, None))
    save_checkpoint(run / checkpoint_dir_name(100, validated=True), _state(model, opt, 0, 100, 2.0))
    names = [checkpoint_dir_name(100, validated=True), checkpoint_dir_name(100)]
    for listed in (names, names[::-1]):  # (as the folder may list them)
        monkeypatch.setattr(P, "glob", lambda self, pattern, listed=listed: [
            self / n for n in listed])
        assert [i.path.rsplit("/", 1)[-1] for i in list_checkpoints(run)] == \
            [checkpoint_dir_name(100), checkpoint_dir_name(100, validated=True)]


def test_a_copy_into_storage_cut_short_is_not_listed(tmp_path):
    """Ray Train copies a checkpoint folder into storage file by file under the final names:
    a copy cut short (checkpoint.pt shorter than meta.json records, or meta.json itself cut)
    is not a checkpoint to resume, average or score."""
    import shutil

    run = _fake_run(tmp_path / "run", [(1, 120, 3.0, True), (2, 240, 2.5, True),
                                       (3, 360, 2.4, True)])
    d = run / checkpoint_dir_name(240)
    whole = (d / CHECKPOINT_FILE).read_bytes()
    assert json.loads((d / META_FILE).read_text())["checkpoint_bytes"] == len(whole)
    (d / CHECKPOINT_FILE).write_bytes(whole[: len(whole) // 2])
    (run / checkpoint_dir_name(360) / META_FILE).write_text('{"epoch": 3, "upd')
    assert [i.update for i in list_checkpoints(run)] == [120]
    # a checkpoint written before sizes were recorded is listed as before
    old = run / checkpoint_dir_name(480)
    shutil.copytree(run / checkpoint_dir_name(120), old)
    meta = json.loads((old / META_FILE).read_text())
    del meta["checkpoint_bytes"]
    (old / META_FILE).write_text(json.dumps({**meta, "update": 480}))
    assert [i.update for i in list_checkpoints(run)] == [120, 480]


def test_a_copy_whose_sentencepiece_model_is_cut_short_or_missing_is_not_listed(tmp_path):
    """The files beside checkpoint.pt come in the same copy, in no set order: a sentencepiece
    model cut short (or not there yet) under a whole meta.json made a checkpoint that was
    listed, then failed to average, stage or translate."""
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"pieces" * 100)
    model, opt, _ = _trained_model()
    run = tmp_path / "run"
    for update in (120, 240, 360):
        save_checkpoint(run / checkpoint_dir_name(update), _state(model, opt, 1, update, 3.0),
                        spm_model=str(spm))
    meta = json.loads((run / checkpoint_dir_name(120) / META_FILE).read_text())
    assert meta["file_bytes"] == {CHECKPOINT_FILE: meta["checkpoint_bytes"],
                                  "sentencepiece.model": 600}
    (run / checkpoint_dir_name(240) / "sentencepiece.model").write_bytes(b"pieces")
    (run / checkpoint_dir_name(360) / "sentencepiece.model").unlink()
    assert [i.update for i in list_checkpoints(run)] == [120]
    # nor is such a folder loaded when named (translate, average, serve --checkpoint DIR):
    # weights beside files that are not the ones meta.json records, e.g. a folder a second
    # writer left half replaced
    with pytest.raises(CheckpointError, match=r"is not a whole checkpoint: its files are not "
                                              r"the sizes its meta.json records"):
        load_checkpoint(run / checkpoint_dir_name(240))
    assert load_checkpoint(run / checkpoint_dir_name(120))["update"] == 120


def test_a_checkpoint_given_by_its_file_is_checked_as_its_folder(tmp_path):
    """`DIR/checkpoint.pt` names the checkpoint of folder DIR: DIR's meta.json decides whether
    it is whole, so a sentencepiece model cut short beside the file is refused as it is when
    DIR is given (the file alone looked whole), and the model's sentencepiece model is DIR's."""
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"pieces" * 100)
    model, opt, _ = _trained_model()
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for d in (whole, cut):
        save_checkpoint(d, _state(model, opt), spm_model=str(spm))
    (cut / SPM_FILE).write_bytes(b"pieces")
    for given in (cut, cut / CHECKPOINT_FILE):
        with pytest.raises(CheckpointError, match=rf"^{cut} is not a whole checkpoint: its "
                                                  r"files are not the sizes its meta.json"):
            load_checkpoint(given)
        with pytest.raises(CheckpointError, match="is not a whole checkpoint"):
            load_model(given)
    assert load_checkpoint(whole / CHECKPOINT_FILE)["update"] == 10
    _, meta = load_model(whole / CHECKPOINT_FILE)
    assert (meta["path"], meta["spm_model"]) == (str(whole), str(whole / SPM_FILE))


def test_list_pick_and_best(tmp_path):
    run = _fake_run(tmp_path, [(1, 120, 3.0, True), (1, 150, None, False), (2, 240, 2.5, True),
                               (2, 300, None, False), (3, 360, 2.7, True)])
    (run / "checkpoint_00000999.tmp").mkdir()  # junk is ignored
    infos = list_checkpoints(run)
    assert [i.update for i in infos] == [120, 150, 240, 300, 360]
    assert [i.update for i in pick_checkpoints(infos, last=2)] == [300, 360]
    assert [i.update for i in pick_checkpoints(infos, last=2, epoch_ends_only=True)] == [240, 360]
    # an interval checkpoint and its epoch's end at one update (the same weights) count once,
    # as the epoch's end: the last two are two states (Ray Train keeps both folders)
    same = [i if i.update != 360 else dataclasses.replace(i, epoch=2, end_of_epoch=False)
            for i in infos] + [infos[-1]]
    assert [(i.update, i.epoch) for i in pick_checkpoints(same, last=2)] == [(300, 2), (360, 3)]
    assert best_checkpoint(run).update == 240  # no best/: lowest validation loss among kept
    publish_dir(run / checkpoint_dir_name(120), run / BEST_DIR, marker=META_FILE)
    assert best_checkpoint(run).update == 120  # best/ wins (it may be older than the kept ones)
    assert [i.update for i in list_checkpoints(run)] == [120, 150, 240, 300, 360]


def test_a_checkpoint_whose_meta_json_is_not_this_projects_is_skipped_or_named(tmp_path):
    """A meta.json another tool wrote, or one edited by hand (not an object, a field missing):
    the run's listing skips that folder (it raised KeyError / AttributeError, so every listing
    of the run, its best model and --init-from failed), and reading it names the file."""
    from convs2s.io.checkpoint import CheckpointError, read_info

    run = _fake_run(tmp_path, [(1, 120, 3.0, True), (2, 240, 2.5, True)])
    (run / checkpoint_dir_name(120) / META_FILE).write_text('{"epoch": 1}')
    (run / checkpoint_dir_name(240) / META_FILE).write_text("[1]")
    assert list_checkpoints(run) == [] and best_checkpoint(run) is None
    for folder in (checkpoint_dir_name(120), checkpoint_dir_name(240)):
        with pytest.raises(CheckpointError, match=f"{folder}/meta.json is not a checkpoint"):
            read_info(run / folder)


def test_best_is_swapped_whole_by_publish_dir(tmp_path):
    a, b, dst = tmp_path / "a", tmp_path / "b", tmp_path / "best"
    a.mkdir(), b.mkdir()
    (a / "meta.json").write_text(json.dumps({"v": 1}))
    (a / "only_in_a").write_text("x")
    (b / "meta.json").write_text(json.dumps({"v": 2}))
    publish_dir(a, dst, marker="meta.json")
    publish_dir(b, dst, marker="meta.json")
    assert sorted(p.name for p in dst.iterdir()) == ["meta.json"]
    assert json.loads((dst / "meta.json").read_text()) == {"v": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "best"]


class _Hostile:
    """Stands for any pickled object: loading it would import and run this module's code."""


@pytest.mark.parametrize("content, says", [
    (lambda: bytes(random.Random(0).getrandbits(8) for _ in range(4096)),
     "is not a readable checkpoint of this project"),
    (lambda: b"not a checkpoint at all\n" * 10, "is not a readable checkpoint of this project"),
    # damaged pickles the weights-only unpickler meets as an empty stack or an unknown memo
    (lambda: b".", "is not a readable checkpoint"),
    (lambda: b"s.", "is not a readable checkpoint"),
    (lambda: b"h\xff.", "is not a readable checkpoint"),
    (lambda: b"(e.", "is not a readable checkpoint"),
])
def test_random_bytes_are_unreadable_not_called_code(tmp_path, content, says):
    (tmp_path / CHECKPOINT_FILE).write_bytes(content())
    from convs2s.io.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=says) as err:
        load_checkpoint(tmp_path)
    assert "could run code" not in str(err.value)


def damaged_tensor_file(good: Path, out: Path, state: dict) -> None:
    """`out`: the torch file `good` with its pickle replaced by one of `state` whose "w" weight
    is rebuilt from a dict where its storage belongs, as damaged bytes may read (only names
    the weights-only unpickler allows: torch's rebuild function and OrderedDict)."""
    import collections
    import pickle
    import zipfile

    class Misbuilt:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2,
                    (collections.OrderedDict(), 0, (1,), (1,), False, collections.OrderedDict()))

    state = {**state, "model": {"w": Misbuilt()}}
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(out, "w") as w:
        for name in z.namelist():
            w.writestr(name, pickle.dumps(state, protocol=2) if name.endswith("data.pkl")
                       else z.read(name))


def test_a_file_damaged_into_objects_torch_cannot_build_is_unreadable_not_a_traceback(tmp_path):
    """Damaged bytes that still unpickle build whatever they name: torch's rebuild functions
    given other objects raise AttributeError or TypeError (a raw traceback through every command
    that loads a checkpoint); weights damaged into other containers pass the load and failed
    later. Each is the one CheckpointError naming the file."""
    from convs2s.io.checkpoint import CheckpointError

    torch.save({"model": {"w": torch.zeros(1)}, "model_config": {}}, tmp_path / "good.pt")
    damaged_tensor_file(tmp_path / "good.pt", tmp_path / CHECKPOINT_FILE,
                        {"model_config": TINY.to_dict()})
    with pytest.raises(CheckpointError, match="is not a readable checkpoint"):
        load_checkpoint(tmp_path)
    torch.save({"model": {"w": [1.0]}, "model_config": TINY.to_dict()},
               tmp_path / CHECKPOINT_FILE)
    with pytest.raises(CheckpointError, match="is not a readable checkpoint"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_pickled_object_is_refused_as_code_without_torch_warnings(tmp_path, protocol):
    """torch.save's protocol 2 and plain pickles of newer protocols (torch warns about those
    before refusing them): one message, no warning before it."""
    import pickle
    import warnings

    from convs2s.io.checkpoint import CheckpointError

    state = {"model": {}, "model_config": TINY.to_dict(), "hook": _Hostile()}
    file = tmp_path / CHECKPOINT_FILE
    if protocol == 2:
        torch.save(state, file)
    else:
        file.write_bytes(pickle.dumps(state, protocol=protocol))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        with pytest.raises(CheckpointError, match="refused: it holds pickled Python objects"):
            load_checkpoint(tmp_path)


def test_a_resume_falls_back_from_a_damaged_meta_json_as_it_did(tmp_path):
    """Ray Train's latest checkpoint with a meta.json cut short (a worker killed while writing
    it): the resume takes the newest whole checkpoint, and a damaged best/ is repaired from the
    kept one; the CheckpointError that names such a file (for the commands) broke both."""
    from convs2s.io.checkpoint import BEST_DIR, foreign_best, read_info, reconcile_best
    from convs2s.train.runtime import newest_checkpoint

    run = _fake_run(tmp_path, [(1, 120, 3.0, True), (2, 240, 2.5, True)])
    (run / checkpoint_dir_name(240) / META_FILE).write_text('{"epoch": 2, "upd')
    assert newest_checkpoint(run, checkpoint_dir_name(240)) == str(run / checkpoint_dir_name(120))
    publish_dir(run / checkpoint_dir_name(120), run / BEST_DIR, marker=META_FILE)
    (run / BEST_DIR / META_FILE).write_text("[]")
    assert reconcile_best(run, 3.0, 120) == f"repaired from {checkpoint_dir_name(120)}"
    assert read_info(run / BEST_DIR).update == 120
    assert foreign_best(run) is None


def test_a_checkpoint_whose_bytes_changed_is_refused_before_its_weights_load(tmp_path):
    """torch.load checks no checksum: a bit flipped in a tensor's bytes (a disk, a copy)
    loaded as other weights without a word. meta.json records checkpoint.pt's SHA-256 and
    every load checks it, naming the file and the fix; a checkpoint written before digests
    were recorded loads as before."""
    model, opt, _ = _trained_model()
    d = save_checkpoint(tmp_path / "run" / checkpoint_dir_name(120),
                        _state(model, opt, 1, 120, 3.0))
    meta = json.loads((d / META_FILE).read_text())
    whole = (d / CHECKPOINT_FILE).read_bytes()
    assert meta["checkpoint_sha256"] == __import__("hashlib").sha256(whole).hexdigest()
    # one bit of the last tensor's data, far from the archive's records: same size, listed
    flipped = bytearray(whole)
    flipped[len(whole) - 4096] ^= 0x10
    (d / CHECKPOINT_FILE).write_bytes(bytes(flipped))
    assert [i.update for i in list_checkpoints(tmp_path / "run")] == [120]
    for given in (d, d / CHECKPOINT_FILE):
        with pytest.raises(CheckpointError, match=r"checkpoint.pt is damaged: its bytes are "
                                                  r"not the ones its meta.json records"):
            load_checkpoint(given)
    # (without the digest the flipped bit loads: what the check is for)
    del meta["checkpoint_sha256"]
    (d / META_FILE).write_text(json.dumps(meta))
    assert load_checkpoint(d)["update"] == 120
    (d / CHECKPOINT_FILE).write_bytes(whole)
    assert load_checkpoint(d)["update"] == 120
