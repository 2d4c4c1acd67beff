"""Scores for translation and summarization output: sacreBLEU, tokenized BLEU, chrF, ROUGE.

All inputs are detokenized text, one sentence per list item (or file line), hypotheses and
references aligned. The numbers (docs/reference.md, Evaluation):

- `bleu`: sacreBLEU with its defaults (tok 13a, smooth exp, case mixed) and its signature: the
  project's main number, equal to what the `sacrebleu` command-line tool prints. It is also the
  paper-comparable number for WMT'16 En-Ro: the paper scores En-Ro with detokenized BLEU
  (§4.3), here on the normalized Romanian text below. Chinese, Japanese and Korean targets,
  written without spaces between words, are tokenized as sacreBLEU does for them
  (`sacrebleu -l xx-zh`: tok zh, ja-mecab, ko-mecab; the last two need `sacrebleu[ja]` /
  `sacrebleu[ko]`): 13a would make each sentence one token. Every other target: 13a.
- `bleu_tokenized`: the paper-comparable number for WMT'14 En-De and En-Fr (§4.3: case-sensitive
  tokenized BLEU). Hypotheses and references are both tokenized the way fairseq's
  prepare-wmt14en2de.sh / prepare-wmt14en2fr.sh (the ConvS2S data) tokenized the test
  references: `’` to `'`, then Moses `tokenizer.perl -a -l <lang>` (sacremoses, target-language
  rules, aggressive hyphen splitting: `Hotel-Zimmer` -> `Hotel @-@ Zimmer`; no XML escaping,
  which maps each token to one token and so leaves BLEU as it is). sacreBLEU then scores them
  with `tokenize="none", force=True` (what multi-bleu.perl computed on tokenized text).
  Not computed for Chinese, Japanese or Korean targets: Moses does not segment them either.
- `chrf`: sacreBLEU's chrF2 defaults (character 6-grams, no word n-grams, beta 2).
- ROUGE-1/2/L recall, precision and F1 (rouge-score, Porter stemming on, as ROUGE-1.5.5's `-m`
  in the standard Gigaword evaluation of Rush et al. 2015, whose setup the paper follows,
  §4.1; the paper itself does not say), averaged over sentences, in %.
- Romanian targets: both sides are normalized as in the WMT'16 En-Ro pipeline (s/t with cedilla
  to comma-below, typographic quotes to ASCII, then Romanian diacritics removed) before every
  metric: the pre-processing of Sennrich et al. (2016b), whose data and pre-processing the paper
  uses for En-Ro (§4.1); the paper does not say whether its En-Ro references kept diacritics.
  `bleu_diacritics` (Romanian targets only): sacreBLEU on the text as written, diacritics kept,
  as official WMT'16 scoring of the released references prints it; a model that drops or
  misplaces diacritics loses there, not in `bleu`.

Run:
    python -m convs2s score --hyp hyp.fr --ref ../shared/data/wmt14-en-fr/newstest2014.fr --lang fr
    python -m convs2s score --hyp hyp.txt --ref ../shared/data/gigaword-sample/title.txt \
        --task summarization
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF

# sacremoses and rouge_score are imported where used: a GPU box with PyTorch and sacreBLEU but
# not these two still imports this module (translation and BLEU need neither).

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
# Stemming on: the Gigaword / DUC ROUGE numbers the paper compares against were computed with
# ROUGE-1.5.5 and its `-m` (Porter stemmer) flag; rouge-score's use_stemmer=True is close to it
# (it stems only tokens longer than 3 characters: on a lead baseline of the Gigaword sample,
# ROUGE-1/2/L F1 32.76 / 12.13 / 30.87 against 32.82 / 12.13 / 30.89 with every token stemmed).
ROUGE_USE_STEMMER = True

# WMT'16 Romanian normalization (Sennrich et al. 2016's wmt16-scripts): normalise-romanian.py
# turns s/t with cedilla (U+015E/F, U+0162/3) into the comma-below letters (U+0218/9, U+021A/B);
# remove-diacritics.py then maps s/t comma-below, a-breve, a-circumflex and i-circumflex to
# ASCII. Typographic quotes become ASCII as the Moses punctuation normalizer run just before
# those scripts does (newstest2016.ro quotes with „...”). All maps are one char to one char.
_RO_TABLE = str.maketrans({
    # normalise-romanian: cedilla forms -> comma-below forms (then stripped below)
    "\u015e": "S", "\u015f": "s", "\u0162": "T", "\u0163": "t",
    # remove-diacritics: comma-below s/t, a-breve, a-circumflex, i-circumflex
    "\u0218": "S", "\u0219": "s", "\u021a": "T", "\u021b": "t",
    "\u0102": "A", "\u0103": "a", "\u00c2": "A", "\u00e2": "a", "\u00ce": "I", "\u00ee": "i",
    # quotes: „ “ ” « » -> "   and   ‚ ‘ ’ -> '
    "\u201e": '"', "\u201c": '"', "\u201d": '"', "\u00ab": '"', "\u00bb": '"',
    "\u201a": "'", "\u2018": "'", "\u2019": "'",
})


@dataclass(frozen=True)
class BleuScore:
    """A corpus BLEU score as sacreBLEU reports it (score in 0..100)."""

    score: float
    signature: str  # e.g. "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    counts: list[int]  # matched n-grams, n = 1..4
    totals: list[int]  # hypothesis n-grams, n = 1..4
    precisions: list[float]  # n-gram precisions in %
    bp: float  # brevity penalty
    ratio: float  # hypothesis length / reference length (in the metric's tokens)
    sys_len: int
    ref_len: int


def _check_pair(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(
            f"{len(hyps)} hypotheses but {len(refs)} references: they must be line-aligned "
            "(one hypothesis per reference line, empty lines kept)"
        )
    if not hyps:
        raise ValueError("no sentences to score (0 hypotheses, 0 references)")


def _bleu_with(metric: BLEU, hyps: list[str], refs: list[str]) -> BleuScore:
    _check_pair(hyps, refs)
    s = metric.corpus_score(list(hyps), [list(refs)])
    return BleuScore(
        score=s.score,
        signature=f"{s.name}|{metric.get_signature().format()}",
        counts=list(s.counts),
        totals=list(s.totals),
        precisions=list(s.precisions),
        bp=s.bp,
        ratio=s.sys_len / s.ref_len if s.ref_len else 0.0,
        sys_len=s.sys_len,
        ref_len=s.ref_len,
    )


# Targets written without spaces between words: sacreBLEU's tokenizer for each (its BLEU's
# choice for `trg_lang`, as `sacrebleu -l en-zh` makes it) and the package it needs. On them
# 13a finds one token per sentence and Moses none either, so BLEU would mean nothing.
UNSPACED_TARGETS = {"zh": ("zh", None), "ja": ("ja-mecab", "sacrebleu[ja]"),
                    "ko": ("ko-mecab", "sacrebleu[ko]")}


def base_language(lang: str | None) -> str | None:
    """The language a scorer's rules are looked up by: the code's base, lowercase ("zh-Hant",
    "zh_CN", "ZH" -> "zh"; "ro-RO" -> "ro"). A region or script, or capitals, found no rule:
    Chinese was scored with 13a (one token a sentence), Romanian without its normalization."""
    if lang is None:
        return None
    return re.split(r"[-_]", lang.strip(), maxsplit=1)[0].lower()


def bleu_metric(tgt_lang: str | None = None) -> BLEU:
    """sacreBLEU's BLEU for a target language: 13a, or the tokenizer of an unspaced language
    (UNSPACED_TARGETS); a ValueError (one line naming the package to install) where sacreBLEU
    cannot build that tokenizer."""
    tgt_lang = base_language(tgt_lang)
    if tgt_lang not in UNSPACED_TARGETS:
        return BLEU()  # 13a: every other language, its scores as they always were
    try:
        return BLEU(trg_lang=tgt_lang)
    except Exception as err:  # sacreBLEU's RuntimeError names the package in several lines
        tok, package = UNSPACED_TARGETS[tgt_lang]
        why = f"pip install '{package}'" if package else str(err).strip().splitlines()[0]
        raise ValueError(f"target language {tgt_lang!r}: sacreBLEU scores it with its {tok} "
                         f"tokenizer, which cannot load here ({type(err).__name__}); "
                         f"{why}") from None


def bleu_problem(tgt_lang: str | None) -> str | None:
    """Why BLEU cannot score `tgt_lang` on this machine (`bleu_metric`'s refusal), or None:
    asked before a run starts, not after it has trained."""
    try:
        bleu_metric(tgt_lang)
    except ValueError as err:
        return str(err)
    return None


def bleu(hyps: list[str], refs: list[str], tgt_lang: str | None = None) -> BleuScore:
    """sacreBLEU on detokenized text with the tool's defaults (smooth exp, mixed case) and its
    tokenizer for the target language (`bleu_metric`: 13a but for zh / ja / ko)."""
    return _bleu_with(bleu_metric(tgt_lang), hyps, refs)


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """Tokenize each line as fairseq's prepare-wmt14en2{de,fr}.sh tokenized the paper's test
    references: `’` to `'` (its sed), then `tokenizer.perl -a -l lang` (aggressive hyphen
    splitting), without XML escaping (`-no-escape`: BLEU is the same either way)."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=base_language(lang))
    return [tok.tokenize(line.replace("\u2019", "'"), aggressive_dash_splits=True, escape=False,
                         return_str=True) for line in lines]


def moses_has_prefixes(lang: str) -> bool:
    """Whether Moses has nonbreaking prefixes (the abbreviations a period does not end, `Mr.`)
    for `lang`. For a language without them sacremoses, as tokenizer.perl, splits with
    English's (the perl script warns; sacremoses says nothing): the signature says so."""
    from sacremoses.corpus import NonbreakingPrefixes

    return base_language(lang) in NonbreakingPrefixes().available_langs.values()


def tokenized_bleu(hyps: list[str], refs: list[str], lang: str) -> BleuScore:
    """Tokenized BLEU (the paper's for WMT'14): both sides through `moses_tokenize`, then
    sacreBLEU with tokenize='none'. Not for Chinese, Japanese or Korean (UNSPACED_TARGETS):
    Moses leaves their sentences unsegmented."""
    if base_language(lang) in UNSPACED_TARGETS:
        raise ValueError(f"tokenized BLEU is not defined for {lang!r}: Moses does not segment "
                         "it into words; use bleu (sacreBLEU's own tokenizer for it)")
    _check_pair(hyps, refs)
    metric = BLEU(tokenize="none", force=True)
    return _bleu_with(metric, moses_tokenize(hyps, lang), moses_tokenize(refs, lang))


def chrf(hyps: list[str], refs: list[str]) -> float:
    """chrF2 with sacreBLEU's defaults, in 0..100."""
    _check_pair(hyps, refs)
    return CHRF().corpus_score(list(hyps), [list(refs)]).score


def normalize_romanian(text: str) -> str:
    """WMT'16 Romanian normalization: cedilla s/t and quotes unified, then diacritics removed."""
    return text.translate(_RO_TABLE)


def rouge(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """ROUGE-1/2/L recall (_r), precision (_p), F1 (_f), averaged over sentences, in %."""
    from rouge_score import rouge_scorer

    _check_pair(hyps, refs)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=ROUGE_USE_STEMMER)
    sums = {f"{t}_{k}": 0.0 for t in ROUGE_TYPES for k in "rpf"}
    for hyp, ref in zip(hyps, refs):
        scores = scorer.score(ref, hyp)  # rouge-score's order: (target, prediction)
        for t in ROUGE_TYPES:
            sums[f"{t}_r"] += scores[t].recall
            sums[f"{t}_p"] += scores[t].precision
            sums[f"{t}_f"] += scores[t].fmeasure
    return {k: 100.0 * v / len(hyps) for k, v in sums.items()}


def length_ratio(hyps: list[str], refs: list[str]) -> float:
    """Total whitespace tokens of the hypotheses / of the references."""
    _check_pair(hyps, refs)
    ref_tokens = sum(len(r.split()) for r in refs)
    if ref_tokens == 0:
        raise ValueError("the references have no tokens: length ratio undefined")
    return sum(len(h.split()) for h in hyps) / ref_tokens


def score_translation(hyps: list[str], refs: list[str], tgt_lang: str) -> dict[str, float]:
    """Metrics of a translation test set, for MLflow: bleu, bleu_tokenized, chrf, length_ratio
    (no bleu_tokenized for Chinese, Japanese or Korean: UNSPACED_TARGETS).

    length_ratio is sacreBLEU's hypothesis / reference length on its BLEU tokens (the `ratio`
    it prints). Romanian targets are normalized first (module docstring).
    """
    _check_pair(hyps, refs)
    base = base_language(tgt_lang)
    out = {}
    if base == "ro":  # (and the text as written: what official WMT'16 scoring prints)
        out["bleu_diacritics"] = bleu(hyps, refs, tgt_lang).score
        hyps = [normalize_romanian(h) for h in hyps]
        refs = [normalize_romanian(r) for r in refs]
    detok = bleu(hyps, refs, tgt_lang)
    out = {"bleu": detok.score, **out}
    if base not in UNSPACED_TARGETS:
        out["bleu_tokenized"] = tokenized_bleu(hyps, refs, tgt_lang).score
    return {**out, "chrf": chrf(hyps, refs), "length_ratio": detok.ratio}


def translation_signatures(tgt_lang: str) -> dict[str, str]:
    """Signatures of score_translation's metrics (for MLflow tags), plus the preprocessing used."""
    # sacreBLEU only fills `nrefs` into a signature after scoring; every score here is against
    # one reference, so score a one-line pair once to read the signatures.
    bleu_sig = bleu(["x"], ["x"], tgt_lang).signature
    chrf_metric = CHRF()
    chrf_metric.corpus_score(["x"], [["x"]])
    sigs = {"bleu": bleu_sig}
    base = base_language(tgt_lang)
    if base in UNSPACED_TARGETS:
        pre = f"bleu_tokenized: not computed for {tgt_lang} (Moses does not segment it)"
    else:
        sigs["bleu_tokenized"] = _bleu_with(BLEU(tokenize="none", force=True), ["x"],
                                            ["x"]).signature
        pre = (f"bleu_tokenized: U+2019 to ', sacremoses {version('sacremoses')} tokenizer "
               f"lang={tgt_lang}, aggressive dash splits (-a), no escape")
        if not moses_has_prefixes(tgt_lang):
            pre += f" (Moses has no nonbreaking prefixes for {tgt_lang}: English's)"
    if base == "ro":
        pre += "; all metrics: WMT16 Romanian normalise + remove-diacritics, quotes to ASCII"
    return {**sigs, "chrf": f"chrF2|{chrf_metric.get_signature().format()}",
            "preprocessing": pre}


def score_summarization(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """Metrics of a summarization test set: rouge{1,2,L}_{r,p,f} (in %) and length_ratio.

    Inputs are the tokenized, lowercased Gigaword text; length_ratio counts whitespace tokens.
    """
    return {**rouge(hyps, refs), "length_ratio": length_ratio(hyps, refs)}


def rouge_signature() -> str:
    """How `rouge` scores: the package and version, the ROUGE types, stemming, averaging."""
    return (f"rouge-score {version('rouge-score')} {'/'.join(ROUGE_TYPES)} "
            f"use_stemmer={ROUGE_USE_STEMMER}, sentence mean")


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file as sacrebleu's CLI reads them (split on \\n, rstripped; a
    gzip file, known by its first bytes, decompressed, as sacrebleu's CLI reads a .gz), without
    a byte-order mark at its start (an editor's; kept, it is part of the first line's first
    word, and that line's n-grams no longer match: 100 BLEU became 79.8 on two lines)."""
    # Opened once and looked into without reading on (a pipe, `<(...)`, is read once: its
    # first bytes read by a check, then opened again, lost 77 of 3,000 lines, scored, exit 0)
    with _opened(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="\n")
        return [line.rstrip() for line in text]


def _opened(path: str | Path):
    """The file's bytes, decompressed when its first bytes say gzip."""
    raw = open(path, "rb")
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def _first_not_utf8(data: bytes) -> str:
    """Where the first byte of `data` that is not UTF-8 is: "line L, byte B of it: b'..'" (a
    text decoder's error gives an offset into its own chunk, not into the file)."""
    for number, line in enumerate(data.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"line {number}, byte {err.start + 1} of it: {line[err.start:err.end]!r}"
    return "a byte of it"


def text_lines(flag: str, path: str | Path) -> list[str]:
    """`read_lines` of a file a user named with `flag`: one that is missing, unreadable, not
    UTF-8 or a damaged gzip file is a ValueError naming it (and the fix)."""
    from storage.paths import shown as shown_uri

    shown = shown_uri(str(path))  # (a URI's user:password@ is never shown)
    if Path(path).is_dir():
        raise ValueError(f"{flag} {shown} is a folder: give a text file")
    try:
        data = _read_whole(path)
        return [line.rstrip() for line in io.StringIO(
            data.decode("utf-8-sig"), newline="\n")]
    except FileNotFoundError:
        raise ValueError(f"{flag} {shown} does not exist") from None
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {shown} is not UTF-8 text ({_first_not_utf8(data)}): give it "
                         "as UTF-8") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise ValueError(f"{flag} {shown} is a damaged gzip file ({err or type(err).__name__}): "
                         "give it compressed whole, or uncompressed") from None
    except OSError as err:
        raise ValueError(f"{flag} {shown} cannot be read: {err.strerror or err}") from None


def _read_whole(path: str | Path) -> bytes:
    """The file's bytes, decompressed when gzip, read once (a pipe too)."""
    with _opened(path) as f:
        return f.read()
