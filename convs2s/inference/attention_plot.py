"""Per-layer attention heatmaps of translated sentences, as in the paper's appendix C (PNG files).

The search returns only the mean attention over the decoder's attention layers. The per-layer
maps are read here without touching the model code: forward hooks on every decoder block's
`Attention` module record the B x T x S map each one returns, during one teacher-forced
decoder pass over the translation the search produced (the same prefix the search scored, so
the mean of the recorded maps is the search's attention: equal in float32, close in bf16 and
int8, whose one pass over the whole prefix rounds, and scales its int8 activations, otherwise
than the search's step-by-step one).

    from convs2s.inference.attention_plot import plot_attention
    paths = plot_attention(translator, ["the cat is small ."], "out/attention")
    # out/attention/attention_000.png: one panel per attention layer, plus the layer mean

Run: python -m convs2s attention --checkpoint runs/demo/best --out pics "the cat is small ."

`--out` is new, empty, or a folder this command wrote before: its `.convs2s-attention.json`
lists the PNGs it wrote, which a rerun replaces (and removes those it no longer writes); a
folder holding anything else is refused, unchanged. Each PNG is written under a temporary
name and renamed into place, so an interrupted run never leaves a truncated one.
Figures are built on matplotlib's object API (no pyplot state), so threads and Ray tasks can
draw at the same time.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from pathlib import Path

import torch
from matplotlib.figure import Figure

from convs2s.config import EOS, PAD


def layer_attention(model, src_ids: list[int], hyp_ids: list[int]) -> torch.Tensor:
    """Attention of every attention layer of `model` for one sentence: A x T x S.

    src_ids: source ids ending in EOS (S); hyp_ids: output ids ending in EOS (T). The decoder
    reads [EOS] + hyp_ids[:-1] (teacher forcing), so row t is the attention while emitting
    hyp_ids[t].
    """
    maps: list[torch.Tensor] = []
    hooks = [blk.attention.register_forward_hook(lambda _m, _in, out: maps.append(out[1]))
             for blk in model.decoder.blocks if blk.attention is not None]
    dev = next(model.parameters()).device
    src = torch.tensor([src_ids], device=dev)  # 1 x S
    prev = torch.tensor([[EOS] + hyp_ids[:-1]], device=dev)  # 1 x T
    was_training = model.training
    try:
        model.eval()
        with torch.inference_mode():
            enc = model.encode(src, src.ne(PAD).sum(1))
            model.decode(prev, enc)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return torch.stack([m[0].float().cpu() for m in maps])  # A x T x S


def attention_figure(maps: torch.Tensor, src_labels: list[str], hyp_labels: list[str],
                     title: str = "") -> Figure:
    """One heatmap per layer (rows: output pieces, columns: source pieces) and their mean."""
    panels = [(f"layer {i + 1}", m) for i, m in enumerate(maps)] + [("mean", maps.mean(0))]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    S, T = maps.shape[2], maps.shape[1]
    cell = 0.28  # inches per token: labels stay readable for sentences of ~40 pieces
    fig = Figure(figsize=(cols * max(3.0, S * cell + 1.5), rows * max(3.0, T * cell + 1.2)),
                 layout="constrained")
    for k, (name, m) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        im = ax.imshow(m.numpy(), cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(S), src_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(T), hyp_labels, fontsize=7)
    fig.colorbar(im, ax=fig.axes, shrink=0.6)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


MANIFEST = ".convs2s-attention.json"  # in --out: the PNGs this command wrote there
_TEMPORARY = re.compile(r"^\.convs2s-attention\.[0-9a-f]{8}\.tmp$")  # ours, while writing


def _own_files(out_dir: Path) -> list[str]:
    """The PNGs an earlier run wrote to `out_dir` (its manifest), after checking that the
    folder holds nothing else: refused (FileExistsError, nothing changed) otherwise."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {out_dir} is a file: give a folder for the PNG files")
    if not out_dir.is_dir():
        return []
    manifest = out_dir / MANIFEST
    listed: list[str] = []
    if manifest.is_file():
        try:
            listed = json.loads(manifest.read_text())["files"]
            if not isinstance(listed, list) or not all(  # plain names of PNGs in the folder
                    isinstance(n, str) and n == Path(n).name and n.endswith(".png")
                    and not n.startswith(".") for n in listed):
                raise ValueError("not a list of PNG file names")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise FileExistsError(f"--out {out_dir}: {MANIFEST} is not the list this command "
                                  f"writes ({err}); give a new or empty folder") from None
    theirs = sorted(p.name for p in out_dir.iterdir()
                    if p.name != MANIFEST and p.name not in listed
                    and not _TEMPORARY.match(p.name))
    if theirs:
        shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3
                                         else "")
        raise FileExistsError(f"--out {out_dir} holds files this command did not write "
                              f"({shown}): give a new or empty folder, or one an earlier "
                              f"`attention` run wrote (its {MANIFEST}); nothing was changed")
    for p in out_dir.iterdir():  # what an interrupted run left under a temporary name
        if _TEMPORARY.match(p.name):
            p.unlink(missing_ok=True)
    return listed


def _replace(out_dir: Path, name: str, write) -> None:
    """`write(path)` to a temporary name in `out_dir`, then renamed to `name`: whole or not
    at all under that name."""
    tmp = out_dir / f".convs2s-attention.{uuid.uuid4().hex[:8]}.tmp"
    try:
        write(tmp)
        os.replace(tmp, out_dir / name)
    finally:
        tmp.unlink(missing_ok=True)


def _list(out_dir: Path, names) -> None:
    _replace(out_dir, MANIFEST, lambda p: p.write_text(json.dumps({"files": sorted(names)},
                                                                  indent=1)))


def plot_attention(translator, lines: list[str], out_dir: str | os.PathLike,
                   model_index: int = 0, prefix: str = "attention") -> list[Path]:
    """Translate `lines` and save one PNG per non-empty line with the per-layer attention of
    model `model_index` of the translator (an ensemble's models attend differently).

    `out_dir` is new, empty, or one this function wrote (its MANIFEST lists the PNGs): those
    are replaced, and the ones this run does not write again removed; a folder holding any
    other file is refused (FileExistsError) before anything is written."""
    from storage import location

    out_dir = location(out_dir)  # (file:// too; "s3:/x" refused)
    if not isinstance(out_dir, Path):
        raise ValueError(f"--out {out_dir}: the pictures go to a local folder (log or copy "
                         "them to a bucket afterwards)")
    before = _own_files(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, codec = translator.models[model_index], translator.codec
    paths: list[Path] = []
    for i, tr in enumerate(translator.translate_full(lines)):
        if not tr.hypotheses:
            continue
        hyp = tr.hypotheses[0]
        src_ids = codec.source_ids(tr.src_pieces) + [EOS]
        maps = layer_attention(model, src_ids, hyp.tokens)
        fig = attention_figure(maps, tr.src_pieces + ["</s>"],
                               [codec.target_piece(t) for t in hyp.tokens[:-1]] + ["</s>"],
                               title=f"{tr.source}\n-> {hyp.text}")
        path = out_dir / f"{prefix}_{i:03d}.png"
        # listed before it appears under its name: an interrupted run's files stay ours
        _list(out_dir, {*before, *(p.name for p in paths), path.name})
        _replace(out_dir, path.name, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
        paths.append(path)
    written = {p.name for p in paths}
    for name in set(before) - written:  # an earlier run's PNGs this run did not write again
        (out_dir / name).unlink(missing_ok=True)
    _list(out_dir, written)
    return paths
