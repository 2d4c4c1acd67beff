"""Dropout that follows the number of passes over the training data a time budget will reach.

Why: the Multi30k `cpu` recipe trains for 60 minutes. A host that multiplies bf16 natively
passes the 29,000 captions 40-65 times in that hour, one without it about 15 times; dropout
0.4 was best on validation at 63 passes and 0.3 at 15-18 (docs/benchmarks.md, "Translation
quality"): more passes need more regularization, and the rate is only known on the machine.

How: `TrainConfig.dropout_by_passes` is a table ((from_passes, dropout), ...). After
`passes_probe_updates` updates (timed from the 50th, past the first updates' start-up cost)
the trainer projects the passes of the whole budget from that rate, picks the last row the
projection reaches and sets every dropout of the model to it, once. The first updates train
with the model's own dropout. The projection leaves out the validations and checkpoints still
to come (the clock counts them): it errs towards more passes by their share of the time. Every
rank gets the same choice (the clock is shared:
`Trainer._clock`), and a resumed run takes the choice from its checkpoint; one resumed inside
the timed updates takes the clock at their start from it and decides at the same update as
the run would have (`PassesProbe`: it timed anew from the resume and decided up to 100 updates
later, training them with the model's dropout). Its timing then counts the restart's first,
slower updates among the timed ones: a slower rate, fewer passes projected.
"""

from __future__ import annotations

import math

import torch.nn as nn


# Not timed: the first updates run slower (memory allocation, the data reader's first reads);
# measured on the Multi30k recipe (Xeon, float32): updates 10-60 took 0.83 s each, 100-200
# 0.69 s, so a probe from update 10 projected 35.5 passes for a run heading to about 42.
WARMUP_UPDATES = 50


def projected_passes(update: int, seconds: float, seconds_per_update: float, max_time: float,
                     updates_per_epoch: int) -> float:
    """Passes over the data at the end of the budget: the updates made, plus those the rest of
    the budget holds at the measured rate, over the updates of one epoch."""
    if seconds_per_update <= 0 or updates_per_epoch <= 0:
        return math.inf
    left = max(max_time - seconds, 0.0) / seconds_per_update
    return (update + left) / updates_per_epoch


def dropout_for(table: tuple[tuple[float, float], ...], passes: float) -> float:
    """The dropout of the last row whose from_passes `passes` reaches."""
    chosen = table[0][1]
    for from_passes, p in table:
        if passes >= from_passes:
            chosen = p
    return chosen


def set_dropout(model: nn.Module, p: float) -> int:
    """Set the dropout probability every module of the model applies (their float `dropout`
    attribute, convs2s.model.network); returns how many modules changed."""
    n = 0
    for m in model.modules():
        value = getattr(m, "dropout", None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            m.dropout = float(p)
            n += 1
    return n


def choice_message(choice: dict) -> str:
    return (f"dropout {choice['dropout']:g} from update {choice['update']}: "
            f"{choice['seconds_per_update']:.3f} s an update projects "
            f"{choice['projected_passes']:.1f} passes over the data in the time budget "
            f"(dropout_by_passes {choice['table']})")


class PassesProbe:
    """The timing of `dropout_by_passes`: updates WARMUP_UPDATES to WARMUP_UPDATES + `updates`
    of the run, counted from its start, not from a resume. `start_seconds` (the training clock
    at the first of them) goes into each checkpoint."""

    def __init__(self, table: tuple[tuple[float, float], ...], updates: int):
        self.table, self.updates = table, updates
        self.start_at, self.start_seconds = WARMUP_UPDATES, None

    def resumed(self, update: int, start_seconds: float | None) -> None:
        """Resumed at `update` with the checkpoint's `start_seconds`. A checkpoint past the
        start without it (written before it was kept) times from the resume, as then."""
        self.start_seconds = start_seconds
        if start_seconds is None and update >= WARMUP_UPDATES:
            self.start_at = update + WARMUP_UPDATES

    def observe(self, update: int, seconds: float, max_time: float,
                updates_per_epoch: int) -> dict | None:
        """After each update (`seconds` of training): the choice, once its updates are timed."""
        if update == self.start_at:
            self.start_seconds = seconds
        if self.start_seconds is None or update < self.start_at + self.updates:
            return None
        per_update = (seconds - self.start_seconds) / (update - self.start_at)
        passes = projected_passes(update, seconds, per_update, max_time, updates_per_epoch)
        return {"dropout": dropout_for(self.table, passes), "update": update,
                "seconds_per_update": round(per_update, 4),
                "projected_passes": round(passes, 2), "table": [list(r) for r in self.table]}
