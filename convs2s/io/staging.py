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
from pathlib import Path

STAGED_FILE = "staged.json"  # in each staged folder: the weights it was made from, written last


def weights_stamp(checkpoints) -> list:
    """Identity of a set of weights: each checkpoint file's path, size and mtime (new weights
    under the same path are new weights)."""
    from convs2s.io.checkpoint import CHECKPOINT_FILE  # here: a stamp needs no torch

    out = []
    for c in checkpoints:
        f = Path(c) / CHECKPOINT_FILE
        st = f.stat() if f.is_file() else None
        out.append([str(c), st.st_size if st else None, st.st_mtime_ns if st else None])
    return out


def stage_models(checkpoints, average: bool, target: str | os.PathLike) -> tuple[str, ...]:
    """The model folders of `checkpoints` under `target`: their weight average as one model
    when `average` (and there are several), else one slim copy each (an ensemble keeps its
    members). Reused while the checkpoints are unchanged; replaced whole otherwise."""
    from convs2s.io.averaging import average_checkpoints

    target = Path(target)
    stamp = {"checkpoints": weights_stamp(checkpoints), "average": average}
    record = target / STAGED_FILE
    if not (record.is_file() and json.loads(record.read_text()) == stamp):
        partial = target.with_name(f".partial-{target.name}")
        shutil.rmtree(partial, ignore_errors=True)
        groups = [list(checkpoints)] if average and len(checkpoints) > 1 else \
            [[c] for c in checkpoints]  # a mean of one is a slim copy
        for i, group in enumerate(groups):
            average_checkpoints(group, partial / f"model_{i:02d}")
        (partial / STAGED_FILE).write_text(json.dumps(stamp))  # written last
        old = target.with_name(f".old-{target.name}")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            os.replace(target, old)
        os.replace(partial, target)
        shutil.rmtree(old, ignore_errors=True)
    return tuple(str(p) for p in sorted(target.glob("model_*")))
