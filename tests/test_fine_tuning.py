"""Fine-tuning as a specification: `--init-from CKPT_DIR` starts a workflow's training from a
checkpoint's weights (one of ours, or a reference model imported with `python -m convs2s
import-fairseq`), keeps its architecture and vocabulary (the new data is encoded with the
model's own sentencepiece model, or Moses + subword-nmt BPE and dictionaries), and its
checkpoints carry that text pipeline, so they translate, score and serve on their own.

    timeout 600 .venv/bin/python -m pytest tests/test_fine_tuning.py -q
"""

from __future__ import annotations

import contextlib
import gzip
import io
from pathlib import Path

import pytest
from conftest import mlflow_store

from convs2s.io.fairseq import import_fairseq
from convs2s.io.text_codec import CheckpointVocabulary, codec_for_checkpoint
from workflows import multi30k_en_de
from workflows.run_spec import SpecError, resolve
from workflows.workflow_config import RunOptions

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "fairseq"


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    """The reference's fconv_iwslt_de_en fixture (En->De, Multi30k train[:2500]), imported."""
    return import_fairseq(FIXTURES / "iwslt", tmp_path_factory.mktemp("imported") / "iwslt")


def _write(folder: Path, stem: str, lang: str, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.{lang}").write_text("".join(line + "\n" for line in lines),
                                           encoding="utf-8")


@pytest.fixture(scope="module")
def new_data(shared_data, tmp_path_factory) -> Path:
    """Multi30k captions the imported model never saw: 2,000 training pairs after the 2,500 it
    was trained on, 100 validation and 100 test_2016_flickr pairs."""
    out = tmp_path_factory.mktemp("new_data")
    for lang in ("en", "de"):
        def lines(stem):
            with gzip.open(shared_data / "multi30k" / f"{stem}.{lang}.gz", "rt",
                           encoding="utf-8") as f:
                return f.read().splitlines()
        _write(out, "train", lang, lines("train")[2500:4500])
        _write(out, "val", lang, lines("val")[:100])
        _write(out, "test_2016_flickr", lang, lines("test_2016_flickr")[:100])
    return out


# --- the vocabulary of a checkpoint ------------------------------------------------------------


def test_a_moses_bpe_checkpoint_encodes_new_data_with_its_own_dictionaries(imported):
    vocab = CheckpointVocabulary(imported)
    codec = codec_for_checkpoint(imported)
    assert vocab.kind == "moses+subword_nmt" and vocab.languages == ("en", "de")
    assert (vocab.src_size, vocab.tgt_size) == (codec.src_size, codec.tgt_size)
    assert vocab.spm_model == ""
    assert {Path(f).name for f in vocab.files} == {"text.json", "bpecodes", "dict.en.txt",
                                                   "dict.de.txt"}
    encode = vocab.encoder()
    src = ["A man in an orange hat starring at something."]
    assert encode(src, "src") == [codec.source_ids(codec.encode(src[0]))]
    tgt = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."]
    (ids,) = encode(tgt, "tgt")
    assert 3 not in ids[:3] and max(ids) < vocab.tgt_size  # target dictionary ids
    assert codec.decode(ids) == tgt[0]  # the target side round-trips through its dictionary


def test_the_vocabulary_fingerprint_follows_its_files(imported, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(imported, copy)
    assert CheckpointVocabulary(copy).fingerprint == CheckpointVocabulary(imported).fingerprint
    with open(copy / "dict.de.txt", "a", encoding="utf-8") as f:
        f.write("neueswort 1\n")
    assert CheckpointVocabulary(copy).fingerprint != CheckpointVocabulary(imported).fingerprint


def test_a_sentencepiece_checkpoint_encodes_both_sides_with_its_joint_model(tiny_checkpoints):
    import sentencepiece as spm

    best = Path(tiny_checkpoints["a"])
    vocab = CheckpointVocabulary(best)
    assert vocab.kind == "sentencepiece" and vocab.languages is None
    assert vocab.spm_model == str(best / "sentencepiece.model")
    sp = spm.SentencePieceProcessor(model_file=vocab.spm_model)
    line = "a small test sentence"
    assert vocab.encoder()([line], "tgt") == [sp.encode(line)]
    assert vocab.src_size == vocab.tgt_size == sp.get_piece_size()


# --- the run ------------------------------------------------------------------------------------


def test_init_from_takes_the_checkpoints_architecture_with_the_presets_dropout(imported):
    spec = resolve(multi30k_en_de.cpu(), RunOptions(preset="cpu", init_from=str(imported)))
    ours = codec_for_checkpoint(imported)
    assert spec.init_from == str(imported)
    assert spec.model.dropout == multi30k_en_de.cpu().model.dropout
    assert spec.model.embed_dim != multi30k_en_de.cpu().model.embed_dim  # the fixture's width
    assert "init_from" in spec.params()["workflow"]
    assert ours.src_size > 4


def test_init_from_a_folder_without_a_checkpoint_or_of_the_other_direction_is_refused(
        imported, tmp_path):
    with pytest.raises(SpecError, match="no checkpoint.pt there"):
        resolve(multi30k_en_de.cpu(), RunOptions(preset="cpu", init_from=str(tmp_path)))
    de_en = multi30k_en_de.cpu()
    de_en = de_en.replace(preprocess=de_en.preprocess.replace(src_lang="de", tgt_lang="en"))
    with pytest.raises(SpecError, match="translates en->de but the data is de->en"):
        resolve(de_en, RunOptions(preset="cpu", init_from=str(imported)))


def _fine_tune_preset():
    """The cpu recipe (its warmup starts at lr 1e-7) on one worker."""
    return multi30k_en_de.cpu()


@pytest.fixture(scope="module")
def fine_tuned(imported, new_data, ray_session, tmp_path_factory) -> dict:
    """The Multi30k workflow fine-tuning the imported model on new captions for 2 updates."""
    root = tmp_path_factory.mktemp("fine_tune")
    uri = mlflow_store(root)
    argv = ["--preset", "cpu", "--data", str(new_data), "--storage-path", str(root / "runs"),
            "--tracking-uri", uri, "--run-name", "ft", "--init-from", str(imported),
            "--max-updates", "2", "--no-system-metrics"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = multi30k_en_de.main({"cpu": _fine_tune_preset}, multi30k_en_de.__doc__, argv)
    assert rc == 0, buf.getvalue()[-3000:]
    return {"root": root, "uri": uri, "out": buf.getvalue(),
            "run_dir": root / "runs" / "ft"}


def test_fine_tuning_starts_where_the_imported_model_stands(fine_tuned, imported, new_data):
    """Two updates at the warmup's first lr barely move the weights: the fine-tuned model
    scores what the imported model scores on the new test captions (a model from random
    weights scores about 0)."""
    import sacrebleu

    from convs2s.config import SearchConfig
    from convs2s.metrics.scoring import read_lines
    from convs2s.inference.translate import load_for_inference

    src = read_lines(new_data / "test_2016_flickr.en")
    ref = read_lines(new_data / "test_2016_flickr.de")
    before = load_for_inference([imported], search=SearchConfig(beam=5)).translate(src)
    bleu_before = sacrebleu.corpus_bleu(before, [ref]).score
    assert bleu_before > 3.0  # the fixture model translates something
    from mlflow.tracking import MlflowClient

    client = MlflowClient(fine_tuned["uri"])
    exp = client.get_experiment_by_name("multi30k_en_de")
    (parent,) = [r for r in client.search_runs([exp.experiment_id])
                 if r.info.run_name == "ft"]
    after = parent.data.metrics["eval/best/test_2016_flickr/bleu"]
    assert after == pytest.approx(bleu_before, abs=1.0), (after, bleu_before)
    assert "fine-tuned from" in fine_tuned["out"]


def test_fine_tuned_checkpoints_keep_the_vocabulary_and_carry_its_text_pipeline(
        fine_tuned, imported):
    from convs2s.io.checkpoint import load_checkpoint

    best = fine_tuned["run_dir"] / "train" / "best"
    for name in ("text.json", "bpecodes", "dict.en.txt", "dict.de.txt"):
        assert (best / name).read_bytes() == (imported / name).read_bytes(), name
    assert not (best / "sentencepiece.model").exists()
    ours, theirs = load_checkpoint(best), load_checkpoint(imported)
    assert (ours["src_vocab_size"], ours["tgt_vocab_size"]) == \
        (theirs["src_vocab_size"], theirs["tgt_vocab_size"])
    assert ours["src_vocab_size"] != ours["tgt_vocab_size"]  # one dictionary per language
    assert ours["model"].keys() == theirs["model"].keys()


def test_the_run_says_where_it_started_in_mlflow(fine_tuned, imported):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(fine_tuned["uri"])
    exp = client.get_experiment_by_name("multi30k_en_de")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert runs["train"].data.tags["convs2s.init_from"] == str(imported)
    assert runs["train"].data.params["job.init_from"] == str(imported)
    assert runs["preprocess"].data.params["vocabulary.kind"] == "moses+subword_nmt"
    assert runs["ft"].data.params["workflow.init_from"] == str(imported)


def test_a_different_init_from_under_the_same_run_name_is_refused(fine_tuned, new_data,
                                                                 tiny_checkpoints):
    from workflows.run_state import reuse_problem

    spec = resolve(multi30k_en_de.cpu(), RunOptions(
        preset="cpu", data=str(new_data), storage_path=str(fine_tuned["root"] / "runs"),
        run_name="ft", init_from=tiny_checkpoints["a"], tracking_uri=fine_tuned["uri"]))
    assert "init_from: " in (reuse_problem(spec) or ""), reuse_problem(spec)
