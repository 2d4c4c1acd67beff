"""Checkpoint directories: save, load (torch only, no Ray), list and pick them.

A checkpoint is a directory (docs/design.md) holding
- `checkpoint.pt`: `{"model", "model_config", "src_vocab_size", "tgt_vocab_size",
  "train_config", "epoch", "update", "optimizer", "scheduler", "rng", "val_loss", ...}`,
  loadable with `torch.load(weights_only=True)` (only tensors, dicts, lists, numbers, strings);
- `sentencepiece.model`: the BPE model, so a checkpoint translates on its own;
- `meta.json`: epoch / update / val_loss / end_of_epoch, so listing a run needs no torch.load;
  the sizes of the folder's files and checkpoint.pt's SHA-256, checked before it loads.

    model, meta = load_model("/runs/demo/checkpoint_00000120")      # eval mode, on CPU
    infos = list_checkpoints("/runs/demo")                          # oldest first
    last5 = pick_checkpoints(infos, last=5, epoch_ends_only=True)   # e.g. for averaging
    best = best_checkpoint("/runs/demo")                            # <run>/best, lowest val loss

A training run `<storage_path>/<run_name>` keeps its last K checkpoints as
`checkpoint_<update>` directories (Ray Train's retention) and a copy of the best one in `best/`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from convs2s.config import OPTIMIZER_KEYS, ModelConfig
from convs2s.io.text_codec import checkpoint_folder, local_checkpoint
from storage import is_uri, local_copy, location, publish_dir, synced

CHECKPOINT_FILE = "checkpoint.pt"
SPM_FILE = "sentencepiece.model"
META_FILE = "meta.json"
# What a checkpoint this project writes always holds (`save_checkpoint` refuses less; loading
# needs only the first two: a file another tool wrote may hold no more)
REQUIRED_KEYS = ("model", "model_config", "src_vocab_size", "tgt_vocab_size", "epoch", "update")
BEST_DIR = "best"


def checkpoint_dir_name(update: int, epoch_end: int | None = None,
                        validated: bool = False) -> str:
    """Directory name of the checkpoint taken after `update` updates (sorts by update). An
    epoch's end at an update that already has a checkpoint (an interval checkpoint at the
    epoch's last update, or the one a rerun resumed from) is `..._epoch<N>`, a validation
    inside an epoch at such an update `..._validated`: two checkpoints of one name made Ray
    Train delete the folder it still listed as the latest."""
    name = f"checkpoint_{update:08d}"
    if epoch_end is not None:
        return f"{name}_epoch{epoch_end}"
    return f"{name}_validated" if validated else name


def save_checkpoint(directory: str | os.PathLike, state: dict, spm_model: str | None = None,
                    end_of_epoch: bool = False, text_files: tuple[str, ...] = (),
                    durable: bool = True) -> Path:
    """Write `state` (the dict described above) to `directory`, with the sentencepiece model
    or the `text_files` of another text pipeline (convs2s.io.text_codec) beside it; returns the
    directory.

    Files are written under temporary names and renamed, so a crash never leaves a truncated
    checkpoint.pt behind; each reaches the disk before its rename, and the folder's entries
    after meta.json's (`storage.synced`): at a power loss a rename can reach the disk before
    the bytes it names, an empty checkpoint.pt under its final name. `durable=False`: not
    flushed, for a scratch folder that is copied elsewhere and deleted (the trainer's: the run
    folder's copy is flushed by `publish_dir`; Ray Train's upload into storage is Ray's own).
    """
    sync = synced if durable else Path
    missing = set(REQUIRED_KEYS) - set(state)
    if missing:
        raise ValueError(f"checkpoint state lacks {sorted(missing)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (CHECKPOINT_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(sync(tmp), directory / CHECKPOINT_FILE)
    if spm_model:  # local, or a bucket's (fetched once per node)
        sync(shutil.copyfile(local_copy(spm_model), directory / SPM_FILE))
    for path in text_files:
        if location(path).name != SPM_FILE or not spm_model:
            sync(shutil.copyfile(local_copy(path), directory / location(path).name))
    meta = {"epoch": int(state["epoch"]), "update": int(state["update"]),
            "val_loss": state.get("val_loss"), "end_of_epoch": bool(end_of_epoch),
            # (Ray Train copies the folder into storage file by file, under the final names, in
            # no set order: a copy cut short is told by the sizes, of every file beside it too)
            "checkpoint_bytes": (directory / CHECKPOINT_FILE).stat().st_size,
            # (torch.load checks no checksum: a bit flipped on a disk or in a copy loads as
            # other weights, or fails deep inside the unpickler; `load_checkpoint` checks it)
            "checkpoint_sha256": file_sha256(directory / CHECKPOINT_FILE),
            "file_bytes": {f.name: f.stat().st_size for f in sorted(directory.iterdir())
                           if f.is_file() and f.name != META_FILE
                           and not f.name.endswith(".tmp")}}
    # what a resume must keep, read without loading the weights (convs2s.train.data.preflight)
    for key in ("seed", "shuffle_buffer"):  # the epoch's plan (convs2s.train.data)
        if (value := (state.get("train_config") or {}).get(key)) is not None:
            meta[key] = int(value)
    # the schedule whose state the checkpoint holds (another's would read it as its own)
    if (value := (state.get("train_config") or {}).get("lr_schedule")) is not None:
        meta["lr_schedule"] = str(value)
    for key in OPTIMIZER_KEYS:  # what the optimizer's saved state was made with
        if (value := (state.get("train_config") or {}).get(key)) is not None:
            meta[key] = value
    if (micro := micro_batches_per_update(state)) is not None:  # the update's size
        meta["micro_batches_per_update"] = micro
    for key in ("model_config", "src_vocab_size", "tgt_vocab_size"):  # the model it holds
        if state.get(key) is not None:
            meta[key] = state[key]
    if state.get("train_data"):
        meta["train_data"] = state["train_data"]
    # meta.json last and whole: a checkpoint is listed (list_checkpoints) only once complete.
    tmp = directory / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(sync(tmp), directory / META_FILE)
    sync(directory)  # its renames
    return directory


def file_sha256(file: Path) -> str:
    """The SHA-256 of a local file, read in 8 MiB pieces (about 1.7 GB/s on the dev hosts)."""
    import hashlib

    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(1 << 23):
            digest.update(chunk)
    return digest.hexdigest()


def micro_batches_per_update(state: dict) -> int | None:
    """The update's size a checkpoint was trained with, in micro-batches over all ranks (its
    ranks x its update_freq; each one batch of the data's cut), or None for a state that does
    not say."""
    world, freq = state.get("world_size"), (state.get("train_config") or {}).get("update_freq")
    return None if world is None or freq is None else int(world) * int(freq)


class CheckpointError(RuntimeError):
    """A checkpoint (or its sentencepiece model) is missing, unreadable or inconsistent."""


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The state dict of a checkpoint directory (or of a checkpoint.pt file), weights only.

    A missing file raises FileNotFoundError; a file that is not a checkpoint of this project
    (truncated, another format) or that holds anything but tensors and plain containers (a
    pickled object: possibly code, never loaded) raises CheckpointError. Both say which file."""
    import pickle

    # a bucket's: fetched once per node, a checkpoint.pt with its folder (file://: its local
    # path); given as the folder or its checkpoint.pt, the folder is checked the same way
    path = local_checkpoint(path)
    folder = checkpoint_folder(path)
    file = path / CHECKPOINT_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no {CHECKPOINT_FILE} in {path}: give a checkpoint directory of a training run "
            "(e.g. <storage_path>/<run_name>/best)"
        )
    if file == folder / CHECKPOINT_FILE and (folder / META_FILE).is_file() \
            and _whole(folder) is None:
        # the sizes meta.json records do not match: a copy cut short, or a folder a second
        # writer left half replaced (new weights beside the old vocabulary)
        raise CheckpointError(
            f"{folder} is not a whole checkpoint: its files are not the sizes its {META_FILE} "
            "records (a copy cut short, or a folder half replaced); copy it again or pick "
            "another checkpoint of the run")
    if file == folder / CHECKPOINT_FILE and (want := _recorded_sha256(folder)) is not None \
            and file_sha256(file) != want:
        raise CheckpointError(
            f"{file} is damaged: its bytes are not the ones its {META_FILE} records (SHA-256; "
            "a disk or a copy changed them); copy the checkpoint again from where it was "
            "saved, or pick another checkpoint of the run")
    try:
        with warnings.catch_warnings():
            # A pickle of another protocol is refused below with its own message; torch's
            # warning about the protocol would only precede it.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        # The weights-only unpickler refuses two things: a pickle that names Python classes or
        # functions to import (possibly code), and bytes that are no pickle at all (random or
        # damaged data: not a checkpoint, and no threat either).
        if not _names_python_objects(file):
            raise CheckpointError(_not_a_checkpoint(file)) from None
        if "argparse.Namespace" in str(err):  # the reference's saved arguments: its model.pt
            raise CheckpointError(
                f"{file} is a checkpoint of the reference implementation (fairseq: its saved "
                "arguments are an argparse.Namespace), not of this project: convert its "
                "archive folder with `python -m convs2s import-fairseq ARCHIVE --out DIR` "
                "and give DIR") from None
        raise CheckpointError(
            f"{file} was refused: it holds pickled Python objects besides tensors, which could "
            "run code when loaded; only checkpoints written by this project's training load "
            "(re-export it from the run that made it)") from None
    except MemoryError:  # (not the file's fault: said as itself)
        raise
    except Exception:  # noqa: BLE001 - damaged bytes raise whatever the objects they build
        # do (an empty stack, an unknown memo key, a dict where a storage belongs: TypeError,
        # AttributeError, AssertionError ... from torch's rebuild functions)
        raise CheckpointError(_not_a_checkpoint(file)) from None
    if not isinstance(state, dict) or "model" not in state or "model_config" not in state:
        raise CheckpointError(f"{file} is a torch file but not a checkpoint of this project "
                              "(no model weights and model_config); pick a checkpoint_* or "
                              "best/ directory of a training run")
    if not isinstance(state["model"], dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state["model"].items()):
        raise CheckpointError(_not_a_checkpoint(file))  # (damaged into other containers)
    return state


def _recorded_sha256(folder: Path) -> str | None:
    """checkpoint.pt's SHA-256 as the folder's meta.json records it; None for a checkpoint
    written before digests were recorded (trusted as before), or a meta.json without one."""
    try:
        want = json.loads((folder / META_FILE).read_text()).get("checkpoint_sha256")
    except (OSError, ValueError, AttributeError):  # (unreadable: `_whole` has said so)
        return None
    return want if isinstance(want, str) else None


def intact(path) -> bool:
    """Whether checkpoint folder `path`'s checkpoint.pt is the bytes its meta.json records
    (SHA-256; True where none is recorded). A bucket's is fetched (once per node: the load
    that follows reads the same copy)."""
    folder = local_checkpoint(path)
    want = _recorded_sha256(folder)
    return want is None or file_sha256(folder / CHECKPOINT_FILE) == want


def _names_python_objects(file: Path) -> bool:
    """Whether `file` is a well-formed pickle (or torch zip archive) that imports Python names.
    Read with pickletools, which parses opcodes and runs nothing."""
    import pickletools
    import zipfile

    try:
        if zipfile.is_zipfile(file):
            with zipfile.ZipFile(file) as z:
                name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
                data = z.read(name) if name else b""
        else:
            data = file.read_bytes()
        imports = False
        for op, _, _ in pickletools.genops(data):
            imports = imports or op.name in ("GLOBAL", "STACK_GLOBAL", "INST")
        return imports
    except Exception:  # noqa: BLE001 - any parse failure: not a pickle at all
        return False


def _not_a_checkpoint(file: Path) -> str:
    return (f"{file} is not a readable checkpoint of this project: the file is truncated, "
            "corrupt or of another format; copy it again or pick another checkpoint of the run")


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """Rebuild the model of a checkpoint for inference -> (ConvS2S in eval mode, meta dict).

    `meta` holds everything but the weights and the optimizer state, plus `path` and
    `spm_model` (the path of the bundled sentencepiece model, or None).
    """
    # imported here: listing checkpoints needs no model code
    from convs2s.model.network import ConvS2S

    shown, path = str(path), local_checkpoint(path)
    state = load_checkpoint(path, map_location="cpu")
    cfg = ModelConfig.from_dict(state["model_config"])
    model = ConvS2S(cfg, state["src_vocab_size"], state["tgt_vocab_size"])
    model.load_state_dict(state["model"])
    model.to(device).eval()
    directory = checkpoint_folder(path)
    spm = directory / SPM_FILE
    meta = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    meta["path"] = shown if is_uri(shown) else str(directory)
    meta["spm_model"] = str(spm) if spm.is_file() else None
    return model, meta


# --- RNG state (stored per rank so a resumed run continues the same random streams) --------------


def capture_rng_state() -> dict:
    """torch (CPU and this rank's CUDA device), Python and NumPy generator states as
    weights_only-safe objects. Only the device this process uses: a rank restored onto a node
    with another number of visible GPUs finds its own state."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }


def restore_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        cuda = cuda_state_for_device(state["cuda"], torch.cuda.current_device())
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def cuda_state_for_device(states: list, device: int):
    """The saved CUDA generator state for this process's device, or None (a CPU checkpoint).
    One entry: this project's format (the saving rank's own device). Several: an older
    checkpoint that held every visible GPU's state; its entry for this device index if there
    is one, else none (a node with more GPUs than the one that saved it): never an IndexError."""
    if not states:
        return None
    if len(states) == 1:
        return states[0]
    return states[device] if device < len(states) else None


# --- listing and picking the checkpoints of a run ----------------------------------------------


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    epoch: int
    update: int
    val_loss: float | None
    end_of_epoch: bool


class MetaError(CheckpointError, ValueError):
    """A meta.json that is no checkpoint's (damaged, cut short, another tool's): a
    CheckpointError to the commands, a ValueError to the code that falls back from an
    unreadable one (the resume's newest whole checkpoint, `foreign_best`)."""


def read_info(path: str | os.PathLike) -> CheckpointInfo:
    file = location(path) / META_FILE
    try:
        info = _info(path, json.loads(file.read_text()))
    except ValueError:
        info = None
    if info is None:
        raise MetaError(f"{file} is not a checkpoint's meta.json (no epoch, update, "
                              "val_loss and end_of_epoch): copy the checkpoint again or pick "
                              "another of the run")
    return info


INFO_KEYS = ("epoch", "update", "val_loss", "end_of_epoch")


def _info(path, meta) -> CheckpointInfo | None:
    """The info a meta.json records, or None where it is not this project's (another tool's,
    or edited: not an object, or a field missing)."""
    if not isinstance(meta, dict) or any(k not in meta for k in INFO_KEYS):
        return None
    return CheckpointInfo(str(path), *(meta[k] for k in INFO_KEYS))


def list_checkpoints(run_dir: str | os.PathLike) -> list[CheckpointInfo]:
    """The kept `checkpoint_*` directories of a run, oldest (fewest updates, then fewest
    epochs: an epoch's end after the checkpoint at its last update; then a validated one after
    an interval's of its update) first; `best/` is not listed (it is a copy of one of them, or
    of an older one Ray already removed)."""
    run_dir = location(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    infos = [info for d in run_dir.glob("checkpoint_*") if (info := _whole(d)) is not None]
    return sorted(infos, key=_age)


def _age(i: CheckpointInfo) -> tuple:
    """A checkpoint's place among its run's, oldest first: update, epoch, and of two at one
    update and epoch (an interval's, then the validation made after it at a limit:
    `checkpoint_<U>_validated`) the validated one last, whatever order the folder lists them
    in."""
    return i.update, i.epoch, i.end_of_epoch, i.val_loss is not None


def _whole(d) -> CheckpointInfo | None:
    """The checkpoint folder `d`'s info if it is whole: meta.json readable and every file it
    records (checkpoint.pt, the sentencepiece model, a text pipeline's files) there with its
    size (a copy into storage cut short has the names, not the bytes); else None."""
    if not ((d / META_FILE).is_file() and (d / CHECKPOINT_FILE).is_file()):
        return None
    try:
        meta = json.loads((d / META_FILE).read_text())
    except ValueError:  # a meta.json cut short
        return None
    if _info(d, meta) is None:  # another tool's meta.json, or one edited by hand
        return None
    # (checkpoints written before sizes were recorded: trusted; before the other files' were,
    # checkpoint.pt's alone)
    sizes = meta.get("file_bytes") or {}
    if meta.get("checkpoint_bytes") is not None:
        sizes = {CHECKPOINT_FILE: meta["checkpoint_bytes"], **sizes}
    for name, want in sizes.items():
        file = d / name
        try:
            size = file.info().size if is_uri(file) else Path(file).stat().st_size
        except OSError:  # (not copied yet)
            return None
        if size != want:
            return None
    return _info(d, meta)


def foreign_best(run_dir: str | os.PathLike) -> str | None:
    """Why a run must not start afresh in `run_dir`, or None: a `best/` model there and no
    checkpoint to resume from (a model exported or copied there, another tool's run). The
    new run would replace it at its first validation, its metrics skipped as already
    logged."""
    run_dir = location(run_dir)
    if not (run_dir / BEST_DIR / META_FILE).is_file() or list_checkpoints(run_dir):
        return None
    try:
        at = f" (update {read_info(run_dir / BEST_DIR).update})"
    except (OSError, ValueError, KeyError):
        at = ""
    return (f"{run_dir} holds a best/ model{at} but no checkpoint to resume from: a new run "
            "there would replace it. Give another --run-name (or --storage-path); if best/ "
            "is this run's own (killed at its first checkpoint), move it away and rerun")


def pick_checkpoints(infos: list[CheckpointInfo], last: int | None = None,
                     epoch_ends_only: bool = False) -> list[CheckpointInfo]:
    """The `last` newest of `infos` (all if None), optionally only end-of-epoch ones. Of two
    checkpoints of one update (an interval's and its epoch end's, the same weights) the later
    counts, once: an average of the last N is of N states."""
    if last is not None and last < 1:  # (chosen[-0:] is all of them, chosen[--1:] all but one)
        raise ValueError(f"the last {last} checkpoints: give a count >= 1")
    by_update = {i.update: i for i in sorted(infos, key=_age)}
    chosen = [i for i in by_update.values() if i.end_of_epoch or not epoch_ends_only]
    return chosen if last is None else chosen[-last:]


def best_checkpoint(run_dir: str | os.PathLike) -> CheckpointInfo | None:
    """`<run_dir>/best` if present, else the kept checkpoint with the lowest validation loss."""
    best = location(run_dir) / BEST_DIR
    if (best / META_FILE).is_file() and (best / CHECKPOINT_FILE).is_file():
        return read_info(best)
    scored = [i for i in list_checkpoints(run_dir) if i.val_loss is not None]
    return min(scored, key=lambda i: i.val_loss) if scored else None


def reconcile_best(run_dir: str | os.PathLike, best_loss: float | None, update: int) -> str:
    """Make `<run_dir>/best/` what the checkpoint resumed from says it is: the kept checkpoint
    with the lowest validation loss `best_loss`, at or before `update`. A worker that died
    between reporting a checkpoint and copying it to best/ (or after copying a checkpoint that
    was never reported) leaves best/ stale; the resumed run repairs it here. Returns what it
    did: "ok", "repaired from <dir>", or "no kept checkpoint has <loss>" (best/ left as is)."""
    if best_loss is None:
        return "ok"
    best = location(run_dir) / BEST_DIR
    if not (best / META_FILE).is_file() and not is_uri(best):
        # A crash between publish_dir's two renames: best/ was set aside (.best.old-*) and
        # its replacement, copied whole before the renames, is the newest .best.tmp-*. (A
        # .tmp without an .old beside it may be a copy cut short: never used.)
        # Failing that, the set-aside old best/ is put back (and checked like any best/).
        olds = sorted(best.parent.glob(f".{BEST_DIR}.old-*"), key=lambda p: p.stat().st_mtime)
        done = sorted(best.parent.glob(f".{BEST_DIR}.tmp-*"), key=lambda p: p.stat().st_mtime)
        usable = [d for d in (done[-1:] if olds else []) + olds[-1:]
                  if _whole(d) is not None]  # (every file at the size meta.json records)
        if usable:
            os.replace(usable[0], best)
            for p in olds + done:
                shutil.rmtree(p, ignore_errors=True)
            info = read_info(best)
            if info.val_loss == best_loss and info.update <= update:
                return f"recovered from the interrupted swap ({usable[0].name})"
    if (best / META_FILE).is_file() and not is_uri(best):
        # best/ is whole: what a publish killed outright (SIGKILL, a node lost) left beside it,
        # a checkpoint's size each, is removed (only this run's lease holder publishes best/)
        for p in [*best.parent.glob(f".{BEST_DIR}.old-*"), *best.parent.glob(f".{BEST_DIR}.tmp-*")]:
            shutil.rmtree(p, ignore_errors=True)
    if (best / META_FILE).is_file():
        try:
            info = read_info(best)
        except MetaError:  # damaged: repaired from the kept checkpoint below
            info = None
        # (and whole: a power loss may leave its checkpoint.pt cut short beside a whole
        # meta.json, local copies not being flushed; evaluation then failed on it)
        if info is not None and info.val_loss == best_loss and info.update <= update \
                and _whole(best) is not None:
            return "ok"
    kept = [i for i in list_checkpoints(run_dir)
            if i.val_loss == best_loss and i.update <= update]
    if not kept:
        return f"no kept checkpoint has validation loss {best_loss}"
    source = kept[-1].path
    publish_dir(source, best, marker=META_FILE)  # meta.json last: best/ is whole or absent
    return f"repaired from {location(source).name}"

