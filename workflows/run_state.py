"""A workflow run's folder and resume state: what every stage needs (the run tree: where to
track, the parent run, the run directory) and what an earlier invocation of the same run
finished.

`<storage>/<run name>/workflow.json` records each finished training run (with the digest of
its settings and data), each logged model (with the stamp of its weights) and each scored
(job, test set) pair (with the stamp of the weights it scored and its child run). It is
rewritten atomically, so a crash never leaves half a file; new weights make every score and
model of the run stale.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from workflows.run_tree import RunTree


def digest(obj) -> str:
    """A short, stable digest of JSON-able settings (what makes a training run the same)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def weights_stamp(checkpoints) -> list:
    """Identity of the weights a job scores: each checkpoint file's path, size and mtime (new
    weights under the same path are new weights)."""
    out = []
    for c in checkpoints:
        f = Path(c) / "checkpoint.pt"
        st = f.stat() if f.is_file() else None
        out.append([str(c), st.st_size if st else None, st.st_mtime_ns if st else None])
    return out


@dataclass
class StageContext:
    """What every stage needs: the run tree (where to track, the parent run, the run folder)
    and the run's resume state (workflow.json)."""

    tree: RunTree
    skipped: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:  # <storage>/<run name>
        return self.tree.run_dir

    def state(self) -> dict:
        """{"train": {name: {key, result}}, "models": {job: {stamp, model_id}},
        "eval": {"<job>/<test set>": {stamp, run_id, metrics, hyp_path}}}"""
        path = self.run_dir / "workflow.json"
        state = json.loads(path.read_text()) if path.is_file() else {}
        for part in ("train", "models", "eval"):
            state.setdefault(part, {})
        return state

    def save_state(self, state: dict) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / "workflow.json.tmp"
        tmp.write_text(json.dumps(state, indent=1, default=str))
        tmp.replace(self.run_dir / "workflow.json")  # atomic: a crash never leaves half a file
