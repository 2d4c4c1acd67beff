"""Fault injection for tests (never a training setting): a rank that dies after a given update,
a rank whose GPU memory check fails, and a record of the sentence ids each update trained. Read
from the environment of the process that calls `fit` (the driver) and handed to the workers in
their train_loop_config (`CrashInjection.from_env`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from convs2s.console import worker_line

CRASH_MARKER = ".crash_injected"

# Test-only: rank CONVS2S_TEST_CRASH_RANK (default 1) dies right after update
# CONVS2S_TEST_CRASH_AT_UPDATE (unset or 0: never). Read from the environment of the process that
# calls `fit` (the driver), which hands them to the workers in train_loop_config: variables set
# after Ray started never reach its worker processes. Not a TrainConfig field, so that a test
# hook is no part of a recipe, its hash (workflow stage keys) or its checkpoints.
CRASH_AT_UPDATE_ENV = "CONVS2S_TEST_CRASH_AT_UPDATE"
CRASH_RANK_ENV = "CONVS2S_TEST_CRASH_RANK"
# A folder: each rank appends the sentence ids of every batch it trains, with the update, to
# rank<r>.jsonl there (the exact-resume tests compare which rows trained, not how many).
RECORD_BATCHES_ENV = "CONVS2S_TEST_RECORD_BATCHES"
# A rank (default: none) whose memory check fails as if its GPU could not hold the budget: the
# ranks' agreement and the Ray path to the driver, tested where there is no GPU.
UNFIT_RANK_ENV = "CONVS2S_TEST_UNFIT_RANK"


@dataclass(frozen=True)
class CrashInjection:
    """Fault injection for tests: a real process death (os._exit), once per run directory (a
    marker file there stops the restarted worker group from dying again); and the record of
    which batches each update trained."""

    at_update: int = 0  # 0: never
    rank: int = 1
    record_dir: str = ""  # "": no record
    unfit_rank: int = -1  # -1: none

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> CrashInjection:
        def number(name: str, default: int) -> int:
            value = env.get(name, "").strip()
            try:
                return int(value) if value else default
            except ValueError:
                raise ValueError(f"{name}={value!r}: give an integer (a test-only "
                                 "fault injection setting)") from None

        return cls(number(CRASH_AT_UPDATE_ENV, 0), number(CRASH_RANK_ENV, 1),
                   env.get(RECORD_BATCHES_ENV, ""), number(UNFIT_RANK_ENV, -1))

    def record(self, rank: int, update: int, batches: list) -> None:
        if self.record_dir:
            line = json.dumps({"update": update, "ids": [b.ids.tolist() for b in batches]})
            with open(Path(self.record_dir) / f"rank{rank}.jsonl", "a") as f:
                f.write(line + "\n")

    def maybe_crash(self, rank: int, update: int, run_dir: Path) -> None:
        if self.at_update and update == self.at_update and rank == self.rank:
            marker = run_dir / CRASH_MARKER
            if not marker.exists():
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text("")
                worker_line(f"[convs2s.train] fault injection: rank {rank} exits at update "
                            f"{update}")
                # Let Ray's controller collect the last report first (it polls the workers
                # every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by default), as when a machine
                # dies some time after its last checkpoint.
                poll_s = float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 2.0))
                time.sleep(max(1.0, 2.5 * poll_s))
                os._exit(1)
