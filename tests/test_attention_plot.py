"""Tests of convs2s.inference.attention_plot: per-layer attention read by forward hooks, PNG
heatmaps.

Run: .venv/bin/python -m pytest tests/test_attention_plot.py -q
"""

from __future__ import annotations

import json

import matplotlib.image
import torch

from convs2s.inference.attention_plot import layer_attention, plot_attention
from convs2s.cli import attention as main
from convs2s.config import EOS, SearchConfig
from convs2s.inference.translate import load_for_inference

SEARCH = SearchConfig(beam=2, max_len_a=0, max_len_b=6)
MANIFEST = ".convs2s-attention.json"  # in --out: the files the command wrote there


def test_layer_maps_average_to_the_search_attention(tiny_checkpoints):
    tr = load_for_inference([tiny_checkpoints["a"]], search=SEARCH)
    line = "The old cat sleeps near the house ."
    t = tr.translate_full([line])[0]
    hyp = t.hypotheses[0]
    src_ids = tr.codec.source_ids(t.src_pieces) + [EOS]
    model = tr.models[0]
    maps = layer_attention(model, src_ids, hyp.tokens)
    n_layers = sum(b.attention is not None for b in model.decoder.blocks)
    assert maps.shape == (n_layers, len(hyp.tokens), len(src_ids))  # A x T x S
    torch.testing.assert_close(maps.sum(-1), torch.ones(n_layers, len(hyp.tokens)))
    # Teacher forcing on the search's own output reproduces its (layer-mean) attention.
    torch.testing.assert_close(maps.mean(0).t(), hyp.attention, atol=1e-5, rtol=1e-4)
    assert all(not b.attention._forward_hooks for b in model.decoder.blocks)  # hooks removed


def test_plot_attention_writes_one_png_per_sentence(tiny_checkpoints, tmp_path):
    tr = load_for_inference([tiny_checkpoints["a"]], search=SEARCH)
    paths = plot_attention(tr, ["The cat sleeps .", "", "A dog runs near the river ."],
                           tmp_path / "pics")
    assert [p.name for p in paths] == ["attention_000.png", "attention_002.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = matplotlib.image.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 300


def test_cli(tiny_checkpoints, tmp_path, capsys):
    assert main(["--checkpoint", tiny_checkpoints["b"], "--out", str(tmp_path),
                 "--max-len-b", "5", "The cat sleeps ."]) == 0
    assert (tmp_path / "attention_000.png").is_file()
    assert "attention_000.png" in capsys.readouterr().out


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_out_holding_someone_elses_files_is_refused_unchanged(tiny_checkpoints, tmp_path,
                                                              capsys):
    """A folder with files this command did not write (even one named like its PNGs) is not
    written to: one line, exit 2, every file as it was."""
    pics = tmp_path / "pics"
    pics.mkdir()
    (pics / "attention_000.png").write_bytes(b"a user's own picture")
    (pics / "notes.txt").write_text("a user's notes")
    before = _files(pics)
    assert main(["--checkpoint", tiny_checkpoints["a"], "--out", str(pics), "--max-len-b", "5",
                 "The cat sleeps ."]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--out {pics} holds files this command did not write " \
        "(attention_000.png, notes.txt): give a new or empty folder" in lines[0], lines
    assert _files(pics) == before


def test_a_rerun_replaces_exactly_the_files_it_wrote(tiny_checkpoints, tmp_path):
    """The folder lists what the command wrote (its manifest); a rerun with fewer sentences
    replaces those and removes the ones it no longer writes, so no stale PNG is left; a
    temporary file an interrupted run left is its own and removed too."""
    tr = load_for_inference([tiny_checkpoints["a"]], search=SEARCH)
    pics = tmp_path / "pics"
    first = plot_attention(tr, ["The cat sleeps .", "A dog runs ."], pics)
    assert sorted(p.name for p in pics.iterdir()) == \
        [MANIFEST, "attention_000.png", "attention_001.png"]
    assert json.loads((pics / MANIFEST).read_text())["files"] == [p.name for p in first]
    (pics / ".convs2s-attention.0123abcd.tmp").write_bytes(b"\x89PNG half written")
    again = plot_attention(tr, ["The dog sleeps ."], pics)
    assert [p.name for p in again] == ["attention_000.png"]
    assert sorted(p.name for p in pics.iterdir()) == [MANIFEST, "attention_000.png"]
    assert json.loads((pics / MANIFEST).read_text())["files"] == ["attention_000.png"]
    assert matplotlib.image.imread(again[0]).ndim == 3  # a whole PNG
