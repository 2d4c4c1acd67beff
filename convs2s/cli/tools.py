"""The smaller commands of `python -m convs2s`: average, score, attention, import-fairseq,
export-fairseq, and train (the loop without Ray, convs2s.train.local). Each imports what it
needs when it runs."""

from __future__ import annotations

import argparse
import json
import sys

from convs2s.config import SearchConfig
from convs2s.metrics.task_kinds import KINDS, task_kind


def average(argv: list[str] | None = None) -> int:
    """python -m convs2s average."""
    p = argparse.ArgumentParser(prog="python -m convs2s average",
                                description="Average the weights of checkpoint directories.")
    p.add_argument("checkpoints", nargs="+", help="checkpoint directories of one run")
    p.add_argument("--out", required=True, help="output checkpoint directory")
    args = p.parse_args(argv)
    from convs2s.io.averaging import average_checkpoints
    from convs2s.io.checkpoint import CheckpointError

    try:
        print(average_checkpoints(args.checkpoints, args.out))
    except (CheckpointError, OSError, ValueError) as err:  # one line naming the file, exit 2
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


def score(argv: list[str] | None = None) -> int:
    """python -m convs2s score."""
    p = argparse.ArgumentParser(prog="python -m convs2s score",
                                description="sacreBLEU / chrF or ROUGE of a hypotheses file.")
    p.add_argument("--hyp", required=True, help="hypotheses, one detokenized sentence per line")
    p.add_argument("--ref", required=True, help="references, line-aligned with --hyp")
    p.add_argument("--lang", help="target language (needed for translation: fr, de, ro, ...)")
    p.add_argument("--task", choices=sorted(KINDS), default="translation",
                   help="the task kind, which decides the metrics (default: translation)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = p.parse_args(argv)
    try:
        hyps, refs = _text_file_lines("--hyp", args.hyp), _text_file_lines("--ref", args.ref)
    except ValueError as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    if len(hyps) != len(refs):
        p.error(f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)} lines")
    if args.task == "translation":
        _check_score_lang(p, args.lang)
    kind = task_kind(args.task)
    try:
        metrics, signatures = kind.score(hyps, refs, args.lang), kind.signatures(args.lang)
    except ValueError as err:  # (nothing to score: empty files)
        print(f"{p.prog}: error: {args.hyp}, {args.ref}: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"metrics": metrics, "signatures": signatures}, indent=1))
    else:
        for name, value in metrics.items():
            print(f"{name}\t{value:.4f}")
        for name, sig in signatures.items():
            print(f"# {name}: {sig}")
    return 0


def _check_score_lang(p: argparse.ArgumentParser, lang: str | None) -> None:
    """--lang for a translation: a language code as sacreBLEU and Moses read it (two or three
    lowercase letters; `FR`, `French` or `en-fr` would be scored as English without a word).
    A code Moses has no abbreviations for is scored as tokenizer.perl scores it, with
    English's, and a note says so (a typo, `--lang fe`, is seen)."""
    import re

    from convs2s.metrics.scoring import UNSPACED_TARGETS, moses_has_prefixes

    if not lang:
        p.error("--lang is required for translation (the target language, e.g. fr)")
    if not re.fullmatch(r"[a-z]{2,3}", lang):
        p.error(f"--lang {lang!r}: give the target language's ISO 639 code, two or three "
                "lowercase letters (fr, de, ro, ...)")
    if lang not in UNSPACED_TARGETS and not moses_has_prefixes(lang):  # (no bleu_tokenized
        # for those: Moses does not segment them)
        print(f"{p.prog}: note: Moses has no nonbreaking prefixes for {lang!r}: bleu_tokenized "
              "splits its sentences with English's, as tokenizer.perl does (check --lang if "
              "that is not the target language)", file=sys.stderr)


def _text_file_lines(flag: str, path: str) -> list[str]:
    """The lines `score` reads (convs2s.metrics.scoring.text_lines: a file that is missing,
    unreadable, not UTF-8 or a damaged .gz is a ValueError naming it)."""
    from convs2s.metrics.scoring import text_lines

    return text_lines(flag, path)


def attention(argv: list[str] | None = None) -> int:
    """python -m convs2s attention."""
    p = argparse.ArgumentParser(prog="python -m convs2s attention",
                                description="Per-layer attention heatmaps (paper appendix C).")
    p.add_argument("--checkpoint", nargs="+", required=True)
    p.add_argument("--out", required=True, help="output folder for the PNG files")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len-b", type=int, default=200, help="most output pieces")
    p.add_argument("sentences", nargs="+", help="source sentences to translate and plot")
    args = p.parse_args(argv)
    try:  # (a bad --beam or --max-len-b before torch loads)
        search = SearchConfig(beam=args.beam, max_len_b=args.max_len_b)
    except ValueError as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    if blank := [i + 1 for i, s in enumerate(args.sentences) if not s.strip()]:
        # (a blank one has no translation to plot: it was skipped without a word, and the
        # pictures' numbers, attention_<i>.png, went on as if it were there)
        print(f"{p.prog}: error: sentence{'s' if len(blank) > 1 else ''} "
              f"{', '.join(map(str, blank))} of {len(args.sentences)} "
              f"{'are' if len(blank) > 1 else 'is'} blank: give each sentence to plot as one "
              "non-empty argument", file=sys.stderr)
        return 2
    from convs2s.inference.attention_plot import plot_attention
    from convs2s.inference.quantize import PrecisionError
    from convs2s.inference.translate import CheckpointError, load_for_inference

    try:
        translator = load_for_inference(args.checkpoint, search=search)
        paths = plot_attention(translator, args.sentences, args.out)
    except (CheckpointError, PrecisionError, OSError, ValueError) as err:  # one line naming
        # the file (StorageError and a refused --out are ValueErrors)
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def import_fairseq(argv: list[str] | None = None) -> int:
    """python -m convs2s import-fairseq: a reference fconv archive -> a checkpoint directory."""
    p = argparse.ArgumentParser(
        prog="python -m convs2s import-fairseq",
        description="Import a trained fconv model of the reference implementation (an unpacked "
                    "archive such as wmt14.v2.en-fr.fconv-py: model.pt, dict.<src>.txt, "
                    "dict.<tgt>.txt, bpecodes) as a checkpoint directory that translate, "
                    "evaluation, averaging and serving accept.")
    p.add_argument("archive", help="the unpacked archive folder")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--source-lang", help="when the saved arguments do not name it")
    p.add_argument("--target-lang", help="when the saved arguments do not name it")
    args = p.parse_args(argv)
    from convs2s.io.fairseq import FairseqImportError
    from convs2s.io.fairseq import import_fairseq as run

    try:
        out = run(args.archive, args.out, args.source_lang, args.target_lang)
    except (FairseqImportError, OSError, ValueError) as err:  # one line, nothing written
        print(f"import-fairseq: error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


def export_fairseq(argv: list[str] | None = None) -> int:
    """python -m convs2s export-fairseq: a checkpoint directory -> a reference archive."""
    p = argparse.ArgumentParser(
        prog="python -m convs2s export-fairseq",
        description="Write a checkpoint as an archive the reference implementation loads "
                    "(model.pt with its arguments, dict.<src>.txt, dict.<tgt>.txt, and the "
                    "bpecodes or sentencepiece.model).")
    p.add_argument("checkpoint", help="a checkpoint directory (best/, checkpoint_*, imported)")
    p.add_argument("--out", required=True, help="archive folder to write")
    args = p.parse_args(argv)
    from convs2s.io.checkpoint import CheckpointError
    from convs2s.io.fairseq import export_fairseq as run

    try:
        out = run(args.checkpoint, args.out)
    except (CheckpointError, OSError, ValueError) as err:
        print(f"export-fairseq: error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


def train(argv: list[str] | None = None) -> int:
    """python -m convs2s train: the training loop without Ray (convs2s.train.local)."""
    from convs2s.train.local import main as train_main

    return train_main(argv)
