"""Staging: the one way weights become the files that are scored, served and logged as a model.

    models = stage_models(checkpoints, average=False, target="run/weights/best")
    # run/weights/best/model_00 (model_01, ... for an ensemble): slim inference copies
    models = stage_models(last5, average=True, target="run/weights/avg_last5")
    # run/weights/avg_last5/model_00: their weight average, computed once

Each model folder is a checkpoint without optimizer state (`convs2s.io.averaging`: a mean of
one checkpoint is its slim copy). A target staged earlier from the same checkpoint files (their
paths, sizes and modification times: `weights_stamp`) is reused; otherwise the new set is
written beside it and swapped in whole, so a crash never leaves a half-written set that reads
as complete. The evaluation tasks score these folders, and the MLflow models of the workflows
(`convs2s.serving.pyfunc.log_translator(..., as_is=True)`) carry the same folders.
"""

from __future__ import annotations

import json
import os
import shutil

from storage import ObjectPath, location, publish_dir, stamp
from storage.paths import local_entry
from storage.scratch import scratch_dir

STAGED_FILE = "staged.json"  # in each staged folder: the weights it was made from, written last


def weights_stamp(checkpoints) -> list:
    """Identity of a set of weights: each checkpoint file's path, size and mtime (new weights
    under the same path are new weights)."""
    from convs2s.io.checkpoint import CHECKPOINT_FILE  # here: a stamp needs no torch

    out = []
    for c in checkpoints:
        try:
            size, mtime_ns = stamp(location(c) / CHECKPOINT_FILE)
        except FileNotFoundError:
            size = mtime_ns = None
        out.append([str(c), size, mtime_ns])
    return out


def stage_models(checkpoints, average: bool, target: str | os.PathLike) -> tuple[str, ...]:
    """The model folders of `checkpoints` under `target` (a folder, or a bucket prefix): their
    weight average as one model when `average` (and there are several), else one slim copy
    each (an ensemble keeps its members). Reused while the checkpoints are unchanged; replaced
    whole otherwise (in a bucket: published with staged.json last, storage.publish_dir)."""
    from convs2s.io.averaging import average_checkpoints

    given, target = target, location(target)
    if not isinstance(target, ObjectPath):  # a linked target is replaced as the link: the
        target = local_entry(given)  # folder it points to (another run's) stays whole
    wanted = {"checkpoints": weights_stamp(checkpoints), "average": average}
    try:
        current = json.loads((target / STAGED_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        current = None
    if current != wanted:
        local = not isinstance(target, ObjectPath)
        if local:  # beside the target (one rename away), named by its writer: one a killed
            # stager left is removed by the next staging on this machine (scratch_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = scratch_dir(f".partial-{target.name}-", target.parent)
            partial.chmod(0o755)  # (mkdtemp's folder is private; the target is read by others)
        else:
            partial = scratch_dir("convs2s-staging-") / target.name
        groups = [list(checkpoints)] if average and len(checkpoints) > 1 else \
            [[c] for c in checkpoints]  # a mean of one is a slim copy
        for i, group in enumerate(groups):
            average_checkpoints(group, partial / f"model_{i:02d}")
        (partial / STAGED_FILE).write_text(json.dumps(wanted))  # written last
        if not local:
            publish_dir(partial, target, marker=STAGED_FILE)
            shutil.rmtree(partial.parent, ignore_errors=True)
        else:
            # this stager's own name (two stagers of one target set aside each their own)
            old = scratch_dir(f".old-{target.name}-", target.parent)
            if target.is_symlink():
                target.unlink()
            elif target.exists():
                os.replace(target, old)  # (onto the empty folder just made: a rename)
            os.replace(partial, target)
            shutil.rmtree(old, ignore_errors=True)
    return tuple(str(p) for p in sorted(target.glob("model_*")))
