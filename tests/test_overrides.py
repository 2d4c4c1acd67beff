"""A researcher's knobs without Python (workflows/overrides.py, --config, --dry-run): any
setting changed with `--set section.field=value`, a preset written to and read from a YAML
file, the resolved run printed before anything starts; a bad name or value is one line, exit 2.

Run: .venv/bin/python -m pytest tests/test_overrides.py -q
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workflows import gigaword, multi30k_en_de, wmt14_en_de, wmt14_en_fr, wmt16_en_ro
from workflows.errors import SpecError
from workflows.orchestrate import config_yaml
from workflows.run_spec import resolve
from workflows.workflow_config import RunOptions, WorkflowConfig

REPO = Path(__file__).resolve().parents[1]


def _main(module, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = module.main(module.PRESETS, module.__doc__, argv)
    return rc, out.getvalue(), err.getvalue()


def test_set_changes_any_section_and_dry_run_shows_the_run_without_starting_anything(tmp_path):
    argv = ["--preset", "paper", "--set", "model.dropout=0.3", "--set", "train.lr=0.5",
            "--set", "search.beam=10", "--set", "data.vocab_size=32000",
            "--set", "ensemble.average_last=3", "--set", "workflow.eval_cpus=2",
            "--set", "model.encoder_layers=[[512, 3], [512, 3]]", "--dry-run",
            "--storage-path", str(tmp_path / "runs"), "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}"]
    code = ("import sys, json\nfrom workflows import wmt14_en_fr as w\n"
            f"rc = w.main(w.PRESETS, w.__doc__, {argv!r})\n"
            "print(json.dumps({'rc': rc, 'ray': 'ray' in sys.modules, "
            "'mlflow': 'mlflow' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)
    *printed, status = proc.stdout.strip().splitlines()
    assert json.loads(status) == {"rc": 0, "ray": False, "mlflow": False}  # nothing started
    run = json.loads("\n".join(printed))
    w = run["workflow"]
    assert w["model"]["dropout"] == 0.3 and w["train"]["lr"] == 0.5
    assert w["search"]["beam"] == 10 and w["preprocess"]["vocab_size"] == 32000
    assert w["ensemble"]["average_last"] == 3
    assert w["model"]["encoder_layers"] == [[512, 3], [512, 3]]
    # the evaluation's resources are the run's settings too (they were shown nowhere but in
    # the overrides line, and nowhere at all from a --config file)
    assert w["eval_cpus"] == 2 and w["eval_gpus"] == wmt14_en_fr.paper().eval_gpus > 0
    assert w["system_metrics_s"] > 0
    assert run["run"]["attention"] == 0
    assert w["overrides"] == ("model.dropout=0.3; train.lr=0.5; search.beam=10; "
                              "data.vocab_size=32000; ensemble.average_last=3; "
                              "workflow.eval_cpus=2; model.encoder_layers=[[512, 3], [512, 3]]")
    # The paper's update: 8 GPUs x 3,000 tokens.
    assert run["update"] == {"workers": 8, "gpus": 8, "max_tokens_per_batch": 3000,
                             "micro_batches_per_update": 1, "max_tokens_per_update": 24000,
                             "preset_tokens_per_update": 24000}
    assert w["update_tokens"] == 24000  # a param of the parent run
    assert run["run"]["tracking_uri"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("workers, freq, tokens", [(8, 1, 24000), (4, 2, 24000), (2, 4, 24000),
                                                   (1, 8, 24000)])
def test_fewer_gpus_keep_the_papers_update_by_accumulating_micro_batches(workers, freq, tokens,
                                                                         tmp_path):
    """The paper's En-Fr update is 8 GPUs x 3,000 tokens: on fewer GPUs each accumulates
    micro-batches (the reference's --update-freq), so the run still trains 24,000-token
    updates; `--dry-run` shows it."""
    rc, out, err = _main(wmt14_en_fr, ["--preset", "paper", "--num-workers", str(workers),
                                       "--dry-run", "--storage-path", str(tmp_path)])
    assert rc == 0, err
    update = json.loads(out)["update"]
    assert (update["workers"], update["micro_batches_per_update"],
            update["max_tokens_per_update"]) == (workers, freq, tokens)
    assert "note" not in update
    spec = resolve(wmt14_en_fr.paper(), RunOptions(preset="paper", num_workers=workers,
                                                   storage_path=str(tmp_path)))
    assert spec.train.update_freq == freq and not spec.update_note


def test_gigawords_update_is_128_sentences_on_any_number_of_gpus(tmp_path):
    """§5.7 "batch size 128" on one GPU: batches of 128 sentences (the token budget does not
    close them first: the default 4,000 did, at 77 on average), and on 4 GPUs the run says
    that it trains 4 x 128 unless each GPU takes 32; `--dry-run` shows sentences."""
    rc, out, err = _main(gigaword, ["--preset", "paper", "--dry-run", "--storage-path",
                                    str(tmp_path)])
    assert rc == 0, err
    update = json.loads(out)["update"]
    assert (update["max_sentences_per_batch"], update["max_sentences_per_update"],
            update["preset_sentences_per_update"], update["workers"]) == (128, 128, 128, 1)
    assert update["max_tokens_per_batch"] >= 128 * 256 and "note" not in update
    four = resolve(gigaword.paper(), RunOptions(preset="paper", num_workers=4,
                                                storage_path=str(tmp_path)))
    assert four.train.update_freq == 1 and four.update_note == (
        "4 worker(s) x 1 micro-batch(es) x 128 sentences = 512 sentences an update: the "
        "preset's update is 128 sentences, which 4 worker(s) cannot keep exactly "
        "(--set data.max_sentences=32 keeps it with 1 micro-batch(es))")
    kept = resolve(gigaword.paper(), RunOptions(preset="paper", num_workers=4,
                                                storage_path=str(tmp_path),
                                                set=["data.max_sentences=32"]))
    assert kept.update_note == "" and kept.params()["workflow"]["update_sentences"] == 128
    # Its UNK -> <unk> map is one param value: `<unk>` as a param name lost the whole batch
    from convs2s.tracking.runs import flatten_params
    from workflows.run_spec import mlflow_key_part

    params = flatten_params(kept.params())
    assert params["workflow.preprocess.token_map"] == '{"UNK": "<unk>"}'
    assert all(mlflow_key_part(part) for key in params for part in key.split(".")), params
    assert "workflow.preprocess.token_map" not in flatten_params(
        resolve(wmt14_en_fr.paper(), RunOptions(storage_path=str(tmp_path))).params())
    with pytest.raises(ValueError, match="in tokens .* or in sentences"):
        gigaword.paper().replace(update_tokens=4000)
    # A token budget that closes the batches first is said when the batches are cut (their
    # manifest: 1,000 Gigaword sample pairs in 13 batches under 4,000 tokens, 8 under 128 x 256)
    from workflows.steps import sentences_fill_note

    small = resolve(gigaword.paper(), RunOptions(preset="paper", storage_path=str(tmp_path),
                                                 set=["data.max_tokens=4000"]))
    assert sentences_fill_note(small, {"batches": 13, "rows_kept": 1000}) == (
        "the training batches hold 77 sentences on average, not the 128 of the preset's "
        "update: data.max_tokens=4,000 closes them first (a larger budget keeps the update)")
    one = resolve(gigaword.paper(), RunOptions(preset="paper", storage_path=str(tmp_path)))
    assert sentences_fill_note(one, {"batches": 8, "rows_kept": 1000}) is None
    assert sentences_fill_note(resolve(wmt14_en_fr.paper(), RunOptions(
        storage_path=str(tmp_path))), {"batches": 13, "rows_kept": 1000}) is None


def test_an_update_the_workers_cannot_keep_is_said_in_one_line(tmp_path, capsys):
    from workflows.run_spec import update_plan

    # 3 GPUs: 3 x 3 x 3,000 = 27,000, the nearest; the note says so and which budgets keep
    # it (no --update-freq can at 3,000 tokens: it said "--update-freq to choose")
    freq, note = update_plan(24000, 3, 3000, None, 1)
    assert freq == 3 and note == ("3 worker(s) x 3 micro-batch(es) x 3,000 tokens = 27,000 "
                                  "tokens an update: the preset's update is 24,000 tokens, "
                                  "which 3 worker(s) cannot keep exactly (--set "
                                  "data.max_tokens=2000 keeps it with 4 micro-batch(es) or "
                                  "--set data.max_tokens=4000 keeps it with 2 micro-batch(es))")
    for budget, micro in ((2000, 4), (4000, 2)):  # and each does
        assert update_plan(24000, 3, budget, None, 1) == (micro, "")
    # En-De's one GPU x 4,000 on 3 GPUs: no budget keeps it; the nearest is named
    assert update_plan(4000, 3, 4000, None, 1)[1].endswith(
        "(no budget keeps it exactly on 3 worker(s); --set data.max_tokens=1333 comes nearest, "
        "3,999 tokens an update)")
    # The paper's En-De update (one GPU x 4,000 tokens) on 8 GPUs: smaller batches keep it.
    spec = resolve(wmt14_en_de.paper(), RunOptions(preset="paper", num_workers=8,
                                                   storage_path=str(tmp_path)))
    assert spec.train.update_freq == 1
    assert spec.update_note.endswith("which 8 worker(s) cannot keep exactly "
                                     "(--set data.max_tokens=500 keeps it with 1 "
                                     "micro-batch(es))")
    kept = resolve(wmt14_en_de.paper(), RunOptions(preset="paper", num_workers=8,
                                                   storage_path=str(tmp_path),
                                                   set=["data.max_tokens=500"]))
    assert kept.update_note == "" and kept.data.max_tokens == 500
    # --update-freq decides; a preset without a stated update keeps its own.
    asked = resolve(wmt14_en_fr.paper(), RunOptions(preset="paper", num_workers=8,
                                                    update_freq=2, storage_path=str(tmp_path)))
    assert asked.train.update_freq == 2 and "not the preset's 24,000" in asked.update_note
    # ... and so does --set train.update_freq (the plan once replaced it without a word)
    set_ = resolve(wmt14_en_fr.paper(), RunOptions(preset="paper", num_workers=8,
                                                   set=["train.update_freq=2"],
                                                   storage_path=str(tmp_path)))
    assert set_.train.update_freq == 2 and "not the preset's 24,000" in set_.update_note
    # --max-updates on top of a --set train.max_epochs keeps both limits
    both = resolve(wmt14_en_fr.paper(), RunOptions(preset="paper", max_updates=1000,
                                                   set=["train.max_epochs=5"],
                                                   storage_path=str(tmp_path)))
    assert (both.train.max_epochs, both.train.max_updates) == (5, 1000)
    assert update_plan(0, 4, 4000, None, 3) == (3, "")
    with pytest.raises(SystemExit) as exited:
        wmt14_en_fr.main(wmt14_en_fr.PRESETS, wmt14_en_fr.__doc__,
                         ["--update-freq", "0", "--storage-path", str(tmp_path)])
    assert exited.value.code == 2
    assert "--update-freq 0: give a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("setting, says", [
    ("train.lrr=0.5", "TrainConfig has no field 'lrr' (did you mean lr"),
    # a setting of another section: named (the section's own names were the suggestions)
    ("train.dropout=0.3", "no field 'dropout' (did you mean dropout_by_passes?); dropout is a "
                          "setting of model.dropout"),
    ("train.lenpen=0.6", "TrainConfig has no field 'lenpen'; lenpen is a setting of "
                         "search.lenpen"),
    ("workflow.lr=0.1", "WorkflowConfig has no field 'lr'; lr is a setting of train.lr"),
    ("train.batch_size=64", "batches are cut by padded tokens, data.max_tokens"),
    ("modle.dropout=0.3", "no section 'modle' (did you mean model?)"),
    ("model.dropout=high", "model.dropout takes float, not 'high'"),
    ("model.dropout=1.5", "dropout must be in [0, 1)"),
    ("train.max_updates=2.5", "train.max_updates takes int"),
    ("search.precision=fp16", "precision must be 'fp32', 'bf16' or 'int8'"),
    ("data.root=/elsewhere", "data.root is set by --storage-path"),
    ("dropout=0.3", "write section.field=value"),
    ("workflow.task_kind=summarisation", "unknown task kind 'summarisation'"),
    ("workflow.num_workers=0", "num_workers >= 1"),
    # accepted before: data outside the storage path, a seed numpy refused in the batches
    # stage hours later, text flags all true (attention everywhere: the opposite asked)
    ("data.task=/tmp/elsewhere", "task names a folder under the storage path"),
    ("data.task=../../outside", "task names a folder under the storage path"),
    ("data.seed=-3", "seed must be an integer >= 0"),
    ('model.decoder_attention=["false", "no", "0"]',
     "decoder_attention is one flag per decoder layer, true or false; got ('false', 'no', "),
])
def test_a_bad_setting_is_one_line_and_exit_2_before_anything_runs(setting, says, tmp_path):
    rc, out, err = _main(wmt14_en_fr, ["--set", setting, "--storage-path", str(tmp_path)])
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --set") and says in lines[0], err
    assert not any(tmp_path.iterdir())


def test_the_other_sections_hint_goes_with_the_field_it_names(tmp_path):
    """It followed the first wrong-section field of the section, whatever the refusal was."""
    rc, _, err = _main(wmt14_en_fr, ["--set", "train.lr=abc", "--set", "train.dropout=0.1",
                                     "--storage-path", str(tmp_path), "--dry-run"])
    assert rc == 2 and err.strip() == "error: --set train.lr=abc: train.lr takes float, not 'abc'"


@pytest.mark.parametrize("setting, says", [
    # values --dry-run passed, that failed after training (a split) or in the workers
    ("data.splits={train: train, test: test}", "data.splits has no 'valid' split, which "
                                               "training validates on"),
    ("data.splits={train: train, valid: validation}", "data.splits has no 'test' split, which "
                                                      "the run scores"),
    ("model.embed_dim=-8", "embed_dim must be a positive integer, got -8"),
    ("model.encoder_layers=[[512, 0]]", "encoder_layers is [[channels, kernel_width], ...]"),
    ("model.encoder_layers=[[512, 3.5]]", "at least one layer of two positive integers"),
    ("model.decoder_layers=[]", "decoder_layers is [[channels, kernel_width], ...]"),
    ("model.max_positions=1", "max_positions must be an integer >= 2"),  # was a traceback
    ("train.adam_betas=[0.9]", "adam_betas is (beta1, beta2), each in [0, 1)"),
    ("train.lr=-1", "lr must be > 0, got -1.0"),
    ("train.momentum=1.5", "momentum must be in [0, 1), got 1.5"),
    ("train.warmup_updates=-5", "warmup_updates must be >= 0, got -5"),
    ("train.max_time=1:30", "train.max_time takes float, not '1:30'"),  # YAML 1.1 read 90
    ("train.max_time=20m", "train.max_time takes float, not '20m': seconds (a duration with "
                           "its unit is the --max-time flag's: --max-time 20m)"),
    # (said as a comparison of a float and a str, and "'int' object is not iterable")
    ("train.adam_betas=[a, b]", "adam_betas is (beta1, beta2), each in [0, 1), got ('a', 'b')"),
    ("train.dropout_by_passes=[1, 2]", "dropout_by_passes is ((from_passes, dropout), ...), a "
                                       "list of number pairs, e.g. [[0, 0.3], [30, 0.4]]"),
    ("train.compile=true", "train.compile takes str, not True: give a name, or false for none"),
    ("train.compile=inducter", "compile='inducter': not a torch.compile backend; give one of "
                               "inductor"),
    ("train.fuse=indcutor", "fuse='indcutor': not a torch.compile backend"),
    # a NaN ratio compared false with every pair's: the filter was off without a word
    ("data.max_len_ratio=.nan", "max_len_ratio must be >= 1 or None, got nan"),
    ("data.max_len=0", "max_len must be >= 1 word or None, got 0"),  # every row too_long, late
    ("data.character_coverage=.nan", "character_coverage must be in (0, 1], got nan"),
    ("data.character_coverage=1.5", "character_coverage must be in (0, 1], got 1.5"),
    # a comma in a split's files: YAML cut the mapping into another key
    ("data.splits={train: a.en,b.fr, valid: v, test: t}",
     'takes dict[str, str], not {\'train\': \'a.en\', \'b.fr\': None, \'valid\': \'v\', '
     '\'test\': \'t\'} (quote a str that YAML reads otherwise, or that holds a comma: '
     '{key: "a.en,b.fr"})'),
    ("data.splits=train", "data.splits takes dict[str, str], not 'train' (a mapping: "
                          "{key: value, ...})"),
])
def test_a_value_out_of_range_is_refused_by_dry_run_in_one_line(setting, says, tmp_path):
    rc, out, err = _main(wmt14_en_fr, ["--set", setting, "--storage-path", str(tmp_path),
                                       "--dry-run"])
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --set") and says in lines[0], err


def test_an_update_stated_twice_names_the_setting_that_turns_one_off(tmp_path):
    rc, out, err = _main(wmt14_en_fr, ["--preset", "paper", "--set", "workflow.update_"
                                       "sentences=64", "--storage-path", str(tmp_path),
                                       "--dry-run"])
    assert rc == 2 and err.strip().endswith("in tokens (update_tokens) or in sentences "
                                            "(update_sentences), not both: set the other to 0 "
                                            "(--set workflow.update_tokens=0)"), err
    rc, out, err = _main(wmt14_en_fr, ["--preset", "paper", "--set", "workflow.update_"
                                       "sentences=64", "--set", "workflow.update_tokens=0",
                                       "--set", "data.max_sentences=8", "--storage-path",
                                       str(tmp_path), "--dry-run"])
    assert rc == 0, err


def test_a_presets_dropout_table_without_the_time_budget_is_off_and_recorded_so(tmp_path):
    """The Multi30k cpu preset's dropout table with its time budget taken off (a fixed count
    of updates instead) was kept in the run's settings and params, and never read: the run
    records no table, the model's dropout throughout."""
    run = _dry_run(multi30k_en_de, ["--preset", "cpu", "--set", "train.max_updates=300",
                                    "--set", "train.max_time=0"], tmp_path)
    assert run["workflow"]["train"]["dropout_by_passes"] == []
    run = _dry_run(multi30k_en_de, ["--preset", "cpu"], tmp_path)
    assert run["workflow"]["train"]["dropout_by_passes"]


@pytest.mark.parametrize("module, settings, says", [
    # each was accepted, recorded as the run's param, and never read by the training
    (wmt14_en_fr, ["train.optimizer=adam", "train.lr=1e-3", "train.momentum=0.9"],
     "--set train.momentum=0.9: momentum is read only with optimizer nag, and this run's is "
     "adam: leave it out, or set train.optimizer"),
    (wmt14_en_fr, ["train.adam_betas=[0.9, 0.99]"], "adam_betas is read only with optimizer "
                                                    "adam, and this run's is nag"),
    (multi30k_en_de, ["--preset", "cpu", "train.momentum=0.9"], "momentum is read only with "
                                                               "optimizer nag"),
    (wmt14_en_fr, ["train.lr_schedule=cosine", "train.min_lr=1e-5"],
     "min_lr is read only with lr_schedule anneal / plateau / fixed, and this run's is cosine"),
    (wmt14_en_fr, ["train.warmup_init_lr=0.1"], "warmup_init_lr is the lr a warmup starts "
                                                "from, and warmup_updates is 0"),
    (wmt14_en_fr, ["--preset", "paper", "train.anneal_from_epoch=null", "train.lr_shrink=0.5"],
     "lr_shrink is read by the fixed schedule once it shrinks the lr, and this run's never "
     "does"),
    # the dropout table without a time budget: the model's dropout throughout
    (wmt14_en_fr, ["train.dropout_by_passes=[[0, 0.2], [10, 0.3]]"],
     "the dropout table chooses by the passes a time budget will reach, and this run has "
     "none: add --max-time"),
    (multi30k_en_de, ["--preset", "cpu", "train.max_updates=500", "train.max_time=0",
                      "train.passes_probe_updates=20"],
     "--set train.passes_probe_updates=20: the dropout table chooses by the passes"),
])
def test_a_setting_the_runs_optimizer_or_schedule_never_reads_is_refused(module, settings, says,
                                                                         tmp_path):
    argv = [a for s in settings for a in ((s,) if s.startswith("-") or "=" not in s
                                          else ("--set", s))]
    rc, out, err = _main(module, [*argv, "--storage-path", str(tmp_path), "--dry-run"])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, err
    # the same settings with the choice that reads them: a run
    ok = {"train.momentum=0.9": ["train.momentum=0.9"],
          "train.min_lr=1e-5": ["train.min_lr=1e-5"]}.get(settings[-1])
    if ok:
        assert _main(module, [*[a for s in ok for a in ("--set", s)], "--storage-path",
                              str(tmp_path), "--dry-run"])[0] == 0
    # a setting turned off, or given its default, is no setting the run ignores (a cosine
    # schedule's --set train.anneal_from_epoch=null was refused)
    for off in (["train.lr_schedule=cosine", "train.anneal_from_epoch=null"],
                ["train.optimizer=adam", "train.lr=1e-3", "train.momentum=0.99"]):
        assert _main(wmt14_en_fr, [*[a for s in off for a in ("--set", s)], "--storage-path",
                                   str(tmp_path), "--dry-run"])[0] == 0, off


@pytest.mark.parametrize("module, setting, says", [
    # accepted, and the workflow scored one translation a sentence all the same
    (wmt14_en_fr, "search.nbest=3", "search.nbest 3: a workflow scores one translation a "
                                    "sentence; n-best lists are `python -m convs2s translate"),
    # refused only by the training, after the preprocessing
    (wmt14_en_fr, "data.max_positions=4096", "data.max_positions 4096 keeps sentences longer "
                                             "than the model takes (model.max_positions 1024)"),
    (wmt16_en_ro, "data.max_sentences=null", "an update of 64 sentences (workflow."
                                             "update_sentences) needs batches cut by sentences "
                                             "(data.max_sentences), or --set workflow."
                                             "update_sentences=0"),
])
def test_a_setting_a_workflow_cannot_honour_is_refused_at_dry_run(module, setting, says,
                                                                  tmp_path):
    rc, out, err = _main(module, ["--preset", "paper", "--set", setting, "--storage-path",
                                  str(tmp_path), "--dry-run"])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("argv, says", [
    (["--data", "demo", "--set", "data.hub_repo=x/y"],
     "data.hub_repo names the hub dataset of --data hub, and the data is 'demo'"),
    (["--data", "hub", "--set", "workflow.local_splits={train: a, valid: b, test: c}"],
     "workflow.local_splits names the files of --data DIR, and the data is 'hub'"),
    (["--no-use-gpu", "--set", "workflow.eval_gpus=0.5"],
     "workflow.eval_gpus is an evaluation task's GPU share with --use-gpu; this run uses CPUs"),
    (["--data", "hub", "--set", "data.demo_rows={train: 1000, valid: 10, test: 10}"],
     "data.demo_rows sizes the corpus of --data demo, and the data is 'hub'"),
    (["--set", "search.shortlist_frequent=500"],
     "search.shortlist_frequent is read only with vocabulary selection, and this run searches "
     "the whole vocabulary: add data.shortlist_per_source=N (a lexical table of the run's "
     "data) or search.shortlist=FILE"),
    (["--set", "train.passes_probe_updates=10"],
     "train.passes_probe_updates is the probe of the dropout table (train.dropout_by_passes), "
     "and this run has none"),
])
def test_a_setting_of_data_or_devices_the_run_does_not_use_is_refused(argv, says, tmp_path):
    """Each was accepted, recorded as the run's param (a later change of it refused as a
    change of the run), and never read; demo_rows keyed a data folder of its own as well."""
    rc, out, err = _main(wmt14_en_fr, ["--preset", "paper", *argv, "--storage-path",
                                       str(tmp_path), "--dry-run"])
    assert rc == 2 and out == "" and err.strip().endswith(f"{says}: leave it out"), err


def test_vocabulary_selection_settings_are_taken_where_the_run_selects(tmp_path):
    run = _dry_run(wmt14_en_fr, ["--preset", "paper", "--set", "data.shortlist_per_source=50",
                                 "--set", "search.shortlist_frequent=500"], tmp_path)
    assert run["workflow"]["search"]["shortlist_frequent"] == 500


def test_test_set_names_given_on_purpose_are_kept_on_a_folder_and_on_the_demo(tmp_path):
    """A split read from another file than the preset's is named after that file, unless
    workflow.test_sets names the sets on purpose (the names were replaced silently: params
    said one name, the scores, datasets and registered model another)."""
    data = tmp_path / "data"
    data.mkdir()
    folder = ["--preset", "cpu", "--src", "en", "--tgt", "de", "--data", str(data),
              "--split", "train=train", "--split", "valid=dev", "--split", "test=nt14"]
    def named(module, argv):
        return _dry_run(module, argv, tmp_path)["run"]["test_sets"]

    assert named(multi30k_en_de, folder) == {"test": "nt14", "valid": "dev"}
    assert named(multi30k_en_de, [*folder, "--set", "workflow.test_sets={test: newstest2014, "
                                  "valid: newstest2013}"]) == {"test": "newstest2014",
                                                               "valid": "newstest2013"}
    assert named(wmt14_en_fr, ["--preset", "smoke"]) == {"test": "demo_test",
                                                         "valid": "demo_valid"}
    assert named(wmt14_en_fr, ["--preset", "smoke", "--set",
                               "workflow.test_sets={test: my_test}"]) == {"test": "my_test"}


def test_dry_run_notes_what_a_local_folder_lacks_that_the_run_would_stop_at(tmp_path):
    """A new pair's folder checked with --dry-run: a side or a split the run would stop at
    before Ray starts is said (the dry run passed, and the run then exited 2); a folder that
    has them gets no note."""
    data = tmp_path / "data"
    data.mkdir()
    for stem in ("train", "dev", "nt14"):
        for lang in ("en", "de"):
            (data / f"{stem}.{lang}").write_text("a line\nanother line\n")
    argv = ["--preset", "cpu", "--src", "en", "--data", str(data), "--split", "train=train",
            "--split", "valid=dev", "--split", "test=nt14", "--dry-run", "--storage-path",
            str(tmp_path / "runs")]
    rc, out, err = _main(multi30k_en_de, [*argv, "--tgt", "de"])
    assert rc == 0 and json.loads(out) and "note" not in err, err
    rc, out, err = _main(multi30k_en_de, [*argv, "--tgt", "fr"])
    assert rc == 0 and json.loads(out), err
    assert f"note: the run would stop before Ray starts: found {data / 'train.en'} but not " \
        f"its other side {data / 'train.fr'}" in err, err


def test_a_fixed_schedule_that_would_anneal_after_the_run_ends_is_said(tmp_path):
    """The paper En-De preset shrinks its lr from epoch 50: with --max-epochs 30 it trained at
    lr 0.5 to the end, annealing never, without a word."""
    short = _dry_run(wmt14_en_de, ["--preset", "paper", "--max-epochs", "30"], tmp_path)
    assert short["schedule_note"] == (
        "lr_schedule fixed shrinks the lr from epoch 50, after the run's last (max_epochs 30): "
        "the lr stays 0.5 to the end; --set train.anneal_from_epoch=N anneals within the run")
    assert "schedule_note" not in _dry_run(wmt14_en_de, ["--preset", "paper"], tmp_path)
    assert "schedule_note" not in _dry_run(wmt14_en_de, [
        "--preset", "paper", "--max-epochs", "30", "--set", "train.anneal_from_epoch=20"],
        tmp_path)


def test_an_average_of_more_checkpoints_than_the_run_keeps_is_refused(tmp_path):
    """It averaged the kept ones and logged them as avg_last<N> (avg_last10 of 5)."""
    for sets in (["ensemble.average_last=10"], ["train.keep_last=1"]):
        rc, out, err = _main(wmt16_en_ro, [*[a for s in sets for a in ("--set", s)],
                                           "--preset", "paper", "--dry-run"])
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert "averages more checkpoints than the run keeps" in err and "raise " \
            "train.keep_last to" in err, err
    assert _main(wmt16_en_ro, ["--preset", "paper", "--set", "ensemble.average_last=10",
                               "--set", "train.keep_last=10", "--storage-path", str(tmp_path),
                               "--dry-run"])[0] == 0


@pytest.mark.parametrize("setting, field, off", [
    ("train.compile=false", "compile", ""), ("train.compile=off", "compile", ""),
    ("train.fuse=no", "fuse", ""), ("train.fuse=null", "fuse", ""),
    ("train.fuse=inductor", "fuse", "inductor"),
])
def test_false_off_and_no_turn_a_compile_backend_off(setting, field, off, tmp_path):
    """`--set train.compile=false` was the backend "false": the feature on, failing in the
    worker."""
    run = _dry_run(wmt14_en_fr, ["--set", setting], tmp_path)
    assert run["workflow"]["train"][field] == off


def test_a_bad_storage_uri_at_dry_run_is_one_line_with_its_credentials_hidden(tmp_path):
    rc, out, err = _main(wmt14_en_fr, ["--storage-path", "s3:/AKIAXX:SECRET@bucket/runs",
                                       "--dry-run"])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: s3:/***@bucket/runs has one slash after s3:") and \
        "SECRET" not in err and "AKIAXX" not in err


def test_a_set_value_holding_credentials_is_shown_without_them(tmp_path):
    """--dry-run printed a --set URI's secret in the settings and in `overrides`, and a --set
    error line quoted it (a run refuses such a URI, redacted)."""
    secret = "search.dictionary=s3://AKIAEXAMPLE:wJalrSECRET@bucket/dict.txt"
    rc, out, err = _main(wmt14_en_fr, ["--set", secret, "--set", "search.replace_unk=true",
                                       "--storage-path", str(tmp_path), "--dry-run"])
    assert rc == 0 and "AKIAEXAMPLE:***@bucket/dict.txt" in out, err
    assert "wJalrSECRET" not in out + err
    rc, out, err = _main(wmt14_en_fr, ["--set", secret, "--storage-path", str(tmp_path),
                                       "--dry-run"])  # (a dictionary without replace_unk)
    assert rc == 2 and "AKIAEXAMPLE:***@bucket" in err and "wJalrSECRET" not in out + err
    rc, out, err = _main(wmt14_en_fr, ["--set", "data.vocab_size=s3://K:wJalrSECRET@b/x",
                                       "--dry-run"])  # (a type error quoting the value)
    assert rc == 2 and "s3://K:***@b/x" in err and "wJalrSECRET" not in out + err


def test_a_presigned_storage_uri_at_dry_run_is_one_line_without_its_signature():
    """A --storage-path with a query holding ":" (X-Amz-Credential=KEY:...) is refused for its
    query in one line, exit 2; neither the signature nor the key is printed (it was, as the
    "host and port" the bucket seemed to be)."""
    rc, out, err = _main(multi30k_en_de, [
        "--storage-path", "s3://team-runs?X-Amz-Date=20250101T000000Z&X-Amz-Signature="
        "SECRETSIGVALUE&X-Amz-Credential=AKIAEXAMPLE:x", "--dry-run"])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: s3://team-runs: a storage URI takes no query"), err
    assert "SECRETSIGVALUE" not in err and "AKIAEXAMPLE" not in err, err


def test_a_file_uri_with_one_slash_as_storage_path_is_that_local_folder(tmp_path):
    """`--storage-path file:/PATH` (what pathlib makes of file:///PATH) is the folder /PATH;
    the dry run showed `<cwd>/file:/PATH`."""
    rc, out, err = _main(multi30k_en_de, ["--preset", "cpu", "--storage-path",
                                          f"file:{tmp_path}", "--run-name", "r",
                                          "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
                                          "--dry-run"])
    assert rc == 0, err
    assert json.loads(out)["run"]["storage"] == str(tmp_path)


def test_set_model_dropout_wins_over_the_passes_table_even_at_the_presets_value(tmp_path):
    """The cpu recipe's model dropout is 0.4 and its table picks 0.3 or 0.4 by the passes:
    `--set model.dropout=0.4` asks for 0.4 throughout (the table was kept: the value was the
    preset's)."""
    assert multi30k_en_de.cpu().model.dropout == 0.4
    assert multi30k_en_de.cpu().train.dropout_by_passes
    for value in ("0.4", "0.3"):
        run = _dry_run(multi30k_en_de, ["--preset", "cpu", "--set", f"model.dropout={value}"],
                       tmp_path)
        assert run["workflow"]["train"]["dropout_by_passes"] == []
    both = _dry_run(multi30k_en_de, ["--preset", "cpu", "--set", "model.dropout=0.4", "--set",
                                     "train.dropout_by_passes=[[0, 0.2], [30, 0.4]]"], tmp_path)
    assert both["workflow"]["train"]["dropout_by_passes"] == [[0, 0.2], [30, 0.4]]


def test_languages_set_as_data_name_the_experiment_and_may_swap_together(tmp_path):
    """The generic workflow's experiment and registered model are named after the pair: a
    `--set data.src_lang` pair trained under the preset's name (a de->fr model could move
    translation_en_fr's champion); two --set that swap the sides were refused one by one."""
    from workflows import translation

    base = ["--preset", "cpu", "--data", str(tmp_path)]
    run = _dry_run(translation, [*base, "--set", "data.src_lang=de"], tmp_path)
    assert run["workflow"]["name"] == run["run"]["experiment"] == "translation_de_fr"
    assert run["workflow"]["preprocess"]["src_lang"] == "de"
    run = _dry_run(translation, [*base, "--set", "data.src_lang=fr", "--set",
                                 "data.tgt_lang=en"], tmp_path)
    assert run["workflow"]["name"] == "translation_fr_en"
    assert _dry_run(translation, [*base, "--src", "ro"], tmp_path)["workflow"][
        "name"] == "translation_ro_fr"
    rc, _, err = _main(translation, [*base, "--set", "data.src_lang=fr", "--dry-run"])
    assert rc == 2 and "src_lang and tgt_lang must differ" in err


def test_a_paper_task_in_the_other_direction_is_a_task_of_its_own(tmp_path):
    """wmt14_en_fr with --src fr --tgt en trains French -> English: its experiment and
    registered models are wmt14_fr_en's, not the En-Fr runs' (whose champion it could never
    be compared with: the validation text differs by direction). The demo's smoke runs keep
    their task's name whatever languages the demo brings."""
    from workflows import wmt14_en_de, wmt14_en_fr

    base = ["--preset", "paper", "--data", str(tmp_path)]
    run = _dry_run(wmt14_en_fr, [*base, "--src", "fr", "--tgt", "en"], tmp_path)
    assert run["workflow"]["name"] == run["run"]["experiment"] == "wmt14_fr_en"
    assert _dry_run(wmt14_en_fr, base, tmp_path)["workflow"]["name"] == "wmt14_en_fr"
    # another pair is another task too (a German -> English model registered as
    # wmt14_en_fr-newstest2014 would hold the alias the En-Fr runs compare with)
    run = _dry_run(wmt14_en_fr, [*base, "--src", "de", "--tgt", "en"], tmp_path)
    assert run["workflow"]["name"] == run["run"]["experiment"] == "wmt14_de_en"
    # other names for the sides (a folder's columns, say) are no other direction
    assert _dry_run(wmt14_en_fr, [*base, "--src", "english", "--tgt", "french"], tmp_path)[
        "workflow"]["name"] == "wmt14_en_fr"
    assert _dry_run(wmt14_en_de, ["--preset", "smoke"], tmp_path)["workflow"][
        "name"] == "wmt14_en_de"  # (the demo: English -> French)


@pytest.mark.parametrize("argv", [["--src", "de"], ["--set", "data.src_lang=de"],
                                  ["--set", "data.tgt_lang=ro"]])
def test_the_demo_corpus_keeps_its_languages(argv, tmp_path):
    """The demo corpus is English -> French: another language given to it (--src / --tgt, or
    --set data.src_lang / tgt_lang, which resolved) would label, clean, score and name its
    text as that language; one line, exit 2."""
    from workflows import wmt14_en_fr

    rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", *argv, "--dry-run"])
    assert rc == 2 and out == "" and "the demo corpus is English -> French" in err, err


def _dry_run(module, argv: list[str], tmp_path) -> dict:
    """`--dry-run`'s resolved run (the run name, storage and tracking fixed)."""
    rc, out, err = _main(module, [*argv, "--dry-run", "--run-name", "r", "--storage-path",
                                  str(tmp_path / "runs"), "--tracking-uri",
                                  f"sqlite:///{tmp_path / 'm.db'}"])
    assert rc == 0, err
    return json.loads(out)


def _config_file(module, argv: list[str], path: Path) -> Path:
    rc, text, err = _main(module, [*argv, "--dry-run", "--format", "yaml"])
    assert rc == 0, err
    path.write_text(text)
    return path


@pytest.fixture
def float32_cpu(monkeypatch):
    """This host trains in float32 on CPUs (the CPU detector's override): the multi30k cpu
    recipe's float32 batch budget applies."""
    from convs2s.precision import cpu_flags

    monkeypatch.setenv("CONVS2S_CPU_BF16", "0")
    cpu_flags.cache_clear()
    yield
    cpu_flags.cache_clear()


@pytest.mark.parametrize("module, preset, sets, flags", [
    (wmt14_en_fr, "smoke", ["data.vocab_size=500", "data.max_len=50"], []),  # on the demo
    (wmt14_en_fr, "smoke", ["data.max_tokens=4000"], []),  # the preset's own value, on demo
    (wmt14_en_fr, "paper", [], ["--num-workers", "2"]),  # the update plan: 4 micro-batches
    (wmt14_en_fr, "paper", ["train.update_freq=1"], ["--num-workers", "2"]),  # asked: 1
    (wmt14_en_fr, "paper", ["model.dropout=0.3"], ["--max-updates", "50"]),
    (wmt14_en_de, "paper", ["train.lr=0.25"], ["--data", "demo"]),
    (multi30k_en_de, "cpu", [], []),  # float32 CPU batches
    (multi30k_en_de, "cpu", ["data.max_tokens=4000"], []),  # asked over them
    (multi30k_en_de, "cpu", ["model.dropout=0.4"], []),  # over the passes table
    (multi30k_en_de, "cpu", ["model.dropout=0.3", "train.dropout_by_passes=[[0, 0.2]]"], []),
])
def test_a_config_file_written_by_dry_run_resolves_to_the_run_it_was_written_from(
        module, preset, sets, flags, tmp_path, float32_cpu):
    """README: `--preset P --set ... --dry-run --format yaml > FILE`, then `--config FILE`
    with the same run-level flags is the same run: a value in the file counts as set on
    purpose exactly as its --set did (kept on the demo corpus, over the update plan, the
    float32 CPU batches and the dropout-by-passes table)."""
    set_flags = [x for s in sets for x in ("--set", s)]
    path = _config_file(module, ["--preset", preset, *set_flags], tmp_path / "my.yaml")
    from_flags = _dry_run(module, ["--preset", preset, *set_flags, *flags], tmp_path)
    from_file = _dry_run(module, ["--config", str(path), *flags], tmp_path)
    assert from_file["workflow"].pop("preset") == "my"  # labelled with the file's stem
    assert from_flags["workflow"].pop("preset") == preset
    from_flags["workflow"].pop("overrides", None)
    assert from_file == from_flags
    # and a file written from the file, with another --set on top, is that run with it
    again = _config_file(module, ["--config", str(path), "--set", "search.beam=7"],
                         tmp_path / "again.yaml")
    plus = _dry_run(module, ["--preset", preset, *set_flags, "--set", "search.beam=7", *flags],
                    tmp_path)
    from_again = _dry_run(module, ["--config", str(again), *flags], tmp_path)
    for run in (plus, from_again):
        run["workflow"].pop("preset"), run["workflow"].pop("overrides", None)
    assert from_again == plus


def test_a_setting_edited_in_a_config_file_counts_as_set_on_purpose(tmp_path, float32_cpu):
    """An edit of the file wins as a --set would: the demo corpus keeps it, the preset's
    update plan and float32 CPU batches do not replace it (each was silently replaced)."""
    def edited(module, preset, old, new, name):
        path = _config_file(module, ["--preset", preset], tmp_path / name)
        text = path.read_text()
        assert text.count(old) == 1, old
        path.write_text(text.replace(old, new))
        return _dry_run(module, ["--config", str(path)], tmp_path)

    run = edited(wmt14_en_fr, "smoke", "  max_len: 175\n", "  max_len: 50\n", "s.yaml")
    assert run["run"]["data_source"] == "demo" and run["workflow"]["preprocess"]["max_len"] == 50
    run = edited(wmt14_en_fr, "paper", "  update_freq: 1\n", "  update_freq: 4\n", "p.yaml")
    assert run["update"]["micro_batches_per_update"] == 4
    assert run["update"]["note"].endswith("not the preset's 24,000 (train.update_freq=4)")
    run = edited(multi30k_en_de, "cpu", "  max_tokens: 4000\n", "  max_tokens: 3000\n",
                 "c.yaml")
    assert run["update"]["max_tokens_per_batch"] == 3000 and "note" not in run["update"]
    run = edited(multi30k_en_de, "cpu", "  dropout: 0.4\n", "  dropout: 0.2\n", "d.yaml")
    assert run["workflow"]["model"]["dropout"] == 0.2
    assert run["workflow"]["train"]["dropout_by_passes"] == []
    # ... and listed under `explicit:`, the preset's own value too
    path = _config_file(multi30k_en_de, ["--preset", "cpu"], tmp_path / "e.yaml")
    path.write_text(path.read_text().replace("explicit: []", "explicit: [preprocess.max_tokens]"))
    assert _dry_run(multi30k_en_de, ["--config", str(path)],
                    tmp_path)["update"]["max_tokens_per_batch"] == 4000


@pytest.mark.parametrize("old, new, says", [
    ("  warmup_updates: 0\n", '  warmup_updates: "200"\n',
     "train.warmup_updates takes int, not '200'"),
    ("  lr: 0.25\n", "  lr: abc\n", "train.lr takes float, not 'abc'"),
    ("  max_time: 0.0\n", "  max_time: 1:30\n", "train.max_time takes float, not '1:30'"),
    ("  src_lang: en\n", "  src_lang: no\n", "preprocess.src_lang takes str, not False "
                                               "(quote a text that YAML reads otherwise)"),
    ("  beam: 5\n", "  beam: [5]\n", "search.beam takes int, not [5]"),
    ("\nuse_gpu: false\n", "\nuse_gpu: 0\n", "use_gpu takes bool, not 0"),
    ("  embed_dim: 128\n", "  embed_dim: -8\n", "model: embed_dim must be a positive integer"),
    ("  root: data/preprocessed\n", "  root: /elsewhere\n",
     "preprocess.root: set by --storage-path"),
    ("preset: smoke\n", "", "no preset: line; name the preset the file starts from "
                            "(paper, smoke)"),
    ("preset: smoke\n", "preset: cpu\n", "preset: 'cpu' names no preset of this workflow"),
    ("explicit: []\n", "explicit: [train.lrr]\n",
     "explicit: train.lrr: no such setting (did you mean train.lr"),
    # a setting with no default is never null (it passed: a traceback, or "None" as a path)
    ("name: wmt14_en_fr\n", "name: null\n", "name takes str, not None"),
    ("data: demo\n", "data: null\n", "data takes str, not None"),
    ("  task: wmt14_en_fr\n", "  task: null\n", "preprocess.task takes str, not None"),
    ("  lr: 0.25\n", "  lr: 1" + "0" * 400 + "\n", "train.lr takes float, not 1000"),
    # a key given twice: PyYAML kept the last without a word (the edit to the first was lost)
    ("  lr: 0.25\n", "  lr: 0.5\n  lr: 0.25\n", "'lr' is given twice (lines "),
    # YAML's own errors say where ("while scanning for the next token" said nothing)
    ("  lr: 0.25\n", "\tlr: 0.25\n", ", column 1: found character '\\t' that cannot start"),
])
def test_a_config_file_value_its_setting_cannot_take_is_one_line_naming_file_and_key(
        old, new, says, tmp_path):
    """A file's values are checked as --set checks one, before anything starts: a string
    warmup_updates or lr used to pass and fail only in the training workers."""
    path = _config_file(wmt14_en_fr, ["--preset", "smoke"], tmp_path / "bad.yaml")
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    rc, out, err = _main(wmt14_en_fr, ["--config", str(path), "--dry-run"])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: --config {path}: ") and says in err, err
    # 1e-3 is a number, as YAML 1.2 and --set read it (PyYAML's 1.1 made it text)
    path.write_text(text.replace("  lr: 0.25\n", "  lr: 1e-3\n"))
    assert _dry_run(wmt14_en_fr, ["--config", str(path)], tmp_path)["workflow"]["train"][
        "lr"] == 0.001


def test_a_short_config_file_keeps_its_presets_other_settings(tmp_path):
    """A file naming a few settings is its preset with those changed: the settings it leaves
    out were the dataclasses' defaults (a Gigaword file without min_len searched with 1, not
    the paper's 14, on CPUs) and counted as set on purpose."""
    short = tmp_path / "short.yaml"
    short.write_text("preset: paper\ntrain:\n  lr: 0.3\nsearch:\n  beam: 4\n")
    run = _dry_run(gigaword, ["--config", str(short)], tmp_path)["workflow"]
    paper = _dry_run(gigaword, ["--preset", "paper"], tmp_path)["workflow"]
    assert run["search"]["min_len"] == paper["search"]["min_len"] == 14
    assert run["use_gpu"] is paper["use_gpu"] is True
    assert (run["train"]["lr"], run["search"]["beam"]) == (0.3, 4)
    assert {k: v for k, v in run["train"].items() if k != "lr"} == \
        {k: v for k, v in paper["train"].items() if k != "lr"}
    assert run["preprocess"] == paper["preprocess"] and run["model"] == paper["model"]
    # a mapping setting (test_sets) is the file's whole, as a --set gives it
    short.write_text("preset: paper\ntrain:\n  lr: 0.3\nsearch:\n  beam: 4\n"
                     "test_sets:\n  test: gigaword_test\n")
    assert _dry_run(gigaword, ["--config", str(short)], tmp_path)["workflow"]["test_sets"] == \
        {"test": "gigaword_test"}
    from workflows.orchestrate import _load_config

    opts = RunOptions(config=str(short))  # what counts as set on purpose: the file's own
    _load_config(opts, gigaword.PRESETS)
    assert sorted(o.text for o in opts.config_settings) == [
        "search.beam=4", "test_sets={'test': 'gigaword_test'}", "train.lr=0.3"]


@pytest.mark.parametrize("text, says", [
    ("data:\n  vocab_size: 16000\n", "data: is the data source (--data: hub, demo or a "
                                      "folder); the data settings (--set data.*) go under "
                                      "preprocess:"),
    ("workflow:\n  num_workers: 2\n", "workflow: the workflow settings (--set workflow.*) sit "
                                       "at the top level of the file, not under workflow:"),
])
def test_a_config_file_with_sets_section_names_says_where_they_go(text, says, tmp_path):
    """`data: {vocab_size: ...}` said "data takes str", `workflow:` "no such setting"."""
    short = tmp_path / "short.yaml"
    short.write_text("preset: paper\n" + text)
    rc, out, err = _main(wmt14_en_fr, ["--config", str(short), "--dry-run"])
    assert rc == 2 and err.strip() == f"error: --config {short}: {says}", err


def test_a_preset_flag_beside_a_config_file_of_another_preset_is_refused(tmp_path):
    """`--preset smoke --config F` where F starts from the paper preset ran F (the paper
    preset's run, hub data and GPUs) without a word about --preset; the same preset, or
    none, runs the file."""
    short = tmp_path / "short.yaml"
    short.write_text("preset: paper\ntrain:\n  lr: 0.25\n")
    rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", "--config", str(short),
                                       "--dry-run"])
    assert rc == 2 and out == "" and err.strip() == (
        f"error: --preset smoke with --config {short}, whose settings start from preset "
        "'paper': leave --preset out (the file names its preset), or run --preset alone")
    for flag in ([], ["--preset", "paper"]):
        run = _dry_run(wmt14_en_fr, [*flag, "--config", str(short)], tmp_path)
        assert run["workflow"]["train"]["lr"] == 0.25 and run["workflow"]["use_gpu"] is True


def test_a_config_file_with_an_unknown_setting_is_refused_with_the_closest_name(tmp_path):
    doc = yaml.safe_load(config_yaml(wmt14_en_fr.smoke(), RunOptions()))
    doc["train"]["lrr"] = 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    rc, out, err = _main(wmt14_en_fr, ["--config", str(bad), "--dry-run"])
    assert rc == 2 and err.strip() == (f"error: --config {bad}: train.lrr: no such setting "
                                       "(did you mean lr or lr_shrink?)")
    rc, _, err = _main(wmt14_en_fr, ["--config", str(tmp_path / "missing.yaml"), "--dry-run"])
    assert rc == 2 and "cannot read it" in err
    del doc["preset"], doc["explicit"], doc["train"]["lrr"]
    with pytest.raises(ValueError, match="colour: no such setting"):
        WorkflowConfig.from_dict({**doc, "colour": 1})
    assert WorkflowConfig.from_dict(doc) == wmt14_en_fr.smoke()
    assert config_yaml(wmt14_en_fr.paper(), RunOptions(preset="paper")).startswith(
        "# wmt14_en_fr: preset paper\n")


def test_a_different_set_on_the_same_run_name_is_refused_like_any_changed_setting(tmp_path):
    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = RunOptions(preset="smoke", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=uri, set=["train.lr=0.5"])
    spec = resolve(wmt14_en_fr.smoke(), opts)
    assert spec.train.lr == 0.5 and spec.params()["workflow"]["overrides"] == "train.lr=0.5"
    record_settings(StageContext(RunTree.open(uri, "exp", spec.run_dir, "r")), spec)
    assert reuse_problem(spec) is None  # the same --set again: the same run
    other = resolve(wmt14_en_fr.smoke(), RunOptions(**{**vars(opts), "set": ["train.lr=0.4"]}))
    assert "train.lr: 0.5 -> 0.4" in reuse_problem(other)
    with pytest.raises(SpecError, match="--set train.lr=abc: train.lr takes float"):
        resolve(wmt14_en_fr.smoke(), RunOptions(**{**vars(opts), "set": ["train.lr=abc"]}))
    # the paper's 10^-4 as one types it (PyYAML alone reads 1e-4 as text)
    tiny = resolve(wmt14_en_fr.smoke(), RunOptions(**{**vars(opts), "set": ["train.min_lr=1e-4",
                                                                            "train.lr=2.5E-1"]}))
    assert (tiny.train.min_lr, tiny.train.lr) == (1e-4, 0.25)


def test_a_rerun_may_change_how_preprocessing_runs_and_a_search_change_names_the_evaluation(
        tmp_path):
    """Preprocessing's encoder tasks and exchange make the same data folder: a rerun may change
    them (a bigger cluster, files after Ray's exchange ran out of memory; they were refused,
    leaving a new run name or --restart, which train again). A change of search settings only
    is refused with the command that scores the trained checkpoints with them."""
    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = RunOptions(preset="smoke", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=uri)
    spec = resolve(wmt14_en_fr.smoke(), opts)
    record_settings(StageContext(RunTree.open(uri, "exp", spec.run_dir, "r")), spec)

    def rerun(*sets):
        return reuse_problem(resolve(wmt14_en_fr.smoke(),
                                     RunOptions(**{**vars(opts), "set": list(sets)})))

    assert rerun("data.encode_tasks=2", "data.exchange=ray") is None
    problem = rerun("search.lenpen=0.6")
    assert "search.lenpen: 1.0 -> 0.6" in problem and (
        "to score its trained checkpoints with other search settings, without training "
        f"again: python -m workflows.evaluation --run-dir {spec.run_dir / 'train'} --test NAME "
        "SRC REF LANG --set lenpen=...") in problem, problem
    assert "workflows.evaluation" not in rerun("search.lenpen=0.6", "train.lr=0.5")
    assert "workflows.evaluation" not in rerun("ensemble.runs=2")  # (trains another run)


def test_the_preprocessing_command_line_takes_the_same_settings(capsys):
    """`python -m preprocessing --set FIELD=VALUE` (or data.FIELD): the same typed changes
    and one-line refusals, before Ray starts."""
    from preprocessing.cli import main

    for setting, says in (("max_lenn=10", "no field 'max_lenn' (did you mean max_len"),
                          ("data.max_len=abc", "data.max_len takes int | None, not 'abc'"),
                          ("root=/x", "data.root is set by --out"),
                          ("vocab_size=100", "vocab_size 100 too small")):
        with pytest.raises(SystemExit) as exit_:
            main(["--task", "demo", "--set", setting])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and says in err[-1], err


def test_the_preprocessing_command_line_takes_its_flags_and_set_as_one_change(capsys,
                                                                             monkeypatch):
    """A flag and a --set of the same field: refused, naming both (the --set won without a
    word: --split valid=dev was lost); a flag and a --set of fields that are right together
    are checked together (the README's --src fr --set tgt_lang=en was refused: the flag was
    checked alone, naming fr twice)."""
    from preprocessing import cli, pipeline

    ran = []
    monkeypatch.setattr(pipeline, "run_pipeline", lambda cfg, *a, **k: ran.append(cfg) or {})
    monkeypatch.setattr(cli, "summary", lambda *a, **k: "", raising=False)
    for argv, says in ((["--split", "valid=dev", "--set", "splits={train: a, valid: b}"],
                        "--set splits={train: a, valid: b} and --split both set splits"),
                       (["--src", "fr", "--set", "src_lang=de"],
                        "--set src_lang=de and --src both set src_lang"),
                       (["--max-tokens", "500", "--set", "max_tokens=9000"],
                        "--set max_tokens=9000 and --max-tokens both set max_tokens")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["--task", "wmt14_en_fr", *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and says in err[-1], err
    assert not ran
    with contextlib.suppress(Exception):  # (what runs after the pipeline is not this test's)
        cli.main(["--task", "wmt14_en_fr", "--src", "fr", "--set", "tgt_lang=en"])
    assert [(c.src_lang, c.tgt_lang) for c in ran] == [("fr", "en")]
    with pytest.raises(SystemExit):  # a flag's own refusal: the message alone, no ": " first
        cli.main(["--task", "wmt14_en_fr", "--src", "en", "--tgt", "en"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "python -m preprocessing: error: src_lang and tgt_lang must differ (they name the two "
        "sides)")


def test_a_source_storage_refuses_is_one_line_at_the_preprocessing_command(capsys, tmp_path):
    """`python -m preprocessing --source` that storage refuses ("s3:/bkt/x", one slash; a
    presigned URL's query) is one `error:` line naming --source, exit 2, its signature unseen:
    it was a traceback, exit 1, before the command's own error handling."""
    from preprocessing.cli import main

    for source, says in (("s3:/bkt/corpus", "error: --source s3:/bkt/corpus has one slash"),
                         ("s3://bkt?X-Amz-Signature=SECRETSIG&X-Amz-Credential=AKIAEX:1",
                          "error: --source s3://bkt: a storage URI takes no query")):
        rc = main(["--task", "demo", "--source", source, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(says) and len(err.strip().splitlines()) == 1, err
        assert "SECRETSIG" not in err and "AKIAEX" not in err
    assert not (tmp_path / "out").exists()


def test_the_training_command_line_checks_its_settings_the_same_way(capsys):
    """`python -m convs2s train --set lr=abc` trained with the string "abc" until the
    optimizer met it; a value is typed and checked as the workflows' --set, one line, exit 2."""
    from convs2s.train.local import main

    common = ["--train-data", "t", "--valid-data", "v", "--spm-model", "missing.model",
              "--storage-path", "runs", "--run-name", "r"]
    for setting, says in (("lr=abc", "--set lr=abc: train.lr takes float, not 'abc'"),
                          ('warmup_updates="200"', "train.warmup_updates takes int, not '200'"),
                          ("lrr=1", "TrainConfig has no field 'lrr' (did you mean lr"),
                          ("compile=inducter", "not a torch.compile backend"),
                          ("momentum=1.5", "momentum must be in [0, 1)")):
        assert main([*common, "--set", setting]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    # typed values pass the settings and reach the next check (the missing spm model)
    assert main([*common, "--set", "lr=1e-3", "--set", "compile=false"]) == 2
    assert "--spm-model missing.model does not exist" in capsys.readouterr().err


def test_a_custom_sweep_takes_its_variants_as_set_lists(tmp_path, capsys):
    """--sweep custom --variant NAME:SETTING;SETTING: each variant is the preset with those
    --set settings (any section), beside the baseline, each seed a whole run; --dry-run lists
    the trials; a variant that changes nothing, or a malformed one, is one line, exit 2."""
    base = ["--preset", "cpu", "--data", "hub", "--sweep", "custom", "--seeds", "2",
            "--storage-path", str(tmp_path), "--run-name", "knobs", "--tracking-uri",
            f"sqlite:///{tmp_path / 'm.db'}"]
    rc, out, err = _main(multi30k_en_de, [
        *base, "--variant", "lr-half:train.lr=0.0015",
        "--variant", "drop-bpe:model.dropout=0.3;data.vocab_size=4000", "--dry-run"])
    assert rc == 0, err
    trials = json.loads(out)
    assert [t["run"]["run_name"] for t in trials] == [
        "baseline-seed1", "baseline-seed2", "lr-half-seed1", "lr-half-seed2",
        "drop-bpe-seed1", "drop-bpe-seed2"]
    by = {t["run"]["run_name"]: t["workflow"] for t in trials}
    cpu = multi30k_en_de.cpu()
    assert by["baseline-seed1"]["train"]["lr"] == cpu.train.lr
    assert by["lr-half-seed2"]["train"]["lr"] == 0.0015
    assert by["lr-half-seed2"]["train"]["seed"] == 2
    assert by["drop-bpe-seed1"]["model"]["dropout"] == 0.3
    assert by["drop-bpe-seed1"]["preprocess"]["vocab_size"] == 4000
    from workflows.sweep import resolve_sweep

    opts = RunOptions(preset="cpu", data="hub", sweep="custom", storage_path=str(tmp_path),
                      run_name="knobs", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
                      variant=["drop-bpe:model.dropout=0.3;data.vocab_size=4000"])
    sweep = resolve_sweep(cpu, opts)
    # a dropout set on purpose also turns off the recipe's dropout-by-passes table
    assert sweep.trials[1].changes == {"model.dropout": "0.3", "preprocess.vocab_size": "4000",
                                       "train.dropout_by_passes": "()"}
    for variant, says in ((f"same:train.lr={cpu.train.lr}", "changes nothing"),
                          ("no-settings", "write NAME:SECTION.FIELD=VALUE"),
                          ("bad:train.lrr=1", "TrainConfig has no field 'lrr'"),
                          # the sweep sets every trial's seed: a variant's was replaced unseen
                          ("s5:train.seed=5", "train.seed is the sweep's own (--seeds N")):
        rc, out, err = _main(multi30k_en_de, [*base, "--variant", variant, "--dry-run"])
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("bf16, use_gpu, sets, tokens", [
    ("0", False, [], 2000),  # float32 on CPUs: the preset's float32 budget
    ("1", False, [], 4000),  # native bf16: the preprocess's budget
    ("0", True, [], 4000),  # GPUs: never
    ("0", False, ["data.max_tokens=3000"], 3000),  # --set decides
])
def test_the_multi30k_recipe_cuts_smaller_batches_where_it_will_train_in_float32_on_cpus(
        tmp_path, monkeypatch, bf16, use_gpu, sets, tokens):
    # A host without native bf16 trains a third of the passes in the hour; there 2,000-token
    # batches reached val BLEU 39.1 against 38.08 with 4,000 (docs/benchmarks.md, Multi30k).
    from convs2s.precision import cpu_flags

    monkeypatch.setenv("CONVS2S_CPU_BF16", bf16)  # the CPU detector's override
    cpu_flags.cache_clear()
    spec = resolve(multi30k_en_de.cpu(), RunOptions(preset="cpu", use_gpu=use_gpu, set=sets,
                                                    storage_path=str(tmp_path)))
    assert spec.data.max_tokens == tokens
    said = "batches of 2,000 tokens, not 4,000: training in float32 on CPUs"
    assert (said in spec.update_note) == (tokens == 2000)
    assert spec.describe()["update"]["max_tokens_per_batch"] == tokens


# --- settings a run or a sweep decides itself: refused, never listed as applied and ignored ----


def test_a_sweep_refuses_the_ensemble_settings_it_sets_for_every_trial(tmp_path):
    """Each trial of a sweep is one run scoring its best checkpoint: `--set ensemble.*` (or a
    --config file's) with --sweep was listed under `overrides` while every trial ran with
    runs 1, average_last 0. Refused in one line naming the settings; `--set train.seed` is
    the sweep's first seed, kept."""
    sweep = ["--sweep", "table4", "--variants", "baseline,no-pos", "--storage-path",
             str(tmp_path / "runs"), "--dry-run"]
    rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", *sweep, "--set",
                                       "ensemble.average_last=5", "--set", "ensemble.runs=3"])
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: --sweep table4: --set ensemble.average_last=5, --set "
                               "ensemble.runs=3: the sweep sets these for every trial"), err
    config = _config_file(wmt14_en_fr, ["--preset", "smoke", "--set", "ensemble.runs=2"],
                          tmp_path / "two-runs.yaml")
    rc, out, err = _main(wmt14_en_fr, ["--config", str(config), *sweep])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and f"--config {config}: ensemble.runs=2: the sweep " \
        "sets this for every trial" in lines[0], err
    rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", *sweep, "--seeds", "2", "--set",
                                       "train.seed=5"])
    assert rc == 0, err
    assert [t["workflow"]["train"]["seed"] for t in json.loads(out)] == [5, 6, 5, 6]
    assert not (tmp_path / "runs").exists()


def test_init_from_refuses_the_settings_its_checkpoint_decides(tiny_checkpoints, tmp_path):
    """--init-from takes the checkpoint's architecture (with the preset's dropout) and encodes
    the data with its vocabulary (no BPE is learned): a --set of the model's shape or of the
    BPE was listed under `overrides` and ignored. Refused in one line naming the setting; the
    dropout and the other data settings still apply."""
    ckpt = tiny_checkpoints["a"]
    for setting, says in (("model.embed_dim=512", "the model's shape comes from the checkpoint"),
                          ("model.src_positions=false", "the model's shape comes from the "
                                                        "checkpoint"),
                          ("data.vocab_size=16000", "the data is encoded with the checkpoint's "
                                                    "vocabulary"),
                          ("data.character_coverage=1.0", "the data is encoded with the "
                                                          "checkpoint's vocabulary")):
        rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", "--init-from", ckpt, "--set",
                                           setting, "--storage-path", str(tmp_path), "--dry-run"])
        lines = err.strip().splitlines()
        assert rc == 2 and out == "" and len(lines) == 1, err
        assert lines[0].startswith(f"error: --init-from {ckpt}: --set {setting}: {says}"), err
    run = _dry_run(wmt14_en_fr, ["--preset", "smoke", "--init-from", ckpt, "--set",
                                 "model.dropout=0.3", "--set", "data.max_len=50"], tmp_path)
    from convs2s.config import PRESETS

    assert run["workflow"]["model"] == PRESETS["tiny"]().replace(dropout=0.3).to_dict()
    assert run["workflow"]["preprocess"]["max_len"] == 50


def test_a_run_recorded_with_a_setting_it_never_read_goes_on_without_it(tmp_path):
    """A run started before such settings were refused (momentum given to an Adam run) is
    told to leave the setting out; without it, the run is the same run (it was refused as
    started with other settings, only --restart left)."""
    import json

    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = RunOptions(preset="cpu", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=uri, data="demo")
    spec = resolve(multi30k_en_de.cpu(), opts)
    assert spec.train.optimizer == "adam"
    record_settings(StageContext(RunTree.open(uri, "exp", spec.run_dir, "r")), spec)
    state_file = spec.run_dir / "workflow.json"
    state = json.loads(state_file.read_text())
    state["settings"]["train.momentum"] = "0.9"  # as recorded by such a run
    state_file.write_text(json.dumps(state))
    assert reuse_problem(spec) is None
    state["settings"]["train.lr"] = "0.5"  # a setting it reads: still a change
    state_file.write_text(json.dumps(state))
    assert "train.lr: 0.5 -> " in reuse_problem(spec)


def test_a_token_map_given_or_taken_away_on_a_rerun_is_a_changed_setting(tmp_path):
    """A token_map is recorded only where set; a rerun that gives one to a run that had none
    (or takes it away) changes the data, and is refused like any changed setting (it was
    accepted, the corpus preprocessed again, and training refused later naming no cause)."""
    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = RunOptions(preset="smoke", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=uri)
    spec = resolve(wmt14_en_fr.smoke(), opts)
    record_settings(StageContext(RunTree.open(uri, "exp", spec.run_dir, "r")), spec)
    mapped = resolve(wmt14_en_fr.smoke(), RunOptions(**{**vars(opts),
                                                        "set": ["data.token_map={UNK: <unk>}"]}))
    assert 'data.token_map: {} -> {"UNK": "<unk>"}' in (reuse_problem(mapped) or "")
    assert reuse_problem(resolve(wmt14_en_fr.smoke(), RunOptions(
        **{**vars(opts), "set": ["data.token_map={}"]}))) is None  # none, said twice


def test_a_long_setting_changed_past_mlflows_param_length_is_a_changed_setting(tmp_path):
    """A setting longer than an MLflow param (6,000 characters: a large token_map) is recorded
    cut with a digest of the whole: a rerun that changes it past the cut is refused as any
    changed setting (the cut values were equal, and the change went unseen); a record cut
    the old way (no digest) still matches the same value."""
    from convs2s.tracking.runs import PARAM_CHARS
    from workflows.run_state import StageContext, record_settings, result_settings, reuse_problem
    from workflows.run_tree import RunTree

    words = {f"w{i:04d}": f"v{i:04d}" for i in range(800)}  # ~12,000 characters as JSON
    last = dict(words, w0799="changed")

    def mapped(m):
        return "data.token_map={" + ", ".join(f"{k}: {v}" for k, v in m.items()) + "}"

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opts = RunOptions(preset="smoke", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=uri, set=[mapped(words)])
    spec = resolve(wmt14_en_fr.smoke(), opts)
    value = result_settings(spec)["data.token_map"]
    assert len(value) == PARAM_CHARS and "characters, sha256 " in value
    record_settings(StageContext(RunTree.open(uri, "exp", spec.run_dir, "r")), spec)
    assert reuse_problem(spec) is None
    other = resolve(wmt14_en_fr.smoke(), RunOptions(**{**vars(opts), "set": [mapped(last)]}))
    assert "data.token_map: " in (reuse_problem(other) or "")
    # a record of before: the value cut at 6,000 characters, no digest
    state = json.loads((spec.run_dir / "workflow.json").read_text())
    whole = json.dumps(words)
    state["settings"]["data.token_map"] = whole[:PARAM_CHARS]
    (spec.run_dir / "workflow.json").write_text(json.dumps(state))
    assert reuse_problem(spec) is None


def test_a_rerun_may_change_how_it_trains_and_its_gpus_but_not_its_update(tmp_path):
    """A days-long run continued with more frequent checkpoints, fewer of them kept, a fused
    step, or on 4 GPUs instead of 8 (the paper preset accumulates two micro-batches each to keep
    its update) is the same run: resumed, not refused, the parent run tagged with what changed.
    The same 4 GPUs asked to step one micro-batch each (half the update) is refused, naming the
    update's size; so is a record of the settings before the update had one (its workers and
    micro-batches as two settings)."""
    from mlflow.tracking import MlflowClient

    from workflows.run_state import StageContext, record_settings, result_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "data").mkdir()
    for stem in ("train", "newstest2013", "newstest2014"):
        for lang in ("en", "fr"):
            (tmp_path / "data" / f"{stem}.{lang}").write_text("a line\n")
    opts = RunOptions(preset="paper", data=str(tmp_path / "data"), num_workers=8,
                      run_name="r", storage_path=str(tmp_path / "runs"), tracking_uri=uri)
    spec = resolve(wmt14_en_fr.paper(), opts)
    f = spec.train.update_freq  # 1: 8 x 3,000 tokens, the paper's update
    micro = 8 * f
    tree = RunTree.open(uri, "exp", spec.run_dir, "r")
    record_settings(StageContext(tree), spec)
    how = ["train.checkpoint_interval=500", "train.keep_last=10", "train.log_interval=10",
           "train.fuse=inductor", "train.ddp_bucket_mb=50",
           # smaller search batches for an evaluation that ran out of memory
           "search.max_sentences=16", "search.max_tokens=2000"]
    later = resolve(wmt14_en_fr.paper(), RunOptions(**{**vars(opts), "num_workers": 4,
                                                         "set": how}))
    assert later.num_workers == 4 and later.train.update_freq == 2 * f
    assert reuse_problem(later) is None
    halved = resolve(wmt14_en_fr.paper(), RunOptions(**{**vars(opts), "num_workers": 4,
                                                          "update_freq": f}))
    assert f"update.micro_batches: {micro} -> {micro // 2}" in (reuse_problem(halved) or "")
    assert "train.lr: 0.5 -> 0.25" in (reuse_problem(resolve(wmt14_en_fr.paper(), RunOptions(
        **{**vars(opts), "num_workers": 4, "set": [*how, "train.lr=0.25"]}))) or "")
    record_settings(StageContext(tree), later)
    changed = MlflowClient(uri).get_run(tree.parent).data.tags["convs2s.changed"]
    for said in ("train.keep_last: 5 -> 10", "train.fuse:  -> inductor",
                 "search.max_sentences: 128 -> 16",
                 "update.workers: 8 -> 4", f"train.update_freq: {f} -> {2 * f}"):
        assert said in changed, changed
    assert "test_sets" not in changed
    # Another test set under the same split: scored, the parent's headline score now of it,
    # and the tag says so (its params keep the first call's set names)
    for lang in ("en", "fr"):
        (tmp_path / "data" / f"other.{lang}").write_text("a line\n")
    other = resolve(wmt14_en_fr.paper(), RunOptions(**{**vars(opts), "num_workers": 4,
                                                         "set": how, "split": ["test=other"]}))
    assert reuse_problem(other) is None
    record_settings(StageContext(tree), other)
    changed = MlflowClient(uri).get_run(tree.parent).data.tags["convs2s.changed"]
    assert "test_sets: test=newstest2014, valid=newstest2013 -> test=other, " \
        "valid=newstest2013" in changed, changed
    # a record from before the update's size: its two factors compared as their product
    old = {k: v for k, v in result_settings(spec).items()}
    (spec.run_dir / "workflow.json").write_text(json.dumps(
        {"settings": old, "budgets": {}, "inputs": {}}))
    assert reuse_problem(later) is None
    assert f"update.micro_batches: {micro} -> {micro // 2}" in (reuse_problem(halved) or "")


def test_a_paper_run_started_on_plateau_resumes_with_the_set_the_readme_gives(tmp_path):
    """README (Resuming a run): an En-Ro run started before the paper presets annealed as
    §4.2 says (`plateau`) is refused as another setting, and `--set
    train.lr_schedule=plateau` resumes it as it was started."""
    from workflows import wmt16_en_ro
    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "data").mkdir()
    for stem in ("train", "newsdev2016", "newstest2016"):
        for lang in ("en", "ro"):
            (tmp_path / "data" / f"{stem}.{lang}").write_text("a line\n")
    opts = RunOptions(preset="paper", data=str(tmp_path / "data"), run_name="ro",
                      storage_path=str(tmp_path / "runs"), tracking_uri=uri)
    before = resolve(wmt16_en_ro.paper(), RunOptions(**{**vars(opts),
                                                        "set": ["train.lr_schedule=plateau"]}))
    record_settings(StageContext(RunTree.open(uri, "exp", before.run_dir, "ro")), before)
    now = resolve(wmt16_en_ro.paper(), opts)
    assert now.train.lr_schedule == "anneal"
    assert "train.lr_schedule: plateau -> anneal" in (reuse_problem(now) or "")
    assert reuse_problem(before) is None


def test_a_fine_tuning_run_that_set_the_bpe_before_it_was_refused_resumes_without_it(
        tiny_checkpoints, tmp_path):
    # A run started with --init-from and --set data.vocab_size=16000 recorded the setting (it
    # was ignored); the run's BPE settings are not its settings, so it resumes without them.
    from workflows.run_state import result_settings, reuse_problem

    opts = RunOptions(preset="smoke", init_from=tiny_checkpoints["a"], run_name="ft",
                      storage_path=str(tmp_path / "runs"))
    spec = resolve(wmt14_en_fr.smoke(), opts)
    settings = result_settings(spec)
    assert not [k for k in settings if k.startswith("data.") and "vocab_size" in k]
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / "workflow.json").write_text(json.dumps(
        {"settings": {**settings, "data.vocab_size": "16000"}, "budgets": {}, "inputs": {}}))
    assert reuse_problem(spec) is None


@pytest.mark.parametrize("name, says", [
    ("../../tmp/x", "give one folder name of letters, digits"),  # the run outside the storage
    ("a/b", "give one folder name of letters, digits"),
    (".hidden", "not starting with '.'"),
    ("two words", "give one folder name of letters, digits"),
    ("preprocessed", "preprocessed/ folder holds the preprocessed data every run shares"),
    ("mlartifacts", "mlartifacts/ folder holds the MLflow artifacts"),
])
@pytest.mark.parametrize("sweep", [[], ["--sweep", "table4"]])
def test_a_run_name_is_one_folder_name_the_storage_path_does_not_keep_for_itself(
        name, says, sweep, tmp_path):
    rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", "--run-name", name, *sweep,
                                       "--storage-path", str(tmp_path / "runs"), "--dry-run"])
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: --run-name ") and says in lines[0], err
    fine = resolve(wmt14_en_fr.smoke(), RunOptions(preset="smoke", run_name="fr-en_2.b",
                                                   storage_path=str(tmp_path / "runs")))
    assert fine.run_dir == tmp_path / "runs" / "fr-en_2.b"


def test_a_folder_no_workflow_run_wrote_is_refused_and_nothing_in_it_moves(tmp_path):
    """A workflow run writes workflow.json before any stage: a run folder with train/ or eval/
    but no workflow.json is not one (--restart moved those folders aside, a run would have
    resumed or pruned the checkpoints in it). Refused, --restart or not, before anything
    starts and again before a restart moves anything; a sweep's folder too."""
    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    opts = RunOptions(preset="smoke", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", restart=True)
    spec = resolve(wmt14_en_fr.smoke(), opts)
    theirs = spec.run_dir / "train" / "checkpoint_00000010" / "checkpoint.pt"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("x")
    (spec.run_dir / "eval").mkdir()
    for s in (spec, spec.replace(restart=False)):
        assert "holds eval/, train/ but no workflow run of this project" in reuse_problem(s)
    ctx = StageContext(RunTree(spec.tracking_uri, "exp", spec.run_dir, None))
    with pytest.raises(SpecError, match="no workflow run of this project .*choose another "
                                        "--run-name"):
        record_settings(ctx, spec)
    assert theirs.is_file() and sorted(p.name for p in spec.run_dir.iterdir()) == ["eval",
                                                                                   "train"]
    sweep = spec.replace(run_name="s", restart=False)
    (sweep.run_dir / "tune").mkdir(parents=True)  # Ray Tune's folder in a sweep's
    assert "holds a sweep named 's', not a workflow run" in reuse_problem(sweep)


@pytest.mark.parametrize("stem", ["wmt19+20", "news(2019)", "a;b", "..", "tést@x"])
def test_a_test_set_stem_mlflow_cannot_name_is_refused_in_one_line_before_the_run(stem,
                                                                                 tmp_path):
    """An added test set's stem names MLflow metrics and params (eval/<job>/<stem>/bleu,
    workflow.test_sets.<stem>): MLflow takes letters, digits, '_', '-', '.', ' ', ':' and '/'
    in a name, and refuses the whole batch that holds another (the headline bleu with it).
    Refused at --dry-run, one line naming the stem and a name it would take."""
    rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", "--data", str(tmp_path),
                                       "--test-set", stem, "--dry-run",
                                       "--storage-path", str(tmp_path / "runs")])
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"error: --test-set {stem!r}: ") and "rename" in lines[0], err
    fine = resolve(wmt14_en_fr.smoke(), RunOptions(
        preset="smoke", data=str(tmp_path), test_set=["wmt19_20", "news-2019.v2", "set 3"],
        storage_path=str(tmp_path / "runs")))
    assert list(fine.added_test_sets) == ["wmt19_20", "news-2019.v2", "set 3"]


def test_a_target_language_its_bleu_cannot_tokenize_here_is_refused_before_training(
        tmp_path):
    """Japanese and Korean BLEU need sacreBLEU's MeCab tokenizers (sacrebleu[ja] / [ko]):
    without them a run would train, then fail to score. Refused when the run is resolved,
    one line naming the package; Chinese needs nothing more and resolves."""
    from sacrebleu.metrics import BLEU

    try:
        BLEU(trg_lang="ja")
        pytest.skip("sacrebleu[ja] is installed here: Japanese scores")
    except RuntimeError:
        pass
    rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", "--data", str(tmp_path),
                                       "--tgt", "ja", "--dry-run",
                                       "--storage-path", str(tmp_path / "runs")])
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert "target language 'ja'" in lines[0] and "pip install 'sacrebleu[ja]'" in lines[0]
    zh = resolve(wmt14_en_fr.smoke(), RunOptions(preset="smoke", data=str(tmp_path), tgt="zh",
                                                 storage_path=str(tmp_path / "runs")))
    assert zh.data.tgt_lang == "zh"


def test_a_restart_that_changed_many_settings_says_so_in_a_tag_mlflow_takes_whole(tmp_path):
    """The convs2s.restarted tag lists the changed settings, cut at 5,000 characters with a
    '...' (as convs2s.replaced is): MLflow keeps 8,000 characters of a tag and would cut the
    end off, where the folder the earlier training and scores went to is named."""
    from conftest import mlflow_store
    from mlflow.tracking import MlflowClient

    from workflows.run_state import StageContext, record_settings, result_settings
    from workflows.run_tree import RunTree

    opts = RunOptions(preset="smoke", storage_path=str(tmp_path / "runs"), run_name="r",
                      tracking_uri=mlflow_store(tmp_path), restart=True)
    spec = resolve(wmt14_en_fr.smoke(), opts)
    tree = RunTree.open(spec.tracking_uri, "exp", spec.run_dir, "r")
    before = {k: f"an earlier value of {k} " * 8 for k in result_settings(spec)}
    StageContext(tree).save_state({"settings": before, "train": {"run": {}}})
    (spec.run_dir / "train").mkdir()
    record_settings(StageContext(tree), spec)
    tag = MlflowClient(spec.tracking_uri).get_run(tree.parent).data.tags["convs2s.restarted"]
    aside = next(spec.run_dir.glob("replaced-*"))
    assert len(tag) < 8000 and tag.endswith(f"; the earlier training and scores are in {aside}")
    first = sorted(before)[0]  # the changes in their order, the first ones kept
    assert f"trained over ({first}: an earlier value" in tag and "...); the earlier" in tag


@pytest.mark.parametrize("module, argv", [
    # the review's command: a pair, a folder, its splits, workers and an update limit
    ("translation", ["--preset", "cpu", "--src", "fr", "--tgt", "de", "--data", "{data}",
                     "--split", "train=train", "--split", "valid=val", "--split",
                     "test=test_2016_flickr", "--num-workers", "2", "--max-updates", "5"]),
    # a paper task in the other direction, with every limit and the update flags
    ("wmt14_en_fr", ["--preset", "paper", "--src", "fr", "--tgt", "en", "--data", "{data}",
                     "--num-workers", "2", "--update-freq", "1", "--no-use-gpu",
                     "--max-epochs", "3", "--max-time", "90m", "--precision", "fp32",
                     "--set", "model.dropout=0.3"]),
    # --split over --set data.splits, and the languages over --set data.*_lang
    ("translation", ["--preset", "gpu", "--data", "{data}", "--set",
                     "data.splits={train: a, valid: b, test: c}", "--split", "test=d",
                     "--set", "data.tgt_lang=en", "--src", "fr", "--tgt", "de"]),
    ("multi30k_en_de", ["--preset", "cpu", "--data", "demo", "--max-updates", "5"]),
])
def test_a_config_file_written_with_run_level_flags_is_the_run_the_command_would_make(
        module, argv, tmp_path, capsys):
    """`--dry-run --format yaml` writes the run the command would make: the flags that are
    settings (--data, --src, --tgt, --split, --num-workers, --use-gpu, the limits,
    --precision, --update-freq) are in the file, so `--config FILE` with no other flag
    resolves to the same run (it used to write the preset with --set only: another pair, on
    the hub, one worker). A run-level flag a file does not hold is named in one line."""
    import importlib

    module = importlib.import_module(f"workflows.{module}")
    argv = [a.replace("{data}", str(tmp_path / "data")) for a in argv]
    path = _config_file(module, argv, tmp_path / "mine.yaml")
    from_flags = _dry_run(module, argv, tmp_path)
    from_file = _dry_run(module, ["--config", str(path)], tmp_path)
    assert from_file["workflow"].pop("preset") == "mine"
    from_flags["workflow"].pop("preset"), from_flags["workflow"].pop("overrides", None)
    # (an update note names where the update was asked: --update-freq, the file's setting)
    notes = [run["update"].pop("note", "").split(" (")[0] for run in (from_file, from_flags)]
    assert from_file == from_flags and notes[0] == notes[1]
    rc, _, err = _main(module, [*argv, "--attention", "2", "--run-name", "r", "--dry-run",
                                "--format", "yaml"])
    assert rc == 0 and err.strip() == ("note: --attention, --run-name are not in the file "
                                       "(run-level): give them with --config as usual")


def test_flags_apply_on_top_of_set_and_the_result_is_checked_once(tmp_path):
    """README: --set changes the preset first, the run-level flags apply on top: --src /
    --tgt / --split too (the --set value used to win over them, and a --set language was
    checked against the preset's other side before the flag applied)."""
    from workflows import translation

    base = ["--preset", "cpu", "--data", str(tmp_path)]
    run = _dry_run(translation, [*base, "--set", "data.src_lang=de", "--src", "ro"], tmp_path)
    assert run["workflow"]["name"] == "translation_ro_fr"
    run = _dry_run(translation, [*base, "--src", "fr", "--tgt", "de", "--set",
                                 "data.tgt_lang=en"], tmp_path)
    assert run["workflow"]["name"] == "translation_fr_de"
    run = _dry_run(translation, [*base, "--src", "de", "--set", "data.tgt_lang=en"], tmp_path)
    assert run["workflow"]["name"] == "translation_de_en"  # checked together: a valid pair
    run = _dry_run(translation, [*base, "--set", "data.splits={train: a, valid: b, test: c}",
                                 "--split", "test=d"], tmp_path)
    assert run["workflow"]["preprocess"]["splits"] == {"train": "a", "valid": "b", "test": "d"}
    # a --test-set is preprocessed beside them (data.* set the splits whole after it was added:
    # scored after training, never preprocessed)
    for more in (["--split", "valid=dev"], ["--set", "data.splits={train: a, valid: b, test: c}"]):
        run = _dry_run(translation, [*base, *more, "--test-set", "extra"], tmp_path)
        assert run["workflow"]["preprocess"]["splits"]["extra"] == "extra", more
        assert run["workflow"]["test_sets"]["extra"] == "extra"
    rc, _, err = _main(translation, [*base, "--set", "data.src_lang=de", "--tgt", "de",
                                     "--dry-run"])
    assert rc == 2 and err.strip() == ("error: --set data.src_lang=de --tgt de: src_lang and "
                                       "tgt_lang must differ (they name the two sides)")


def test_a_split_given_another_file_is_named_after_it_and_no_two_sets_share_a_name(tmp_path):
    """A split given another file (--split, --set data.splits) is scored under that file's
    stem, not the preset's set name (its scores, dataset and registered model named
    newstest2013 for text that was not); two evaluation sets of one name are refused before
    the run (the evaluation raised a bare ValueError after training)."""
    from workflows import wmt14_en_fr

    base = ["--preset", "paper", "--data", str(tmp_path / "d")]
    run = _dry_run(wmt14_en_fr, [*base, "--split", "valid=dev", "--test-set", "newstest2013"],
                   tmp_path)
    assert run["workflow"]["test_sets"] == {"test": "newstest2014", "valid": "dev",
                                            "newstest2013": "newstest2013"}
    run = _dry_run(wmt14_en_fr, [*base, "--set", "workflow.local_splits={train: train, valid: "
                                 "dev, test: newstest2014}"], tmp_path)  # (the same, set so)
    assert run["workflow"]["test_sets"]["valid"] == "dev"
    # --split on the files workflow.local_splits set (they were dropped for the preset's)
    run = _dry_run(wmt14_en_fr, [*base, "--set", "workflow.local_splits={train: nc-a, valid: "
                                 "nc-b, test: nc-c}", "--split", "valid=nc-x"], tmp_path)
    assert run["workflow"]["preprocess"]["splits"] == {"train": "nc-a", "valid": "nc-x",
                                                       "test": "nc-c"}
    run = _dry_run(wmt14_en_fr, base, tmp_path)  # the preset's files keep its names
    assert run["workflow"]["test_sets"] == {"test": "newstest2014", "valid": "newstest2013"}
    for more in (["--split", "test=newstest2013"],
                 ["--set", "workflow.test_sets={test: newstest2014, valid: newstest2014}"]):
        rc, out, err = _main(wmt14_en_fr, [*base, *more, "--dry-run"])
        assert rc == 2 and out == "" and err.strip().startswith(
            "error: evaluation sets of splits test and valid are both named 'newstest"), more


def test_a_hub_split_read_from_other_data_than_the_presets_is_named_after_it(tmp_path):
    """On the hub as in a folder: an evaluation split read from another hub split, dataset or
    configuration than the preset's is scored under a name of what it reads (wmt15's test was
    logged as newstest2014 and competed for wmt14_en_fr-newstest2014's champion; valid and
    test swapped chose the champion on the test set, named newstest2013); names set on
    purpose (workflow.test_sets) are kept."""
    from workflows import translation

    base = ["--preset", "paper"]
    run = _dry_run(wmt14_en_fr, base, tmp_path)
    assert run["workflow"]["test_sets"] == {"test": "newstest2014", "valid": "newstest2013"}
    run = _dry_run(wmt14_en_fr, [*base, "--set", "data.hub_repo=wmt/wmt15"], tmp_path)
    assert run["workflow"]["test_sets"] == {"test": "wmt15_test", "valid": "wmt15_validation"}
    run = _dry_run(wmt14_en_fr, [*base, "--set", "data.splits={train: train, valid: test, "
                                 "test: validation}"], tmp_path)
    assert run["workflow"]["test_sets"] == {"test": "wmt14_validation", "valid": "wmt14_test"}
    run = _dry_run(translation, ["--preset", "cpu", "--src", "de", "--tgt", "en", "--set",
                                 "data.hub_config=de-en"], tmp_path)
    assert run["workflow"]["test_sets"] == {"test": "wmt14_de-en_test",
                                            "valid": "wmt14_de-en_validation"}
    run = _dry_run(wmt14_en_fr, [*base, "--set", "data.hub_repo=wmt/wmt15", "--set",
                                 "workflow.test_sets={test: newstest2015, valid: newsdev}"],
                   tmp_path)
    assert run["workflow"]["test_sets"] == {"test": "newstest2015", "valid": "newsdev"}
    # the same through a --config file: written by --format yaml, or by hand (the file's own
    # data was compared with itself: wmt15's test was newstest2014 again)
    rc, text, err = _main(wmt14_en_fr, [*base, "--set", "data.hub_repo=wmt/wmt15",
                                        "--dry-run", "--format", "yaml"])
    written, hand = tmp_path / "w15.yaml", tmp_path / "hand.yaml"
    written.write_text(text)
    hand.write_text("preset: paper\npreprocess:\n  hub_repo: wmt/wmt15\n")
    for file in (written, hand):
        run = _dry_run(wmt14_en_fr, ["--config", str(file)], tmp_path)
        assert run["workflow"]["test_sets"] == {"test": "wmt15_test",
                                                "valid": "wmt15_validation"}, file


def test_languages_the_hub_configuration_does_not_hold_are_refused_naming_the_one_that_does(
        tmp_path):
    """--src de --tgt en on the hub's wmt14 fr-en passed the dry run (named wmt14_de_en) and
    was refused only once Ray had started, reading the files' columns."""
    from workflows import translation

    rc, out, err = _main(wmt14_en_fr, ["--preset", "paper", "--src", "de", "--tgt", "en",
                                       "--dry-run"])
    assert rc == 2 and out == "" and err.strip() == (
        "error: the hub's wmt/wmt14 fr-en holds fr and en, not de -> en: name the hub's "
        "configuration of the pair (--set data.hub_config=de-en), or give the data with "
        "--data DIR")
    run = _dry_run(wmt14_en_fr, ["--preset", "paper", "--src", "de", "--tgt", "en", "--set",
                                 "data.hub_config=de-en"], tmp_path)
    assert run["workflow"]["name"] == "wmt14_de_en"
    _dry_run(translation, ["--preset", "cpu", "--src", "fr", "--tgt", "en"], tmp_path)


def test_a_renamed_hub_split_is_refused_naming_the_task_and_the_mapping_to_give(tmp_path):
    """--set data.splits without the run's `test` split: one line naming the task with its
    languages (it printed translation_{src}_{tgt}) and the mapping that keeps the split's
    name, which then resolves."""
    from workflows import translation

    base = ["--preset", "cpu", "--data", "hub", "--storage-path", str(tmp_path / "runs")]
    rc, out, err = _main(translation, [*base, "--set", "data.splits={train: train, valid: dev, "
                                                       "newstest: newstest}", "--dry-run"])
    assert rc == 2 and out == "" and err.strip() == (
        "error: --set data.splits={train: train, valid: dev, newstest: newstest}: "
        "translation_en_fr: data.splits has no 'test' split, which the run scores: keep the "
        "name and map it to the data's, e.g. data.splits={train: train, valid: dev, "
        "test: newstest}")
    fix = err.strip().rsplit("e.g. ", 1)[1]
    run = _dry_run(translation, [*base, "--set", fix], tmp_path)
    assert run["workflow"]["preprocess"]["splits"] == {"train": "train", "valid": "dev",
                                                       "test": "newstest"}


def test_a_second_test_set_of_a_hub_dataset_is_a_split_of_its_own(tmp_path):
    """Every test split had to be named valid or test (the demo corpus's), whatever the data:
    a hub dataset's second test set could not be scored. The demo refuses another name,
    --data DIR a split its files do not map."""
    from workflows import translation

    sets = ["--set", "data.hub_repo=wmt/wmt17", "--set", "data.hub_config=zh-en", "--set",
            "data.splits={train: train, valid: validation, test: test, test18: test}", "--set",
            "workflow.test_sets={test: newstest2017, test18: newstest2018, valid: valid}"]
    run = _dry_run(translation, ["--preset", "gpu", "--src", "en", "--tgt", "zh", *sets],
                   tmp_path)
    assert run["workflow"]["test_sets"]["test18"] == "newstest2018"
    assert run["workflow"]["preprocess"]["splits"]["test18"] == "test"
    rc, _, err = _main(translation, ["--preset", "gpu", "--data", "demo", *sets, "--dry-run"])
    assert rc == 2 and "test split 'test18' is not a split of the demo corpus" in err, err
    rc, _, err = _main(translation, ["--preset", "gpu", "--data", str(tmp_path), *sets,
                                     "--dry-run"])
    assert rc == 2 and "workflow.local_splits has no 'test18' split, which the run scores" \
        in err, err


@pytest.mark.parametrize("module, says, not_says", [
    ("translation", ["cpu, gpu, smoke (default: smoke)", "cpu=hub wmt/wmt14 fr-en en->fr",
                     "gpu=hub wmt/wmt14 fr-en en->fr", "smoke=demo",
                     "Without --data, cpu and gpu read the hub's wmt/wmt14 fr-en"],
     ["paper:", "paper=", "smoke: the embedded demo corpus, a small model",
      "data key inputs"]),
    ("wmt16_en_ro", ["paper, smoke (default: smoke)", "paper=hub wmt/wmt16 ro-en en->ro",
                     "smoke=demo"], ["data key inputs"]),
])
def test_help_describes_the_presets_the_workflow_has_and_what_dry_run_prints(
        module, says, not_says, tmp_path, capsys, monkeypatch):
    """--help lists the file's own presets and each one's default data (the hub dataset and
    pair, or the demo), not a generic paper / smoke text, and --dry-run's contents as its
    JSON holds them."""
    import importlib

    module = importlib.import_module(f"workflows.{module}")
    monkeypatch.setenv("COLUMNS", "1000")  # (argparse wraps at a hyphen: "ro-\nen")
    with pytest.raises(SystemExit) as exit_:
        module.main(module.PRESETS, module.__doc__, ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0
    for part in says:
        assert part in text, part
    for part in not_says:
        assert part not in text, part
    for part in ("every setting", "tokens per update", "the data source, test sets, run "
                 "folder, tracking URI and experiment"):
        assert part in text, part
    run = _dry_run(module, ["--preset", "smoke"], tmp_path)
    assert "max_tokens_per_update" in run["update"] and {
        "data_source", "test_sets", "run_dir", "tracking_uri", "experiment"} <= set(run["run"])


def test_a_split_the_hub_dataset_lacks_names_a_fix_both_commands_take(tmp_path, capsys):
    """A hub dataset without the split asked for (a loopback hub listing wmt14's fr-en
    files): one line whose fix, --set 'data.splits={...}', both the preprocessing command and
    the workflows take (it said --split valid=validation, which a workflow refuses on the
    hub); the preprocessing command then finds the split."""
    import http.server
    import threading

    from preprocessing.cli import main as preprocess
    from preprocessing.config import translation as hub_preset
    from preprocessing.sources import hub_parquet_files
    from workflows import translation

    listing = json.dumps({"id": "wmt/wmt14", "sha": "0" * 40, "siblings": [
        {"rfilename": f"fr-en/{s}-00000-of-00001.parquet"}
        for s in ("train", "validation", "test")]}).encode()

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(listing)))
            self.end_headers()
            self.wfile.write(listing)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hub = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        rc = preprocess(["--task", "translation", "--source", "hub", "--hub-endpoint", hub,
                         "--out", str(tmp_path / "prep"), "--set",
                         "data.splits={train: training, valid: validation, test: test}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1] == (
            "error: hub dataset wmt/wmt14@main has no parquet files for config 'fr-en' split "
            "'training': check hub_config, and map each split to a split of the hub's, e.g. --set "
            "'data.splits={train: train, valid: validation, test: test}'")
        value = err[-1].rsplit("--set ", 1)[1].strip("'")
        fixed = hub_preset().replace(splits=yaml.safe_load(value.partition("=")[2]))
        assert [hub_parquet_files(fixed, fixed.splits[s], hub)[0][0].rsplit("/", 1)[1]
                for s in fixed.splits] == [f"{s}-00000-of-00001.parquet"
                                           for s in ("train", "validation", "test")]
    finally:
        server.shutdown()
    # a workflow on the hub takes it (its --split is for --data DIR)
    run = _dry_run(translation, ["--preset", "cpu", "--data", "hub", "--set", value], tmp_path)
    assert run["workflow"]["preprocess"]["splits"]["valid"] == "validation"


def test_max_tokens_is_the_batch_budget_setting_and_the_update_plan_follows_it(tmp_path):
    """`--max-tokens N` (issue 37's name for a new batch budget) is `--set data.max_tokens=N`:
    the same resolved run, the same dry-run; the paper's En-Fr update on one GPU is then kept
    with 6 micro-batches of 4,000 tokens instead of 8 of 3,000."""
    flag = _dry_run(wmt14_en_fr, ["--preset", "paper", "--num-workers", "1", "--max-tokens",
                                  "4000"], tmp_path)
    set_ = _dry_run(wmt14_en_fr, ["--preset", "paper", "--num-workers", "1", "--set",
                                  "data.max_tokens=4000"], tmp_path)
    assert flag == set_
    assert flag["update"]["max_tokens_per_batch"] == 4000
    # a run-level flag, applied on top of --set as the others are (the --set won)
    both = _dry_run(wmt14_en_fr, ["--preset", "paper", "--num-workers", "1", "--max-tokens",
                                  "4000", "--set", "data.max_tokens=2000"], tmp_path)
    assert both["update"] == flag["update"]
    assert both["workflow"]["preprocess"] == flag["workflow"]["preprocess"]
    assert flag["update"]["micro_batches_per_update"] == 6
    assert flag["update"]["max_tokens_per_update"] == 24000


def test_data_and_workflow_changes_are_checked_together_not_each_with_the_others_preset(
        tmp_path):
    """--set data.* and --set workflow.* are one change of the run: a pair that is right only
    together resolves (each was checked against the other's preset value and refused), and a
    pair that is wrong only together is refused in one line (it passed both checks and
    crashed computing the update)."""
    from workflows import translation

    data = tmp_path / "data"
    data.mkdir()
    for stem in ("train", "valid", "test", "v"):
        for lang in ("fr", "en"):
            (data / f"{stem}.{lang}").write_text("a b\n")
    # sentence-capped batches off: the update by sentences goes with them
    giga = resolve(gigaword.paper(), RunOptions(preset="paper", set=[
        "workflow.update_sentences=0", "data.max_sentences=null"]))
    assert giga.data.max_sentences is None
    # a hub dataset without a test split: the run scores its validation split only
    hub = resolve(translation.cpu(), RunOptions(preset="cpu", set=[
        "workflow.test_sets={valid: v}", "data.splits={train: train, valid: validation}"]))
    assert hub.test_sets == {"valid": "v"}
    with pytest.raises(SpecError, match=r"^--set data.max_sentences=null --set "
                                        r"workflow.update_sentences=64: .*update_sentences\) "
                                        r"needs batches cut by sentences"):
        resolve(translation.cpu(), RunOptions(preset="cpu", data=str(data), set=[
            "workflow.update_sentences=64", "data.max_sentences=null"]))


@pytest.mark.parametrize("split, test_set, says", [
    (["train=c", "valid=o", "test=o"], ["c"], "--test-set c shares lines with the training "
                                              "split (c)"),
    (["train=c[:900]", "valid=o", "test=o"], ["c"], "--test-set c shares lines with the "
                                                    "training split (c[:900])"),
    (["train=c[:4750]", "valid=c[4500:4750]", "test=c[4750:]"], [],
     "split valid (c[4500:4750]) shares lines with the training split (c[:4750])"),
])
def test_an_evaluation_split_on_training_lines_is_refused(tmp_path, split, test_set, says):
    """Scores on lines the model and its BPE learned: a --test-set naming the training file
    was dropped without a word (as if scored already), and ranges of one file that meet were
    taken as they came."""
    from workflows import translation

    for lang in ("fr", "en"):
        (tmp_path / f"c.{lang}").write_text("".join(f"w{i}\n" for i in range(5000)))
        (tmp_path / f"o.{lang}").write_text("x\n")
    opts = dict(preset="cpu", src="fr", tgt="en", data=str(tmp_path))
    with pytest.raises(SpecError, match=re.escape(says)):
        resolve(translation.cpu(), RunOptions(**opts, split=split, test_set=test_set))
    apart = resolve(translation.cpu(), RunOptions(**opts, split=[
        "train=c[:4500]", "valid=c[4500:4750]", "test=c[4750:]"], test_set=["o"]))
    assert apart.data.splits == {"train": "c[:4500]", "valid": "c[4500:4750]",
                                 "test": "c[4750:]", "o": "o"}


def test_a_run_refused_only_for_its_batch_budget_is_told_how_to_keep_its_own(tmp_path):
    """A preset may choose its batches by the machine (float32 CPUs cut smaller ones): a rerun
    of the same command from another host differs only there. The refusal says which
    `--set data.max_tokens` resumes the run with its own batches."""
    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    data = tmp_path / "data"
    data.mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            (data / f"{stem}.{lang}").write_text("a line\n")
    opts = RunOptions(preset="cpu", data=str(data), run_name="r",
                      storage_path=str(tmp_path / "runs"),
                      tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    first = resolve(multi30k_en_de.cpu(), RunOptions(**{**vars(opts),
                                                        "set": ["data.max_tokens=3000"]}))
    tree = RunTree.open(opts.tracking_uri, "exp", first.run_dir, "r")
    record_settings(StageContext(tree), first)
    said = reuse_problem(resolve(multi30k_en_de.cpu(), opts))
    assert "data.max_tokens: 3000 -> " in said
    assert "--set data.max_tokens=3000 resumes it with its own batches" in said
    assert reuse_problem(resolve(multi30k_en_de.cpu(), RunOptions(
        **{**vars(opts), "set": ["data.max_tokens=3000"]}))) is None
    other = reuse_problem(resolve(multi30k_en_de.cpu(), RunOptions(
        **{**vars(opts), "set": ["train.lr=0.1"]})))
    assert "resumes it with its own batches" not in other  # more than the budget changed


def test_dry_run_says_what_it_would_do_with_a_run_name_that_exists(tmp_path):
    """--dry-run on an existing --run-name says whether the run would go on with it, set it
    aside (--restart) or be refused and why: it printed a plan the run then refused."""
    from workflows.run_state import StageContext, record_settings
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--preset", "smoke", "--storage-path", str(tmp_path / "runs"), "--run-name", "r",
            "--tracking-uri", uri, "--dry-run"]
    rc, out, err = _main(wmt14_en_fr, argv)
    assert rc == 0 and json.loads(out) and "note:" not in err  # a new run name
    spec = resolve(wmt14_en_fr.smoke(), RunOptions(preset="smoke", run_name="r",
                                                    storage_path=str(tmp_path / "runs"),
                                                    tracking_uri=uri))
    record_settings(StageContext(RunTree.open(uri, "exp", spec.run_dir, "r")), spec)
    for extra, says in (([], "exists with these settings: this command goes on with it"),
                        (["--set", "train.lr=0.1"],
                         "would be refused: run 'r' in"),
                        (["--set", "train.lr=0.1", "--restart"],
                         "--restart sets its training and scores aside")):
        rc, out, err = _main(wmt14_en_fr, argv + extra)
        assert rc == 0 and json.loads(out), err
        assert says in err, (extra, err)
    assert "train.lr: 0.25 -> 0.1" in _main(wmt14_en_fr, argv + ["--set", "train.lr=0.1"])[2]


def test_a_run_name_goes_on_only_in_the_experiment_it_is_tracked_in(tmp_path):
    """A rerun of a run name with another --experiment went on silently: its finished training
    and scores were skipped, their runs left in the first experiment, and the new one showed
    a run without them. It is refused, naming the experiment; --restart starts it over."""
    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def spec_of(experiment, restart=False):
        return resolve(wmt14_en_fr.smoke(), RunOptions(
            preset="smoke", run_name="r", storage_path=str(tmp_path / "runs"),
            tracking_uri=uri, experiment=experiment, restart=restart))

    spec = spec_of("first")
    record_settings(StageContext(RunTree.open(uri, "first", spec.run_dir, "r")), spec)
    assert reuse_problem(spec_of("first")) is None
    assert reuse_problem(spec_of("second")) == (
        f"run 'r' in {spec.run_dir} is tracked in MLflow experiment 'first', where its runs "
        "are: give --experiment first to go on with it, or another --run-name")
    assert reuse_problem(spec_of("second", restart=True)) is None


def test_a_raised_budget_nothing_trained_under_may_be_taken_back(tmp_path, tiny_checkpoints):
    """--max-updates 40000 typed for 4000, stopped before an update was checkpointed, was the
    run's budget for good: the intended one refused as smaller (a sweep's trials with it,
    which cannot --restart). Taken back while nothing trained since; once a checkpoint was
    made under the raise, the run may have trained past the smaller one: refused."""
    import shutil

    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def spec_of(updates):
        return resolve(wmt14_en_fr.smoke(), RunOptions(
            preset="smoke", run_name="r", storage_path=str(tmp_path / "runs"),
            tracking_uri=uri, max_updates=updates))

    def record(spec):
        record_settings(StageContext(RunTree.open(uri, spec.experiment, spec.run_dir, "r")),
                        spec)

    record(spec_of(4000))
    (spec_of(4000).run_dir / "train").mkdir(parents=True)
    record(spec_of(40000))  # the typo, stopped at once
    assert reuse_problem(spec_of(4000)) is None
    record(spec_of(4000))
    assert reuse_problem(spec_of(4000)) is None
    record(spec_of(40000))
    shutil.copytree(tiny_checkpoints["a"], spec_of(4000).run_dir / "train" / "checkpoint_1")
    assert "max_updates: 40000 -> 4000 (smaller)" in (reuse_problem(spec_of(4000)) or "")


def test_a_copy_of_a_run_folder_beside_its_original_is_refused_and_a_moved_one_goes_on(
        tmp_path):
    """`cp -r team-a/r team-b/r` (or a bucket sync) then a rerun in the copy: its record named
    the original's training, so training was skipped, the original's checkpoints scored and
    its MLflow runs re-parented under the copy's. Refused while the original is there; once it
    is moved away (the run moved, not copied), the run goes on in its new folder."""
    import shutil

    from workflows.run_state import StageContext, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def spec_of(storage):
        return resolve(wmt14_en_fr.smoke(), RunOptions(
            preset="smoke", run_name="r", storage_path=str(tmp_path / storage),
            tracking_uri=uri))

    a = spec_of("team-a")
    ctx = StageContext(RunTree.open(uri, a.experiment, a.run_dir, "r"))
    record_settings(ctx, a)
    (a.run_dir / "train").mkdir()
    state = ctx.state()
    state["train"]["train"] = {"key": "k", "result": {"run_dir": str(a.run_dir / "train")}}
    ctx.save_state(state)
    shutil.copytree(a.run_dir, tmp_path / "team-b" / "r")
    b = spec_of("team-b")
    assert reuse_problem(b) == (
        f"run folder {b.run_dir} is a copy of {a.run_dir} (its workflow.json records that "
        "folder's training, and that folder is there): the copy would score that folder's "
        f"weights and take over its MLflow runs. Go on with the run in {a.run_dir}; or, to go "
        "on here instead, move that run away first")
    assert reuse_problem(a) is None
    # renamed, and a new run under the old name: not the same run (its own MLflow runs)
    shutil.move(a.run_dir, tmp_path / "team-a" / "r-v1")
    ctx = StageContext(RunTree.open(uri, a.experiment, a.run_dir, "r"))
    record_settings(ctx, a)
    (a.run_dir / "train").mkdir()
    state = ctx.state()
    state["train"]["train"] = {"key": "k", "result": {"run_dir": str(a.run_dir / "train"),
                                                       "run_id": "another"}}
    ctx.save_state(state)
    assert reuse_problem(b) is None
    shutil.rmtree(a.run_dir)  # moved: the original gone
    assert reuse_problem(b) is None


def test_a_run_name_goes_on_only_in_the_tracking_store_it_is_tracked_in(tmp_path):
    """A rerun against another store (MLFLOW_TRACKING_URI set in one shell only, the default
    mlflow.db of another folder) went on: its training skipped, its parent there without a
    training run or registered model, every score made again. Refused, naming the store; a
    password changed in the URI is the same store."""
    from workflows.run_state import StageContext, _store, record_settings, reuse_problem
    from workflows.run_tree import RunTree

    one = f"sqlite:///{tmp_path / 'one.db'}"

    def spec_of(uri, restart=False):
        return resolve(wmt14_en_fr.smoke(), RunOptions(
            preset="smoke", run_name="r", storage_path=str(tmp_path / "runs"),
            tracking_uri=uri, restart=restart))

    spec = spec_of(one)
    record_settings(StageContext(RunTree.open(one, spec.experiment, spec.run_dir, "r")), spec)
    assert reuse_problem(spec_of(one)) is None
    assert reuse_problem(spec_of(f"sqlite:///{tmp_path / 'two.db'}")) == (
        f"run 'r' in {spec.run_dir} is tracked at {one}, where its runs are: give "
        f"--tracking-uri {one} (or set MLFLOW_TRACKING_URI) to go on with it, or another "
        "--run-name (the same store at another address, e.g. localhost for 127.0.0.1 or a new "
        "host name: write the address as \"tracking\" in the run's workflow.json)")
    assert reuse_problem(spec_of(f"sqlite:///{tmp_path / 'two.db'}", restart=True)) is None
    assert _store("https://u:old@mlflow.team:5000/") == _store("https://u:new@mlflow.team:5000")


def test_a_restart_marks_the_logged_models_of_the_weights_it_sets_aside(tmp_path):
    """After --restart the earlier weights' logged models (`r-best` with its scores) stood
    beside the new ones of the same names, nothing telling them apart; they are tagged
    convs2s.replaced, saying what changed and where the weights went."""
    from mlflow.tracking import MlflowClient

    from workflows.run_state import StageContext, record_settings

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def spec_of(restart=False, lr="0.25"):
        return resolve(wmt14_en_fr.smoke(), RunOptions(
            preset="smoke", run_name="r", storage_path=str(tmp_path / "runs"),
            tracking_uri=uri, restart=restart, set=[f"train.lr={lr}"]))

    spec = spec_of()
    ctx = StageContext(_tree_of(uri, spec))
    record_settings(ctx, spec)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("exp").experiment_id
    model = client.create_logged_model(exp, name="r-best").model_id
    (spec.run_dir / "train").mkdir(parents=True)
    ctx.save_state({**ctx.state(), "models": {"best": {"stamp": "s", "model_id": model}}})
    again = spec_of(restart=True, lr="0.1")
    record_settings(StageContext(_tree_of(uri, again)), again)
    tag = client.get_logged_model(model).tags["convs2s.replaced"]
    assert "trained over (train.lr: 0.25 -> 0.1)" in tag and "replaced-" in tag, tag


def _tree_of(uri, spec):
    from workflows.run_tree import RunTree

    return RunTree.open(uri, "exp", spec.run_dir, "r", restarting=spec.restart)


def test_dry_run_on_storage_that_does_not_answer_says_so_not_that_the_run_exists(
        tmp_path, monkeypatch):
    """A bucket --storage-path whose endpoint does not answer (a typo, no network) made the
    dry run say "run 'r' exists; its record could not be compared": it cannot tell, and says
    that. (A bucket of its own: pyarrow reads the endpoint once per bucket and process.)"""
    from workflows.cluster import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # (nothing there)
    rc, out, err = _main(wmt14_en_fr, ["--preset", "smoke", "--storage-path",
                                       "s3://no-such-endpoint-bucket/runs", "--run-name", "r",
                                       "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
                                       "--dry-run"])
    assert rc == 0 and json.loads(out)
    assert err.startswith("note: could not tell whether run 'r' exists (its storage did not "
                          "answer: "), err
    assert err.rstrip().endswith("the run checks it before Ray starts") and "exists;" not in err
