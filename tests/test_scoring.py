"""convs2s.metrics.scoring against the tools themselves, on real test sets from ../shared/data.

References are real newstest / Gigaword files; hypotheses are a deterministic perturbation of
them (words dropped, swapped, replaced with a seeded RNG). The oracles are the `sacrebleu` and
`sacremoses` command-line tools run as subprocesses and rouge-score used directly.

    timeout 900 .venv/bin/python -m pytest tests/test_scoring.py -q
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import at_once
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from convs2s.metrics import scoring

BIN = Path(sys.executable).parent  # .venv/bin: sacrebleu and sacremoses CLIs live beside python


def perturb(lines: list[str], seed: int) -> list[str]:
    """A noisy copy: per word 8% dropped, 8% replaced by a corpus word, 8% swapped with the next.

    Every 97th line becomes empty, so empty hypotheses and line alignment are exercised too.
    """
    rng = random.Random(seed)
    vocab = sorted({w for line in lines for w in line.split()})
    out = []
    for i, line in enumerate(lines):
        if i % 97 == 50:
            out.append("")
            continue
        words = line.split()
        j = 0
        while j < len(words):
            r = rng.random()
            if r < 0.08:
                del words[j]
                continue
            if r < 0.16:
                words[j] = rng.choice(vocab)
            elif r < 0.24 and j + 1 < len(words):
                words[j], words[j + 1] = words[j + 1], words[j]
                j += 1
            j += 1
        out.append(" ".join(words))
    return out


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def sacrebleu_cli(ref: Path, hyp: Path, *args: str) -> list[dict]:
    """Run `sacrebleu REF -i HYP -m bleu chrf -w 6 ARGS` and return its JSON records."""
    cmd = [str(BIN / "sacrebleu"), str(ref), "-i", str(hyp), "-w", "6", "-f", "json", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rec = json.loads(out)
    return rec if isinstance(rec, list) else [rec]


def sacremoses_cli(src: Path, dst: Path, lang: str) -> Path:
    """Tokenize a file as fairseq's prepare-wmt14en2de.sh tokenized the paper's references:
    `sed -e "s/\\’/\\'/g" | tokenizer.perl -a -l LANG`, here with the sacremoses command-line
    tool's `tokenize -a` (aggressive dash splits).

    The CLI always XML-escapes (its -x flag defaults to on). Escaping maps each token to one
    token injectively, so BLEU with tokenize=none is the same as on our unescaped tokens.
    """
    sed = Path(src).read_text(encoding="utf-8").replace("\u2019", "'")
    with open(dst, "w", encoding="utf-8") as fout:
        subprocess.run([str(BIN / "sacremoses"), "-l", lang, "-j", "1", "-q", "tokenize", "-a"],
                       input=sed, encoding="utf-8", stdout=fout, check=True)
    return dst


def wmt16_romanian_scripts(line: str) -> str:
    """Transcription of normalise-romanian.py | remove-diacritics.py (wmt16-scripts), plus the
    quote normalization the project adds, as a chain of replaces (the scripts' own form)."""
    line = line.replace("\u015e", "\u0218").replace("\u015f", "\u0219")
    line = line.replace("\u0162", "\u021a").replace("\u0163", "\u021b")
    line = line.replace("\u0218", "S").replace("\u0219", "s")
    line = line.replace("\u021a", "T").replace("\u021b", "t")
    line = line.replace("\u0102", "A").replace("\u0103", "a")
    line = line.replace("\u00C2", "A").replace("\u00E2", "a")
    line = line.replace("\u00CE", "I").replace("\u00EE", "i")
    for q in "\u201e\u201c\u201d\u00ab\u00bb":
        line = line.replace(q, '"')
    for q in "\u201a\u2018\u2019":
        line = line.replace(q, "'")
    return line


@pytest.fixture(scope="module")
def en_fr(shared_data, tmp_path_factory) -> tuple[Path, Path]:
    """(reference, perturbed hypothesis) files for newstest2014 En-Fr (3,003 lines)."""
    ref = shared_data / "wmt14-en-fr" / "newstest2014.fr"
    hyp = tmp_path_factory.mktemp("fr") / "hyp.fr"
    write_lines(hyp, perturb(scoring.read_lines(ref), seed=14))
    return ref, hyp


# --- detokenized sacreBLEU and chrF ----------------------------------------------------------


@pytest.mark.parametrize("pair,lang", [("wmt14-en-fr/newstest2014", "fr"),
                                       ("wmt14-en-de/newstest2014", "de")])
def test_bleu_chrf_equal_sacrebleu_cli(shared_data, tmp_path, pair, lang):
    ref = shared_data / f"{pair}.{lang}"
    refs = scoring.read_lines(ref)
    assert len(refs) == 3003  # the full newstest2014 (docs/reference.md, Evaluation)
    hyps = perturb(refs, seed=7)
    hyp = write_lines(tmp_path / f"hyp.{lang}", hyps)
    cli_bleu, cli_chrf = sacrebleu_cli(ref, hyp, "-m", "bleu", "chrf")

    ours = scoring.bleu(hyps, refs)
    assert 20 < ours.score < 80  # a real, non-trivial score: the perturbation is moderate
    assert ours.score == pytest.approx(cli_bleu["score"], abs=1e-6)
    assert ours.signature == f"{cli_bleu['name']}|{cli_bleu['signature']}"
    assert f"hyp_len = {ours.sys_len} ref_len = {ours.ref_len}" in cli_bleu["verbose_score"]
    assert f"BP = {ours.bp:.3f}" in cli_bleu["verbose_score"]
    assert scoring.chrf(hyps, refs) == pytest.approx(cli_chrf["score"], abs=1e-6)

    metrics = scoring.score_translation(hyps, refs, lang)
    assert metrics["bleu"] == pytest.approx(cli_bleu["score"], abs=1e-6)
    assert metrics["chrf"] == pytest.approx(cli_chrf["score"], abs=1e-6)
    assert metrics["length_ratio"] == pytest.approx(ours.sys_len / ours.ref_len)
    sigs = scoring.translation_signatures(lang)
    assert sigs["bleu"] == ours.signature
    assert sigs["chrf"] == f"{cli_chrf['name']}|{cli_chrf['signature']}"


def test_tokenized_bleu_equals_moses_cli_then_sacrebleu_none(en_fr, tmp_path):
    ref, hyp = en_fr
    tok_ref = sacremoses_cli(ref, tmp_path / "ref.tok", "fr")
    tok_hyp = sacremoses_cli(hyp, tmp_path / "hyp.tok", "fr")
    (cli,) = sacrebleu_cli(tok_ref, tok_hyp, "-m", "bleu", "-tok", "none", "--force")

    hyps, refs = scoring.read_lines(hyp), scoring.read_lines(ref)
    ours = scoring.tokenized_bleu(hyps, refs, "fr")
    assert ours.score == pytest.approx(cli["score"], abs=1e-6)
    assert ours.signature == f"BLEU|{cli['signature']}"
    assert "tok:none" in ours.signature
    # Moses splits French elisions and punctuation differently from 13a: the numbers differ.
    assert ours.score != pytest.approx(scoring.bleu(hyps, refs).score, abs=1e-3)
    assert scoring.score_translation(hyps, refs, "fr")["bleu_tokenized"] == ours.score


def test_tokenized_bleu_splits_hyphens_and_unifies_apostrophes_on_both_sides():
    # tokenizer.perl -a, as the paper's references were tokenized (fairseq's prepare-wmt14 scripts)
    assert scoring.moses_tokenize(["Die Hotel-Zimmer sind 3-4 m hoch ."], "de") == \
        ["Die Hotel @-@ Zimmer sind 3 @-@ 4 m hoch ."]
    # ’ becomes ' first (the scripts' sed), so French elisions split the same with either quote
    assert scoring.moses_tokenize(["l\u2019h\u00f4tel", "l'h\u00f4tel"], "fr") == \
        ["l' h\u00f4tel", "l' h\u00f4tel"]
    # A near miss on a compound keeps its matching half and the hyphen: 2 of 3 unigrams match
    # (tokenized whole, "Hotel-Bar" against "Hotel-Zimmer" would match none).
    s = scoring.tokenized_bleu(["Hotel-Bar"], ["Hotel-Zimmer"], "de")
    assert (s.counts[0], s.totals[0], s.ref_len) == (2, 3, 3)
    same = scoring.tokenized_bleu(["Er sagte \u201edas ist\u2019s\u201c ."],
                                  ["Er sagte \u201edas ist's\u201c ."], "de")
    assert same.score == pytest.approx(100.0)


# --- targets written without spaces (zh, ja, ko) ------------------------------------------------

ZH_REFS = ["我今天去公园散步了。", "这家餐厅的菜很好吃。", "他每天早上六点起床。",
           "我们明天下午开会讨论这个问题。"]
ZH_HYPS = ["今天我去公园散步。", "这个餐厅的菜很好吃。", "他每天六点起床。",
           "我们明天开会讨论这个问题。"]


def test_a_chinese_target_is_scored_on_sacrebleus_chinese_tokens_as_its_cli_does(tmp_path):
    """13a finds no spaces in Chinese: each sentence is one token and near-misses score 0.
    sacreBLEU's zh tokenizer (what `sacrebleu -l en-zh` picks) splits the characters; Moses
    does not segment Chinese either, so there is no bleu_tokenized for it."""
    ref = write_lines(tmp_path / "ref.zh", ZH_REFS)
    hyp = write_lines(tmp_path / "hyp.zh", ZH_HYPS)
    (cli,) = sacrebleu_cli(ref, hyp, "-m", "bleu", "-l", "en-zh")
    assert "tok:zh" in cli["signature"]

    metrics = scoring.score_translation(ZH_HYPS, ZH_REFS, "zh")
    assert scoring.bleu(ZH_HYPS, ZH_REFS).score == 0.0  # 13a: whole sentences, none equal
    assert 20 < metrics["bleu"] < 80
    assert metrics["bleu"] == pytest.approx(cli["score"], abs=1e-6)
    sigs = scoring.translation_signatures("zh")
    assert sigs["bleu"] == f"{cli['name']}|{cli['signature']}"  # says tok:zh, not tok:13a
    assert "bleu_tokenized" not in metrics and "bleu_tokenized" not in sigs
    assert "not computed for zh" in sigs["preprocessing"]
    with pytest.raises(ValueError, match="not defined for 'zh': Moses does not segment"):
        scoring.tokenized_bleu(ZH_HYPS, ZH_REFS, "zh")


@pytest.mark.parametrize("lang", ["zh-Hant", "zh_CN", "ZH"])
def test_a_language_code_with_a_region_script_or_capitals_is_scored_by_its_base(lang):
    """zh-Hant / zh_CN / ZH found no rule: 13a scored each Chinese sentence as one token
    (0 BLEU) and a bleu_tokenized undefined for Chinese was logged; ro-RO skipped the
    Romanian normalization."""
    assert scoring.score_translation(ZH_HYPS, ZH_REFS, lang) == \
        scoring.score_translation(ZH_HYPS, ZH_REFS, "zh")
    assert "tok:zh" in scoring.translation_signatures(lang)["bleu"]
    hyps, refs = ["\u015fi \u021bar\u0103 ."], ["si tara ."]
    assert scoring.score_translation(hyps, refs, "ro-RO") == \
        scoring.score_translation(hyps, refs, "ro")
    assert "Romanian normalise" in scoring.translation_signatures("ro-RO")["preprocessing"]


@pytest.mark.parametrize("lang", ["fr", "de", "ro", "en"])
def test_every_other_target_keeps_13a_and_its_scores(lang):
    """Only zh / ja / ko changed tokenizer: every other language scores as it always did
    (sacreBLEU's defaults), so stored scores stand (no new scoring version)."""
    hyps, refs = ["the cat sat on the mat ."], ["the cat sat on a mat ."]
    metrics = scoring.score_translation(hyps, refs, lang)
    assert metrics["bleu"] == BLEU().corpus_score(hyps, [refs]).score
    assert "bleu_tokenized" in metrics
    assert "tok:13a" in scoring.translation_signatures(lang)["bleu"]


@pytest.mark.parametrize("lang, package", [("ja", "sacrebleu[ja]"), ("ko", "sacrebleu[ko]")])
def test_a_target_whose_tokenizer_cannot_load_is_named_with_the_package_to_install(lang,
                                                                                    package):
    """Japanese and Korean need MeCab's packages (sacrebleu[ja] / [ko]); where they are not
    installed the refusal is one line naming them, asked before anything is scored."""
    try:
        BLEU(trg_lang=lang)
    except Exception:  # noqa: BLE001 - sacreBLEU's own refusal: the packages are missing
        pass
    else:
        pytest.skip(f"{package} is installed here: {lang} scores")
    problem = scoring.bleu_problem(lang)
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"target language {lang!r}") and f"pip install '{package}'" in \
        problem
    with pytest.raises(ValueError, match=re.escape(f"pip install '{package}'")):
        scoring.score_translation(["x"], ["x"], lang)
    assert scoring.bleu_problem("zh") is None and scoring.bleu_problem("fr") is None


# --- Romanian normalization -------------------------------------------------------------------


@pytest.mark.parametrize("raw,expected", [
    ("\u015ei \u0163ara", "Si tara"),  # cedilla forms
    ("\u0218i \u021bara", "Si tara"),  # comma-below forms: same result
    ("\u00cen Rom\u00e2nia, \u201e\u015ftiin\u0163\u0103\u201d.", 'In Romania, "stiinta".'),
    ("\u0102\u00c2\u00ce\u0218\u021a \u0103\u00e2\u00ee\u0219\u021b", "AAIST aaist"),
    ("\u00abcitat\u00bb \u2018a\u2019 \u201cb\u201d", '"citat" \'a\' "b"'),
    ("caf\u00e9 M\u00fcller \u00e7a", "caf\u00e9 M\u00fcller \u00e7a"),  # other letters untouched
])
def test_normalize_romanian_examples(raw, expected):
    assert scoring.normalize_romanian(raw) == expected


def normalize_romanian_words(line: str) -> str:
    """A Romanian line with its diacritics dropped, as a model that never writes them would."""
    return line.translate(str.maketrans("\u0219\u021b\u0103\u00e2\u00ee\u0218\u021a\u0102"
                                        "\u00c2\u00ce", "staaiSTAAI"))


def test_romanian_scores_on_normalized_text(shared_data, tmp_path):
    ref = shared_data / "wmt16-en-ro" / "newstest2016.ro"
    refs = scoring.read_lines(ref)
    assert len(refs) == 1999
    raw_text = "\n".join(refs)
    assert all(c in raw_text for c in "\u0219\u021b\u0103\u00e2\u00ee\u201e\u201d")
    hyps = perturb(refs, seed=16)

    # Oracle: the scripts' replace chains on both files, then the CLI tools.
    norm_ref = write_lines(tmp_path / "ref.ro", [wmt16_romanian_scripts(x) for x in refs])
    norm_hyp = write_lines(tmp_path / "hyp.ro", [wmt16_romanian_scripts(x) for x in hyps])
    normalized = norm_ref.read_text(encoding="utf-8")
    removed = "\u0219\u021b\u015f\u0163\u0103\u00e2\u00ee\u201e\u201d"
    assert not any(c in normalized for c in removed)
    # (the three tools at once: 1.5 s less, where one after another left a core idle)
    (cli_bleu, cli_chrf), tok_ref, tok_hyp = at_once(
        lambda: sacrebleu_cli(norm_ref, norm_hyp, "-m", "bleu", "chrf"),
        lambda: sacremoses_cli(norm_ref, tmp_path / "ref.tok", "ro"),
        lambda: sacremoses_cli(norm_hyp, tmp_path / "hyp.tok", "ro"))
    (cli_tok,) = sacrebleu_cli(tok_ref, tok_hyp, "-m", "bleu", "-tok", "none", "--force")

    metrics = scoring.score_translation(hyps, refs, "ro")
    assert metrics["bleu"] == pytest.approx(cli_bleu["score"], abs=1e-6)
    assert metrics["chrf"] == pytest.approx(cli_chrf["score"], abs=1e-6)
    assert metrics["bleu_tokenized"] == pytest.approx(cli_tok["score"], abs=1e-6)
    # Normalization matters on this set: plain sacreBLEU on the raw files differs; it is
    # reported beside, as official WMT'16 scoring of the text as written prints it (a model
    # that drops diacritics loses there, not in bleu)
    (cli_raw,) = sacrebleu_cli(write_lines(tmp_path / "raw.ro", refs),
                               write_lines(tmp_path / "rawhyp.ro", hyps), "-m", "bleu")
    assert metrics["bleu_diacritics"] == pytest.approx(cli_raw["score"], abs=1e-6)
    assert metrics["bleu_diacritics"] != pytest.approx(metrics["bleu"], abs=1e-3)
    bare = [normalize_romanian_words(h) for h in refs]  # diacritics dropped: bleu forgives
    assert scoring.score_translation(bare, refs, "ro")["bleu"] == pytest.approx(100.0)
    assert scoring.score_translation(bare, refs, "ro")["bleu_diacritics"] < 60
    assert "Romanian" in scoring.translation_signatures("ro")["preprocessing"]


# --- ROUGE --------------------------------------------------------------------------------------


def test_rouge_equals_rouge_score_on_gigaword(shared_data):
    refs = scoring.read_lines(shared_data / "gigaword-sample" / "title.txt")
    assert len(refs) == 1000
    hyps = perturb(refs, seed=5)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    per_sentence = [scorer.score(r, h) for h, r in zip(hyps, refs)]

    ours = scoring.score_summarization(hyps, refs)
    for t in ("rouge1", "rouge2", "rougeL"):
        for key, field in (("r", "recall"), ("p", "precision"), ("f", "fmeasure")):
            expected = 100 * np.mean([getattr(s[t], field) for s in per_sentence])
            assert ours[f"{t}_{key}"] == pytest.approx(expected, abs=1e-9), f"{t}_{key}"
    assert 30 < ours["rouge1_f"] < 95
    n_hyp = sum(len(h.split()) for h in hyps)
    n_ref = sum(len(r.split()) for r in refs)
    assert ours["length_ratio"] == pytest.approx(n_hyp / n_ref)


def test_rouge_hand_computed_with_stemming():
    # ref: 6 tokens; hyp "the cats sat" stems to "the cat sat": 3 unigrams, 2 bigrams, LCS 3.
    r = scoring.rouge(["the cats sat"], ["the cat sat on the mat"])
    assert r["rouge1_p"] == pytest.approx(100.0)
    assert r["rouge1_r"] == pytest.approx(50.0)
    assert r["rouge1_f"] == pytest.approx(100 * 2 * 0.5 / 1.5)
    assert r["rouge2_r"] == pytest.approx(40.0)  # 2 of 5 reference bigrams
    assert r["rougeL_r"] == pytest.approx(50.0)
    # averaged over sentences, not pooled: a perfect and an empty hypothesis give 50
    assert scoring.rouge(["a b", ""], ["a b", "c d"])["rouge1_f"] == pytest.approx(50.0)


# --- errors, length ratio, CLI -----------------------------------------------------------------


def test_mismatched_counts_name_both():
    for fn in (scoring.bleu, scoring.chrf, scoring.rouge, scoring.length_ratio,
               scoring.score_summarization):
        with pytest.raises(ValueError, match="3 hypotheses but 2 references"):
            fn(["a", "b", "c"], ["a", "b"])
    with pytest.raises(ValueError, match="1 hypotheses but 2 references"):
        scoring.score_translation(["a"], ["a", "b"], "fr")
    with pytest.raises(ValueError, match="no sentences"):
        scoring.bleu([], [])


def test_length_ratio_hand_computed():
    assert scoring.length_ratio(["a b", "c"], ["a b c", "d e f"]) == pytest.approx(0.5)
    assert scoring.bleu(["a b c d"], ["a b c d e f g h"]).ratio == pytest.approx(0.5)


def test_cli_prints_the_api_numbers(en_fr, tmp_path):
    # The first 300 lines keep this test short; the metrics themselves are checked above.
    ref = write_lines(tmp_path / "ref.fr", scoring.read_lines(en_fr[0])[:300])
    hyp = write_lines(tmp_path / "hyp.fr", scoring.read_lines(en_fr[1])[:300])
    out = subprocess.run(
        [sys.executable, "-m", "convs2s", "score", "--hyp", str(hyp), "--ref", str(ref),
         "--lang", "fr", "--json"], check=True, capture_output=True, text=True).stdout
    printed = json.loads(out)
    expected = scoring.score_translation(scoring.read_lines(hyp), scoring.read_lines(ref), "fr")
    assert printed["metrics"] == pytest.approx(expected)
    assert printed["signatures"]["bleu"].startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a")

    short = write_lines(tmp_path / "short.fr", ["un", "deux"])
    bad = subprocess.run(
        [sys.executable, "-m", "convs2s", "score", "--hyp", str(short), "--ref", str(ref),
         "--lang", "fr"], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "has 2 lines" in bad.stderr and "has 300 lines" in bad.stderr


def test_score_lang_is_a_language_code_and_one_moses_lacks_is_said(tmp_path, capsys):
    """`--lang FR`, `French`, `en-fr` were scored as English without a word: refused, one
    line. A code Moses has no abbreviations for (`xx`, a typo of one) is scored as
    tokenizer.perl scores it, with English's: a note says so, and the signature too."""
    from convs2s import cli

    hyp = write_lines(tmp_path / "h", ["M. Dupont est là .", "le chat"])
    ref = write_lines(tmp_path / "r", ["M. Dupont est ici .", "le chat"])
    for lang in ("FR", "French", "en-fr"):
        with pytest.raises(SystemExit) as stop:
            cli.main(["score", "--hyp", str(hyp), "--ref", str(ref), "--lang", lang])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and f"--lang {lang!r}: give the target language's ISO " \
            "639 code" in err, err
    assert cli.main(["score", "--hyp", str(hyp), "--ref", str(ref), "--lang", "fr"]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(["score", "--hyp", str(hyp), "--ref", str(ref), "--lang", "xx",
                     "--json"]) == 0
    out, err = capsys.readouterr()
    assert "Moses has no nonbreaking prefixes for 'xx'" in err and len(err.splitlines()) == 1
    assert "(Moses has no nonbreaking prefixes for xx: English's)" in \
        json.loads(out)["signatures"]["preprocessing"]
    assert "nonbreaking" not in scoring.translation_signatures("fr")["preprocessing"]
    # Chinese: no tokenized BLEU to say anything about (it once said English's were used)
    assert cli.main(["score", "--hyp", str(hyp), "--ref", str(ref), "--lang", "zh"]) == 0
    assert capsys.readouterr().err == ""


def test_a_byte_order_mark_at_a_files_start_is_not_part_of_its_first_line(tmp_path):
    """An editor's byte-order mark at the start of a hypothesis or reference file is not
    scored as text: the same lines score the same with it, CRLF line ends too."""
    lines = ["the cat sat on the mat .", "a dog ran in the park ."]
    ref = write_lines(tmp_path / "ref.en", lines)
    marked = tmp_path / "hyp.en"
    marked.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    assert scoring.read_lines(marked) == lines
    assert scoring.score_translation(scoring.read_lines(marked), scoring.read_lines(ref),
                                     "en")["bleu"] == pytest.approx(100.0)


def test_a_gzip_file_is_read_as_sacrebleus_cli_reads_it_and_a_bad_one_is_named(tmp_path):
    """A .gz reference or hypothesis (the Multi30k test sets come so) is decompressed, as
    sacrebleu's CLI reads one; a damaged one or one not UTF-8 is a ValueError naming the flag
    and the file (`score`, and `python -m workflows.evaluation --test`, read it so)."""
    import gzip

    lines = ["\ufeffno: first line", "a second line"]
    (tmp_path / "ref.de.gz").write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
    assert scoring.read_lines(tmp_path / "ref.de.gz") == ["no: first line", "a second line"]
    whole = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    (tmp_path / "cut.de.gz").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(ValueError, match=rf"--ref {tmp_path / 'cut.de.gz'} is a damaged gzip "
                                         "file .*give it compressed whole"):
        scoring.text_lines("--ref", tmp_path / "cut.de.gz")
    (tmp_path / "latin.de").write_bytes(b"x\n" * 60_000 + "caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"--test t: .*latin\.de is not UTF-8 text \(line "
                                         r"60001, byte 4 of it: b'\\xe9'\)"):
        scoring.text_lines("--test t:", tmp_path / "latin.de")  # (past a decoder's chunk)


def test_a_pipe_is_read_whole_and_a_named_uri_never_shows_its_password(tmp_path):
    """`score --hyp <(cat hyps)` read a pipe twice (its first bytes looked at for gzip, then
    opened again): 77 of 3,000 lines lost, scored, exit 0. A pipe, gzip or not, is read once,
    whole; a URI's user:password@ is never in the error line."""
    import gzip
    import os
    import threading

    lines = [f"the line number {i}" for i in range(3000)]
    for data in ("\n".join(lines).encode() + b"\n", gzip.compress(
            "\n".join(lines).encode() + b"\n")):
        fifo = tmp_path / "pipe"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        writer = threading.Thread(target=fifo.write_bytes, args=(data,))
        writer.start()
        assert scoring.text_lines("--hyp", fifo) == lines
        writer.join()
    for uri, shown in (("s3://AK:SECRET@b/x", "s3://***@b/x"),
                       ("https://bob:hunter2@example.invalid/r.txt",
                        "https://***@example.invalid/r.txt")):
        with pytest.raises(ValueError) as err:
            scoring.text_lines("--ref", uri)
        assert str(err.value) == f"--ref {shown} does not exist"
    with pytest.raises(ValueError, match=r"--ref .* is a folder: give a text file"):
        scoring.text_lines("--ref", tmp_path)
