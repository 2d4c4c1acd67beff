"""Tests of convs2s.inference.translate: the Translator API and the convs2s-translate command line.

Fast tests use randomly initialised `tiny` checkpoints (tests/conftest.py `tiny_checkpoints`);
the slow ones use the demo model trained for a few minutes by convs2s.train.launch.fit
(`demo_trained`)
and check that translating through the command line beats an untrained model by far.

Run: .venv/bin/python -m pytest tests/test_translate.py -q            (add -m "not slow")
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import at_once, calls_in_a_fresh_process

from convs2s.cli import translate as main
from convs2s.config import EOS, UNK, SearchConfig
from convs2s.metrics.scoring import read_lines, score_translation
from convs2s.inference.translate import CheckpointError, batches_by_budget, load_for_inference
from convs2s.inference.unk_replace import unk_replaced_text
from convs2s.io.text_codec import codec_for_checkpoint

REPO = Path(__file__).resolve().parents[1]
SHORT = SearchConfig(beam=3, max_len_a=0, max_len_b=4)  # bounded work for random models


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "convs2s", "translate", *args], input=stdin,
                          capture_output=True, text=True, cwd=REPO, timeout=600)


def run_clis(*calls: tuple[tuple[str, ...], str | None]) -> list[subprocess.CompletedProcess]:
    """`run_cli(*args, stdin=stdin)` for each (args, stdin), the commands running at once (each
    a process of its own, as two users' would), results in order."""
    return at_once(*[partial(run_cli, *args, stdin=stdin) for args, stdin in calls])


def test_search_config_validation():
    with pytest.raises(ValueError, match="nbest"):
        SearchConfig(beam=2, nbest=3)
    with pytest.raises(ValueError, match="replace_unk"):
        SearchConfig(dictionary="lex.txt")
    cfg = SearchConfig(beam=4, lenpen=0.6)
    assert SearchConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown"):
        SearchConfig.from_dict({"beam_size": 5})


def test_empty_lines_keep_order_and_ensemble_of_one(tiny_checkpoints):
    tr = load_for_inference([tiny_checkpoints["a"]], search=SHORT)
    lines = [s for s, _ in tiny_checkpoints["pairs"][:6]]
    lines[1] = lines[4] = ""
    out = tr.translate_full(lines)
    assert [t.text == "" for t in out] == [False, True, False, False, True, False]
    assert all(t.hypotheses for i, t in enumerate(out) if i not in (1, 4))
    # A path given alone or as a one-checkpoint ensemble: the same translations and scores.
    alone = load_for_inference(tiny_checkpoints["a"], search=SHORT).translate_full(lines)
    assert [t.text for t in alone] == [t.text for t in out]
    assert [t.hypotheses[0].score for t in alone if t.hypotheses] == \
        [t.hypotheses[0].score for t in out if t.hypotheses]


def test_batches_sorted_by_length_give_input_order(tiny_checkpoints):
    """Batching (max_sentences=2, length-sorted) returns each sentence's own translation."""
    lines = [s for s, _ in tiny_checkpoints["pairs"][:5]]
    batched = load_for_inference([tiny_checkpoints["a"]],
                                          search=SHORT.replace(max_sentences=2))
    out = batched.translate_full(lines)
    for line, t in zip(lines, out, strict=True):
        assert t.source == line
        ids, _, _ = batched.encode(line)
        assert t.hypotheses[0].attention.shape[0] == len(ids)  # its own source length
    # each one's own translation: as each sentence searched alone
    alone = load_for_inference([tiny_checkpoints["a"]], search=SHORT.replace(max_sentences=1))
    for t, one in zip(out, alone.translate_full(lines), strict=True):
        assert t.text == one.text
        assert t.hypotheses[0].score == pytest.approx(one.hypotheses[0].score, abs=1e-4)


def test_a_token_budget_cuts_batches_without_changing_translations(tiny_checkpoints):
    """max_tokens bounds sentences x longest source per batch (longest first); a sentence over
    the budget is searched alone; the translations are the sentence-budget ones."""
    todo = [(i, [0] * n) for i, n in enumerate([10, 8, 8, 5, 5, 5, 3, 2, 2, 1])]
    cut = batches_by_budget(todo, max_sentences=128, max_tokens=20)
    assert [[i for i, _ in b] for b in cut] == [[0, 1], [2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(len(b) * len(b[0][1]) <= 20 for b in cut)
    assert [[i for i, _ in b] for b in batches_by_budget(todo, 4, 0)] == \
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [len(b) for b in batches_by_budget(todo, 128, 5)] == [1] * 7 + [2, 1]
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        SearchConfig(max_tokens=-1)
    lines = [s for s, _ in tiny_checkpoints["pairs"][:12]]
    by_sentences = load_for_inference([tiny_checkpoints["a"]], search=SHORT).translate(lines)
    by_tokens = load_for_inference([tiny_checkpoints["a"]],
                                   search=SHORT.replace(max_tokens=24)).translate(lines)
    assert by_tokens == by_sentences


def test_overlong_line_is_truncated_with_a_warning(tiny_checkpoints, caplog):
    tr = load_for_inference([tiny_checkpoints["a"]], search=SHORT)
    long_line = " ".join(s for s, _ in tiny_checkpoints["pairs"][:60])  # > 256 pieces
    with caplog.at_level(logging.WARNING, logger="convs2s.inference.translate"):
        out = tr.translate_full(["a cat .", long_line])
    assert out[1].truncated and not out[0].truncated
    assert len(out[1].src_pieces) == tr.max_positions - 1  # + EOS = 256 positions
    assert "line 2" in caplog.text and "cut to" in caplog.text
    assert out[1].hypotheses[0].tokens[-1] == EOS


def test_a_long_line_is_encoded_as_far_as_the_model_reads_it_with_the_same_pieces(
        tiny_checkpoints, monkeypatch):
    """Only the words that reach the model's positions are encoded (a line of megabytes was
    encoded whole: seconds and hundreds of MB a corpus actor): the pieces kept are the whole
    line's first pieces; a junk "word" of thousands of characters is cut and the line marked."""
    from convs2s.inference import translate as module

    tr = load_for_inference([tiny_checkpoints["a"]], search=SHORT)
    limit = tr.max_positions - 1
    long_line = " ".join(s for s, _ in tiny_checkpoints["pairs"][:400])  # ~4,000 words
    whole = tr.codec.encode(long_line)
    seen = []
    encode = tr.codec.encode
    monkeypatch.setattr(tr.codec, "encode", lambda line: seen.append(len(line)) or encode(line))
    ids, pieces, truncated = tr.encode(long_line)
    assert truncated and pieces == whole[:limit] and len(ids) == limit + 1
    assert seen[0] < len(long_line) // 4  # (the words past limit + 1 were never encoded)
    ids, pieces, truncated = tr.encode("a " + "x" * (module.MAX_WORD_CHARS * 3))
    assert truncated and seen[-1] == 2 + module.MAX_WORD_CHARS
    short = "the cat sleeps ."
    assert tr.encode(short)[1] == encode(short) and not tr.encode(short)[2]
    # a no-break space or a tab is a character to the model, not a space between words
    odd = long_line.replace(" .", "\u00a0.").replace(" the ", "\tthe ")
    assert tr.encode(odd)[1] == encode(odd)[:limit]


def test_the_command_names_a_cut_line_by_its_number_in_the_input_and_counts_them(
        tiny_checkpoints, tmp_path, caplog):
    """The command translates its input a buffer at a time: the warning named a cut line by
    its place in its buffer (line 2 of the input's 4th line), and no closing line counted
    them, as the --actors job's manifest does."""
    long_line = " ".join(s for s, _ in tiny_checkpoints["pairs"][:60])  # > 256 pieces
    src = tmp_path / "in.txt"
    src.write_text(f"a cat .\nthe dog .\nhello .\n{long_line}\n")
    # (the command's logger: a corpus actor or Serve replica run in this process quiets it)
    with caplog.at_level(logging.WARNING, logger="convs2s.inference.translate"):
        assert main(["--checkpoint", str(tiny_checkpoints["a"]), "--input", str(src),
                     "--output", str(tmp_path / "out.txt"), "--buffer-size", "2",
                     "--beam", "1", "--max-len-b", "5"]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("line 4 has ") for m in said), said
    assert "1 line(s) longer than the model's positions were cut (first: line 4)" in said


def test_nbest_and_alignment(tiny_checkpoints):
    tr = load_for_inference([tiny_checkpoints["a"]], search=SHORT.replace(nbest=3))
    t = tr.translate_full(["The cat sleeps ."])[0]
    assert len(t.hypotheses) == 3
    scores = [h.score for h in t.hypotheses]
    assert scores == sorted(scores, reverse=True)
    h = t.hypotheses[0]
    # attention: (source pieces + EOS) x (target pieces + EOS), each column a distribution
    assert h.attention.shape == (len(t.src_pieces) + 1, len(h.tokens))
    torch.testing.assert_close(h.attention.sum(0), torch.ones(len(h.tokens)))
    align = h.alignment()  # each target piece (EOS excluded) with its most attended source
    assert [tgt for _, tgt in align] == list(range(len(h.tokens) - 1))
    assert all(h.attention[s, tgt] == h.attention[:-1, tgt].max() for s, tgt in align)


def test_an_alignment_names_source_pieces_only_even_where_the_source_eos_is_most_attended():
    """Alignments are src-tgt piece index pairs (the A- lines, a served answer's "alignment"):
    the source EOS, the attention's last row, is no piece, so a target piece that attends it
    most is aligned to its most attended source piece instead."""
    from convs2s.inference.translate import Hypothesis, Translation, format_translation

    # 2 source pieces + EOS (rows) x 3 target pieces + EOS (columns); pieces 0 and 2 attend
    # the source EOS most
    attention = torch.tensor([[0.1, 0.7, 0.3, 0.0],
                              [0.2, 0.2, 0.1, 0.0],
                              [0.7, 0.1, 0.6, 1.0]])
    h = Hypothesis(text="a b c", score=-1.0, tokens=[7, 8, 9, EOS],
                   positional_scores=[-1.0] * 4, attention=attention)
    assert h.alignment() == [(1, 0), (0, 1), (0, 2)]
    tr = Translation(source="x y", src_pieces=["\u2581x", "\u2581y"], hypotheses=[h])
    assert format_translation(tr, 0, 1, verbose=True).splitlines()[-1] == "A-0\t1-0 0-1 0-2"


# Text that cleaning changes: controls, format characters (soft hyphen, zero width, BOM)
# between a letter and its combining accent, line breaks, odd spaces, private use.
UNCLEAN = ["Son e\u00ad\u0301l\u00e9phant", "e\u200b\u0301", "Cafe\x07\u0301 ok",
           "a\ufeff\u030a\u00ad", "Cafe\u0301", "  a \t b\u00a0c\u3000d  ",
           "zero\u200bwidth\u00adsoft\ufeffbom", "bell\x07 esc\x1b[0m",
           "line\u2028sep\x85nel", "priv\ue000ate", "o\u0308\u200d\u0301 A\u030a\u2060",
           "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", "a\u2581b \u2581", "\u2581", ""]


@pytest.mark.parametrize("raw", UNCLEAN)
def test_translation_input_is_cleaned_exactly_as_training_text_was(raw):
    """convs2s keeps its own copy of preprocessing's cleaning (it may not import
    preprocessing): the copy must give the same text, or a model meets input it never saw."""
    from convs2s.inference.translate import normalize
    from preprocessing.cleaning import normalize as training_normalize

    assert normalize(raw) == training_normalize(raw)


def test_a_letter_and_accent_parted_by_a_deleted_character_reach_the_model_composed(
        tiny_checkpoints):
    """The sentencepiece model does not normalize (rule "identity"): an accent left apart from
    its letter would be split into byte pieces that the training text never had."""
    from preprocessing.cleaning import normalize as training_normalize

    tr = load_for_inference([tiny_checkpoints["a"]], search=SHORT)
    line = "Son e\u00ad\u0301l\u00e9phant"
    out = tr.translate_full([line], attention=False)[0]
    assert out.source == "Son \u00e9l\u00e9phant"
    assert out.src_pieces == tr.codec.encode(training_normalize(line))
    assert not any(p.startswith("<0x") for p in out.src_pieces)


def test_replace_unk_copies_attended_source_pieces(tiny_checkpoints, tmp_path):
    """A huge negative unk penalty makes every output token <unk>; each is then replaced by
    its most attended source piece (a whole source word: that word, or its dictionary
    entry), so the output is the attended source pieces decoded."""
    line = "The cat sleeps near the old house ."
    search = SHORT.replace(unk_penalty=-1e4, replace_unk=True, min_len=3)
    tr = load_for_inference([tiny_checkpoints["a"]], search=search)
    out = tr.translate_full([line])[0]
    hyp = out.hypotheses[0]
    ids = hyp.tokens[:-1]
    assert set(ids) == {UNK}
    attended = hyp.attention[: len(out.src_pieces), : len(ids)].argmax(dim=0).tolist()
    src_ids = tr.codec.source_ids(out.src_pieces)
    assert out.text == tr.codec.decode([src_ids[s] for s in attended])
    # A line of words that are one piece each: every output word is a dictionary entry.
    line = "the son will not be in"
    assert tr.codec.encode(line) == [f"\u2581{w}" for w in line.split()]
    table = tmp_path / "lex.txt"
    table.write_text("".join(f"{w} X{i}\n" for i, w in enumerate(line.split())))
    with_dict = load_for_inference(
        [tiny_checkpoints["a"]], search=search.replace(dictionary=str(table))).translate([line])
    assert with_dict[0] and all(w.startswith("X") for w in with_dict[0].split())


def attending(rows: list[int], n_source: int) -> torch.Tensor:
    """A hypothesis's attention, (source pieces + EOS) x (target pieces + EOS): target piece j
    attends source piece rows[j] only, the EOS the source EOS."""
    attn = torch.zeros(n_source + 1, len(rows) + 1)
    attn[rows, list(range(len(rows)))] = 1.0
    attn[n_source, len(rows)] = 1.0
    return attn


def test_replace_unk_copies_moses_bpe_pieces_with_their_continuation_marks(tmp_path):
    """An imported model's pipeline: the attended source piece is copied with its `@@`, as
    fairseq's --replace-unk does: unks that attend the pieces of a word spell it once, an unk
    that continues a word adds its piece only, the dictionary translates whole words."""
    from convs2s.io.text_codec import MOSES_BPE, MosesBpeCodec, codec_settings

    shutil.copy(REPO / "tests" / "fixtures" / "fairseq" / "iwslt" / "bpecodes", tmp_path)
    (tmp_path / "dict.de.txt").write_text("in 1\nist 1\n")
    (tmp_path / "dict.en.txt").write_text("the 1\nis 1\nZ@@ 1\n")
    codec = MosesBpeCodec(tmp_path, codec_settings(MOSES_BPE, "de", "en"))
    the, is_, z = 4, 5, 6
    source, pieces = "in Zürich ist", ["in", "Zü@@", "rich", "ist"]

    def text(ids, rows, dictionary=None):
        return unk_replaced_text(codec, ids, source, pieces, attending(rows, 4), dictionary)

    assert text([the, UNK, UNK, is_], [0, 1, 2, 3]) == "the Zürich is"
    assert text([the, z, UNK, is_], [0, 1, 2, 3]) == "the Zrich is"
    assert text([UNK, UNK, UNK, UNK], [0, 1, 2, 3], {"in": "to", "Zürich": "Zurich"}) == \
        "to Zürich ist"


def test_an_imported_pipelines_word_cache_stays_bounded(tmp_path, monkeypatch):
    """subword-nmt keeps every word it has split: a replica or a corpus actor meeting ever new
    words grew without end. The cache is emptied past BPE_CACHE_WORDS, and the words split
    the same after it."""
    import convs2s.io.text_codec as text_codec
    from convs2s.io.text_codec import MOSES_BPE, MosesBpeCodec, codec_settings

    shutil.copy(REPO / "tests" / "fixtures" / "fairseq" / "iwslt" / "bpecodes", tmp_path)
    (tmp_path / "dict.de.txt").write_text("in 1\n")
    (tmp_path / "dict.en.txt").write_text("the 1\n")
    codec = MosesBpeCodec(tmp_path, codec_settings(MOSES_BPE, "de", "en"))
    first = codec.encode("in Zürich ist")
    monkeypatch.setattr(text_codec, "BPE_CACHE_WORDS", 50)
    for i in range(400):
        codec.encode(f"wort{i}x{i * 7} neu{i}")
        assert len(codec.bpe.cache) <= 50 + 3
    assert codec.encode("in Zürich ist") == first


def test_replace_unk_copies_sentencepiece_pieces_with_their_word_marks(tiny_checkpoints):
    """This project's pipeline: the attended source piece is copied (U+2581 opens a word;
    byte pieces decode with their neighbours): unks that attend the pieces of a word spell it
    once, an unk that continues a word adds its piece only, the dictionary translates whole
    words, and a piece the vocabulary lacks is copied as text."""
    codec = codec_for_checkpoint(tiny_checkpoints["a"])
    source = "the Zürich"
    pieces = codec.encode(source)
    n = len(pieces) - 1  # Zürich's pieces
    assert pieces[0] == "\u2581the" and n >= 2
    the = codec.source_ids(pieces)[0]

    def text(ids, rows, dictionary=None, src_pieces=pieces):
        return unk_replaced_text(codec, ids, source, src_pieces,
                                 attending(rows, len(src_pieces)), dictionary)

    assert text([the] + [UNK] * n, list(range(n + 1))) == "the Zürich"
    for k in range(1, n):  # Zürich's first k pieces emitted, the unks attend the others
        ids = [the] + codec.source_ids(pieces[1: k + 1]) + [UNK] * (n - k)
        assert text(ids, list(range(n + 1))) == "the Zürich"
    assert text([UNK] + [UNK] * n, list(range(n + 1)), {"the": "le", "Zürich": "Zurich"}) == \
        "le Zürich"
    unknown = ["\u2581the", "\u2581Zü", "rich"]  # pieces of another vocabulary
    assert text([the, UNK, UNK], [0, 1, 2], src_pieces=unknown) == "the Zürich"
    # A rare word split as a bare word mark and its characters: one unk attending the mark
    # copies the word (through the dictionary), where it copied a space and lost the word;
    # unks attending the mark and then each character spell it once
    rare = ["\u2581the", "\u2581", "Z", "ü", "rich"]
    assert text([the, UNK], [0, 1], src_pieces=rare) == "the Zürich"
    assert text([the, UNK], [0, 1], {"Zürich": "Zurich"}, src_pieces=rare) == "the Zurich"
    assert text([the, UNK, UNK, UNK, UNK], [0, 1, 2, 3, 4], src_pieces=rare) == "the Zürich"


def test_missing_and_corrupt_checkpoints_give_clear_errors(tiny_checkpoints, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_for_inference([tmp_path / "nope"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint.pt"):
        load_for_inference([empty])
    bad = tmp_path / "bad"
    bad.mkdir()
    data = (Path(tiny_checkpoints["a"]) / "checkpoint.pt").read_bytes()
    (bad / "checkpoint.pt").write_bytes(data[: len(data) // 2])  # a cut copy
    (bad / "sentencepiece.model").write_bytes(Path(tiny_checkpoints["spm"]).read_bytes())
    with pytest.raises(CheckpointError, match="truncated, corrupt"):
        load_for_inference([bad])
    no_bpe = tmp_path / "no_bpe"
    no_bpe.mkdir()
    (no_bpe / "checkpoint.pt").write_bytes(data)
    with pytest.raises(CheckpointError, match="no sentencepiece.model"):
        load_for_inference([no_bpe])
    given = load_for_inference([no_bpe], search=SHORT,
                                        spm_model=tiny_checkpoints["spm"])
    assert given.translate(["The cat ."]) == load_for_inference(
        [tiny_checkpoints["a"]], search=SHORT).translate(["The cat ."])
    (tmp_path / "junk.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(CheckpointError, match="not a readable sentencepiece model"):
        load_for_inference([no_bpe], spm_model=tmp_path / "junk.model")
    # A given model does not override a member's own, other one: its ids mean other pieces.
    other = tmp_path / "other"
    other.mkdir()
    (other / "checkpoint.pt").write_bytes(data)
    (other / "sentencepiece.model").write_bytes(b"another sentencepiece model")
    with pytest.raises(CheckpointError, match=r"other.* bundles another sentencepiece model "
                                              r"than --spm-model"):
        load_for_inference([no_bpe, other], spm_model=tiny_checkpoints["spm"])
    res = run_cli("--checkpoint", str(bad), stdin="a cat .\n")
    assert res.returncode == 2 and "truncated, corrupt" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_checkpoint_given_by_its_file_translates_as_its_folder(tiny_checkpoints, tmp_path,
                                                                  capsys):
    """`--checkpoint DIR/checkpoint.pt` names the checkpoint of folder DIR: the text pipeline
    is DIR's, alone or as an ensemble member beside one given by its folder (the same
    sentencepiece model: one vocabulary), and DIR with its sentencepiece model cut short is
    refused as DIR itself is: one line naming it, no output."""
    src = tmp_path / "in.en"
    src.write_text("The cat sleeps .\nA dog runs .\n", encoding="utf-8")
    args = ["--beam", "3", "--max-len-a", "0", "--max-len-b", "4", "--threads", "1",
            "--input", str(src)]
    a, b = tiny_checkpoints["a"], tiny_checkpoints["b"]
    for i, (given, same) in enumerate((([f"{a}/checkpoint.pt"], [a]),
                                       ([a, f"{b}/checkpoint.pt"], [a, b]))):
        out = tmp_path / f"out{i}"
        assert main(["--checkpoint", *given, *args, "--output", str(out)]) == 0, \
            capsys.readouterr().err
        assert read_lines(out) == load_for_inference(same, search=SHORT).translate(
            read_lines(src))
    half = tmp_path / "half"
    shutil.copytree(a, half)
    spm = (half / "sentencepiece.model").read_bytes()
    (half / "sentencepiece.model").write_bytes(spm[:1000])
    capsys.readouterr()
    assert main(["--checkpoint", str(half / "checkpoint.pt"), *args,
                 "--output", str(tmp_path / "cut")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{half} is not a whole checkpoint" in err[0], err
    assert not (tmp_path / "cut").exists()


def test_a_given_sentencepiece_model_is_refused_for_an_imported_checkpoint(tiny_checkpoints,
                                                                          tmp_path):
    """--spm-model replaces only a sentencepiece pipeline: an imported model's token ids are
    those of its own dictionaries, whatever model is given. Members that differ in their
    dictionaries (of the same size) are never one ensemble, with or without it."""
    from convs2s.io.fairseq import import_fairseq

    imported = import_fairseq(REPO / "tests" / "fixtures" / "fairseq" / "iwslt",
                              tmp_path / "imported")
    other = tmp_path / "other"
    shutil.copytree(imported, other)
    lines = (other / "dict.de.txt").read_text().splitlines(keepends=True)
    (other / "dict.de.txt").write_text("".join([lines[1], lines[0], *lines[2:]]))  # ids swapped
    says = (r"is an imported model whose text pipeline is Moses \+ subword-nmt BPE .*, not "
            r"sentencepiece: leave out the sentencepiece model .* \(--spm-model\)$")
    for members in ([imported], [imported, other], [other, imported]):
        with pytest.raises(CheckpointError, match=says):
            load_for_inference(members, SHORT, spm_model=tiny_checkpoints["spm"])
    with pytest.raises(CheckpointError, match=r"other uses another text pipeline"):
        load_for_inference([imported, other], SHORT)
    assert load_for_inference([imported], SHORT).translate(["A man ."])[0]


def test_cli_file_and_stdin(tiny_checkpoints, tmp_path):
    src = tmp_path / "in.en"
    src.write_text("The cat sleeps .\n\nA dog runs .\n", encoding="utf-8")
    args = ["--checkpoint", tiny_checkpoints["a"], "--beam", "3", "--max-len-a", "0",
            "--max-len-b", "4", "--threads", "1"]
    assert main([*args, "--input", str(src), "--output", str(tmp_path / "out")]) == 0
    out = read_lines(tmp_path / "out")
    expected = load_for_inference([tiny_checkpoints["a"]], search=SHORT).translate(
        read_lines(src))
    assert out == expected and out[1] == ""
    res, attention = run_clis(((*args, "--nbest", "2"), src.read_text()),
                              ((*args, "--print-attention"), "The cat sleeps .\n"))
    assert res.returncode == 0, res.stderr
    nbest = res.stdout.split("\n")[:-1]
    assert len(nbest) == 6  # 2 lines per input, the empty one included
    assert (nbest[0], nbest[2:4], nbest[4]) == (expected[0], ["", ""], expected[2])
    assert attention.returncode == 0, attention.stderr
    tags = [line.split("\t")[0] for line in attention.stdout.splitlines()]
    assert tags == ["S-0", "H-0", "P-0", "A-0"]


# --- a model trained for a few minutes on the demo corpus ----------------------------------------


@pytest.mark.slow
def test_trained_model_beats_untrained_through_the_cli(demo_trained, tmp_path):
    refs = read_lines(demo_trained.test_ref)
    models = {"trained": demo_trained.train.best_checkpoint, "untrained": demo_trained.untrained}
    results = run_clis(*[(("--checkpoint", ckpt, "--input", demo_trained.test_src, "--output",
                           str(tmp_path / f"{name}.fr"), "--max-len-a", "1.5", "--max-len-b",
                           "10"), None) for name, ckpt in models.items()])
    scores = {}
    for name, res in zip(models, results):
        assert res.returncode == 0, res.stderr
        scores[name] = score_translation(read_lines(tmp_path / f"{name}.fr"), refs, "fr")
    print(f"demo test BLEU: trained {scores['trained']['bleu']:.2f}, "
          f"untrained {scores['untrained']['bleu']:.2f}")
    assert scores["untrained"]["bleu"] < 2.0
    assert scores["trained"]["bleu"] > scores["untrained"]["bleu"] + 10.0


@pytest.mark.slow
def test_ensemble_of_copies_and_batching_match_single_model(demo_trained):
    best = demo_trained.train.best_checkpoint
    lines = read_lines(demo_trained.test_src)[:40]
    search = SearchConfig(max_len_a=1.5, max_len_b=10)
    single = load_for_inference([best], search=search).translate_full(lines)
    pair = load_for_inference([best, best], search=search).translate_full(lines)
    one_by_one = load_for_inference(
        [best], search=search.replace(max_sentences=1)).translate_full(lines)
    assert [t.text for t in pair] == [t.text for t in single]
    assert [t.text for t in one_by_one] == [t.text for t in single]
    for a, b in zip(single, pair):
        assert a.hypotheses[0].score == pytest.approx(b.hypotheses[0].score, abs=1e-4)
        torch.testing.assert_close(a.hypotheses[0].attention, b.hypotheses[0].attention)


@pytest.mark.gpu
def test_cuda_translation_agrees_with_cpu(tiny_checkpoints):
    """Same checkpoint on CUDA and CPU: empty lines kept, (near-)identical translations (a
    random model's near-ties may flip under different kernels, hence the 80% bound)."""
    lines = [s for s, _ in tiny_checkpoints["pairs"][:20]] + [""]
    cpu = load_for_inference([tiny_checkpoints["a"]], SHORT, "cpu").translate(lines)
    gpu_tr = load_for_inference([tiny_checkpoints["a"]], SHORT, "cuda")
    assert next(gpu_tr.models[0].parameters()).is_cuda
    gpu = gpu_tr.translate(lines)
    assert gpu[-1] == "" and len(gpu) == len(lines)
    assert sum(a == b for a, b in zip(cpu, gpu)) >= 0.8 * len(lines)


def test_cli_touches_no_output_before_its_input_is_valid(tiny_checkpoints, tmp_path, capsys):
    existing = tmp_path / "existing.txt"
    existing.write_text("earlier translations\n")
    args = ["--checkpoint", tiny_checkpoints["a"], "--beam", "1", "--max-len-b", "5"]
    for bad, says in ((tmp_path / "missing.txt", "does not exist"), (tmp_path, "is a directory")):
        assert main([*args, "--input", str(bad), "--output", str(existing)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(bad) in err[0] and says in err[0], err
        assert existing.read_text() == "earlier translations\n"  # not emptied
    src = tmp_path / "src.txt"
    src.write_text("The cat .\n")
    assert main([*args, "--input", str(src), "--output", str(existing)]) == 0
    assert existing.read_text() != "earlier translations\n"
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_a_refused_command_answers_before_torch_loads(tiny_checkpoints, tmp_path):
    """A missing input, an output that is a folder, an --actors output this command did not
    write: one error line, exit 2, in a process that never imported torch, MLflow or Ray (torch's
    import alone is seconds of CPU: the refusal was that slow before)."""
    (tmp_path / "a.en").write_text("one\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    ck, a = tiny_checkpoints["a"], str(tmp_path / "a.en")
    cases = [["--input", str(tmp_path / "missing.en")],
             ["--input", a, "--output", str(tmp_path)],
             ["--input", str(tmp_path / "missing.en"), "--actors", "2", "--output",
              str(tmp_path / "parts")],
             ["--input", a, "--actors", "2", "--output", str(tmp_path / "other")],
             ["--input", a, "--device", "gpu0"],
             ["--input", a, "--output", str(tmp_path / "no-such-folder" / "out.txt")],
             ["--input", a, "--actors", "2", "--device", "cpu", "--output",
              str(tmp_path / "parts")],
             ["--input", a, "--column", "text"],
             ["--input", a, "--shortlist-per-source", "-1"],
             ["--input", str(fifo)]]
    results, loaded = calls_in_a_fresh_process(
        "from convs2s.cli import main", f"main(['translate', '--checkpoint', {ck!r}, *extra])",
        cases)
    says = ["missing.en does not exist", "is a directory", "missing.en does not exist",
            "holds files this command did not write", "--device gpu0: give cpu, cuda or cuda:N",
            "no-such-folder does not exist; create it first",
            "--device: the --actors job does not use it",
            "--column text: only a .parquet --input has columns",
            "shortlist_per_source must be >= 0",
            # (it was "does not exist"; read once, it cannot be told text, gzip or parquet)
            f"input {fifo} is not a regular file (a pipe or a device): give it on the standard "
            "input"]
    for (rc, err), said in zip(results, says):
        assert rc == 2 and said in err and err.count("\n") == 1, err
    assert loaded == []
    assert not (tmp_path / "parts").exists()


def test_column_is_for_parquet_input_named_in_any_case():
    from types import SimpleNamespace

    from convs2s.cli.translate_command import _check_flags

    flags = dict(actors=0, device=None, buffer_size=None, column="text")
    _check_flags(SimpleNamespace(input="corpus.PARQUET", **flags))  # read as parquet: kept
    with pytest.raises(ValueError, match="only a .parquet --input has columns"):
        _check_flags(SimpleNamespace(input="corpus.txt", **flags))


def test_a_gpu_this_machine_lacks_and_a_help_request_are_answered_plainly(tiny_checkpoints,
                                                                          tmp_path, capsys):
    import torch

    from convs2s.cli import main as command

    src = tmp_path / "a.en"
    src.write_text("The cat .\n")
    if not torch.cuda.is_available():  # (a traceback from inside torch, before)
        assert main(["--checkpoint", tiny_checkpoints["a"], "--input", str(src),
                     "--device", "cuda:0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--device cuda:0: no CUDA GPU is visible here" in err[0], err
    assert command(["--help"]) == 0  # asked for: stdout, exit 0
    assert "usage: python -m convs2s {translate," in capsys.readouterr().out


def test_a_translation_without_attention_is_the_same_and_keeps_none(tiny_checkpoints,
                                                                     tmp_path):
    """translate_full(attention=False) (the command without --print-attention, corpus parts,
    served requests that do not ask it): the same hypotheses, none of the attention; replace_unk
    still finds its source words (the search keeps attention for it)."""
    tr = load_for_inference([tiny_checkpoints["a"]], search=SHORT.replace(nbest=2))
    lines = [s for s, _ in tiny_checkpoints["pairs"][:6]] + [""]
    kept, none = tr.translate_full(lines), tr.translate_full(lines, attention=False)
    assert [[(h.text, h.score) for h in t.hypotheses] for t in none] == \
        [[(h.text, h.score) for h in t.hypotheses] for t in kept]
    assert all(h.attention is None for t in none for h in t.hypotheses)
    with pytest.raises(ValueError, match="searched without attention"):
        none[0].hypotheses[0].alignment()
    table = tmp_path / "lex.txt"
    table.write_text("the LE\n")
    unk = load_for_inference([tiny_checkpoints["a"]], search=SHORT.replace(
        unk_penalty=-1e4, replace_unk=True, dictionary=str(table)))
    line = ["the son will not be in the"]  # one piece a word: each unk copies a whole word
    assert unk.translate_full(line, attention=False)[0].text == unk.translate_full(line)[0].text
    assert set(unk.translate(line)[0].split()) <= set(line[0].split()) - {"the"} | {"LE"}


def test_the_command_reads_gz_and_parquet_inputs_as_actors_do(tiny_checkpoints, tmp_path,
                                                              capsys):
    """--input mono.en.gz or a parquet column in one process: the lines the plain file gives
    (as --actors reads them); a .gz that is not gzip, cut short, or a parquet file without
    the column: one error line, exit 2, the output untouched."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = ["The cat sleeps .", "", "A dog runs near the river ."]
    plain = tmp_path / "mono.en"
    plain.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    (tmp_path / "mono.en.gz").write_bytes(gzip.compress(plain.read_bytes()))
    pq.write_table(pa.table({"id": ["1", "2", "3"], "en": lines}), tmp_path / "mono.parquet")
    args = ["--checkpoint", tiny_checkpoints["a"], "--beam", "1", "--max-len-b", "5",
            "--device", "cpu", "--threads", "1"]
    for name, extra in (("mono.en", []), ("mono.en.gz", []),
                        ("mono.parquet", ["--column", "en"])):
        assert main([*args, "--input", str(tmp_path / name), "--output",
                     str(tmp_path / f"{name}.out"), *extra]) == 0
    want = (tmp_path / "mono.en.out").read_text()
    assert len(want.splitlines()) == 3
    assert (tmp_path / "mono.en.gz.out").read_text() == want
    assert (tmp_path / "mono.parquet.out").read_text() == want
    capsys.readouterr()
    (tmp_path / "text.gz").write_bytes(b"plain text, not gzip\n")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(plain.read_bytes() * 50)[:40])
    (tmp_path / "text.parquet").write_text("plain text under a parquet name\n")
    existing = tmp_path / "existing.txt"
    existing.write_text("earlier translations\n")
    for name, extra, says in (("text.gz", [], "is not a whole gzip file"),
                              ("cut.gz", [], "is not a whole gzip file"),
                              ("text.parquet", [], "is not a readable parquet file"),
                              ("mono.parquet", [], "2 string columns (id, en)"),
                              ("mono.parquet", ["--column", "de"], "no string column 'de'")):
        assert main([*args, "--input", str(tmp_path / name), "--output", str(existing),
                     *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0] and says in err[0], err
        assert existing.read_text() == "earlier translations\n"
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_an_output_that_is_the_input_is_refused(tiny_checkpoints, tmp_path, capsys):
    """--output naming the --input file (however spelled, or through a link) would replace the
    source by its translation: one error line, exit 2, the source untouched."""
    src = tmp_path / "same.en"
    src.write_text("The cat .\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.en").symlink_to(src)
    args = ["--checkpoint", tiny_checkpoints["a"], "--beam", "1", "--max-len-b", "5"]
    for output in (src, tmp_path / "sub" / ".." / "same.en", tmp_path / "link.en"):
        assert main([*args, "--input", str(src), "--output", str(output)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is the --input file" in err[0], err
        assert src.read_text() == "The cat .\n"


def test_an_output_that_is_a_link_or_a_fifo_stays_what_it_is(tiny_checkpoints, tmp_path,
                                                              capsys):
    """--output through a symlink writes the link's target (the link stays a link); a FIFO
    gets the translations as they are written. The rename over them that keeps a failed run
    from leaving half an output made each a plain file: the reader of the FIFO got nothing,
    and --output /dev/stdout would have replaced /dev/stdout."""
    import os
    import threading

    src = tmp_path / "src.en"
    src.write_text("The cat .\nA dog .\n")
    args = ["--checkpoint", tiny_checkpoints["a"], "--beam", "1", "--max-len-b", "5",
            "--input", str(src)]
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("earlier\n")
    link.symlink_to(target)
    assert main([*args, "--output", str(link)]) == 0
    assert link.is_symlink() and len(target.read_text().splitlines()) == 2
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    assert main([*args, "--output", str(fifo)]) == 0
    reader.join(30)
    assert fifo.is_fifo() and got and len(got[0].splitlines()) == 2
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_an_output_named_by_a_file_uri_is_written_at_its_path(tiny_checkpoints, tmp_path,
                                                              monkeypatch):
    """--output file:///PATH (or file:/PATH, what pathlib makes of it) writes the file PATH,
    as --input and --checkpoint read theirs: it was written as `<cwd>/file:/PATH`, a folder
    named "file:" (or failed after the model loaded where that folder did not exist)."""
    src = tmp_path / "src.en"
    src.write_text("The cat .\nA dog .\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["--checkpoint", tiny_checkpoints["a"], "--beam", "1", "--max-len-b", "5",
            "--input", src.as_uri()]
    for output, name in ((f"file://{tmp_path}/out.txt", "out.txt"),
                         (f"file:{tmp_path}/one.txt", "one.txt")):
        assert main([*args, "--output", output]) == 0, output
        assert len((tmp_path / name).read_text().splitlines()) == 2
    assert list(work.iterdir()) == []  # no folder named "file:"
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_flags_that_were_taken_and_meant_something_else_are_refused(tiny_checkpoints,
                                                                    tmp_path, capsys):
    """--buffer-size 0 (read as 10,000) or below (never cut: the whole input held), --threads
    below 0, a --lenpen of nan (it changed the outputs), an --output naming a folder
    (`out/`: a raw errno about a temporary file after the model loaded), an empty --input, a
    --dictionary that is not UTF-8 text (no file named): one line each, exit 2, before any
    output; `score` of two empty files: one line, not a traceback."""
    from convs2s.cli import score

    src = tmp_path / "src.en"
    src.write_text("The cat .\n")
    (tmp_path / "dict.txt").write_bytes(b"chat \xff\n")
    args = ["--checkpoint", tiny_checkpoints["a"], "--beam", "1", "--max-len-b", "5"]
    cases = [(["--input", str(src), "--buffer-size", "0"], "--buffer-size 0"),
             (["--input", str(src), "--buffer-size", "-3"], "--buffer-size -3"),
             (["--input", str(src), "--threads", "-1"], "--threads -1"),
             (["--input", str(src), "--lenpen", "nan"], "lenpen must be a finite number"),
             (["--input", str(src), "--output", f"{tmp_path}/new/"], "is a directory"),
             (["--input", ""], "--input is empty"),
             (["--input", str(src), "--replace-unk", "--dictionary",
               str(tmp_path / "dict.txt")], "dict.txt: cannot be read as UTF-8")]
    for extra, says in cases:
        assert main([*args, *extra]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], (extra, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dict.txt", "src.en"]
    (tmp_path / "empty.txt").write_text("")
    empty = str(tmp_path / "empty.txt")
    assert score(["--hyp", empty, "--ref", empty, "--lang", "fr"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no sentences to score" in err[0], err


def test_score_attention_serve_and_average_refuse_bad_input_in_one_line(tiny_checkpoints,
                                                                        tmp_path):
    """A missing or non-UTF-8 file to score, a missing checkpoint, a beam of 0 or a blank
    sentence to plot (it was skipped without a word), a
    search the replicas could not build, an averaging --out that holds files: one error line,
    exit 2, before anything is written or Ray starts."""
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("a\n")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9\n".encode("latin-1"))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    ck, pics = tiny_checkpoints["a"], str(tmp_path / "pics")
    cases = {
        ("score", "--hyp", str(tmp_path / "missing.txt"), "--ref", str(hyp), "--lang", "fr"):
            "--hyp " + str(tmp_path / "missing.txt") + " does not exist",
        ("score", "--hyp", str(hyp), "--ref", str(latin1), "--lang", "fr"):
            "latin1.txt is not UTF-8 text",
        ("attention", "--checkpoint", str(tmp_path / "nope"), "--out", pics, "a cat"):
            "nope does not exist",
        ("attention", "--checkpoint", ck, "--beam", "0", "--out", pics, "a cat"):
            "beam must be >= 1",
        ("attention", "--checkpoint", ck, "--out", pics, "a cat", " "):
            "sentence 2 of 2 is blank: give each sentence to plot",
        ("serve", "--checkpoint", ck, "--beam", "0"): "beam must be >= 1",
        ("serve", "--checkpoint", ck, "--max-len-b", "-1"): "max_len_b must be >= 0",
        ("average", ck, "--out", str(taken)): "exists and is not empty",
        ("attention", "--checkpoint", "s3:/bucket/ck", "--out", pics, "a cat"):
            "has one slash after s3:",
        ("import-fairseq", "s3:/bucket/archive", "--out", str(tmp_path / "imported")):
            "has one slash after s3:",
        ("attention", "--checkpoint", ck, "--out", "s3://bucket/pics", "a cat"):
            "the pictures go to a local folder",
        ("serve", "--model", "models:/wmt14_en_fr-newstest2014@champion", "--spm-model",
         str(hyp)): "a logged model (--model) carries its own text pipeline",
    }
    results, loaded = calls_in_a_fresh_process(
        "from convs2s.cli import main", "main(list(extra))", [list(c) for c in cases],
        modules=("ray",))
    for (rc, err), (case, says) in zip(results, cases.items()):
        assert rc == 2 and says in err and err.count("\n") == 1, (case, err)
    assert loaded == []  # Ray never started
    assert not (tmp_path / "pics").exists()


# --- the corpus job's output (convs2s.serving.corpus, the --actors path), without Ray -----------


def test_corpus_part_names_sort_in_input_order_past_99999_parts():
    """`cat <output>/part-*.txt` reads the parts in order: past 99,999 parts every part's number
    is as wide as the last one's; up to there the names stay five digits (a folder written
    before resumes)."""
    from convs2s.serving.corpus import part_name, part_width

    assert part_width(1) == part_width(100_000) == 5 and part_width(100_001) == 6
    assert part_name(7, "txt", part_width(100_000)) == "part-00007.txt"
    for parts in (100_000, 100_001, 12_345_678):
        w = part_width(parts)
        names = [part_name(i, "txt", w) for i in sorted({0, 9, 10_000, 99_999, parts - 1})]
        assert sorted(names) == names, names


def test_a_corpus_job_records_the_version_of_each_file_it_reads_by_path(tiny_checkpoints,
                                                                        tmp_path):
    """The sentencepiece model and the replace-unk dictionary regenerated at the same path make
    another job: a rerun into the same output is refused (not a mix of old and new parts)."""
    import json
    import os
    import shutil

    from convs2s.serving.corpus import (JOB_FILE, CorpusError, CorpusJob, _identity,
                                        translate_corpus)

    src = tmp_path / "in.en"
    src.write_text("a cat\n")
    spm = tmp_path / "spm.model"
    shutil.copyfile(tiny_checkpoints["spm"], spm)
    lex = tmp_path / "lex.txt"
    lex.write_text("cat CHAT\n")
    search = SHORT.replace(replace_unk=True, dictionary=str(lex))
    job = CorpusJob([tiny_checkpoints["a"]], str(src), str(tmp_path / "out"), search=search,
                    spm_model=str(spm), progress=False)
    first = _identity(job)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / JOB_FILE).write_text(json.dumps(first))
    st = spm.stat()
    spm.write_bytes(spm.read_bytes())  # regenerated: the same bytes, a new version
    os.utime(spm, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    lex.write_text("cat KATZE\n")
    now = _identity(job)
    assert sorted(k for k in now if now[k] != first.get(k)) == ["dictionary_stamp",
                                                                "spm_model_stamp"]
    with pytest.raises(CorpusError, match=r"another job \(changed: dictionary_stamp, "
                                          r"spm_model_stamp\)"):
        translate_corpus(job)
    plain = CorpusJob([tiny_checkpoints["a"]], str(src), str(tmp_path / "out2"), search=SHORT)
    assert not [k for k in _identity(plain) if k.endswith("_stamp") and k != "input_stamp"]


def test_ray_workers_get_absolute_local_paths(tiny_checkpoints, tmp_path, monkeypatch):
    """Corpus actors and serving replicas do not run in the driver's folder: the local paths
    they are given (checkpoints, sentencepiece model, output, shortlist, dictionary) are
    absolute; URIs stay as they are."""
    from convs2s.serving.corpus import _worker_search
    from storage import worker_path
    from convs2s.serving.online import ServeSettings

    monkeypatch.chdir(tmp_path)
    assert worker_path("runs/best") == str(tmp_path / "runs" / "best")
    assert worker_path("s3://bucket/best") == "s3://bucket/best"
    assert worker_path(None) is None
    search = _worker_search(SHORT.replace(replace_unk=True, dictionary="lex.txt",
                                          shortlist="sl/shortlist.npz"))
    assert (search["dictionary"], search["shortlist"]) == \
        (str(tmp_path / "lex.txt"), str(tmp_path / "sl" / "shortlist.npz"))
    s = ServeSettings(checkpoints=["runs/best", "s3://b/ck"], spm_model="spm.model",
                      search={"beam": 2, "shortlist": "sl.npz"}).for_replicas()
    assert s.checkpoints == [str(tmp_path / "runs" / "best"), "s3://b/ck"]
    assert (s.spm_model, s.search) == (str(tmp_path / "spm.model"),
                                       {"beam": 2, "shortlist": str(tmp_path / "sl.npz")})


def test_replace_unk_copies_a_byte_piece_with_the_rest_of_its_character(tiny_checkpoints):
    """A character outside the vocabulary is byte pieces (sentencepiece's byte fallback): an
    unk that attends one of its bytes copies the character, never a lone byte (which decoded
    as U+FFFD); unks that attend each of its bytes spell it once; an unk after the hypothesis
    emitted the character's first byte itself adds the rest."""
    codec = codec_for_checkpoint(tiny_checkpoints["a"])
    source = "the Жук"
    pieces = codec.encode(source)
    first = pieces.index("<0xD0>")  # Ж is D0 96 in UTF-8, outside this demo vocabulary
    assert pieces[first + 1] == "<0x96>", pieces
    before = codec.source_ids(pieces[:first])  # "▁the", and the piece that opens the word
    after = codec.source_ids(pieces[first + 2:])  # the pieces of "ук"
    lead = codec.source_ids(["<0xD0>"])[0]
    head, tail = list(range(first)), list(range(first + 2, len(pieces)))

    def text(middle, rows):
        return unk_replaced_text(codec, before + middle + after, source, pieces,
                                 attending(head + rows + tail, len(pieces)), None)

    assert text([UNK], [first + 1]) == "the Жук"  # its second byte: the character
    assert text([UNK], [first]) == "the Жук"  # its first byte
    assert text([UNK, UNK], [first, first + 1]) == "the Жук"  # each byte: spelled once
    assert text([UNK, UNK], [first + 1, first]) == "the Жук"
    assert text([lead, UNK], [first, first + 1]) == "the Жук"  # the rest after its first
    # The spans of the characters' bytes: a 3-byte €, then a stray continuation byte alone.
    assert codec.byte_characters(["\u2581", "<0xE2>", "<0x82>", "<0xAC>", "<0x96>", "x"]) == \
        [None, (1, 4), (1, 4), (1, 4), (4, 5), None]


def test_the_console_script_takes_a_ctrl_c_as_python_m_convs2s_does(tiny_checkpoints, tmp_path):
    """`convs2s-translate` (the installed script) runs the command as `python -m convs2s
    translate` does, under its signal handling: a Ctrl-C while torch imports or the model loads
    is "interrupted", exit 130 (the script called the command bare: a KeyboardInterrupt's
    traceback, exit by the signal)."""
    import signal
    import time

    script = Path(sys.executable).parent / "convs2s-translate"
    if not script.is_file():
        pytest.skip(f"{script} is not installed (pip install -e .)")
    src = tmp_path / "src.en"
    src.write_text("The cat sleeps on the small red mat near the door .\n" * 3000)
    proc = subprocess.Popen([str(script), "--checkpoint", tiny_checkpoints["a"], "--input",
                             str(src), "--output", str(tmp_path / "out.txt")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(1.0)  # (torch imports, or the model loads)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("interrupted"), err[-500:]
    assert not (tmp_path / "out.txt").exists()


def test_a_line_without_a_finite_translation_is_named_in_a_warning(tiny_checkpoints, caplog):
    """NaN or infinite log-probabilities (damaged weights, an overflow) leave a line without a
    finite translation: the warning names it, where translate wrote an empty line silently."""
    tr = load_for_inference([tiny_checkpoints["a"]],
                            search=SearchConfig(beam=2, max_len_a=0, max_len_b=3))
    with caplog.at_level(logging.WARNING, logger="convs2s.inference.translate"):
        tr.translate_full(["a man sleeps .", "a dog runs ."])
    assert "no finite translation" not in caplog.text
    with torch.no_grad():
        tr.models[0].decoder.fc3.bias[10] = float("inf")
    with caplog.at_level(logging.WARNING, logger="convs2s.inference.translate"):
        out = tr.translate_full(["", "a man sleeps .", "a dog runs ."], first_line=40)
    assert "lines 42, 43: no finite translation" in caplog.text
    assert out[0].hypotheses == []  # an empty line is no failure


def test_a_min_len_past_the_models_position_table_is_refused_in_one_line(tiny_checkpoints):
    """`--min-len` beyond what the model can write (its position table, less EOS) was taken:
    EOS is forced at the table's end, so every output was cut there whatever min_len asked
    (`max_len_b` below min_len is refused alike)."""
    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference

    translator = load_for_inference([tiny_checkpoints["a"]], SearchConfig(beam=1), "cpu")
    most = translator.max_positions - 1
    with pytest.raises(ValueError, match=rf"min_len={most + 1} is more output pieces than the "
                                         rf"model writes \(max_positions {most + 1}: at most "
                                         rf"{most} and EOS\): lower min_len"):
        load_for_inference([tiny_checkpoints["a"]], SearchConfig(beam=1, min_len=most + 1,
                                                                 max_len_b=most + 10), "cpu")
    load_for_inference([tiny_checkpoints["a"]], SearchConfig(beam=1, min_len=most,
                                                             max_len_b=most + 10), "cpu")


def test_translations_to_stdout_are_utf8_in_any_locale_and_a_reader_leaving_ends_it_quietly(
        tiny_checkpoints, tmp_path):
    """To the standard output: in an ASCII locale (a cron job's, PYTHONIOENCODING=ascii) the
    first non-ASCII word was a UnicodeEncodeError traceback; `| head -1` ended it with
    "error: [Errno 32] Broken pipe", exit 2. The text is UTF-8 as a file's is, and a reader
    that leaves ends the command, exit 0, as other filters end."""
    src = tmp_path / "src.txt"
    src.write_text("".join(f"a cat is on the mat number {i} .\n" for i in range(200)))
    cmd = [sys.executable, "-m", "convs2s", "translate", "--checkpoint", tiny_checkpoints["a"],
           "--input", str(src), "--beam", "1"]
    ascii_env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run(cmd, capture_output=True, env=ascii_env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    text = done.stdout.decode("utf-8")  # (the random model writes non-ASCII pieces)
    assert len(text.splitlines()) == 200 and any(ord(c) > 127 for c in text)
    proc = subprocess.Popen([*cmd, "--buffer-size", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)  # (written a line at a time)
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves after one line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0 and "Broken pipe" not in err and "Traceback" not in err, \
        err[-2000:]
