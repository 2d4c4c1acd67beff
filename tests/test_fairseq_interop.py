"""The reference implementation's fconv checkpoints, imported and exported, checked against what
the reference itself computed on them (tests/fixtures/fairseq, made by
scripts/fairseq_fixtures.sh with fairseq 0.12 on small models it trained on Multi30k):

- the imported model's log-probabilities equal the reference's within 1e-5;
- beam 5 gives the hypotheses (and scores) of `fairseq-generate`;
- raw text through Moses + subword-nmt, the model and Moses detokenization gives the
  reference hub interface's translations;
- a decoder saved before the reference's weight-norm fix imports to the same function;
- an export imports back to the same weights; with the reference installed
  (FAIRSEQ_PYTHON, or the scratch venv the script makes) its own hub loads the export;
- bad archives: one line, exit 2, nothing written.

    .venv/bin/python -m pytest tests/test_fairseq_interop.py -q
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import mlflow_store
import torch

from convs2s.io.checkpoint import load_model
from convs2s.config import EOS, PAD, SearchConfig
from convs2s.io.fairseq import (
    ARCHIVE_MODEL,
    FairseqImportError,
    convert_weights,
    export_fairseq,
    import_fairseq,
    model_config,
    read_reference_checkpoint,
    WRITTEN_BY,
    saved_arguments,
)
from convs2s.inference.search import generate
from convs2s.io.text_codec import codec_for_checkpoint
from convs2s.inference.translate import load_for_inference

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "fairseq"
MODELS = ["iwslt", "mixed"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("imported")
    return {name: import_fairseq(FIXTURES / name, root / name) for name in MODELS}


def assert_same_log_probs(ours: torch.Tensor, theirs: torch.Tensor, tol: float = 1e-5) -> None:
    """Within `tol` plus float32 rounding of the value (1e-6 x |log p|, about 8 ulps: a
    log-probability of -20 has an ulp of 2e-6). The fixtures come from one host; another
    host's matrix kernels sum in another order (the Intel Xeon host: 1.14e-5 at log p = -19.7,
    where the AMD EPYC host that made them stayed within 1e-5)."""
    assert ours.shape == theirs.shape
    diff = (ours - theirs).abs()
    excess = diff - (tol + 1e-6 * theirs.abs())
    assert (excess <= 0).all(), (diff.max().item(), excess.max().item())
    assert diff[theirs > -20.7].max().item() < 2 * tol  # p > 1e-9: never more than 2e-5


def _lprobs(model, src: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits, _ = model(src[None], torch.tensor([len(src)]), prev[None])
    return torch.log_softmax(logits.float(), dim=-1)[0]


@pytest.mark.parametrize("name", MODELS)
def test_imported_log_probabilities_equal_the_references(imported, name):
    model, meta = load_model(imported[name])
    assert meta["imported_from"]["kind"] == "fairseq fconv"
    items = torch.load(FIXTURES / name / "logprobs.pt", weights_only=True)
    assert len(items) >= 5
    for item in items:
        assert_same_log_probs(_lprobs(model, item["src"], item["prev"]), item["lprobs"])


@pytest.mark.parametrize("name", MODELS)
def test_beam5_gives_the_hypotheses_of_fairseq_generate(imported, name):
    model, _ = load_model(imported[name])
    codec = codec_for_checkpoint(imported[name])
    recorded = json.loads((FIXTURES / name / "generate.json").read_text())
    same = 0
    for sent in recorded["sentences"]:
        ids = codec.source_ids(sent["source_bpe"].split()) + [EOS]
        (best, *_), = generate([model], torch.tensor([ids]), torch.tensor([len(ids)]),
                               beam_size=recorded["beam"], max_len_a=0, max_len_b=200)
        text = " ".join(codec.target_piece(t) for t in best["tokens"].tolist()[:-1])
        assert text == sent["hypothesis_bpe"], sent["id"]
        # fairseq-generate prints the length-normalized score in base 2
        assert best["score"] / torch.log(torch.tensor(2.0)).item() == \
            pytest.approx(sent["score"], abs=2e-4)
        same += 1
    assert same == len(recorded["sentences"]) >= 30


@pytest.mark.parametrize("name", MODELS)
def test_raw_text_translates_as_the_reference_hub_does(imported, name):
    recorded = json.loads((FIXTURES / name / "hub.json").read_text())
    tr = load_for_inference([imported[name]], search=SearchConfig(beam=recorded["beam"]))
    assert tr.codec.kind == "moses+subword_nmt"
    assert tr.translate(recorded["source"]) == recorded["translation"]


def _old_style_decoder(state: dict, cfg) -> dict:
    """The reference's decoder weights as saved before its weight-norm fix: gains per kernel
    position (dim 0 of kernel x in x out), no version buffer."""
    fs = dict(state["model"])
    for i in range(len(cfg.decoder_layers)):
        g, v = fs[f"decoder.convolutions.{i}.weight_g"], fs[f"decoder.convolutions.{i}.weight_v"]
        w = v * (g / v.norm(dim=(0, 1), keepdim=True))
        scale = torch.linspace(0.5, 2.0, w.shape[0]).reshape(-1, 1, 1)  # any direction scale
        fs[f"decoder.convolutions.{i}.weight_v"] = w * scale
        fs[f"decoder.convolutions.{i}.weight_g"] = w.norm(dim=(1, 2), keepdim=True)
    fs.pop("decoder.version", None)
    return {**state, "model": fs}


@pytest.mark.parametrize("name", MODELS)
def test_a_decoder_saved_before_the_weight_norm_fix_imports_to_the_same_function(
        imported, name, tmp_path):
    archive = tmp_path / "old"
    shutil.copytree(FIXTURES / name, archive)
    path = archive / ARCHIVE_MODEL
    state = read_reference_checkpoint(path)
    cfg, _ = model_config(saved_arguments(state, path), path)
    torch.save(_old_style_decoder(state, cfg), path)
    model, _ = load_model(import_fairseq(archive, tmp_path / "ckpt"))
    # The old layout is folded into the new one (weight norm over another dimension): one
    # more float32 rounding per weight than a current checkpoint, seen as up to 1.4e-5 on an
    # AMD EPYC host without AVX-512 (a wrong fold changes the weights, not their last bits).
    for item in torch.load(FIXTURES / name / "logprobs.pt", weights_only=True):
        assert_same_log_probs(_lprobs(model, item["src"], item["prev"]), item["lprobs"],
                              tol=3e-5)


@pytest.mark.parametrize("name", MODELS)
def test_an_export_imports_back_to_the_same_weights(imported, name, tmp_path):
    exported = export_fairseq(imported[name], tmp_path / "exported")
    # the archive's files, and the mark that the folder is this command's to replace
    assert {p.name for p in exported.iterdir()} == {ARCHIVE_MODEL, "dict.en.txt", "dict.de.txt",
                                                    "bpecodes", WRITTEN_BY}
    again, _ = load_model(import_fairseq(exported, tmp_path / "again"))
    first, _ = load_model(imported[name])
    for (k, a), (k2, b) in zip(first.state_dict().items(), again.state_dict().items(),
                               strict=True):
        assert k == k2 and torch.equal(a, b), k
    # and the reference's own file, not only our reading of ours: the archive's weights are
    # the ones its model.pt holds (names, dtypes, values) under the same architecture
    ref, ours = (read_reference_checkpoint(d / ARCHIVE_MODEL) for d in (FIXTURES / name,
                                                                          exported))
    assert ref["model"].keys() == ours["model"].keys()
    for k, a in ref["model"].items():
        b = ours["model"][k]
        assert a.dtype == b.dtype and torch.equal(a, b), k
    assert model_config(saved_arguments(ours, exported), exported) == \
        model_config(saved_arguments(ref, FIXTURES / name), FIXTURES / name)


def test_a_sentencepiece_checkpoint_exports_with_its_own_dictionary(tiny_checkpoints, tmp_path):
    exported = export_fairseq(tiny_checkpoints["a"], tmp_path / "exported")
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(exported / "sentencepiece.model"))
    lines = (exported / "dict.src.txt").read_text(encoding="utf-8").splitlines()
    # the reference adds <s> <pad> </s> <unk> as ids 0-3: the file starts at id 4
    assert [line.split(" ")[0] for line in lines] == \
        [sp.id_to_piece(i) for i in range(4, sp.get_piece_size())]
    state = read_reference_checkpoint(exported / ARCHIVE_MODEL)
    cfg, _ = model_config(saved_arguments(state, exported), exported)
    back = convert_weights(state["model"], cfg, exported)
    ours = torch.load(Path(tiny_checkpoints["a"]) / "checkpoint.pt", weights_only=True)["model"]
    assert set(back) == set(ours)
    for k in ours:
        assert torch.equal(back[k], ours[k].float()), k


def test_a_checkpoint_given_by_its_file_exports_as_its_folder(tiny_checkpoints, tmp_path):
    """`export-fairseq DIR/checkpoint.pt` exports the checkpoint of folder DIR, with DIR's
    sentencepiece model: the same archive as `export-fairseq DIR`."""
    by_folder = export_fairseq(tiny_checkpoints["a"], tmp_path / "folder")
    by_file = export_fairseq(f"{tiny_checkpoints['a']}/checkpoint.pt", tmp_path / "file")
    for name in ("sentencepiece.model", "dict.src.txt", "dict.tgt.txt"):
        assert (by_file / name).read_bytes() == (by_folder / name).read_bytes(), name
    a, b = (read_reference_checkpoint(d / ARCHIVE_MODEL)["model"] for d in (by_folder, by_file))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _reference_python() -> str | None:
    path = os.environ.get("FAIRSEQ_PYTHON") or "/tmp/fairseq-ref-venv/bin/python"
    return path if Path(path).is_file() else None


HUB = """
import json, sys
from fairseq.models.fconv import FConvModel
d = sys.argv[1]
hub = FConvModel.from_pretrained(d, checkpoint_file="model.pt", data_name_or_path=".",
                                 tokenizer="moses", bpe="subword_nmt", bpe_codes=d + "/bpecodes")
print(json.dumps(hub.translate(json.loads(sys.argv[2]), beam=5)))
"""


@pytest.mark.skipif(_reference_python() is None,
                    reason="the reference implementation is not installed (run "
                           "scripts/fairseq_fixtures.sh, or set FAIRSEQ_PYTHON)")
def test_the_reference_itself_loads_an_export(imported, tmp_path):
    exported = export_fairseq(imported["mixed"], tmp_path / "exported")
    recorded = json.loads((FIXTURES / "mixed" / "hub.json").read_text())
    sources = recorded["source"][:8]
    proc = subprocess.run([_reference_python(), "-c", HUB, str(exported), json.dumps(sources)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert theirs == recorded["translation"][:8]


@pytest.mark.skipif(_reference_python() is None,
                    reason="the reference implementation is not installed (run "
                           "scripts/fairseq_fixtures.sh, or set FAIRSEQ_PYTHON)")
def test_the_layout_benchmark_times_the_reference_on_the_same_sentences(tiny_checkpoints):
    """benchmarks.generation_layout's reference rows: the reference's generator on the ids our
    translator searches, in one process and in one process per shard, back in input order."""
    from benchmarks.generation_layout import reference_runner
    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference

    lines = [s for s, _ in tiny_checkpoints["pairs"][:12]]
    settings = argparse.Namespace(cores=2, max_len_a=0.0, max_len_b=4, beam=3,
                                  checkpoint=Path(tiny_checkpoints["a"]),
                                  reference_python=Path(_reference_python()))
    tr = load_for_inference([tiny_checkpoints["a"]], SearchConfig(beam=3, max_len_a=0.0,
                                                                  max_len_b=4))
    one_sec, one = reference_runner(settings, tr, lines, 1)()
    two_sec, two = reference_runner(settings, tr, lines, 2)()
    assert one_sec > 0 and two_sec > 0 and len(one) == len(two) == len(lines)
    # the same sentence in either layout (a shard changes only which sentences share a batch)
    assert sum(a == b for a, b in zip(one, two)) >= 0.8 * len(lines)
    # in input order: most agree with our translator's output for the same line (a random
    # model's near-ties and length limits aside); out of order, next to none would
    ours = tr.translate(lines)
    assert sum(a.startswith(b) or b.startswith(a) for a, b in zip(ours, one)) >= len(lines) // 2


# --- bad input: one line, exit 2, nothing written ------------------------------------------------


class Hostile:
    """Stands for a pickled object that would run code when loaded."""


def _broken(archive: Path, how: str) -> None:
    model = archive / ARCHIVE_MODEL
    if how == "no dictionary":
        (archive / "dict.de.txt").unlink()
    elif how == "no bpecodes":
        (archive / "bpecodes").unlink()
    elif how == "dictionary of another size":
        lines = (archive / "dict.de.txt").read_text().splitlines()
        (archive / "dict.de.txt").write_text("\n".join(lines[:-3]) + "\n")
    elif how == "unknown architecture":
        state = read_reference_checkpoint(model)
        saved = state["args"] if isinstance(state.get("args"), argparse.Namespace) \
            else state["cfg"]["model"]  # fairseq 0.12: a Namespace inside the cfg dict
        saved.arch = "transformer"
        torch.save(state, model)
    elif how == "architecture not a name":
        state = read_reference_checkpoint(model)
        saved = state["args"] if isinstance(state.get("args"), argparse.Namespace) \
            else state["cfg"]["model"]
        saved.arch = ["fconv"]
        torch.save(state, model)
    elif how in ("weights not a dict", "embedding not a tensor"):
        state = read_reference_checkpoint(model)
        if how == "weights not a dict":
            state["model"] = [1, 2]
        else:
            state["model"]["encoder.embed_tokens.weight"] = [[0.0]]
        torch.save(state, model)
    elif how in ("old version, new gains", "empty version"):
        state = read_reference_checkpoint(model)
        state["model"]["decoder.version"] = torch.tensor([1.0] if how.startswith("old")
                                                         else [])
        torch.save(state, model)
    elif how == "damaged into other objects":  # (torch's rebuild given a dict: AttributeError)
        from test_checkpoint import damaged_tensor_file

        good = archive / "good.pt"
        model.rename(good)
        damaged_tensor_file(good, model, {})
        good.unlink()
    elif how == "pickled object":
        state = read_reference_checkpoint(model)
        state["extra_state"] = {"hook": Hostile()}
        torch.save(state, model)
    elif how == "truncated":
        data = model.read_bytes()
        model.write_bytes(data[: len(data) // 2])
    elif how == "damaged pickle":  # a memo the opcodes never stored: the unpickler's KeyError
        import io
        import zipfile

        with zipfile.ZipFile(model) as z:
            files = {n: z.read(n) for n in z.namelist()}
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for n, data in files.items():
                z.writestr(n, b"\x80\x02h\x05." if n.endswith("data.pkl") else data)
        model.write_bytes(buf.getvalue())
    elif how == "language not a code":  # dict.<lang>.txt would be a path outside the folder
        state = read_reference_checkpoint(model)
        saved = state["args"] if isinstance(state.get("args"), argparse.Namespace) \
            else state["cfg"]["model"]
        (archive / "dict.x").mkdir()
        saved.source_lang = "x/../../secret"
        torch.save(state, model)
    elif how == "bpecodes linked outside":
        secret = archive.parent / "secret.txt"
        secret.write_text("#version: 0.2\na b\n")  # (codes, but not the archive's)
        (archive / "bpecodes").unlink()
        (archive / "bpecodes").symlink_to(secret)
    elif how == "bpecodes not codes":
        (archive / "bpecodes").write_text("#version: 0.2\ni n\nnot-a-merge\n")


@pytest.mark.parametrize("how, says", [
    ("no dictionary", "dict.de.txt is missing"),
    ("no bpecodes", "bpecodes is missing"),
    ("dictionary of another size", "the dictionary is not the model's"),
    ("unknown architecture", "architecture 'transformer' is not a convolutional"),
    ("architecture not a name", "architecture ['fconv'] is not a convolutional"),
    ("weights not a dict", "holds no 'model' weights"),
    ("embedding not a tensor", "encoder.embed_tokens.weight"),
    ("pickled object", "was refused: it holds a pickled object outside the allowlist"),
    ("truncated", "is not a readable checkpoint"),
    ("damaged pickle", "is not a readable checkpoint"),
    ("damaged into other objects", "is not a readable checkpoint"),
    # (imported, it computed another function: lprobs 23.7 apart from the reference's)
    ("old version, new gains", "decoder.convolutions.0.weight_g has shape (1, 1, "),
    ("empty version", "decoder.version is empty"),
    ("language not a code", "source_lang 'x/../../secret' is not a language code"),
    ("bpecodes linked outside", "outside the archive folder"),
    ("bpecodes not codes", "bpecodes:3: expected a merge of two symbols"),
])
def test_a_bad_archive_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, how, says):
    from convs2s.cli import main

    archive = tmp_path / "archive"
    shutil.copytree(FIXTURES / "iwslt", archive)
    _broken(archive, how)
    out = tmp_path / "out"
    assert main(["import-fairseq", str(archive), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("import-fairseq: error: ") and says in err[0], err
    assert not out.exists() and not list(tmp_path.glob("out.*"))


def test_layer_strings_are_read_as_literals_never_evaluated(tmp_path):
    path = tmp_path / ARCHIVE_MODEL
    args = {"arch": "fconv", "encoder_layers": "[(64, 3)] * 2 + [(128, 1)]",
            "decoder_layers": "[(64, 3)]", "decoder_attention": "[False]",
            "encoder_embed_dim": 32, "decoder_embed_dim": 32, "decoder_out_embed_dim": 16}
    cfg, _ = model_config(args, path)
    assert cfg.encoder_layers == [(64, 3), (64, 3), (128, 1)]
    assert cfg.decoder_attention == (False,) and cfg.max_positions == 1024 - PAD - 1
    with pytest.raises(FairseqImportError, match="is not a layer expression"):
        model_config({**args, "encoder_layers": "__import__('os').system('true')"}, path)


@pytest.mark.parametrize("change, says", [
    ({"encoder_layers": "[(64, 3)] * 1000000000"}, "a repeat of 1000000000 exceeds 1000"),
    ({"encoder_layers": "[(64, 3)] * 201"}, "has 201 layers, more than 200"),
    ({"decoder_layers": "[(10000000, 3)]"}, "is outside (1...40960 channels"),
    ({"encoder_embed_dim": 10**6, "decoder_embed_dim": 10**6}, "encoder_embed_dim = 1000000 "
                                                               "is outside"),
    ({"max_source_positions": 10**8, "max_target_positions": 10**8}, "max_source_positions"),
    # a list times a list: refused before the message could build the repeat it names
    ({"encoder_layers": "[(64, 3)] * 2 * ([1] * 999)"}, "a list repeated by a non-integer"),
    ({"encoder_layers": "[(64, 3)]" + " + [(64, 3)]" * 2000}, "characters long, more than"),
    ({"decoder_attention": "1"}, "decoder_attention = '1' is neither True / False"),
    ({"decoder_attention": "[True, False]"}, "nor one of them for each of the 1 decoder"),
    ({"dropout": 1.5}, "the saved arguments give no valid model"),
    ({"dropout": "lots"}, "the saved arguments give no valid model"),
])
def test_an_architecture_too_large_to_build_is_refused_before_any_tensor(tmp_path, change,
                                                                          says):
    """Saved arguments are untrusted input: an unbounded repeat or a size no model of the
    paper's family has is one error, decided before any list or tensor is built."""
    args = {"arch": "fconv", "encoder_layers": "[(64, 3)] * 2", "decoder_layers": "[(64, 3)]",
            "encoder_embed_dim": 32, "decoder_embed_dim": 32, "decoder_out_embed_dim": 16}
    with pytest.raises(FairseqImportError, match=re.escape(says)):
        model_config({**args, **change}, tmp_path / ARCHIVE_MODEL)


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "sub/bpecodes", "~x"])
def test_a_text_json_naming_files_outside_its_folder_is_refused(imported, tmp_path, name):
    """text.json names its files; a path out of the checkpoint folder would be read, staged
    with the weights and uploaded as an MLflow artifact."""
    from convs2s.io.text_codec import CodecError, read_codec_settings

    folder = tmp_path / "ckpt"
    shutil.copytree(imported["iwslt"], folder)
    settings = json.loads((folder / "text.json").read_text())
    (folder / "text.json").write_text(json.dumps({**settings, "bpe_codes": name}))
    with pytest.raises(CodecError, match="must name a file in the checkpoint's own folder"):
        read_codec_settings(folder)


@pytest.mark.parametrize("how, says", [
    ("a list", "holds a JSON list, not the text pipeline's settings"),
    ("no source language", "source_lang = None must be a language code"),
    ("codes with a bad line", "is not a subword-nmt codes file"),
])
def test_a_bad_text_pipeline_is_one_error_naming_its_file(imported, tmp_path, how, says):
    """text.json and the BPE codes are read from a checkpoint folder like any input: a bad one
    is a CodecError naming the file (translate, serve and the corpus job say it in one line),
    never a traceback, nor subword-nmt's exit, which would end a Serve replica's process."""
    from convs2s.io.text_codec import CodecError, codec_for_checkpoint

    folder = tmp_path / "ckpt"
    shutil.copytree(imported["iwslt"], folder)
    settings = json.loads((folder / "text.json").read_text())
    if how == "a list":
        (folder / "text.json").write_text("[]")
    elif how == "no source language":
        (folder / "text.json").write_text(json.dumps(
            {k: v for k, v in settings.items() if k != "source_lang"}))
    else:
        codes = folder / settings["bpe_codes"]
        codes.write_text(codes.read_text() + "abc\n")
    with pytest.raises(CodecError, match=re.escape(says)):
        codec_for_checkpoint(folder)


def test_a_dictionary_far_larger_than_any_is_refused_unread(tmp_path):
    from convs2s.io.text_codec import MAX_DICTIONARY_BYTES, CodecError, read_dictionary

    big = tmp_path / "dict.de.txt"
    with open(big, "wb") as f:
        f.truncate(MAX_DICTIONARY_BYTES + 1)  # sparse: no memory, no disk
    with pytest.raises(CodecError, match="more than a dictionary's"):
        read_dictionary(big)
    # one not UTF-8: named, with the fix (the decoder's words alone named no file)
    bad = tmp_path / "dict.fr.txt"
    bad.write_bytes(b"le 10\n\xff\xfe bad 1\n")
    with pytest.raises(CodecError, match=r"dict\.fr\.txt is not UTF-8 text .*copy or download "
                                         r"the file again"):
        read_dictionary(bad)


def test_a_reference_checkpoint_given_as_ours_points_to_the_import(tmp_path):
    """The reference's model.pt given where a checkpoint of this project goes (translate,
    average, init_from) is refused, never loaded, saying to import it (it was told to
    "re-export it from the run that made it")."""
    from convs2s.io.checkpoint import CheckpointError, load_checkpoint

    shutil.copyfile(FIXTURES / "iwslt" / ARCHIVE_MODEL, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match=r"is a checkpoint of the reference implementation "
                       r".*python -m convs2s import-fairseq ARCHIVE --out DIR"):
        load_checkpoint(tmp_path)


def test_a_dictionary_reads_as_the_reference_reads_it(tmp_path):
    """As the reference's Dictionary.add_from_file: the symbol is all before the count (a
    symbol with a space in it), a symbol given again is refused unless flagged
    #fairseq:overwrite, and then has its later id (the first id was kept, the space cut)."""
    from convs2s.io.text_codec import CodecError, read_dictionary

    path = tmp_path / "dict.en.txt"
    path.write_text("foo 5\nnew york 3\nbar 2\nfoo 1 #fairseq:overwrite\n", encoding="utf-8")
    symbols = read_dictionary(path)
    assert symbols[4:] == ["foo", "new york", "bar", "foo"]
    assert {s: i for i, s in enumerate(symbols)}["foo"] == 7  # as the codec's index reads it
    path.write_text("foo 5\nbar 2\nfoo 1\n", encoding="utf-8")
    with pytest.raises(CodecError, match=r"dict.en.txt:3: 'foo' is given twice"):
        read_dictionary(path)
    path.write_text("<unk> 5\n", encoding="utf-8")  # (ids 0-3 are the reference's own)
    with pytest.raises(CodecError, match="'<unk>' is given twice"):
        read_dictionary(path)


def test_an_export_whose_vocabulary_is_not_the_models_is_refused(tiny_checkpoints, tmp_path):
    """The reference builds the model from its dictionaries' lengths: a checkpoint folder whose
    sentencepiece model is not its weights' (another run's, copied in) was exported, and the
    reference's load then failed on a size mismatch. Refused, nothing written."""
    import pyarrow as pa
    import sentencepiece as spm

    from convs2s.io.checkpoint import load_checkpoint, save_checkpoint
    from preprocessing.demo import translation_pairs
    from preprocessing.vocab import train_bpe

    pairs = translation_pairs(3, 0, 2000)
    train_bpe(pa.table({"src": [a for a, _ in pairs], "tgt": [b for _, b in pairs]}),
              tmp_path / "spm", 500, 1.0)
    assert spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model")).get_piece_size() \
        != load_checkpoint(tiny_checkpoints["a"])["src_vocab_size"]
    ckpt = save_checkpoint(tmp_path / "other", load_checkpoint(tiny_checkpoints["a"]),
                           spm_model=str(tmp_path / "spm.model"))
    with pytest.raises(ValueError, match=r"its source vocabulary has 500 entries but the "
                       r"model's source embedding 400 rows"):
        export_fairseq(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_imported_model_averages_and_serves_like_a_trained_one(imported, tmp_path):
    """The slim copies that averaging, evaluation jobs and the MLflow model make carry the
    imported text pipeline (dictionaries, BPE codes, text.json)."""
    from convs2s.io.averaging import average_checkpoints

    slim = average_checkpoints([imported["iwslt"]], tmp_path / "slim")
    assert {"text.json", "bpecodes", "dict.en.txt", "dict.de.txt"} <= \
        {p.name for p in slim.iterdir()}
    recorded = json.loads((FIXTURES / "iwslt" / "hub.json").read_text())
    tr = load_for_inference([slim], search=SearchConfig(beam=5))
    assert tr.translate(recorded["source"][:5]) == recorded["translation"][:5]


def test_an_imported_model_is_logged_and_served_with_its_text_pipeline(imported, tmp_path):
    import mlflow

    from convs2s.serving.pyfunc import log_translator
    from convs2s.tracking.runs import global_tracking_uri

    uri = mlflow_store(tmp_path)
    recorded = json.loads((FIXTURES / "mixed" / "hub.json").read_text())
    served = log_translator([imported["mixed"]], SearchConfig(beam=5), tracking_uri=uri,
                            experiment_name="imported", registered_model_name="paper-en-de",
                            alias="champion", input_example=recorded["source"][:1])
    with global_tracking_uri(uri):
        model = mlflow.pyfunc.load_model(served.registered_uri)
        assert model.predict(recorded["source"][:4]) == recorded["translation"][:4]


def test_an_evaluation_job_scores_an_imported_model_as_the_reference_would(imported, ray_session,
                                                                           tmp_path):
    """`python -m workflows.evaluation --checkpoint NAME=DIR`: a Ray task scores the imported
    model; its BLEU is the BLEU of the reference hub's own translations, and the score is
    linked to the logged model."""
    import sacrebleu
    from mlflow.tracking import MlflowClient

    from workflows.evaluation_command import main

    recorded = json.loads((FIXTURES / "iwslt" / "hub.json").read_text())
    src, ref = tmp_path / "test.en", tmp_path / "test.de"
    src.write_text("\n".join(recorded["source"]) + "\n")
    ref.write_text("\n".join(recorded["reference"]) + "\n")
    uri = mlflow_store(tmp_path)
    assert main(["--checkpoint", f"paper={imported['iwslt']}", "--test", "flickr", str(src),
                 str(ref), "de", "--tracking-uri", uri, "--out", str(tmp_path / "eval"),
                 "--set", "search.max_sentences=3"]) == 0  # (any search setting: batches)
    expected = sacrebleu.corpus_bleu(recorded["translation"], [recorded["reference"]]).score
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("convs2s")
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if "bleu" in r.data.metrics]
    assert run.data.metrics["bleu"] == pytest.approx(expected, abs=0.01)
    assert run.data.params["search.max_sentences"] == "3"
    (model,) = client.search_logged_models([exp.experiment_id])
    assert any(m.key == "bleu" for m in model.metrics)


def test_a_model_without_position_embeddings_is_not_exported(tiny_checkpoints, tmp_path):
    """Table 4's ablation has no fconv counterpart (the reference always adds positions)."""
    from convs2s.io.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(tiny_checkpoints["a"])
    state["model_config"] = {**state["model_config"], "src_positions": False}
    state["model"] = {k: v for k, v in state["model"].items()
                      if k != "encoder.embed_positions.weight"}
    ckpt = save_checkpoint(tmp_path / "nopos", state, spm_model=tiny_checkpoints["spm"])
    assert load_for_inference([ckpt]).translate(["The cat sleeps ."])  # loads and translates
    with pytest.raises(ValueError, match="no fconv counterpart"):
        export_fairseq(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_import_leaves_the_folder_another_writer_is_filling_beside_its_out(tmp_path):
    """Two commands writing one shared --out (containers whose pids repeat: pid 1 in each):
    each fills a temporary folder beside it. One named by the pid alone was removed by the
    other as it began, both then wrote into one folder; now each writer's is its own."""
    import os

    theirs = tmp_path / f"out.writing-{os.getpid()}"  # the other container's, by the old name
    theirs.mkdir()
    (theirs / "model.pt").write_text("being written")
    import_fairseq(FIXTURES / "iwslt", tmp_path / "out")
    assert (theirs / "model.pt").read_text() == "being written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", theirs.name]


def test_an_import_into_a_bucket_cut_short_is_replaced_by_the_same_command(s3, tmp_path,
                                                                          monkeypatch):
    """A bucket's --out is published with its record deleted first: an import cut short
    there (Ctrl-C, the network) left a folder the same command then refused as not its own,
    for the user to clear by hand. Its publishing record says whose it is; a file of anyone
    else's there is still refused."""
    from convs2s.io import fairseq, interop_folders
    from storage import location
    from storage.transfer import publish_dir

    out = f"s3://convs2s-test/interop/{tmp_path.name}/ckpt"

    def cut_short(src, dest, marker, leave=(), keep=()):
        (location(dest) / marker).unlink(missing_ok=True)  # as publish_dir begins
        name = sorted(p.name for p in Path(src).iterdir() if p.name != marker)[0]
        (location(dest) / name).write_bytes((Path(src) / name).read_bytes())
        raise KeyboardInterrupt

    import_fairseq(FIXTURES / "iwslt", out)
    whole = sorted(name for name, _ in location(out).files())
    monkeypatch.setattr(interop_folders, "publish_dir", cut_short)
    with pytest.raises(KeyboardInterrupt):
        import_fairseq(FIXTURES / "iwslt", out)
    assert fairseq.WRITTEN_BY not in [name for name, _ in location(out).files()]
    monkeypatch.setattr(interop_folders, "publish_dir", publish_dir)
    import_fairseq(FIXTURES / "iwslt", out)  # (refused before: "not written by import-fairseq")
    assert sorted(name for name, _ in location(out).files()) == whole
    load_model(out)
    # cut as the marker is copied, the last step (the old files removed: no record was left)
    from storage import transfer

    real_copy = transfer._copy

    def marker_fails(src, dest, size=None):
        if str(dest).endswith(fairseq.WRITTEN_BY):
            raise KeyboardInterrupt
        return real_copy(src, dest, size)

    monkeypatch.setattr(transfer, "_copy", marker_fails)
    with pytest.raises(KeyboardInterrupt):
        import_fairseq(FIXTURES / "iwslt", out)
    monkeypatch.setattr(transfer, "_copy", real_copy)
    import_fairseq(FIXTURES / "iwslt", out)
    assert sorted(name for name, _ in location(out).files()) == whole
    monkeypatch.setattr(interop_folders, "publish_dir", cut_short)
    with pytest.raises(KeyboardInterrupt):
        import_fairseq(FIXTURES / "iwslt", out)
    (location(out) / "notes.txt").write_text("a user's file")
    monkeypatch.setattr(interop_folders, "publish_dir", publish_dir)
    with pytest.raises(FileExistsError, match=r"holds files import-fairseq did not write "
                                              r"\(notes.txt\)"):
        import_fairseq(FIXTURES / "iwslt", out)


def test_out_is_never_a_folder_the_command_did_not_write(tmp_path, capsys, tiny_checkpoints):
    """import / export --out onto a folder of someone else's files is refused with nothing
    changed; onto its own earlier output (or an empty folder) it replaces it whole."""
    from convs2s.cli import main

    theirs = tmp_path / "runs"
    (theirs / "run-a").mkdir(parents=True)
    (theirs / "run-a" / "notes.txt").write_text("a user's file")
    for argv in (["import-fairseq", str(FIXTURES / "iwslt"), "--out", str(theirs)],
                 ["export-fairseq", tiny_checkpoints["a"], "--out", str(theirs)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "exists and was not written by import-fairseq" in err[0], err
        assert (theirs / "run-a" / "notes.txt").read_text() == "a user's file"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no leftovers
    ours = tmp_path / "imported"
    ours.mkdir()  # an empty folder: nothing to lose
    assert main(["import-fairseq", str(FIXTURES / "iwslt"), "--out", str(ours)]) == 0
    first = (ours / "checkpoint.pt").stat().st_mtime_ns
    assert main(["import-fairseq", str(FIXTURES / "iwslt"), "--out", str(ours)]) == 0
    assert (ours / "checkpoint.pt").stat().st_mtime_ns != first  # its own output, replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imported", "runs"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _source(command: str, imported: dict) -> str:
    """What `command` reads: the reference's archive (import), or a checkpoint (export)."""
    return str(FIXTURES / "iwslt") if command == "import-fairseq" else str(imported["iwslt"])


@pytest.mark.parametrize("command", ["import-fairseq", "export-fairseq"])
def test_a_rerun_replaces_its_own_out_only_while_it_holds_nothing_else(imported, tmp_path,
                                                                       capsys, command):
    """The command's record in --out (.convs2s-interop) lists the files it wrote. A rerun into
    that folder replaces it only while it holds those files alone: a file or folder added
    since (a translation, scores) is kept, and the rerun exits 2 with one line naming the
    folder, what it did not write and the fix. Moved away, the rerun replaces the folder."""
    from convs2s.cli import main

    out = tmp_path / "out"
    assert main([command, _source(command, imported), "--out", str(out)]) == 0
    (out / "hyp.de").write_text("notes\n")
    (out / "eval").mkdir()
    (out / "eval" / "bleu.json").write_text("{}")
    before = _snapshot(out)
    capsys.readouterr()
    assert main([command, _source(command, imported), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{command}: error: --out {out} holds files {command} did not write "
                   "(eval/, hyp.de): give another --out, or move those files away; nothing "
                   "was changed"], err
    assert _snapshot(out) == before  # the foreign files, and the command's own, as they were
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing beside it
    (out / "hyp.de").rename(tmp_path / "hyp.de")
    (out / "eval").rename(tmp_path / "eval")
    assert main([command, _source(command, imported), "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval", "hyp.de", "out"]
    record = json.loads((out / WRITTEN_BY).read_text())
    assert record["command"] == command
    assert record["files"] == sorted(p.name for p in out.iterdir() if p.name != WRITTEN_BY)


@pytest.mark.parametrize("first, then", [("import-fairseq", "export-fairseq"),
                                         ("export-fairseq", "import-fairseq")])
def test_one_commands_out_is_never_replaced_by_the_other(imported, tmp_path, capsys, first,
                                                         then):
    """Import and export write the same record file, which says which of them wrote the
    folder: an export into an imported checkpoint's folder (or an import into an export's
    archive) is refused in one line naming the folder and what is there, the folder kept."""
    from convs2s.cli import main

    out = tmp_path / "out"
    assert main([first, _source(first, imported), "--out", str(out)]) == 0
    before = _snapshot(out)
    capsys.readouterr()
    assert main([then, _source(then, imported), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"{then}: error: --out {out} was written by {first}, not {then} (") \
        and "give another --out, or move it away yourself; nothing was changed" in err[0], err
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_record_that_lists_no_files_is_refused(tmp_path, capsys):
    """A .convs2s-interop that does not say which command wrote the folder and which files (an
    older version's, or a damaged one) proves nothing about the files beside it: refused."""
    from convs2s.cli import main

    out = tmp_path / "out"
    out.mkdir()
    (out / WRITTEN_BY).write_text(json.dumps({"pid": 1, "time": 0.0}))
    (out / "notes.txt").write_text("a user's file")
    assert main(["import-fairseq", str(FIXTURES / "iwslt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out {out}: its {WRITTEN_BY} does not say which command" \
        in err[0] and "give another --out, or move the folder away" in err[0], err
    assert sorted(p.name for p in out.iterdir()) == [WRITTEN_BY, "notes.txt"]


@pytest.mark.parametrize("command, out, says", [
    ("export-fairseq", ".", "is the checkpoint"),  # an imported checkpoint: it has WRITTEN_BY
    ("export-fairseq", "exported", "lies inside the checkpoint"),
    ("export-fairseq", "..", "holds the checkpoint"),
    ("import-fairseq", ".", "is the archive folder"),  # an export: it has WRITTEN_BY too
])
def test_out_is_never_the_commands_own_input(imported, tmp_path, capsys, command, out, says):
    """`--out` the folder the command reads (or one around it, or inside it) would replace
    its own input: refused in one line before anything is written."""
    from convs2s.cli import main

    source = tmp_path / "work" / "input"
    if command == "export-fairseq":
        shutil.copytree(imported["iwslt"], source)  # (a copy: the old code deleted it)
    else:
        export_fairseq(imported["iwslt"], source)
    assert (source / WRITTEN_BY).is_file()  # the mark that lets --out replace a folder
    before, around = _snapshot(source), sorted(p.name for p in source.parent.iterdir())
    assert main([command, str(source), "--out", str(source / out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{command}: error: --out ") and says in err[0] \
        and "that this command reads" in err[0] and "give another --out" in err[0], err
    assert _snapshot(source) == before  # the input as it was
    assert sorted(p.name for p in source.parent.iterdir()) == around  # nothing beside it


@pytest.mark.parametrize("command", ["export-fairseq", "import-fairseq"])
def test_a_bucket_out_that_lost_a_slash_is_refused_not_made_a_local_folder(
        tiny_checkpoints, tmp_path, capsys, monkeypatch, command):
    """`--out s3:/bucket/x` (one slash, as pathlib writes s3://) is not a local folder "s3:"."""
    from convs2s.cli import main

    monkeypatch.chdir(tmp_path)
    source = tiny_checkpoints["a"] if command == "export-fairseq" else str(FIXTURES / "iwslt")
    assert main([command, source, "--out", "s3:/team-bucket/exported"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{command}: error: --out s3:/team-bucket") \
        and "write s3://team-bucket/exported" in err[0], err
    assert list(tmp_path.iterdir()) == []  # no folder named "s3:"
