"""Dropout that follows the passes a time budget will reach (`convs2s.train.regularization`,
`TrainConfig.dropout_by_passes`, the Multi30k `cpu` recipe): the choice for a measured rate,
without training; and a short real training run that makes it and keeps it in its checkpoint.

    .venv/bin/python -m pytest tests/test_regularization.py -q
"""

from __future__ import annotations

import math

import pytest

from convs2s.config import PRESETS, TrainConfig
from convs2s.model.network import ConvS2S
from convs2s.train.regularization import (WARMUP_UPDATES, dropout_for, projected_passes,
                                          set_dropout)

from workflows.multi30k_en_de import cpu

RECIPE = cpu().train.dropout_by_passes


@pytest.mark.parametrize("host, seconds_per_update, dropout", [
    # 29,000 captions in 122 updates an epoch (the recipe's batches), 60 minutes
    ("float32 host (EPYC without AVX-512: 1,792 updates in an hour)", 3600 / 1792, 0.3),
    ("bf16 host (Xeon with AMX: 7,717 updates in an hour)", 3600 / 7717, 0.4),
])
def test_the_recipe_picks_dropout_by_the_passes_the_hour_will_reach(host, seconds_per_update,
                                                                  dropout):
    passes = projected_passes(update=60, seconds=60 * seconds_per_update,
                              seconds_per_update=seconds_per_update, max_time=3600,
                              updates_per_epoch=122)
    assert dropout_for(RECIPE, passes) == dropout, (host, passes)


def test_projection_and_table_edges():
    table = ((0.0, 0.3), (30.0, 0.4), (80.0, 0.5))
    assert [dropout_for(table, p) for p in (0, 29.9, 30, 79, 80, 500)] == \
        [0.3, 0.3, 0.4, 0.4, 0.5, 0.5]
    # 100 updates done in 50 s; 3,550 s left at 0.5 s an update: 7,200 updates, 100 an epoch
    assert projected_passes(100, 50.0, 0.5, 3600, 100) == pytest.approx(72.0)
    assert projected_passes(100, 4000.0, 0.5, 3600, 100) == pytest.approx(1.0)  # budget spent
    assert projected_passes(1, 0.0, 0.0, 3600, 100) == math.inf


def test_set_dropout_reaches_every_dropout_of_the_model():
    net = ConvS2S(PRESETS["tiny"]().replace(dropout=0.2), 50, 50)
    n = set_dropout(net, 0.35)
    values = {m.dropout for m in net.modules() if isinstance(getattr(m, "dropout", None), float)}
    assert n > 4 and values == {0.35}


def test_a_bad_table_is_refused():
    for bad in [((5.0, 0.3),), ((0.0, 0.3), (0.0, 0.4)), ((0.0, 1.2),), ((0.0,),)]:
        with pytest.raises(ValueError, match="dropout_by_passes"):
            TrainConfig(dropout_by_passes=bad, max_time=60)
    assert TrainConfig(dropout_by_passes=[[0, 0.3], [30, 0.4]]).dropout_by_passes == \
        ((0.0, 0.3), (30.0, 0.4))  # from JSON / --set


@pytest.mark.slow
def test_a_budgeted_run_makes_the_choice_once_and_keeps_it(demo_batches, tmp_path):
    """A real training run with a time budget (the Trainer's loop in this process, as under
    Ray Train): after the probe the dropout is chosen, said in the result, and kept in the
    checkpoint a resume reads."""
    from convs2s.io.checkpoint import load_checkpoint
    from convs2s.train.job import TrainJob
    from convs2s.train.local import fit_local

    train = TrainConfig(max_epochs=0, max_updates=WARMUP_UPDATES + 10, max_time=3600,
                        log_interval=10,
                        precision="fp32", passes_probe_updates=5,
                        dropout_by_passes=((0.0, 0.05), (1e9, 0.5)))
    result = fit_local(TrainJob(model=PRESETS["tiny"]().replace(dropout=0.2), train=train,
                                train_data=demo_batches.batches["train"],
                                valid_data=demo_batches.batches["valid"],
                                spm_model=demo_batches.spm_model,
                                vocab_size=demo_batches.vocab_size,
                                storage_path=str(tmp_path / "runs"), run_name="probe"))
    choice = result.metrics["dropout_choice"]
    assert choice["dropout"] == 0.05  # the table's first row: far from 1e9 passes
    assert choice["update"] == WARMUP_UPDATES + 5  # untimed start, then 5 timed updates
    assert 0 < choice["projected_passes"] < 1e9
    state = load_checkpoint(result.best_checkpoint)
    assert state["dropout_choice"] == choice


def test_a_dropout_set_on_purpose_wins_over_the_table():
    import json
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks.quality import with_variant

    variant = with_variant(cpu(), "recipe:dropout-0.5")  # a sweep variant's dropout
    assert variant.model.dropout == 0.5 and variant.train.dropout_by_passes == ()
    assert with_variant(cpu(), "recipe:tied-output").train.dropout_by_passes == RECIPE
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "workflows/multi30k_en_de.py", "--preset", "cpu",
                          "--data", "demo", "--set", "model.dropout=0.2", "--dry-run",
                          "--format", "json"], cwd=repo, capture_output=True, text=True,
                         timeout=120, check=True)
    spec = json.loads(out.stdout)["workflow"]
    assert spec["model"]["dropout"] == 0.2 and spec["train"]["dropout_by_passes"] == []


def test_a_run_resumed_inside_the_timed_updates_decides_at_the_same_update(demo_batches,
                                                                           tmp_path,
                                                                           monkeypatch):
    """The probe timed its updates from the resume (the clock at their start was not kept):
    a run resumed before its choice decided up to 100 updates later than the run would have,
    training those with the model's dropout. Now the same update, and the same weights."""
    import torch

    from convs2s.io.checkpoint import load_checkpoint
    from convs2s.train import regularization
    from convs2s.train.job import TrainJob
    from convs2s.train.local import fit_local

    monkeypatch.setattr(regularization, "WARMUP_UPDATES", 3)  # (50: seconds, not minutes)

    def run(name: str, updates: int):
        train = TrainConfig(max_epochs=0, max_updates=updates, max_time=3600,
                            log_interval=1000, precision="fp32", seed=3, shuffle_buffer=8,
                            passes_probe_updates=3, dropout_by_passes=((0.0, 0.05), (1e9, 0.5)))
        return fit_local(TrainJob(model=PRESETS["tiny"]().replace(dropout=0.2), train=train,
                                  train_data=demo_batches.batches["train"],
                                  valid_data=demo_batches.batches["valid"],
                                  spm_model=demo_batches.spm_model,
                                  vocab_size=demo_batches.vocab_size,
                                  storage_path=str(tmp_path / "runs"), run_name=name,
                                  system_metrics_s=0.0))

    straight = run("straight", 10)
    run("resumed", 5)  # stops at update 5, inside the timed updates 3-6: checkpointed
    resumed = run("resumed", 10)
    assert resumed.metrics["resumed_from_update"] == 5  # (a fresh start would decide at 6 too)
    assert straight.metrics["dropout_choice"]["update"] == 6
    assert resumed.metrics["dropout_choice"]["update"] == 6
    a, b = (load_checkpoint(r.last_checkpoint)["model"] for r in (straight, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a checkpoint past the start that does not hold it (written before it was kept): timed
    # from the resume, as then
    probe = regularization.PassesProbe(((0.0, 0.05),), 3)
    probe.resumed(4, None)
    assert probe.observe(7, 10.0, 3600, 100) is None and probe.start_at == 7
    assert probe.observe(10, 13.0, 3600, 100)["seconds_per_update"] == 1.0
