"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints (torch only).

Averaging the last N checkpoints of one run is the reference implementation's cheap ensemble
(scripts/average_checkpoints.py): one model, the cost of one model at inference. Parameters are
averaged as stored, i.e. the weight-norm gains g and directions v separately, as the reference
does with its state dicts.

    from convs2s.io.averaging import average_checkpoints
    out = average_checkpoints(["runs/demo/checkpoint_00000300", "runs/demo/checkpoint_00000400"],
                              "runs/demo/averaged_last2")
    # out/checkpoint.pt + out/sentencepiece.model + out/meta.json: a checkpoint like any other

Run: python -m convs2s average --out runs/demo/avg runs/demo/checkpoint_*

Weights given twice count once (the glob also matches an epoch's end saved beside the
checkpoint of the same update, `checkpoint_<u>_epoch<N>`), with a line naming the one set aside.

The sum is accumulated in float64 and cast back to each tensor's dtype, so the average of N
identical checkpoints is bit-identical to them. The result keeps only what inference needs
(weights, model config, vocabulary sizes, epoch/update of the newest input) — no optimizer
state — so `average_checkpoints([path], out)` also makes a slim copy for serving.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

import torch

from convs2s.io.checkpoint import (CHECKPOINT_FILE, REQUIRED_KEYS, SPM_FILE, load_checkpoint,
                                  save_checkpoint)
from convs2s.io.text_codec import TEXT_FILE, checkpoint_folder, codec_files, local_checkpoint
from storage import StorageError, location
from storage.paths import shown

log = logging.getLogger(__name__)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/+")  # "s3://" and "s3:/" alike

KEEP = ("model_config", "src_vocab_size", "tgt_vocab_size", "train_config", "epoch", "update",
        "val_loss")


def _start(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A running sum: float tensors in float64, other tensors (integer buffers) as they are."""
    return {k: v.to(torch.float64, copy=True) if v.is_floating_point() else v.clone()
            for k, v in state.items()}


def _add(total: dict, state: dict, name: str, ref: str) -> None:
    """total += state, after checking that both hold the same tensors of the same shapes."""
    if state.keys() != total.keys():
        diff = sorted(set(state) ^ set(total))[:5]
        raise ValueError(f"{name} and {ref} hold different parameters (e.g. {diff}): only "
                         "checkpoints of the same model configuration can be averaged")
    for k, v in state.items():
        if v.shape != total[k].shape:
            raise ValueError(f"{name}: {k} has shape {tuple(v.shape)}, {ref} has "
                             f"{tuple(total[k].shape)}")
        if v.is_floating_point():
            total[k] += v.to(torch.float64)
        elif not torch.equal(v, total[k]):
            raise ValueError(f"{name}: non-float tensor {k} differs from {ref}")


def _finish(total: dict, like: dict, n: int) -> dict[str, torch.Tensor]:
    """The mean, cast back to the dtypes of `like`."""
    return {k: (v / n).to(like[k].dtype) if like[k].is_floating_point() else v
            for k, v in total.items()}


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Mean of floating-point tensors; other tensors (integer buffers) must be equal."""
    if not states:
        raise ValueError("nothing to average")
    total = _start(states[0])
    for i, state in enumerate(states[1:], 1):
        _add(total, state, f"state dict {i}", "state dict 0")
    return _finish(total, states[0], len(states))


def _fingerprint(state: dict[str, torch.Tensor]) -> str:
    """A digest of a state dict's names, dtypes and bytes: equal only for the same weights."""
    h = hashlib.blake2b(digest_size=16)
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous().reshape(-1)
        h.update(f"{k}|{t.dtype}|".encode())
        h.update(memoryview(t.view(torch.uint8).numpy()))
    return h.hexdigest()


def _local_out(out_dir: str | os.PathLike) -> Path:
    """`out_dir` as a local path; a bucket URI (also one that lost a slash going through
    pathlib: "s3:/bucket/x") is refused, not made a local folder named "s3:". An average is
    renamed into place whole, which a bucket cannot do."""
    text = str(out_dir)
    scheme = _SCHEME.match(text)
    if scheme and scheme[1].lower() != "file":
        raise StorageError(f"--out {shown(text)}: an average is written to a local or shared "
                           "folder only; give a local path (and copy the folder to the bucket "
                           "afterwards if it belongs there)")
    return location(text)  # (file:// too)


def _text_files(path: Path, given: str) -> list[Path]:
    """The text pipeline of checkpoint `path` (a checkpoint directory, or a checkpoint.pt file:
    its folder's): the files an average must carry to translate. Refused (ValueError) when
    the folder holds none, or lacks one that its text.json names."""
    folder = checkpoint_folder(path)
    files = codec_files(folder)
    if not files:
        raise ValueError(f"{given}: no {SPM_FILE} or {TEXT_FILE} in {folder}, so an average "
                         "of it could not translate; give the checkpoint's own folder (a "
                         "run's checkpoint_* or best/, or an imported model), which holds "
                         "its text pipeline")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{given}: {folder} lacks {', '.join(missing)} that its {TEXT_FILE} "
                         "names: copy the whole checkpoint folder (or import the model again)")
    return files


def _averageable(state: dict, given: str) -> dict:
    """`state` when it records what an average keeps and a checkpoint must hold (its update,
    epoch and vocabulary sizes: every checkpoint this project writes or imports does); else a
    ValueError naming the file (a file another tool wrote was a KeyError's traceback)."""
    missing = sorted(set(REQUIRED_KEYS) - set(state))
    if missing:
        raise ValueError(f"{given}: the checkpoint records no {', '.join(missing)}: only "
                         "checkpoints of this project's training (or import-fairseq) can be "
                         "averaged")
    return state


def average_checkpoints(paths: list[str | os.PathLike], out_dir: str | os.PathLike) -> Path:
    """Write the average of the checkpoint directories `paths` (or their checkpoint.pt files)
    to `out_dir`; returns it.

    Checkpoints are read one at a time into a running float64 sum (memory: about five or six
    models in float32: the sum, twice a model; the first checkpoint's weights, kept as the
    template; one checkpoint as saved, its optimizer state with it).
    `out_dir` must be a local (or shared) folder, new or empty (an average never replaces what
    is there); it is written beside it and renamed into place whole, the weights with their
    text pipeline.
    """
    as_given = [str(p) for p in paths]  # (a bucket's URIs), for the record
    out_dir = _local_out(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} " + ("exists and is not empty" if out_dir.is_dir()
                                               else "is a file") + ": give a new folder to "
                              "--out (an average never writes over what is there)")
    paths = [local_checkpoint(p) for p in paths]  # a bucket's: fetched once per node
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    for given, path in zip(as_given, paths):  # (as import / export refuse it)
        folder = checkpoint_folder(path).resolve()
        if isinstance(location(given), Path) and (folder / CHECKPOINT_FILE).is_file() \
                and out_dir.resolve().is_relative_to(folder):
            raise FileExistsError(f"--out {out_dir} lies inside the checkpoint {folder} that "
                                  "this command reads: a run removes or replaces a checkpoint's "
                                  "folder whole (keep_last, a new best/), the average with it; "
                                  "give a folder outside it")
    first = _averageable(load_checkpoint(paths[0]), as_given[0])
    # The text pipeline travels with the weights: the sentencepiece model, or an imported
    # model's dictionaries, BPE codes and text.json (convs2s.io.text_codec); a checkpoint.pt
    # file's are those of its folder.
    texts = [_text_files(paths[0], as_given[0])]
    like = first["model"]
    total, newest = _start(like), {k: first[k] for k in KEEP if k in first}
    del first  # keep only the weights and the metadata (not the optimizer state)
    # Weights given twice are counted once: `checkpoint_*` matches an epoch's end saved beside
    # the checkpoint of the same update (the trainer's checkpoint_<u>_epoch<N>), and best/ is a
    # copy of one of them; counted twice, they would weigh double in the mean.
    seen, counted = {_fingerprint(like): as_given[0]}, [as_given[0]]
    for p, given in zip(paths[1:], as_given[1:]):
        state = _averageable(load_checkpoint(p), given)
        if state["model_config"] != newest["model_config"]:
            raise ValueError(f"{p} and {paths[0]} have different model configurations: "
                             "only checkpoints of one model can be averaged")
        texts.append(files := _text_files(p, given))
        if [f.name for f in files] != [f.name for f in texts[0]] or \
                any(a.read_bytes() != b.read_bytes() for a, b in zip(files, texts[0])):
            raise ValueError(f"{p} and {paths[0]} were trained on different BPE vocabularies "
                             "(sentencepiece model, or dictionaries and codes) and cannot be "
                             "averaged")
        if (same := seen.get(digest := _fingerprint(state["model"]))) is not None:
            log.warning("%s holds the same weights as %s: counted once", given, same)
            del state
            continue
        seen[digest] = given
        counted.append(given)
        _add(total, state["model"], str(p), str(paths[0]))
        if state["update"] >= newest["update"]:
            newest = {k: state[k] for k in KEEP if k in state}
        del state
    out = dict(newest)
    if len(counted) > 1:
        out["val_loss"] = None  # the inputs' validation losses do not describe the average
    out.update(model=_finish(total, like, len(counted)),
               averaged_from=counted)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.averaging-{uuid.uuid4().hex[:8]}"
    try:
        save_checkpoint(tmp, out, text_files=tuple(str(f) for f in texts[0]))
        if out_dir.is_dir():
            out_dir.rmdir()  # (empty: checked above)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # what this call wrote, if it did not finish
    return out_dir
