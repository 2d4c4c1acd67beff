"""Tests of convs2s.io.averaging (checkpoint weight averaging).

Run: .venv/bin/python -m pytest tests/test_averaging.py -q
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from convs2s.io.averaging import average_checkpoints, average_state_dicts
from convs2s.io.checkpoint import load_checkpoint, save_checkpoint
from convs2s.cli import average as main
from convs2s.config import PRESETS, SearchConfig
from convs2s.inference.translate import load_for_inference


def test_average_of_identical_checkpoints_is_bit_identical(tiny_checkpoints, tmp_path):
    a = tiny_checkpoints["a"]
    out = average_checkpoints([a, a, a], tmp_path / "avg")
    original, averaged = load_checkpoint(a)["model"], load_checkpoint(out)["model"]
    assert original.keys() == averaged.keys()
    for k in original:
        assert averaged[k].dtype == original[k].dtype
        assert torch.equal(averaged[k], original[k]), k


def test_average_of_two_is_their_mean_and_keeps_only_inference_state(tiny_checkpoints,
                                                                      tmp_path):
    a, b = tiny_checkpoints["a"], tiny_checkpoints["b"]
    out = average_checkpoints([a, b], tmp_path / "avg")
    sa, sb, avg = load_checkpoint(a), load_checkpoint(b), load_checkpoint(out)
    for k, v in avg["model"].items():
        torch.testing.assert_close(v, (sa["model"][k] + sb["model"][k]) / 2)
    assert "optimizer" not in avg and avg["val_loss"] is None
    assert avg["update"] == max(sa["update"], sb["update"])  # metadata of the newest input
    assert avg["averaged_from"] == [a, b]
    assert (Path(out) / "sentencepiece.model").read_bytes() == \
        Path(tiny_checkpoints["spm"]).read_bytes()
    # The result is an ordinary checkpoint: it translates.
    tr = load_for_inference([out], search=SearchConfig(beam=2, max_len_b=3))
    assert len(tr.translate(["The cat sleeps ."])) == 1


def test_a_checkpoint_that_records_no_update_is_refused_naming_it(tiny_checkpoints, tmp_path):
    """A checkpoint another tool wrote may hold only the weights and the model config (what
    loading needs): an average, itself a checkpoint, needs its update, epoch and vocabulary
    sizes. One error naming the file (it was a KeyError's traceback)."""
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(tiny_checkpoints["b"], bare)
    state = load_checkpoint(bare)
    state.pop("update")
    torch.save(state, bare / "checkpoint.pt")
    (bare / "meta.json").unlink()
    with pytest.raises(ValueError, match=f"{bare}: the checkpoint records no update"):
        average_checkpoints([tiny_checkpoints["a"], str(bare)], tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_the_same_weights_given_twice_are_counted_once(tiny_checkpoints, tmp_path, caplog):
    """`average runs/x/checkpoint_*` also matches an epoch's end saved beside the checkpoint of
    the same update (checkpoint_<u>_epoch<N>: the same weights); best/ is a copy of one. Weights
    given twice count once in the mean, and the command says which it set aside."""
    a, b = tiny_checkpoints["a"], tiny_checkpoints["b"]
    run = tmp_path / "run"
    shutil.copytree(b, run / "checkpoint_00000050")
    shutil.copytree(a, run / "checkpoint_00000100")
    shutil.copytree(a, run / "checkpoint_00000100_epoch1")
    given = sorted(str(p) for p in run.glob("checkpoint_*"))
    assert main(["--out", str(tmp_path / "avg"), *given]) == 0
    assert f"{given[2]} holds the same weights as {given[1]}: counted once" in caplog.text
    sa, sb, avg = load_checkpoint(a), load_checkpoint(b), load_checkpoint(tmp_path / "avg")
    for k, v in avg["model"].items():  # the mean of two, not a weighed twice
        torch.testing.assert_close(v, (sa["model"][k] + sb["model"][k]) / 2)
    assert avg["averaged_from"] == given[:2]


def test_average_state_dicts_checks_shapes_and_integer_buffers():
    x = {"w": torch.ones(2), "n": torch.tensor([3])}
    y = {"w": torch.zeros(2), "n": torch.tensor([3])}
    assert torch.equal(average_state_dicts([x, y])["w"], torch.full((2,), 0.5))
    with pytest.raises(ValueError, match="shape"):
        average_state_dicts([x, {"w": torch.ones(3), "n": torch.tensor([3])}])
    with pytest.raises(ValueError, match="non-float"):
        average_state_dicts([x, {"w": torch.ones(2), "n": torch.tensor([4])}])
    with pytest.raises(ValueError, match="different parameters"):
        average_state_dicts([x, {"w": torch.ones(2)}])
    # float64 inputs are read, not summed into
    a, b = {"w": torch.tensor([2.0, 4.0], dtype=torch.float64)}, {"w": torch.zeros(2).double()}
    assert torch.equal(average_state_dicts([a, b])["w"], torch.tensor([1.0, 2.0]).double())
    assert torch.equal(a["w"], torch.tensor([2.0, 4.0], dtype=torch.float64))


def test_incompatible_checkpoints_are_refused(tiny_checkpoints, tmp_path):
    state = load_checkpoint(tiny_checkpoints["a"])
    other = PRESETS["tiny"]().replace(max_positions=128)
    state["model_config"] = other.to_dict()
    odd = save_checkpoint(tmp_path / "odd", state, spm_model=tiny_checkpoints["spm"])
    with pytest.raises(ValueError, match="different model configurations"):
        average_checkpoints([tiny_checkpoints["a"], odd], tmp_path / "avg")
    other_spm = tmp_path / "other.model"  # a checkpoint written with another BPE model
    other_spm.write_bytes(b"another model")
    copy = save_checkpoint(tmp_path / "other_bpe", load_checkpoint(tiny_checkpoints["b"]),
                           spm_model=str(other_spm))
    with pytest.raises(ValueError, match="different BPE"):
        average_checkpoints([tiny_checkpoints["a"], copy], tmp_path / "avg2")
    with pytest.raises(FileNotFoundError, match="no checkpoint.pt"):
        average_checkpoints([tmp_path], tmp_path / "avg3")


def test_cli(tiny_checkpoints, tmp_path, capsys):
    assert main([tiny_checkpoints["a"], tiny_checkpoints["b"], "--out",
                 str(tmp_path / "cli")]) == 0
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == \
        ["checkpoint.pt", "meta.json", "sentencepiece.model"]
    assert str(tmp_path / "cli") in capsys.readouterr().out
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch left
    # an --out that holds something is never written over (one line, exit 2); empty is fine
    before = {p.name: p.read_bytes() for p in (tmp_path / "cli").iterdir()}
    assert main([tiny_checkpoints["a"], "--out", str(tmp_path / "cli")]) == 2
    assert "exists and is not empty: give a new folder" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "cli").iterdir()} == before
    (tmp_path / "a_file").write_text("notes")  # a file is named as one
    assert main([tiny_checkpoints["a"], "--out", str(tmp_path / "a_file")]) == 2
    assert "a_file is a file: give a new folder" in capsys.readouterr().err
    assert (tmp_path / "a_file").read_text() == "notes"
    (tmp_path / "empty").mkdir()
    assert main([tiny_checkpoints["a"], "--out", str(tmp_path / "empty")]) == 0
    assert (tmp_path / "empty" / "meta.json").is_file()


@pytest.mark.parametrize("out", ["s3://team-bucket/runs/avg", "s3:/team-bucket/runs/avg"])
def test_cli_refuses_a_bucket_out_with_one_line(out, tiny_checkpoints, tmp_path, capsys,
                                                monkeypatch):
    # an average is local only (docs/storage.md): a bucket URI, or one that lost a slash on
    # its way through pathlib, is not made a local folder named "s3:"
    monkeypatch.chdir(tmp_path)
    assert main([tiny_checkpoints["a"], "--out", out]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--out {out}: an average is written to a local or shared " \
        "folder only; give a local path" in lines[0], lines
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_bucket_out_is_refused_without_its_signature_or_key(tiny_checkpoints, tmp_path,
                                                             capsys, monkeypatch):
    """The refusal of a bucket --out shows the URI as storage messages do (`shown`): no query
    (a presigned URL's signature) and no `KEY:SECRET@`; it printed the query whole."""
    monkeypatch.chdir(tmp_path)
    for out in ("s3://team-bucket/avg?X-Amz-Signature=SECRETSIG&X-Amz-Credential=AKIAEX:1",
                "s3://AKIAEX:SECRETSIG@team-bucket/avg"):
        assert main([tiny_checkpoints["a"], "--out", out]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "an average is written to a local" in err
        assert "SECRETSIG" not in err and "AKIAEX" not in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


class _Payload:
    """Unpickling this runs code (print): a stand-in for a malicious checkpoint."""

    def __reduce__(self):
        return (print, ("unsafe code ran",))


@pytest.mark.parametrize("case", ["missing", "corrupt", "unsafe", "not_ours"])
def test_cli_refuses_a_bad_checkpoint_with_one_line(case, tiny_checkpoints, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    data = (Path(tiny_checkpoints["a"]) / "checkpoint.pt").read_bytes()
    if case == "corrupt":
        (bad / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    elif case == "unsafe":
        torch.save({"model": {}, "model_config": {}, "x": _Payload()}, bad / "checkpoint.pt")
    elif case == "not_ours":
        torch.save({"weights": torch.ones(2)}, bad / "checkpoint.pt")
    rc = main([tiny_checkpoints["a"], str(bad), "--out", str(tmp_path / "avg")])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, captured.err
    assert str(bad) in lines[0] and "weights_only" not in lines[0]
    assert "unsafe code ran" not in captured.out
    expect = {"missing": "no checkpoint.pt", "corrupt": "truncated, corrupt",
              "unsafe": "refused: it holds pickled Python objects",
              "not_ours": "not a checkpoint of this project"}[case]
    assert expect in lines[0]
    assert not (tmp_path / "avg" / "checkpoint.pt").exists()  # nothing written


def test_a_checkpoint_file_is_averaged_as_its_folder(tiny_checkpoints, tmp_path):
    """`average --out OUT CKPT/checkpoint.pt`: the file's folder holds the text pipeline the
    average needs to translate, and it goes with the weights."""
    files = [str(Path(tiny_checkpoints[k]) / "checkpoint.pt") for k in ("a", "b")]
    out = average_checkpoints(files, tmp_path / "avg")
    assert sorted(p.name for p in out.iterdir()) == \
        ["checkpoint.pt", "meta.json", "sentencepiece.model"]
    assert load_checkpoint(out)["averaged_from"] == files
    tr = load_for_inference([out], search=SearchConfig(beam=2, max_len_b=3))
    assert len(tr.translate(["The cat sleeps ."])) == 1


@pytest.mark.parametrize("given", ["folder", "file"])
def test_a_checkpoint_whose_sentencepiece_model_was_cut_is_refused_by_folder_or_file(
        given, tiny_checkpoints, tmp_path, capsys):
    """A checkpoint folder whose sentencepiece.model is shorter than its meta.json records (a
    copy cut short) is not averaged, whether given by its folder or by its checkpoint.pt:
    one line naming the folder, nothing written (the average would record the cut file as
    whole in its own meta.json)."""
    half = tmp_path / "half"
    shutil.copytree(tiny_checkpoints["a"], half)
    spm = (half / "sentencepiece.model").read_bytes()
    (half / "sentencepiece.model").write_bytes(spm[:1000])
    arg = str(half if given == "folder" else half / "checkpoint.pt")
    assert main(["--out", str(tmp_path / "avg"), arg]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"python -m convs2s average: error: {half} is not a whole checkpoint: its "
                     "files are not the sizes its meta.json records (a copy cut short, or a "
                     "folder half replaced); copy it again or pick another checkpoint of the "
                     "run"], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half"]  # nothing written


@pytest.mark.parametrize("given", ["folder", "file"])
def test_a_checkpoint_without_its_text_pipeline_is_refused(given, tiny_checkpoints, tmp_path,
                                                           capsys):
    """Weights alone (a checkpoint.pt copied out of its folder) would average to a model that
    cannot translate: one line naming the checkpoint and the fix, nothing written."""
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copyfile(Path(tiny_checkpoints["a"]) / "checkpoint.pt", bare / "checkpoint.pt")
    arg = str(bare if given == "folder" else bare / "checkpoint.pt")
    assert main([arg, "--out", str(tmp_path / "avg")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m convs2s average: error: {arg}: "
                                                   "no sentencepiece.model or text.json in") \
        and "give the checkpoint's own folder" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare"]  # nothing written


def test_an_out_inside_a_checkpoint_it_averages_is_refused(tiny_checkpoints, tmp_path, capsys):
    """`average --out RUN/checkpoint_X/avg RUN/checkpoint_X ...` wrote the average inside an
    input's folder, which the run removes or replaces whole (keep_last, a new best/): refused
    in one line, nothing written (import and export refused the same already)."""
    a = tmp_path / "a"
    shutil.copytree(tiny_checkpoints["a"], a)
    for arg in (str(a), str(a / "checkpoint.pt")):
        assert main([arg, tiny_checkpoints["b"], "--out", str(a / "avg")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"--out {a / 'avg'} lies inside the checkpoint {a}" in \
            lines[0], lines
    assert sorted(p.name for p in a.iterdir()) == ["checkpoint.pt", "meta.json",
                                                   "sentencepiece.model"]
