"""Sweeps (workflows/sweep.py, workflows/ablations.py): the paper's §5.4-§5.6 variants of a preset,
bad sweep requests refused in one line before Ray starts, the paper-shaped summary, and (slow)
a 2-variant x 2-seed sweep of whole workflow runs on Ray Tune with one MLflow child run per
trial, a killed trial reported while the others go on, and a rerun that skips the finished
trials and continues the killed one from its checkpoint; a Ctrl-C during a sweep's trials
stops it as it stops a workflow run.

    timeout 600 .venv/bin/python -m pytest tests/test_sweep.py -q
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import cpu_holders, mlflow_store

from convs2s.config import PRESETS
from convs2s.model.network import ConvS2S
from workflows import engine, multi30k_en_de, orchestrate
from workflows.ablations import BASELINE, SWEEPS, SweepError, table4, table5, variants_for
from workflows.sweep import concurrency, resolve_sweep, run_sweep
from workflows.sweep_summary import mean_sd, summary_metrics, summary_table
from workflows.workflow_config import RunOptions

CPU_MODEL = multi30k_en_de.cpu().model  # 4 + 3 layers of 256 units, kernel 3


# --- the variants: plain functions of the preset's model -----------------------------------------



def test_a_trials_error_reaches_ray_tune_without_a_password():
    """Ray Tune prints a failed trial's error and writes it to error.txt: an error quoting the
    tracking URI with its password (MLflow's, when the server is down) goes there redacted;
    one without a credential is raised as it was."""
    from workflows.sweep import without_credentials

    down = ConnectionError("API request to http://bob:S3CRET@mlflow:5000/api/2.0/mlflow/runs/"
                           "create failed with exception Max retries exceeded")
    clean = without_credentials(down)
    assert isinstance(clean, RuntimeError) and "S3CRET" not in str(clean)
    assert str(clean).startswith("ConnectionError: API request to http://bob:***@mlflow:5000/")
    plain = ValueError("the training split has 3 batch(es)")
    assert without_credentials(plain) is plain


def test_table4_has_the_papers_four_rows_with_its_numbers():
    rows = table4(CPU_MODEL)
    assert [v.name for v in rows] == [BASELINE, "no-src-pos", "no-tgt-pos", "no-pos"]
    assert [v.paper for v in rows] == [(6.64, 21.7), (6.69, 21.3), (6.63, 21.5), (6.68, 21.2)]
    assert rows[3].changed(CPU_MODEL) == {"model.src_positions": "False",
                                          "model.tgt_positions": "False"}
    assert rows[0].changed(CPU_MODEL) == {}  # the baseline is the preset's model


def test_table5_moves_attention_into_fewer_decoder_layers():
    """The paper's placements for an n-layer decoder, in its order: layers 1..k, every other
    layer, then each single layer; its numbers only beside a decoder of its 5 layers."""
    rows = table5(CPU_MODEL)  # a 3-layer decoder
    assert [v.name for v in rows] == [BASELINE, "attn-1-2", "attn-1-3", "attn-1", "attn-2",
                                      "attn-3"]
    assert rows[1].apply(CPU_MODEL).decoder_attention == (True, True, False)
    assert rows[2].apply(CPU_MODEL).decoder_attention == (True, False, True)
    assert rows[5].apply(CPU_MODEL).decoder_attention == (False, False, True)
    assert not any(v.paper for v in rows)
    ablation = PRESETS["wmt14_en_de_ablation"]()  # the paper's 5-layer decoder: Table 5's rows
    rows = table5(ablation)
    assert [(v.label.split()[-1], v.paper) for v in rows[1:]] == [
        ("1,2,3,4", (6.70, 21.54)), ("1,2,3", (6.95, 21.36)), ("1,2", (6.92, 21.47)),
        ("1,3,5", (6.97, 21.10)), ("1", (7.15, 21.26)), ("2", (7.09, 21.30)),
        ("3", (7.11, 21.19)), ("4", (7.19, 21.31)), ("5", (7.66, 20.24))]
    assert rows[0].paper == (6.65, 21.63)
    assert rows[4].apply(ablation).decoder_attention == (True, False, True, False, True)


def test_the_ablation_presets_trials_end_annealed_wherever_their_budget_ends():
    """A sweep's trial is budgeted (`--max-time 12h`): the paper-recipe lr, fixed until epoch
    50, would end every trial at 0.5; the ablation preset's falls over the budget."""
    from convs2s.train.optim import LRSchedule
    from workflows import wmt14_en_de

    train = wmt14_en_de.ablation().train
    lr = LRSchedule(train)
    assert lr.lr_at(0, spent=0.0) == train.lr == 0.5
    assert lr.lr_at(10**6, spent=0.5) == pytest.approx(0.25)
    assert lr.lr_at(10**6, spent=0.999) < train.lr / 1000
    assert wmt14_en_de.ablation().model == PRESETS["wmt14_en_de_ablation"]()


def test_tables_7_and_8_are_the_papers_depth_by_kernel_grids():
    """Encoder 5 / 9 / 13 layers and decoder 3 / 5 / 7 layers, each at kernel 3, 5 and 7, the
    preset's own combination its baseline; the paper's BLEU (it gives no PPL) beside each
    where the preset is its analysis model, the grid's other side."""
    ablation = PRESETS["wmt14_en_de_ablation"]()  # 13 x k3 encoder, 5 x k5 decoder
    enc = {v.name: v for v in variants_for("table7", ablation)}
    assert len(enc) == 9 and "enc-13-k3" not in enc  # the baseline
    assert enc[BASELINE].paper == (None, 21.63)
    assert enc["enc-5-k7"].paper == (None, 20.81)
    assert enc["enc-5-k7"].apply(ablation).encoder_layers == [(512, 7)] * 5
    assert enc["enc-5-k7"].apply(ablation).decoder_layers == ablation.decoder_layers
    dec = {v.name: v for v in variants_for("table8", ablation)}
    assert len(dec) == 9 and "dec-5-k5" not in dec
    assert (dec[BASELINE].paper, dec["dec-5-k3"].paper) == ((None, 21.63), (None, 21.71))
    assert dec["dec-7-k3"].apply(ablation).decoder_layers == [(512, 3)] * 7
    cpu = variants_for("table8", CPU_MODEL)  # 3 x k3 decoder: another model, no numbers
    assert len(cpu) == 9 and not any(v.paper for v in cpu)
    assert "dec-3-k3" not in {v.name for v in cpu}


def test_every_sweep_builds_distinct_models_on_the_cpu_and_paper_ablation_presets():
    for model in (CPU_MODEL, PRESETS["wmt14_en_de_ablation"]()):
        for name in SWEEPS:
            variants = variants_for(name, model)
            assert variants[0].name == BASELINE
            assert all(v.changed(model) for v in variants[1:]), name
    assert [v.name for v in variants_for("paper-5.2", CPU_MODEL)][:4] == \
        [BASELINE, "no-src-pos", "no-tgt-pos", "no-pos"]
    depth = variants_for("depth", CPU_MODEL)
    assert [v.name for v in depth] == [BASELINE, "enc-2", "enc-8", "enc-9", "dec-1", "dec-2",
                                       "dec-6"]  # the paper's 9 and 2 among them (§5.6)
    assert [len(v.apply(CPU_MODEL).encoder_layers) for v in depth[1:3]] == [2, 8]
    # The kernel sweep keeps a paper model's 1 x 1 output layers (§5.1: "linear mappings")
    en_de = PRESETS["wmt14_en_de"]()
    kernels = {v.name: v.apply(en_de) for v in variants_for("kernel", en_de)}
    assert "enc-k3" not in kernels  # its kernel-3 layers are the baseline's
    assert kernels["enc-k5"].encoder_layers == [(512, 5)] * 9 + [(1024, 5)] * 4 \
        + [(2048, 1)] * 2


def test_the_recipe_sweep_adds_dropout_width_and_tying_and_the_quality_benchmark_takes_one():
    """Not the paper's: what a small-corpus recipe retunes for more updates per hour."""
    from benchmarks.quality import main as quality, with_variant

    d = CPU_MODEL.dropout  # the recipe's: 0.4
    more, most = f"{d + 0.1:g}", f"{d + 0.2:g}"
    rows = variants_for("recipe", CPU_MODEL)  # width 256
    assert [v.name for v in rows] == [BASELINE, f"dropout-{more}", f"dropout-{most}", "wide-384",
                                      "tied-output"]
    wide = rows[3].apply(CPU_MODEL)
    assert wide.embed_dim == 384 and wide.dropout == float(more)
    assert {w for w, _ in wide.encoder_layers + wide.decoder_layers} == {384}
    assert wide.out_embed_dim == CPU_MODEL.out_embed_dim  # the vocabulary projection: as before
    tied = rows[4].apply(CPU_MODEL)
    assert tied == CPU_MODEL.replace(share_decoder_embed=True)
    net = ConvS2S(tied, 50, 50)
    assert net.decoder.fc3.weight is net.decoder.embed_tokens.weight
    # where the output width differs from the embedding's, there is nothing to tie
    other = CPU_MODEL.replace(out_embed_dim=CPU_MODEL.embed_dim // 2)
    assert "tied-output" not in [v.name for v in variants_for("recipe", other)]
    cfg = with_variant(multi30k_en_de.cpu(), f"recipe:dropout-{most}")
    assert cfg.model == CPU_MODEL.replace(dropout=float(most))
    # the variant's dropout holds for the whole run: the dropout-by-passes table is off
    assert cfg.train == multi30k_en_de.cpu().train.replace(dropout_by_passes=())
    with pytest.raises(SweepError, match="give SWEEP:NAME"):
        with_variant(multi30k_en_de.cpu(), f"dropout-{more}")
    assert quality(["--variant", "recipe:dropout-9",
                    "--data", str(Path(__file__).parent)]) == 2  # refused before Ray starts


# --- bad requests: one line, before Ray -------------------------------------------------------


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = multi30k_en_de.main({"cpu": multi30k_en_de.cpu, "smoke": multi30k_en_de.smoke},
                                     multi30k_en_de.__doc__, argv)
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("args, says", [
    (["--sweep", "table9"], "invalid choice: 'table9'"),
    (["--sweep", "table4", "--variants", "baseline,no-such"],
     "error: --variants no-such: not a variant of the 'table4' sweep"),
    (["--sweep", "table4", "--seeds", "0"], "--seeds 0: give the number of seeds"),
    (["--seeds", "2"], "--seeds applies to a sweep: add --sweep NAME"),
    (["--sweep", "table4", "--init-from", "/x"], "error: --init-from fixes the model's"),
])
def test_a_bad_sweep_request_is_one_line_before_ray_starts(args, says, tmp_path, monkeypatch):
    def no_ray(*a, **k):
        raise AssertionError("Ray was started for a request refused up front")

    monkeypatch.setattr(engine, "start_ray", no_ray)
    rc, out, err = _main(["--preset", "smoke", "--storage-path", str(tmp_path), *args])
    lines = err.strip().splitlines()
    assert rc == 2 and says in lines[-1], err  # argparse style: usage, then one error line
    assert "Traceback" not in err and sum("error" in line for line in lines) == 1


def test_a_variant_that_changes_nothing_in_the_preset_is_refused():
    no_src = CPU_MODEL.replace(src_positions=False)
    with pytest.raises(SweepError, match="variant no-src-pos: it changes nothing"):
        variants_for("table4", no_src)
    assert [v.name for v in variants_for("table4", no_src, ["baseline", "no-tgt-pos"])] == \
        [BASELINE, "no-tgt-pos"]


def test_each_trial_is_a_whole_run_of_the_preset_with_its_variant_and_seed(tmp_path):
    opts = RunOptions(preset="cpu", storage_path=str(tmp_path), run_name="s", sweep="table4",
                      seeds=2, variants=["baseline", "no-pos"], max_time=480.0)
    sweep = resolve_sweep(multi30k_en_de.cpu(), opts)
    assert [t.name for t in sweep.trials] == ["baseline-seed1", "baseline-seed2",
                                              "no-pos-seed1", "no-pos-seed2"]
    t = sweep.trials[3]
    assert t.spec.train.seed == 2 and not t.spec.model.src_positions
    assert t.spec.train.max_time == 480 and sweep.trials[0].spec.train.max_time == 480
    assert t.spec.run_dir == tmp_path / "s" / "no-pos-seed2"
    # single models (the paper's tables), no ensemble average, never a champion
    assert t.spec.ensemble.runs == 1 and t.spec.ensemble.average_last == 0
    assert not t.spec.register_champion
    assert len({x.key for x in sweep.trials}) == 4
    # each trial's changes are every setting it runs with otherwise (the seed aside): the
    # no-pos variant's two fields; the baseline's none
    assert t.changes == {"model.src_positions": "False", "model.tgt_positions": "False"}
    assert sweep.trials[0].changes == sweep.trials[1].changes == {}
    # a named variant's dropout also turns the preset's dropout-by-passes table off: said
    # (only the model's field was, unlike the same change asked as a custom variant)
    recipe = resolve_sweep(multi30k_en_de.cpu(), dataclasses.replace(
        opts, sweep="recipe", variants=["dropout-0.5"], seeds=1))
    named = next(x.changes for x in recipe.trials if x.variant.name == "dropout-0.5")
    custom = next(x.changes for x in resolve_sweep(multi30k_en_de.cpu(), dataclasses.replace(
        opts, sweep="custom", variants=[], seeds=1, variant=["d5:model.dropout=0.5"])).trials
        if x.variant.name == "d5")
    assert named == custom and set(named) == {"model.dropout", "train.dropout_by_passes"}
    # fewer checkpoints kept than the preset's average of 5: none is averaged in a trial (it
    # was refused, with a fix the sweep refuses too)
    fewer = resolve_sweep(multi30k_en_de.cpu(), dataclasses.replace(opts, set=[
        "train.keep_last=2"], variant=["lr:train.lr=0.0015"], sweep="custom", variants=[]))
    assert {x.spec.train.keep_last for x in fewer.trials} == {2}


def test_a_finished_trial_runs_again_when_its_test_sets_changed_and_only_then(tmp_path):
    """trial.json answers a rerun only for the test sets it scored, as it scored them: a rerun
    that adds a --test-set, edits a test file or scores another way runs the trial again (the
    workflow run's own resume keeps its training and scores what is new), where it once
    reported the old scores, "-" under the new test set and a full `n`."""
    data = tmp_path / "data"
    data.mkdir()
    for stem in ("train", "val", "test_2016_flickr", "extra"):
        (data / f"{stem}.en").write_text("a man sleeps .\n" * 3, encoding="utf-8")
        (data / f"{stem}.de").write_text("ein Mann schl\u00e4ft .\n" * 3, encoding="utf-8")

    def trial(**more):
        opts = RunOptions(preset="cpu", storage_path=str(tmp_path / "st"), run_name="s",
                          sweep="table4", seeds=1, variants=["baseline"], max_updates=100,
                          data=str(data), **more)
        return resolve_sweep(multi30k_en_de.cpu(), opts).trials[0]

    first = trial()
    first.spec.run_dir.mkdir(parents=True)
    first.write_record({"test_2016_flickr/bleu": 30.0, "val/bleu": 31.0})
    assert trial().finished()["metrics"]["val/bleu"] == 31.0  # the same rerun: skipped
    # A record of an older scoring (BLEU tokenized without -a: no "scoring" in it) runs again
    rec = json.loads(first.record.read_text())
    first.record.write_text(json.dumps({k: v for k, v in rec.items() if k != "scoring"}))
    assert trial().recorded() is not None and trial().finished() is None
    first.write_record({"test_2016_flickr/bleu": 30.0, "val/bleu": 31.0})

    added = trial(test_set=["extra"])
    assert added.key == first.key  # the same settings and budget: the training stands
    assert added.recorded() is not None and added.finished() is None

    (data / "test_2016_flickr.de").write_text("ein Mann schl\u00e4ft nicht .\n" * 3,
                                              encoding="utf-8")
    assert trial().finished() is None


def test_the_summary_gives_mean_and_spread_per_variant_beside_the_papers_numbers(tmp_path):
    opts = RunOptions(preset="cpu", storage_path=str(tmp_path), run_name="s", sweep="table4",
                      seeds=2, variants=["baseline", "no-pos"], max_updates=100)
    sweep = resolve_sweep(multi30k_en_de.cpu(), opts)
    tests = list(sweep.base.test_sets.values())
    res = {"baseline-seed1": {"valid_ppl": 7.0, f"{tests[0]}/bleu": 30.0},
           "baseline-seed2": {"valid_ppl": 9.0, f"{tests[0]}/bleu": 32.0},
           "no-pos-seed1": {"valid_ppl": 8.0, f"{tests[0]}/bleu": 29.0}}
    table = summary_table(sweep, res, {"no-pos-seed2": "RayActorError: killed"})
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[:4]]
    assert cells[0] == ["variant", "n", "valid PPL", f"bleu {tests[0]}", f"bleu {tests[1]}",
                        "paper PPL", "paper bleu"]
    assert cells[2] == ["baseline", "2/2", "8.00 +- 1.41", "31.00 +- 1.41", "-", "6.64", "21.7"]
    assert cells[3] == ["no-pos", "1/2", "8.00", "29.00", "-", "6.68", "21.2"]
    assert "FAILED no-pos-seed2: RayActorError: killed" in table
    assert "not per BPE piece" in table  # the paper's PPL is per word of another vocabulary
    # A table without the paper's PPL (Table 7) leaves its cell empty, its BLEU as printed
    grid = dataclasses.replace(sweep, variants=variants_for(
        "table7", PRESETS["wmt14_en_de_ablation"]())[:2])
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in summary_table(grid, {}, {}).splitlines()[2:4]]
    assert [r[-2:] for r in rows] == [["", "21.63"], ["", "20.61"]]
    assert mean_sd([1.0])[0] == 1.0 and math.isnan(mean_sd([1.0])[1])
    # The same figures are the sweep run's metrics: mean and spread over the finished seeds
    # (one seed: no spread; a test set no trial scored: no metric).
    metrics = summary_metrics(sweep, res, {"no-pos-seed2": "RayActorError: killed"})
    assert metrics["baseline/n"] == 2 and metrics["no-pos/n"] == 1
    assert metrics["baseline/valid_ppl_mean"] == 8.0
    assert metrics["baseline/valid_ppl_sd"] == pytest.approx(math.sqrt(2))
    assert metrics[f"baseline/{tests[0]}_bleu_mean"] == 31.0
    assert metrics["no-pos/valid_ppl_mean"] == 8.0 and "no-pos/valid_ppl_sd" not in metrics
    assert f"baseline/{tests[1]}_bleu_mean" not in metrics
    assert (metrics["trials_finished"], metrics["trials_failed"]) == (3, 1)


def _test_data(folder: Path) -> Path:
    """A --data folder of the cpu preset's splits (three sentence pairs each)."""
    folder.mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        (folder / f"{stem}.en").write_text("a man sleeps .\n" * 3, encoding="utf-8")
        (folder / f"{stem}.de").write_text("ein Mann schl\u00e4ft .\n" * 3, encoding="utf-8")
    return folder


def test_a_trial_in_a_bucket_records_that_it_finished_and_a_rerun_reads_it_back(s3, tmp_path):
    """--storage-path s3://...: trial.json is one object, written whole by one PUT (a bucket
    renames nothing: every trial once failed after its training, no record written, and a
    rerun trained them all again)."""
    opts = RunOptions(preset="cpu", storage_path="s3://convs2s-test/sweep-records", run_name="s",
                      sweep="table4", seeds=1, variants=["baseline"], max_updates=100,
                      data=str(_test_data(tmp_path / "data")))
    trial = resolve_sweep(multi30k_en_de.cpu(), opts).trials[0]
    assert str(trial.record) == "s3://convs2s-test/sweep-records/s/baseline-seed1/trial.json"
    trial.write_record({"test_2016_flickr/bleu": 30.0, "valid_ppl": 7.5})
    assert s3.keys("convs2s-test", "sweep-records/") == \
        ["sweep-records/s/baseline-seed1/trial.json"]  # the record alone, nothing beside it
    rerun = resolve_sweep(multi30k_en_de.cpu(), opts).trials[0]
    assert rerun.finished()["metrics"] == {"test_2016_flickr/bleu": 30.0, "valid_ppl": 7.5}


def test_a_sweep_goes_on_only_in_the_experiment_its_trials_are_tracked_in(tmp_path):
    """A sweep rerun with another --experiment went on: its finished trials skipped, their
    runs left in the first experiment (yet counted in the new sweep run's summary), the others
    trained on in the second. Refused, naming the experiment, as a workflow run is."""
    from workflows.run_state import StageContext, record_settings
    from workflows.run_tree import RunTree
    from workflows.sweep import SweepError

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = dict(tracking_uri=uri, data=str(_test_data(tmp_path / "data")))
    trial = _sweep_of(tmp_path / "runs", experiment="first", **run).trials[0]
    tree = RunTree.open(uri, "first", trial.spec.run_dir, trial.name)
    record_settings(StageContext(tree), trial.spec)
    assert _sweep_of(tmp_path / "runs", experiment="first", **run)
    with pytest.raises(SweepError, match=rf"sweep 's', trial {trial.name}: .* is tracked in "
                                         r"MLflow experiment 'first'.*--experiment first"):
        _sweep_of(tmp_path / "runs", experiment="second", **run)


def test_a_finished_trial_stays_finished_when_the_code_adds_a_setting(tmp_path):
    """A field a newer version of the code adds (its default the earlier behaviour) changed
    every trial's key, and a sweep's rerun after a code update ran every finished trial
    again. The record keeps its settings: compared as a rerun compares them, a field only one
    side names aside; another value, or another budget, still runs the trial."""
    import json

    trial = _sweep_of(tmp_path / "runs", data=str(_test_data(tmp_path / "data"))).trials[0]
    trial.write_record({"test_2016_flickr/bleu": 30.0})
    rec = json.loads(trial.record.read_text())
    assert trial.recorded() is not None
    # recorded by the code before model.new_field existed: another key, one setting fewer
    older = {**rec, "key": "0123456789abcdef",
             "settings": {k: v for k, v in rec["settings"].items() if k != "model.dropout"}}
    trial.record.write_text(json.dumps(older))
    assert trial.recorded() is not None
    changed = {**older, "settings": {**older["settings"], "train.lr": "0.123"}}
    trial.record.write_text(json.dumps(changed))
    assert trial.recorded() is None
    longer = {**older, "budgets": {**older["budgets"], "max_updates": 7}}
    trial.record.write_text(json.dumps(longer))
    assert trial.recorded() is None


def test_a_finished_training_stays_finished_when_the_code_adds_a_setting():
    from workflows.steps import same_training

    was = {"model": {"dropout": 0.2, "layers": [[512, 3]]}, "train": {"lr": 0.5},
           "data": ["c", "f"]}
    now = {"model": {"dropout": 0.2, "layers": ((512, 3),), "new_field": 1},
           "train": {"lr": 0.5}, "data": ["c", "f"]}
    assert same_training(was, now)
    assert not same_training(was, {**now, "train": {"lr": 0.25}})
    assert not same_training(was, {**now, "init_from": "/ckpt"})
    assert not same_training(None, now)


def _sweep_of(tmp_path, **opts):
    """The cpu preset's table4 sweep, 2 variants x 2 seeds unless `opts` say otherwise."""
    run = {"preset": "cpu", "storage_path": str(tmp_path), "run_name": "s", "sweep": "table4",
           "seeds": 2, "variants": ["baseline", "no-pos"], "max_updates": 100, **opts}
    return resolve_sweep(multi30k_en_de.cpu(), RunOptions(**run))


def _node(cpus: float, gpus: float = 0, kind: str | None = None, alive: bool = True) -> dict:
    """A node as ray.nodes() lists it."""
    res = {"CPU": cpus, **({"GPU": gpus} if gpus else {}),
           **({f"accelerator_type:{kind}": 1.0} if kind else {})}
    return {"Alive": alive, "Resources": res}


def test_a_sweep_runs_as_many_trials_at_once_as_the_nodes_hold_their_workers(tmp_path):
    """Each training worker is placed whole on one node: trials at once = workers the alive
    nodes hold side by side / workers a trial trains, at most the trials there are."""
    cpu = _sweep_of(tmp_path, num_workers=2)  # 4 trials of 2 workers x 2 CPUs (the preset's)
    assert concurrency(cpu, [_node(8), _node(4), _node(64, alive=False)]) == 3
    assert concurrency(cpu, [_node(3), _node(3), _node(3)]) == 1  # a worker each, not 9 // 4
    assert concurrency(cpu, [_node(64)]) == 4
    assert concurrency(_sweep_of(tmp_path, num_workers=2, concurrent_trials=1),
                       [_node(64)]) == 1


def test_with_an_accelerator_type_only_that_models_gpus_count(tmp_path):
    """--accelerator-type A100 places each worker on an A100 node: the cluster's other GPUs
    hold none of its trials (they counted, and more trials were started than could run)."""
    gpu = {"use_gpu": True, "num_workers": 2, "seeds": 4}  # 8 trials of 2 workers x 1 GPU
    nodes = [_node(16, 4, "A100"), _node(32, 8, "A10G"), _node(8)]
    assert concurrency(_sweep_of(tmp_path, accelerator_type="A100", **gpu), nodes) == 2
    assert concurrency(_sweep_of(tmp_path, **gpu), nodes) == 6  # any GPU: 12 of them


def test_a_sweep_whose_trial_no_local_node_holds_is_refused_in_one_line(tmp_path, ray_session,
                                                                           monkeypatch, caplog):
    """A local Ray (no RAY_ADDRESS) never grows: a trial needing more than it has would have
    waited CONVS2S_PLACEMENT_WAIT_S (15 minutes) for its workers, then failed, trial after
    trial. On a cluster the autoscaler may add nodes: the sweep waits, one trial at a time."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    nodes = ray_session.nodes()  # the session's local Ray: 2 CPUs
    with pytest.raises(SweepError) as err:
        concurrency(_sweep_of(tmp_path, num_workers=3), nodes)
    assert str(err.value).startswith("--sweep table4: each trial trains 3 worker(s) of 2 CPU, "
                                     "but this machine's Ray has 2 CPU(s): no trial could start")
    assert "; run with --num-workers 1, or submit the sweep to a cluster" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(SweepError, match="run with --set workflow.cpus_per_worker=2 "):
        concurrency(_sweep_of(tmp_path, set=["workflow.cpus_per_worker=3"]), nodes)
    with pytest.raises(SweepError, match="has 2 CPU.s. and 0 GPU.s.: .*run without --use-gpu"):
        concurrency(_sweep_of(tmp_path, use_gpu=True), nodes)
    with pytest.raises(SweepError, match="no trial could start"):  # whatever trials at once
        concurrency(_sweep_of(tmp_path, num_workers=3, concurrent_trials=2), nodes)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert concurrency(_sweep_of(tmp_path, num_workers=3), nodes) == 1
    # ... and says how to run more at once: Ray Tune's waiting trials ask its autoscaler for
    # nothing, so one at a time it stays however far the cluster could grow
    assert "so the 4 trials run 1 at a time; --concurrent-trials N runs N at once" in \
        caplog.text
    from workflows import sweep  # a cluster joined without RAY_ADDRESS (a `ray up` head)

    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(sweep, "never_grows", lambda: False)
    assert concurrency(_sweep_of(tmp_path, num_workers=3), nodes) == 1


def test_a_variant_may_not_change_a_trials_resources(tmp_path):
    """The sweep checks the GPUs and counts the trials that fit from its own resources: a
    variant's --set workflow.num_workers (use_gpu, cpus_per_worker, accelerator_type, and the
    evaluation's eval_cpus / eval_gpus: more than a node holds, the trial's evaluation would
    wait without end) would outgrow them unseen, so it is refused with the flags that apply
    to every trial."""
    for setting in ("workflow.num_workers=2", "workflow.use_gpu=true",
                    "workflow.cpus_per_worker=4", "workflow.accelerator_type=A100",
                    "workflow.eval_cpus=64", "workflow.eval_gpus=1"):
        with pytest.raises(SweepError) as err:
            _sweep_of(tmp_path, sweep="custom", variants=[], variant=[f"big:{setting}"])
        key = setting.split("=")[0]
        assert str(err.value) == (
            f"--variant big: {key} is the sweep's own (a trial's resources are the sweep's: "
            "--num-workers, --use-gpu, --accelerator-type and --set workflow.cpus_per_worker "
            "/ eval_cpus / eval_gpus apply to every trial), the same for every variant")


def test_two_variants_that_run_the_same_settings_are_refused(tmp_path):
    """Two custom variants with the same settings (written alike or not: 0.5 and 0.50) ran the
    same trials twice over, the summary listing them as two variants."""
    with pytest.raises(SweepError, match=r"--variant b runs the same settings as a "
                       r"\(model.dropout=0.5; train.dropout_by_passes=\(\)\): drop one"):
        _sweep_of(tmp_path, sweep="custom", variants=[],
                  variant=["a:model.dropout=0.5", "b:model.dropout=0.50"])


def test_a_variant_may_not_change_the_budget_every_trial_trains_for(tmp_path):
    """Trials are compared at one budget (the summary states it for all): a variant's
    train.max_updates (max_time, max_epochs) trained it longer than the others unseen."""
    for setting in ("train.max_updates=5000", "train.max_time=2h", "train.max_epochs=9"):
        with pytest.raises(SweepError, match=rf"--variant long: {setting.split('=')[0]} is the "
                           r"sweep's own \(every trial trains for the sweep's budget"):
            _sweep_of(tmp_path, sweep="custom", variants=[], variant=[f"long:{setting}"])


def test_a_rerun_names_a_changed_trial_and_a_lost_data_folder_in_one_line(tmp_path):
    """A trial folder run under other settings: the line's fix is a new sweep --run-name (it
    offered --restart, which a sweep refuses). A rerun whose --data folder is gone: one
    `error:` line and the --data hint, exit 2, as a run says it (it was a traceback, exit 1,
    the status of a failed trial)."""
    from workflows.run_state import budgets, result_settings

    data = _test_data(tmp_path / "data")
    argv = ["--preset", "cpu", "--storage-path", str(tmp_path / "st"), "--run-name", "s",
            "--sweep", "table4", "--variants", "baseline", "--max-updates", "100", "--data",
            str(data)]
    trial = resolve_sweep(multi30k_en_de.cpu(), orchestrate.parse_args(
        argv, {"cpu": multi30k_en_de.cpu}, None)).trials[0]
    trial.spec.run_dir.mkdir(parents=True)
    (trial.spec.run_dir / "workflow.json").write_text(json.dumps(
        {"settings": result_settings(trial.spec), "budgets": budgets(trial.spec),
         "inputs": {"data.train": "recorded"}}))
    rc, out, err = _main(argv + ["--set", "train.lr=0.5"])
    assert rc == 2 and "trial baseline-seed1: its run was started with other settings (" in err
    assert "give the sweep a new --run-name" in err and "--restart" not in err, err
    import shutil

    shutil.rmtree(data)
    rc, out, err = _main(argv)
    lines = err.strip().splitlines()
    assert rc == 2 and "Traceback" not in err, err
    assert lines[0].startswith("error: ") and str(data) in lines[0], err
    assert lines[1].startswith("hint: this workflow reads its data with --data"), err


def test_a_finished_trial_runs_again_for_more_attention_pictures(tmp_path):
    """--attention N on a rerun draws the pictures (as a run's rerun does): a trial recorded
    with fewer runs again (its training and scores kept), one with as many or more does not."""
    def trial(attention):
        opts = RunOptions(preset="cpu", storage_path=str(tmp_path / "st"), run_name="s",
                          sweep="table4", seeds=1, variants=["baseline"], max_updates=100,
                          data=str(data), attention=attention)
        return resolve_sweep(multi30k_en_de.cpu(), opts).trials[0]

    data = _test_data(tmp_path / "data")
    first = trial(0)
    first.spec.run_dir.mkdir(parents=True)
    first.write_record({"val/bleu": 31.0})
    assert trial(0).finished() is not None and trial(2).finished() is None
    trial(2).write_record({"val/bleu": 31.0})
    assert trial(2).finished() is not None and trial(1).finished() is not None


def test_a_sweeps_metrics_are_its_latest_summarys(tmp_path):
    """A rerun of fewer seeds or variants summarizes its own trials: the figures an earlier
    invocation logged that it has none for (another variant's, an sd over seeds now one) read
    NaN, not the old numbers beside the new ones."""
    from convs2s.tracking.runs import (describe_run, find_or_create_run, log_artifacts,
                                       log_final_metrics, mlflow_client)
    from workflows.sweep import SweepResult
    from workflows.sweep_summary import log_summary, sweep_params

    uri = mlflow_store(tmp_path)
    m = {"valid_ppl": 10.0}

    def summarize(results, **opts):
        sweep = _sweep_of(tmp_path / "st", **opts)
        rid = find_or_create_run(uri, "x", run_key=str(sweep.folder), run_name="s")
        describe_run(uri, rid, sweep_params(sweep))
        result = SweepResult(sweep, rid, uri, results=results)
        result.table = summary_table(sweep, results, {})
        log_summary(sweep, result, uri, rid, log_final_metrics, log_artifacts)
        return mlflow_client(uri).get_run(rid).data.metrics

    both = summarize({"baseline-seed1": m, "baseline-seed2": {"valid_ppl": 20.0},
                      "no-pos-seed1": m, "no-pos-seed2": m})
    assert both["baseline/valid_ppl_sd"] > 0 and both["no-pos/n"] == 2
    again = summarize({"baseline-seed1": {"valid_ppl": 12.0}}, seeds=1, variants=["baseline"],
                      max_updates=200)
    assert again["baseline/valid_ppl_mean"] == 12.0 and again["baseline/n"] == 1
    assert math.isnan(again["baseline/valid_ppl_sd"])
    assert math.isnan(again["no-pos/n"]) and math.isnan(again["no-pos/valid_ppl_mean"])
    assert again["trials_finished"] == 1
    # summary.json is JSON any parser reads: the sd of one seed is null (json.dumps wrote NaN)
    text = (tmp_path / "st" / "s" / "summary.json").read_text()
    stats = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))[
        "variants"]["baseline"]["stats"]
    assert stats["valid_ppl"] == [12.0, None]


def test_a_sweep_is_refused_in_one_line_where_a_local_ray_could_not_run_it(tmp_path, ray_session,
                                                                        monkeypatch):
    """On a local Ray (it never grows): --concurrent-trials over the trials its CPUs hold (the
    others waited 15 minutes for room, then failed), an evaluation task larger than the
    machine (it waited without end after the training: a single run refused it, a sweep did
    not), and a custom variant's file that does not exist (found after its training) are one
    line before any trial starts."""
    from workflows.errors import SpecError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    data = str(_test_data(tmp_path / "data"))
    with pytest.raises(SweepError) as err:  # the cpu preset: a 2-CPU worker a trial
        concurrency(_sweep_of(tmp_path, num_workers=1, concurrent_trials=2),
                    ray_session.nodes())
    assert str(err.value) == (
        "--concurrent-trials 2: this machine's Ray holds the training workers of 1 trial(s) "
        "at a time (1 worker(s) each; a local Ray never grows: the others would wait 900 s "
        "for room, then fail); give --concurrent-trials 1, or leave it out")
    # ... counting the trials still to run: a rerun with one left runs it
    assert concurrency(_sweep_of(tmp_path, num_workers=1, concurrent_trials=2),
                       ray_session.nodes(), todo=1) == 2
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # a cluster may grow: as asked
    assert concurrency(_sweep_of(tmp_path, num_workers=1, concurrent_trials=2),
                       ray_session.nodes()) == 2
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(SpecError, match="workflow.eval_cpus=64: each evaluation task asks "
                                        "for 64 CPUs, but this machine's Ray has 2"):
        run_sweep(_sweep_of(tmp_path / "e", num_workers=1, data=data,
                            set=["workflow.eval_cpus=64"]))
    custom = _sweep_of(tmp_path / "c", num_workers=1, data=data, sweep="custom", variants=[],
                       variant=["dict:search.replace_unk=true;search.dictionary=/nope.txt"])
    with pytest.raises(SpecError, match="search.dictionary=/nope.txt: no such file"):
        run_sweep(custom)
    assert not (tmp_path / "c").exists()  # refused before the lease: nothing written


# --- end to end on the session's Ray (slow) ---------------------------------------------------


def _ray_processes() -> dict[int, str]:
    """{pid: title} of this machine's Ray worker processes ("ray::<actor class>.<method>")."""
    out = {}
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, ValueError):
            continue
        if title.startswith("ray::"):
            out[int(proc.name)] = title
    return out


def _trial_of(pid: int) -> str:
    """The trial a Ray Tune actor runs: Tune moves its working directory to the trial's
    (`.../working_dirs/<trial dir name>`, the trial's name in a sweep)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).name
    except OSError:
        return ""


def _kill_trial_when_checkpointed(trial_dir: Path, stop: threading.Event, killed: list):
    """SIGKILL the Ray Tune actor running the trial at `trial_dir` (a function trial's process
    is titled `ray::ImplicitFunc.train`), and no other trial's, once Ray Train has recorded a
    checkpoint of its training: a crashed trial, whose Ray Train run goes with it."""
    snapshot = trial_dir / "train" / "checkpoint_manager_snapshot.json"
    while not stop.is_set():
        try:
            latest = json.loads(snapshot.read_text()).get("latest_checkpoint_result")
        except (OSError, ValueError):
            latest = None
        if latest:
            pids = [pid for pid, title in _ray_processes().items()
                    if title.startswith("ray::ImplicitFunc") and
                    _trial_of(pid) == trial_dir.name]
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            killed.extend(pids or [f"no trial among {sorted(set(_ray_processes().values()))}"])
            return
        time.sleep(0.05)


# Updates of each trial of the sweep below: a checkpoint every 10, the killed trial dies after its
# first and its rerun trains the rest (docs/benchmarks.md has what 20 instead of 30 saved)
UPDATES = 20


def _sweep_cfg():
    """The Multi30k smoke preset cut for the sweeps below: outputs of at most 1.2 x |source| +
    10 pieces (untrained models would run to 200); one CPU a trial: two trials at a time on the
    session's two; a quarter of the demo corpus, 100 sentences to validate and score on; a
    checkpoint every 10 updates (the killed trial dies after its first)."""
    cfg = multi30k_en_de.smoke()
    return cfg.replace(train=cfg.train.replace(checkpoint_interval=10, keep_last=5),
                       search=cfg.search.replace(max_len_a=1.2, max_len_b=10), cpus_per_worker=1,
                       preprocess=cfg.preprocess.replace(
                           demo_rows={"train": 5000, "valid": 100, "test": 100}))


@pytest.fixture(scope="module")
def sweep_storage(tmp_path_factory):
    """One storage path for this module's sweeps (each its own run name): the data they share
    is prepared once."""
    return tmp_path_factory.mktemp("sweeps")


@pytest.mark.slow
def test_a_sweep_runs_each_trial_as_a_child_run_and_a_rerun_continues_a_killed_one(
        ray_session, sweep_storage, tmp_path):
    from mlflow.tracking import MlflowClient

    from convs2s.io.checkpoint import best_checkpoint, list_checkpoints, load_model
    from convs2s.model.network import inference_copy

    uri = mlflow_store(tmp_path)
    cfg = _sweep_cfg()
    opts = RunOptions(preset="smoke", storage_path=str(sweep_storage), run_name="t4",
                      tracking_uri=uri, sweep="table4", seeds=1,
                      variants=["baseline", "no-pos"], max_updates=UPDATES)
    # Two trials, both at once: the mean and spread over seeds are a function's
    # (test_the_summary_gives_mean_and_spread_per_variant_beside_the_papers_numbers).
    sweep = resolve_sweep(cfg, opts)
    assert concurrency(sweep, ray_session.nodes()) == 2
    victim = sweep.trials[0]  # baseline-seed1, killed beside no-pos-seed1
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_trial_when_checkpointed,
                               args=(victim.spec.run_dir, stop, killed), daemon=True)
    watcher.start()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGUSR1)}
    try:
        first = run_sweep(sweep)
    finally:
        stop.set()
        watcher.join()
    # Ray Tune's Ctrl-C and SIGUSR1 handlers (which stop its experiment) end with the sweep: the
    # caller's are in place again
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert killed and all(isinstance(k, int) for k in killed), killed
    # The killed trial is reported; the other ran to the end.
    assert list(first.failed) == ["baseline-seed1"]
    assert sorted(first.results) == ["no-pos-seed1"]
    assert "FAILED baseline-seed1" in first.table and "| baseline | 0/1 |" in first.table
    # The checkpoints Ray Train had recorded when the trial died (its snapshot is what a
    # restored run resumes from).
    snapshot = json.loads((victim.spec.run_dir / "train/checkpoint_manager_snapshot.json")
                          .read_text())
    recorded = {r["checkpoint_dir_name"] for r in snapshot["checkpoint_results"]}
    kept = {c.update: c.path for c in list_checkpoints(victim.spec.run_dir / "train")
            if Path(c.path).name in recorded}
    assert kept and max(kept) < UPDATES, (recorded, kept)
    stamps = {u: (Path(p) / "checkpoint.pt").stat().st_mtime_ns for u, p in kept.items()}

    # MLflow: the sweep run, one child per trial with its variant, seed and changes as params.
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("multi30k_en_de")
    runs = client.search_runs([exp.experiment_id], max_results=500)
    (top,) = [r for r in runs if r.info.run_name == "t4"]
    assert top.data.tags["convs2s.sweep"] == "table4" and top.info.status == "FAILED"
    said = top.data.tags["convs2s.sweep.invocation"]  # what its summary and metrics are of
    assert f"variants baseline,no-pos; seeds 1; {UPDATES} updates per trial" in said, said
    trials = {r.info.run_name: r for r in runs
              if r.data.tags.get("mlflow.parentRunId") == top.info.run_id}
    assert set(trials) == {t.name for t in sweep.trials}
    # One filter finds a sweep's run and its trials' runs: the tags mean the same on each.
    found = client.search_runs([exp.experiment_id], max_results=500, filter_string=(
        "tags.`convs2s.sweep` = 'table4' and tags.`convs2s.sweep.run` = 't4'"))
    assert {r.info.run_id for r in found} == {top.info.run_id} | \
        {r.info.run_id for r in trials.values()}
    assert trials["no-pos-seed1"].data.tags["convs2s.variant"] == "no-pos"
    # The killed trial's workflow died with it: the sweep ended its runs as FAILED.
    assert trials["baseline-seed1"].info.status == "FAILED"
    assert not _open_runs(client, exp.experiment_id, sweep.folder)
    p = trials["no-pos-seed1"].data.params
    assert (p["sweep.variant"], p["sweep.seed"]) == ("no-pos", "1")
    assert p["sweep.changes"] == "model.src_positions=False; model.tgt_positions=False"
    assert p["workflow.model.src_positions"] == "False"
    assert trials["baseline-seed1"].data.params["sweep.changes"] == "none"
    assert "bleu" in trials["no-pos-seed1"].data.metrics
    assert "no-pos/valid_ppl_mean" in top.data.metrics and top.data.metrics["baseline/n"] == 0

    # A model without position embeddings trained, round-trips through its checkpoint and
    # decodes incrementally like its full pass.
    import torch
    import torch.nn.functional as F

    model, meta = load_model(best_checkpoint(sweep.trials[1].spec.run_dir / "train").path)
    assert not meta["model_config"]["src_positions"]
    assert not any("embed_positions" in k for k in model.state_dict())
    src = torch.randint(4, 200, (2, 9))
    prev = torch.randint(4, 200, (2, 6))
    lengths = torch.tensor([9, 9])
    net = inference_copy(model)
    with torch.no_grad():
        full, _ = model(src, lengths, prev)
        state = net.init_state(net.encode(src, lengths))
        for t in range(prev.shape[1]):
            step, _ = net.decode_step(prev[:, t], state)
            torch.testing.assert_close(F.log_softmax(step, -1), F.log_softmax(full[:, t], -1),
                                       rtol=0, atol=1e-4)

    # The rerun skips the finished trial and continues the killed one from its checkpoints
    # (kept as they were) to the same budget.
    again = run_sweep(resolve_sweep(cfg, opts))
    assert sorted(again.skipped) == ["no-pos-seed1"]
    resumed = again.results["baseline-seed1"]
    assert not again.failed and resumed["updates"] == UPDATES
    assert resumed["resumed_from_update"] == max(kept)
    for u, stamp in stamps.items():
        assert (Path(kept[u]) / "checkpoint.pt").stat().st_mtime_ns == stamp
    runs = client.search_runs([exp.experiment_id], max_results=500)
    (top2,) = [r for r in runs if r.info.run_name == "t4"]
    assert top2.info.run_id == top.info.run_id and top2.info.status == "FINISHED"
    again_trials = {r.info.run_name: r for r in runs
                    if r.data.tags.get("mlflow.parentRunId") == top.info.run_id}
    assert {n: r.info.run_id for n, r in again_trials.items()} == \
        {n: r.info.run_id for n, r in trials.items()}  # reopened, none added
    assert again_trials["baseline-seed1"].info.status == "FINISHED"
    (train,) = [r for r in runs if r.info.run_name == "train" and
                r.data.tags.get("mlflow.parentRunId") == trials["baseline-seed1"].info.run_id]
    steps = [m.step for m in client.get_metric_history(train.info.run_id, "valid/ppl")]
    assert steps == sorted(set(steps)) and steps[-1] == UPDATES  # each validation logged once
    assert "| baseline | 1/1 |" in again.table
    assert "baseline/valid_ppl_mean" in top2.data.metrics
    assert (sweep.folder / "summary.md").read_text().count("| no-pos") == 1
    # Once every trial finished, the same sweep again skips them all and runs nothing.
    third = run_sweep(resolve_sweep(cfg, opts))
    assert sorted(third.skipped) == sorted(t.name for t in sweep.trials) and not third.failed
    assert third.table.splitlines()[2:4] == again.table.splitlines()[2:4]

    # The printed summary links the sweep run and a compare view of every trial's run.
    printed = orchestrate.sweep_summary(again, 60.0)
    assert "==== sweep t4 (table4 on multi30k_en_de smoke) done in 1.0 min ====" in printed
    (compare,) = [line for line in printed.splitlines() if line.startswith("  compare: ")]
    assert all(r.info.run_id in compare for r in trials.values())
    assert f"/runs/{top.info.run_id}?workflowType=machine_learning" in printed


def test_a_stopped_trials_runs_end_killed_even_where_its_teardown_ended_them_failed(tmp_path):
    """A trial Ray Tune stopped may live long enough to see its Ray Train run lost and end its
    runs FAILED: the sweep ends them KILLED, with those still open; a run of the trial that
    failed before this sweep's trials started keeps its FAILED."""
    from mlflow.tracking import MlflowClient

    from convs2s.tracking.runs import end_run
    from workflows.run_tree import RunTree

    uri = mlflow_store(tmp_path)
    sweep = RunTree.open(uri, "stops", tmp_path / "sweep", "sweep")
    trial = RunTree.open(uri, "stops", tmp_path / "sweep" / "t1", "t1", within=sweep.parent)
    earlier = trial.child("eval/best/old", "eval")
    end_run(uri, earlier, "FAILED")
    time.sleep(0.01)
    since = time.time()
    time.sleep(0.01)
    torn_down = trial.child("train", "train")
    end_run(uri, torn_down, "FAILED")  # (the error the stop caused)
    still_open = trial.child("eval/best/test", "eval")
    other = RunTree.open(uri, "stops", tmp_path / "sweep" / "t2", "t2", within=sweep.parent)
    end_run(uri, other.parent, "FAILED")  # another trial's: not this one's to end
    sweep.end_open("KILLED", under=trial.run_dir, also=("FAILED",), since=since)
    client = MlflowClient(uri)
    status = {name: client.get_run(run_id).info.status for name, run_id in [
        ("trial", trial.parent), ("torn down", torn_down), ("open", still_open),
        ("earlier", earlier), ("other trial", other.parent), ("sweep", sweep.parent)]}
    assert status == {"trial": "KILLED", "torn down": "KILLED", "open": "KILLED",
                      "earlier": "FAILED", "other trial": "FAILED", "sweep": "RUNNING"}


def _open_runs(client, experiment_id: str, folder: Path) -> list[str]:
    """The names of the runs still RUNNING whose key (tag convs2s.run_key) is under `folder`."""
    root = str(folder)
    return [r.info.run_name for r in client.search_runs(
                [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000)
            if r.data.tags.get("convs2s.run_key", "").startswith(root + "/")
            or r.data.tags.get("convs2s.run_key") == root]


@pytest.mark.slow
def test_ctrl_c_stops_a_sweep_as_it_stops_a_run_its_runs_killed_and_nothing_summarized(
        ray_session, sweep_storage, tmp_path):
    """Ray Tune's handler takes a Ctrl-C during a sweep and stops the trials; the sweep then
    raises KeyboardInterrupt (a workflow exits 130 with the command that resumes) instead of
    summarizing the stopped trials as if they had run."""
    import logging

    from mlflow.tracking import MlflowClient

    from storage.signals import sigterm_handed_to_ctrl_c

    uri = mlflow_store(tmp_path)
    opts = RunOptions(preset="smoke", storage_path=str(sweep_storage), run_name="ctrl-c",
                      tracking_uri=uri, sweep="table4", seeds=1, variants=["baseline"],
                      max_updates=400)  # far beyond where the key is pressed
    sweep = resolve_sweep(_sweep_cfg(), opts)
    first = sweep.trials[0]
    client = MlflowClient(uri)
    pressed, stop = [], threading.Event()

    def press_once_the_first_trial_trains():
        """Ctrl-C once Ray Train has recorded the first trial's first checkpoint (its run is
        under way, its placement group in the hands of Ray Train's cleaner)."""
        snapshot = first.spec.run_dir / "train" / "checkpoint_manager_snapshot.json"
        while not stop.wait(0.1):
            try:
                latest = json.loads(snapshot.read_text()).get("latest_checkpoint_result")
            except (OSError, ValueError):
                latest = None
            if latest:
                pressed.append(signal.getsignal(signal.SIGTERM))
                os.kill(os.getpid(), signal.SIGINT)
                return

    tune_records = []
    collect = logging.Handler()
    collect.emit = lambda record: tune_records.append(record.getMessage())
    tune_log = logging.getLogger("ray.tune.tune")
    tune_log.addHandler(collect)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # a command's Ctrl-C
    presser = threading.Thread(target=press_once_the_first_trial_trains, daemon=True)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt, match=f"Ray Tune stopped the sweep before "
                                                    f"{first.name}"):
            run_sweep(sweep)
    finally:
        stop.set()
        presser.join()
        tune_log.removeHandler(collect)
        after = signal.signal(signal.SIGINT, before)
    assert pressed, "the first trial never recorded a checkpoint"
    assert after is signal.default_int_handler  # the caller's again, not Ray Tune's
    # SIGTERM (`ray job stop`) meanwhile went to the handler that hands it to Ray Tune's Ctrl-C
    assert pressed[0] is sigterm_handed_to_ctrl_c
    # Ray Tune's own notice came; its hint to resume through its API did not (the workflow
    # prints the command that resumes).
    assert any("Stop signal received" in m for m in tune_records), tune_records
    assert not any("Tuner.restore(" in m for m in tune_records), tune_records

    exp = client.get_experiment_by_name("multi30k_en_de")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert runs["ctrl-c"].info.status == "KILLED"
    assert runs[first.name].info.status == "KILLED"
    assert not _open_runs(client, exp.experiment_id, sweep.folder)
    # Nothing summarized and no trial recorded as finished: the same command resumes the sweep.
    assert not (sweep.folder / "summary.md").exists()
    assert all(t.finished() is None for t in sweep.trials)
    # The stopped trial's Ray Tune actor is gone (Ray Tune's cleanup kills it), and its
    # training's CPUs are free again (Ray Train's cleaner removes the run's placement group; one
    # it missed, the sweep: the next test).
    deadline = time.monotonic() + 30
    while left := [pid for pid, title in _ray_processes().items()
                   if title.startswith("ray::ImplicitFunc") and _trial_of(pid) == first.name]:
        assert time.monotonic() < deadline, f"trial actor(s) {left} still running"
        time.sleep(0.2)
    from workflows.evaluation import _free_cpus_per_node

    assert _free_cpus_per_node(settle_s=max(0.0, deadline - time.monotonic())), \
        f"the session's CPUs are still taken after the stop, by {cpu_holders()}"


def test_a_stopped_sweep_removes_the_placement_groups_its_trials_left_and_no_other(ray_session):
    """Ray Train's controller, ended while it restarted a stopped trial's workers, once made a
    placement group on its way out that nothing removed: 1 CPU of the session's Ray held for
    good. A stopped sweep removes what its job made since it began, one made late included,
    and keeps what was there before."""
    from ray.util import placement_group, placement_group_table, remove_placement_group

    from workflows.sweep import _job_placement_groups, _remove_placement_groups_left

    ray, made, late = ray_session, [], []
    maker = threading.Timer(0.5, lambda: late.append(placement_group([{"CPU": 0.5}])))
    try:
        kept = placement_group([{"CPU": 1}])  # the caller's own, from before the sweep
        made.append(kept)
        ray.get(kept.ready(), timeout=60)
        before = _job_placement_groups()
        left = placement_group([{"CPU": 1}])
        made.append(left)
        ray.get(left.ready(), timeout=60)
        maker.start()
        removed = _remove_placement_groups_left(before, quiet_s=1.5)
        maker.join()
        assert sorted(removed) == sorted([left.id.hex(), late[0].id.hex()])
        table = placement_group_table()
        assert table[left.id.hex()]["state"] == table[late[0].id.hex()]["state"] == "REMOVED"
        assert table[kept.id.hex()]["state"] == "CREATED"
    finally:  # (the session's Ray has 2 CPUs: nothing of this test may hold one after it)
        maker.cancel()
        for group in made + late:
            remove_placement_group(group)


def test_a_hub_trial_finished_before_hub_data_was_keyed_by_commit_stays_finished(tmp_path):
    """Since 2026-12-07 a hub dataset's revision name is no setting of a run (its commit is
    the run's input identity): a trial.json written before, whose key named it, still answers
    a rerun of the same trial (its training was not launched again)."""
    from workflows import wmt14_en_de

    opts = RunOptions(preset="ablation", storage_path=str(tmp_path / "st"), run_name="s",
                      sweep="table4", seeds=1, variants=["baseline"], max_updates=100)
    trial = resolve_sweep(wmt14_en_de.ablation(), opts).trials[0]
    assert trial.spec.data.source == "hub" and len(trial.keys_before) == 1
    trial.spec.run_dir.mkdir(parents=True)
    trial.record.write_text(json.dumps({"key": trial.keys_before[0], "metrics": {}}))
    assert trial.recorded() is not None
    trial.record.write_text(json.dumps({"key": "another", "metrics": {}}))
    assert trial.recorded() is None


def test_a_sweep_inside_a_workflows_live_run_folder_is_refused(tmp_path):
    """A sweep whose --storage-path is a workflow's run folder while that workflow runs: its
    trials would be written inside a run another command holds (a workflow and `convs2s
    train` were refused there; the sweep's lease named no folder above it)."""
    from storage.lease import LEASE_FILE, LeaseHeld

    held = tmp_path / "wf"
    held.mkdir()
    now = time.time()
    (held / LEASE_FILE).write_text(json.dumps({
        "host": "other-host", "pid": 4242, "id": "someone", "command": "wmt14_en_fr paper",
        "renewed": now, "expires": now + 120}))
    with pytest.raises(LeaseHeld, match=r"inside .*wf, which is in use by another command "
                                        r"\(wmt14_en_fr paper\)"):
        run_sweep(_sweep_of(held, seeds=1, variants=["baseline"], data="demo"))
    assert not (held / "s").exists()
