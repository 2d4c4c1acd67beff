"""The command lines of the model package, apart from its library modules:

    convs2s-translate --checkpoint runs/demo/best [runs/other/best ...] < src.txt > hyp.txt
    python -m convs2s translate --checkpoint ... --input src.txt --output hyp.txt [--beam 5 ...]
    python -m convs2s translate --checkpoint ... --input mono.en.gz --output parts/ --actors 4
    python -m convs2s serve --checkpoint runs/demo/best  (or --model models:/NAME@champion)
    python -m convs2s train --train-data CUT/train --valid-data CUT/valid \\
        --spm-model PREP/spm/spm.model --storage-path runs --run-name demo  (no Ray: train/local.py;
        CUT: a preprocessing output's batches for one token budget, PREP/batches/<hash>)
    python -m convs2s average --out runs/demo/avg runs/demo/checkpoint_*
    python -m convs2s score --hyp hyp.fr --ref newstest2014.fr --lang fr [--json]
    python -m convs2s attention --checkpoint runs/demo/best --out pics "the cat is small ."
    python -m convs2s import-fairseq wmt14.v2.en-fr.fconv-py --out runs/paper/en-fr
    python -m convs2s export-fairseq runs/demo/best --out exported/

Bad input (a missing or unreadable file, a checkpoint that is not ours) is one line on stderr
naming the file, exit status 2; nothing half-written is left behind.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from convs2s.config import INFERENCE_PRECISIONS, SearchConfig
from convs2s.metrics.task_kinds import KINDS, task_kind
from storage import StorageError, check_storage, is_uri, location
from storage.scratch import scratch_dir

# Each command imports what it needs when it runs: `convs2s-translate` does not pay for
# matplotlib (attention) or sacreBLEU / rouge (score) at start-up.

log = logging.getLogger("convs2s.inference.translate")


# --- translate --------------------------------------------------------------------------------


def _check_input(path: str | None) -> None:
    """A named input must be a readable file (checked before any output is touched)."""
    if path in (None, "-"):
        return
    if not path.strip():
        raise FileNotFoundError("--input is empty: give a text file with one sentence per line "
                                "(or - for the standard input)")
    p = location(path)  # a local file, or an object in a bucket
    if p.is_dir():
        raise FileNotFoundError(f"input {path} is a directory: give a text file with one "
                                "sentence per line")
    if not p.is_file():
        raise FileNotFoundError(f"input file {path} does not exist")


def _check_not_the_input(path: str | None, output: str | None) -> None:
    """--output naming the --input file would replace the source by its translation."""
    if path in (None, "-") or not output:
        return
    src, dst = location(path), location(output)
    same = src.samefile(dst) if isinstance(src, Path) and isinstance(dst, Path) \
        and dst.exists() else str(src) == str(dst)
    if same:
        raise ValueError(f"--output {output} is the --input file: its translation would "
                         "replace the source; give another --output")


_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def _check_device(asked: str | None) -> None:
    """--device names cpu or cuda[:N] (checked before torch loads)."""
    if asked is not None and not _DEVICE.match(asked):
        raise ValueError(f"--device {asked}: give cpu, cuda or cuda:N")


def _inference_device(asked: str | None, precision: str) -> str:
    """The device to translate on: --device (its GPU visible here), else cuda when a GPU is
    visible (int8 weights run on PyTorch's quantized CPU kernels: the CPU)."""
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if asked is None:
        return "cuda" if visible and precision != "int8" else "cpu"
    index = int(asked.partition(":")[2] or 0)
    if asked.startswith("cuda") and index >= visible:  # (else a traceback from inside torch)
        raise ValueError(f"--device {asked}: " + (
            f"this process sees {visible} CUDA GPU(s)" if visible else
            f"no CUDA GPU is visible here (torch {torch.__version__}); give --device cpu or "
            "leave it out"))
    return asked


def _check_flags(args) -> None:
    """Flags that would be taken and then not used: refused."""
    given = [f"--{f.replace('_', '-')}" for f in ("device", "buffer_size")
             if getattr(args, f) is not None]
    if args.actors and given:
        raise ValueError(f"{' and '.join(given)}: the --actors job does not use "
                         f"{'it' if len(given) == 1 else 'them'} (each actor's device is "
                         "--gpus-per-actor's; its unit of work is --shard-lines)")
    # (their defaults are None / False: given, not only set; a namespace without them, a
    # caller's own, gives none)
    for_actors = [f"--{f.replace('_', '-')}" for f in ("gpus_per_actor", "shard_lines",
                                                       "no_progress")
                  if getattr(args, f, None) not in (None, False)]
    if not args.actors and for_actors:
        raise ValueError(f"{' and '.join(for_actors)}: only the --actors job uses "
                         f"{'it' if len(for_actors) == 1 else 'them'}; give --actors N, or "
                         "leave it out (one process: --device, --buffer-size)")
    if args.column and not str(args.input or "").lower().endswith(".parquet"):  # (as read)
        raise ValueError(f"--column {args.column}: only a .parquet --input has columns")
    buffer_size, threads = getattr(args, "buffer_size", None), getattr(args, "threads", 0)
    if buffer_size is not None and buffer_size < 1:  # (0 was read as 10,000; < 0: no cut)
        raise ValueError(f"--buffer-size {buffer_size}: give a number of lines >= 1")
    if threads is not None and threads < 0:
        raise ValueError(f"--threads {threads}: give a number >= 1 (0: the CPUs this process "
                         "may use)")


def _output_files(output: str | None) -> tuple[Path | None, Path | None]:
    """Where translate writes --output: (the local file it ends up as, the temporary file
    written first), either None where it does not apply. Translations go to a temporary file
    beside the output, renamed over it only when all are written: a failed run never leaves an
    emptied or half-written output. In a bucket: a local scratch file, uploaded as one object
    once complete. A symlink's target is written (the link stays); a FIFO or a device
    (/dev/stdout) is written as it is: renaming over them replaced them with a file."""
    if not output:
        return None, None
    if is_uri(output):
        return None, scratch_dir("convs2s-translate-") / "out"
    target = Path(os.path.realpath(output))
    if target.exists() and not target.is_file():
        return target, None
    return target, target.with_name(f"{target.name}.tmp-{os.getpid()}")


def _read_lines(path: str | None, column: str | None = None,
                non_utf8: dict | None = None) -> Iterator[str]:
    """Lines split on \\n only (as the scorer reads references). A line that is not UTF-8 is
    an empty line (its translation an empty line, as `--actors` gives it: the same outputs
    either way), counted in `non_utf8` ({"count", "first"}: the first one's line number). A
    named input (checked with `_check_input`) is read as --actors reads it: text, .gz or a
    parquet column (`convs2s.serving.corpus.input_lines`); it is opened here, so a .gz that is
    not gzip or a missing column is a CorpusError before anything loads."""
    if path in (None, "-"):
        raw = (line.rstrip(b"\n") for line in sys.stdin.buffer)

        def decoded(line: bytes) -> str | None:
            try:
                return line.decode("utf-8")
            except UnicodeDecodeError:
                return None

        lines = (decoded(line) for line in raw)
    else:
        from convs2s.serving.corpus import input_lines

        lines = input_lines(path, column)

    def kept() -> Iterator[str]:
        for number, line in enumerate(lines, 1):
            if line is None and non_utf8 is not None:
                non_utf8["count"] += 1
                non_utf8["first"] = non_utf8["first"] or number
            yield "" if line is None else line

    return kept()


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _translate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="convs2s-translate", description="Translate text with "
                                "ConvS2S checkpoints (one model or an ensemble).")
    d = SearchConfig()
    p.add_argument("--checkpoint", nargs="+", required=True,
                   help="checkpoint directories; several = an ensemble")
    p.add_argument("--spm-model", help="sentencepiece model (default: the one bundled with "
                   "the checkpoints)")
    p.add_argument("--input", help="source text, one sentence per line (default: stdin); "
                   "a .gz of it, or a .parquet file's text column")
    p.add_argument("--column", help="parquet input: the text column (default: its only "
                   "string column)")
    p.add_argument("--output", help="where translations go (default, or -: stdout)")
    p.add_argument("--beam", type=int, default=d.beam)
    p.add_argument("--lenpen", type=float, default=d.lenpen)
    p.add_argument("--max-len-a", type=float, default=d.max_len_a)
    p.add_argument("--max-len-b", type=int, default=d.max_len_b)
    p.add_argument("--min-len", type=int, default=d.min_len)
    p.add_argument("--unk-penalty", type=float, default=d.unk_penalty)
    p.add_argument("--nbest", type=int, default=d.nbest)
    p.add_argument("--replace-unk", action="store_true",
                   help="replace <unk> by the most attended source word")
    p.add_argument("--dictionary", help="`source target` word table for --replace-unk")
    p.add_argument("--batch-size", type=int, default=d.max_sentences,
                   help="sentences per search batch")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens,
                   help="also cut a batch at this many padded source tokens (0: sentences only)")
    p.add_argument("--precision", choices=INFERENCE_PRECISIONS, default=d.precision,
                   help="weights to search with: fp32 as trained (default); bf16 (fast where "
                        "the hardware has native bf16); int8 (per-channel int8 weights, CPU)")
    p.add_argument("--precision-fallback", choices=["fp32"], default=d.precision_fallback,
                   help="where --precision cannot run here (no int8 kernels, no bf16 on this "
                        "GPU): serve fp32 with a warning instead of failing")
    p.add_argument("--shortlist", metavar="NPZ",
                   help="vocabulary selection: the lexical table of the model's data "
                        "(<data>/shortlist/<key>/shortlist.npz, preprocessing --shortlist)")
    p.add_argument("--shortlist-frequent", type=int, default=d.shortlist_frequent,
                   help="most frequent target tokens always in the shortlist")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when a GPU is "
                   "visible)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default: the CPUs this process may use; with "
                        "--actors: per actor, default 1)")
    p.add_argument("--buffer-size", type=int,
                   help="lines read, translated and written at a time (10,000)")
    p.add_argument("--print-attention", action="store_true",
                   help="verbose output with scores and attention alignments")
    big = p.add_argument_group(
        "a large corpus on Ray (convs2s.serving.corpus): --actors turns --output into a folder "
        "of parts with a manifest; a rerun resumes")
    big.add_argument("--actors", type=int, default=0,
                     help="translator actors of a Ray Data job (0: this process alone)")
    big.add_argument("--gpus-per-actor", type=float,
                     help="GPU share of each actor (default 0: CPU actors)")
    big.add_argument("--shard-lines", type=int,
                     help="input lines per part (10,000): the unit of work, progress and "
                          "resume; equal to --buffer-size, parts are batched as one process "
                          "batches")
    big.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _corpus_job(args, search):
    """--actors N: the corpus job, checked (its input, output folder and checkpoints) before
    torch or Ray loads; CorpusError (or StorageError) otherwise."""
    from convs2s.serving.corpus import CorpusError, CorpusJob, check_job

    if args.input in (None, "-") or not args.output:
        raise CorpusError("--actors needs --input (a file or an object) and --output (a "
                          "folder for the parts)")
    if args.print_attention:
        raise CorpusError("--print-attention is for one process; leave out --actors")
    job = CorpusJob(checkpoints=args.checkpoint, input=args.input, output=args.output,
                    search=search, actors=args.actors,
                    threads_per_actor=args.threads or 1,
                    gpus_per_actor=args.gpus_per_actor or 0.0,
                    shard_lines=10_000 if args.shard_lines is None else args.shard_lines,
                    column=args.column,
                    spm_model=args.spm_model, progress=not args.no_progress)
    check_job(job)
    if is_uri(args.output):
        check_storage(args.output, "--output", write=True)
    return job


def _corpus_interrupted(output: str) -> int:
    """Ctrl-C, or SIGTERM (`ray job stop`), during a corpus job: the line that resumes, 130."""
    # Ray Data ends the stopped job's translators when its dataset iterator is collected,
    # which reference cycles leave to Python's cyclic collector (they held their CPUs for
    # minutes in a process that went on); once the interrupt is handled (called after the
    # except block: its traceback's frames hold the iterator), nothing else holds them
    gc.collect()
    print(f"\ninterrupted: the finished parts are kept in {output}; the same command "
          "translates the rest", file=sys.stderr, flush=True)
    return 130


def _root_cause(err: BaseException) -> str:
    """`Type: first line` of the error that started a chain of Ray's wrappers (Ray Data's
    UserCodeException, RayTaskError, ActorDiedError), credentials hidden."""
    from ray.exceptions import RayError

    from convs2s.tracking.runs import redact_text

    chain = [err]
    while True:  # RayTaskError.cause: the worker's exception; else the one raised from
        inner = getattr(chain[-1], "cause", None)
        inner = inner if isinstance(inner, BaseException) else chain[-1].__cause__
        # (Ray Data chains a bare SystemException as a marker, not a cause)
        if not isinstance(inner, BaseException) or not str(inner).strip() or inner in chain:
            break
        chain.append(inner)
    for e in chain:
        if isinstance(e, RayError):  # its message carries the worker's traceback, whose
            # first `Name: message` line is the error raised there first (the wrappers Ray
            # raised from it follow; an actor's constructor's error is only there)
            raised = [line.strip() for line in str(e).splitlines()
                      if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?",
                                  line.strip())]
            if raised:
                return redact_text(raised[0])
    text = str(chain[-1]).strip().splitlines()
    return redact_text(f"{type(chain[-1]).__name__}: {text[0] if text else ''}".rstrip(": "))


def _translate_corpus(args, job, search) -> int:
    """--actors N: the Ray Data job (convs2s.serving.corpus) of a checked `job`."""
    from convs2s.io.checkpoint import CheckpointError
    from convs2s.inference.quantize import PrecisionError
    from convs2s.inference.translate import load_for_inference
    from ray.exceptions import RayError

    from convs2s.serving.corpus import translate_corpus
    from storage.lease import LeaseHeld

    failed = None  # the line of a translator's failure
    try:
        if job.device == "cpu":  # the model and settings load here before any actor starts
            load_for_inference(args.checkpoint, search, "cpu", spm_model=args.spm_model)
        manifest = translate_corpus(job)
    except (CheckpointError, PrecisionError, StorageError, LeaseHeld, OSError,
            ValueError) as err:  # (CorpusError is a ValueError)
        print(f"convs2s-translate: error: {err}", file=sys.stderr)
        return 2
    except RayError as err:  # a translator actor failed (Ray Data gives its error wrapped)
        failed = (f"convs2s-translate: error: a translator failed: {_root_cause(err)}; the "
                  f"finished parts are kept in {args.output}: the same command translates "
                  "the rest")
        manifest = None
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (`ray job stop`) while the parts translate
        manifest = None
    if failed:  # (out of the except block, as below: the other
        # translators are ended once the job's iterator, which the error's traceback held, is
        # collected; they held their CPUs in a process that went on, e.g. a caller of `main`)
        gc.collect()
        print(failed, file=sys.stderr)
        return 2
    if manifest is None:  # (out of the except block: the interrupt's traceback held the job)
        return _corpus_interrupted(args.output)
    f = manifest["failures"]
    log.info("%s: %d lines in, %d out (%d empty, %d not UTF-8, %d cut to the model's "
             "positions); %s", args.output, manifest["lines_in"], manifest["lines_out"],
             f["empty"], f["non_utf8"]["count"], f["truncated"]["count"],
             f"{manifest['sentences_per_s']:.1f} sentences/s" if manifest["sentences_per_s"]
             else "resumed")
    return 0


def translate(argv: list[str] | None = None) -> int:
    """convs2s-translate / python -m convs2s translate. Bad input (a flag's value, a missing
    input, an output that is a folder, an --actors output this command did not write) is
    refused before torch loads: in a fraction of a second, not the seconds torch's import
    takes."""
    args = _translate_parser().parse_args(argv)
    if args.output == "-":  # as --input -: the standard stream
        args.output = None
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(levelname)s %(message)s",
                        stream=sys.stderr)
    job = None
    try:
        _check_device(args.device)
        _check_flags(args)
        search = SearchConfig(beam=args.beam, lenpen=args.lenpen, max_len_a=args.max_len_a,
                              max_len_b=args.max_len_b, min_len=args.min_len,
                              unk_penalty=args.unk_penalty, nbest=args.nbest,
                              replace_unk=args.replace_unk, dictionary=args.dictionary,
                              max_sentences=args.batch_size, max_tokens=args.max_tokens,
                              precision=args.precision,
                              precision_fallback=args.precision_fallback,
                              shortlist=args.shortlist,
                              shortlist_frequent=args.shortlist_frequent)
        if args.actors:
            job = _corpus_job(args, search)
        else:
            _check_input(args.input)  # before anything is loaded or written
            if args.output and (location(args.output).is_dir() or args.output.endswith("/")):
                raise ValueError(f"--output {args.output} is a directory: give a file name")
            _check_not_the_input(args.input, args.output)
            if args.output and is_uri(args.output):
                check_storage(location(args.output).parent, "--output", write=True)
            elif args.output and not location(args.output).parent.is_dir():
                raise FileNotFoundError(f"--output {args.output}: its folder "
                                        f"{location(args.output).parent} does not exist; "
                                        "create it first")
            non_utf8 = {"count": 0, "first": None}
            lines = _read_lines(args.input, args.column, non_utf8)
    except (OSError, ValueError, StorageError) as err:  # (CorpusError is a ValueError)
        print(f"convs2s-translate: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.actors:
            return _corpus_interrupted(args.output)
        raise
    import torch

    torch.set_num_threads(max(1, args.threads or len(os.sched_getaffinity(0))))
    if job is not None:
        return _translate_corpus(args, job, search)

    from convs2s.console import sigterm_as_ctrl_c
    from convs2s.io.checkpoint import CheckpointError
    from convs2s.inference.quantize import PrecisionError
    from convs2s.inference.translate import format_translation, load_for_inference
    from convs2s.serving.corpus import CorpusError

    try:
        device = _inference_device(args.device, args.precision)
        translator = load_for_inference(args.checkpoint, search, device,
                                        spm_model=args.spm_model)
        target, tmp = _output_files(args.output)
        out = open(tmp or target, "w", encoding="utf-8") if args.output else sys.stdout
    except (CheckpointError, OSError, ValueError, PrecisionError, StorageError) as err:
        print(f"convs2s-translate: error: {err}", file=sys.stderr)
        return 2
    n, t0 = 0, time.perf_counter()
    try:
        with torch.inference_mode(), sigterm_as_ctrl_c():  # (SIGTERM left the temporary file)
            for chunk in _chunks(lines, args.buffer_size or 10_000):
                # (attention only for --print-attention's alignments: a search keeps none else)
                for tr in translator.translate_full(chunk, attention=args.print_attention):
                    out.write(format_translation(tr, n, args.nbest, args.print_attention))
                    n += 1
                out.flush()
        if tmp:
            out.close()
            if is_uri(args.output):
                location(args.output).upload(tmp)
            else:
                os.replace(tmp, target)
    except (OSError, CorpusError) as err:  # (CorpusError: a .gz found cut short)
        print(f"convs2s-translate: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM: --output as it was (written whole or not)
        print(f"\ninterrupted after {n:,} lines" + (
            f"; {args.output} not written" if tmp else ""), file=sys.stderr)
        return 130
    finally:
        if args.output:
            out.close()
        if tmp:
            tmp.unlink(missing_ok=True)
            if is_uri(args.output):
                tmp.parent.rmdir()
    secs = time.perf_counter() - t0
    log.info("translated %d lines in %.1f s (%.1f sentences/s)", n, secs, n / max(secs, 1e-9))
    if non_utf8["count"]:  # as the --actors job counts them (its manifest: failures.non_utf8)
        log.warning("%d line(s) of %s are not UTF-8 (first: line %d): each was translated as "
                    "an empty line", non_utf8["count"], args.input or "stdin",
                    non_utf8["first"])
    return 0


# --- average, score, attention -----------------------------------------------------------------


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
    """The lines `score` reads (convs2s.metrics.scoring.read_lines); a file that is missing,
    unreadable or not UTF-8 is a ValueError naming it."""
    from convs2s.metrics.scoring import read_lines

    try:
        return read_lines(path)
    except FileNotFoundError:
        raise ValueError(f"{flag} {path} does not exist") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{flag} {path} is not UTF-8 text (byte {err.start}: "
                         f"{err.object[err.start:err.start + 1]!r}): give it as UTF-8") from None
    except OSError as err:
        raise ValueError(f"{flag} {path} cannot be read: {err.strerror or err}") from None


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


def serve(argv: list[str] | None = None) -> int:
    """python -m convs2s serve: the Ray Serve deployment (convs2s.serving.online)."""
    d = SearchConfig()
    p = argparse.ArgumentParser(
        prog="python -m convs2s serve",
        description="Serve a translator over HTTP on Ray Serve, batching concurrent requests "
                    "(POST /translate {\"inputs\": [...], \"params\": {...}}; GET /health).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", nargs="+", help="checkpoint directories (several: an "
                      "ensemble)")
    what.add_argument("--model", help="an MLflow model URI: models:/NAME@ALIAS or "
                      "models:/NAME/latest (pinned to the version it names at start), "
                      "models:/NAME/VERSION, models:/m-ID, runs:/RUN/NAME")
    p.add_argument("--tracking-uri", help="where --model resolves (default: "
                   "MLFLOW_TRACKING_URI)")
    p.add_argument("--spm-model")
    p.add_argument("--beam", type=int, help=f"default beam of requests (checkpoints: {d.beam})")
    p.add_argument("--lenpen", type=float)
    p.add_argument("--max-len-a", type=float)
    p.add_argument("--max-len-b", type=int)
    p.add_argument("--precision", choices=INFERENCE_PRECISIONS)
    p.add_argument("--precision-fallback", choices=["fp32"],
                   help="serve float32 weights where --precision cannot run (one warning)")
    p.add_argument("--shortlist", metavar="NPZ")
    p.add_argument("--shortlist-frequent", type=int)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--min-replicas", type=int, help="autoscaling: fewest replicas")
    p.add_argument("--max-replicas", type=int, help="autoscaling: most replicas")
    p.add_argument("--target-ongoing-requests", type=float, default=8.0,
                   help="autoscaling: requests in flight per replica it aims at")
    p.add_argument("--threads-per-replica", type=int, default=1,
                   help="CPUs (torch threads) each replica holds")
    p.add_argument("--gpus-per-replica", type=float, default=0.0)
    p.add_argument("--max-batch-size", type=int, default=32,
                   help="most sentences searched together")
    p.add_argument("--batch-wait-ms", type=float, default=2.0,
                   help="at rest, how long a sentence waits for others to share its search")
    p.add_argument("--max-queued-requests", type=int, default=256,
                   help="requests each HTTP proxy holds waiting for a replica; past them, 503 "
                        "at once (-1: no limit)")
    p.add_argument("--request-timeout", type=float, metavar="SECONDS",
                   help="a request that takes longer is answered 408 (default: no limit; on "
                        "a Serve already running, its own setting stays)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(levelname)s %(message)s",
                        stream=sys.stderr)
    from convs2s.io.checkpoint import CheckpointError
    from convs2s.inference.quantize import PrecisionError
    from convs2s.serving import ray_join
    from convs2s.serving.corpus import start_ray
    from convs2s.serving.online import DeployError, ServeSettings, resolve_model_uri, run

    search = {k: v for k, v in (("beam", args.beam), ("lenpen", args.lenpen),
                                ("max_len_a", args.max_len_a), ("max_len_b", args.max_len_b),
                                ("precision", args.precision),
                                ("precision_fallback", args.precision_fallback),
                                ("shortlist", args.shortlist),
                                ("shortlist_frequent", args.shortlist_frequent))
              if v is not None}
    try:
        settings = ServeSettings(
            checkpoints=args.checkpoint or [], model=args.model, tracking_uri=args.tracking_uri,
            search=search, spm_model=args.spm_model, replicas=args.replicas,
            min_replicas=args.min_replicas, max_replicas=args.max_replicas,
            target_ongoing_requests=args.target_ongoing_requests,
            threads_per_replica=args.threads_per_replica,
            gpus_per_replica=args.gpus_per_replica, max_batch_size=args.max_batch_size,
            batch_wait_ms=args.batch_wait_ms, max_queued_requests=args.max_queued_requests,
            request_timeout_s=args.request_timeout)
        if settings.model and args.spm_model:
            raise ValueError(f"--spm-model {args.spm_model}: a logged model (--model) carries "
                             "its own text pipeline; leave it out")
        if settings.model:  # resolved (and an alias pinned) before Ray starts
            import mlflow

            # read here, once, and given to the replicas (whose environment may not hold
            # $MLFLOW_TRACKING_URI); shown only through redact_uri
            settings.tracking_uri = settings.tracking_uri or mlflow.get_tracking_uri()
            settings.model = resolve_model_uri(settings.model, settings.tracking_uri)
        else:
            for c in settings.checkpoints:
                if not location(c).is_dir():
                    raise ValueError(f"checkpoint {c} does not exist: give a checkpoint "
                                     "directory of a training run (e.g. RUN/train/best)")
            SearchConfig.from_dict(search)  # (a --beam 0: before torch loads)
        _load_as_replicas_will(settings)
        # (a new local Ray, not one `ray.init()` would join on this machine, `ray start
        # --head`: its Serve proxy may hold --port already, serving this very application
        # from an earlier `serve`, replaced, not refused)
        if not os.environ.get("RAY_ADDRESS") and not ray_join.running_here():
            _check_port_free(args.host, args.port)  # a new local Ray: its HTTP proxy binds here
            _check_replicas_fit_here(settings)
    except (CheckpointError, PrecisionError, StorageError, OSError, ValueError) as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    from ray.exceptions import RayError  # (Ray once the checks have passed)

    try:
        # Serve's per-request lines stay in Ray's log files
        start_ray(log_to_driver=False, command="python -m convs2s serve ...")
    except (RayError, ValueError, OSError) as err:  # a RAY_ADDRESS it cannot join (said
        # with its password hidden; Ray's own errors too)
        from convs2s.tracking.runs import redact_text

        print(f"{p.prog}: error: {redact_text(str(err))}", file=sys.stderr)
        return 2
    try:
        run(settings, host=args.host, port=args.port, blocking=True)
    except (DeployError, RayError, OSError) as err:  # (an unreachable RAY_ADDRESS: a
        # ConnectionError; Serve's deployment failing: DeployError, with the replica's error)
        from convs2s.tracking.runs import redact_text

        print(f"{p.prog}: error: {redact_text(str(err).splitlines()[0])}", file=sys.stderr)
        return 2
    return 0


def _check_port_free(host: str, port: int) -> None:
    """--host / --port free to bind (Serve's proxy, started later, only logs that it could not,
    and retries)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as uvicorn binds)
        try:
            sock.bind((host, port))
        except OSError as err:
            why = err.strerror or err
            raise OSError(f"--port {port} on --host {host} cannot be bound ({why}): give "
                          "another --port, or stop what holds it") from None


def _check_replicas_fit_here(settings) -> None:
    """A new local Ray has this machine's CPUs and GPUs: replicas that need more at start (at
    least one: autoscaling from 0 starts one at the first request) would wait for them without
    end (Serve waits for an autoscaler to add nodes). A GPU fraction is placed on one GPU."""
    import math

    import torch

    try:
        from ray._private.utils import get_num_cpus  # (what a new local Ray counts: cgroups)
    except ImportError:  # (moved in another Ray)
        get_num_cpus = os.cpu_count
    n = max(1, settings.replicas if settings.min_replicas is None else settings.min_replicas)
    t, g = settings.threads_per_replica, settings.gpus_per_replica
    need_cpus, cpus = n * t, get_num_cpus()
    if need_cpus > cpus:
        raise ValueError(f"{n} replica(s) x --threads-per-replica {t} need {need_cpus} CPUs, "
                         f"and this machine has {cpus}: Serve would wait for them without "
                         "end; give fewer replicas or threads, or join a cluster (RAY_ADDRESS)")
    if not g:
        return
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    fit = gpus // g if g >= 1 else gpus * math.floor(1 / g + 1e-9)  # (whole GPUs, or shares
    # of one GPU each)
    if n > fit:
        raise ValueError(f"{n} replica(s) x --gpus-per-replica {g:g} need more GPUs than this "
                         f"machine has ({gpus}: {fit:g} such replica(s) fit): Serve would wait "
                         "for them without end; give fewer replicas, or join a cluster with "
                         "GPUs (RAY_ADDRESS)")


def _load_as_replicas_will(settings) -> None:
    """The model loaded once here, on the CPU, with the settings every replica will load it
    with: a folder without checkpoint.pt, a corrupt checkpoint, a missing --shortlist or a
    precision that cannot run is one line now, not an error in every replica while Serve
    retries them (as `translate --actors` checks its model before the actors start)."""
    import torch

    from convs2s.inference.quantize import resolve_precision
    from convs2s.inference.translate import load_for_inference

    torch.set_num_threads(1)  # (a check: the replicas' threads are theirs)
    if settings.model:
        from convs2s.serving.online import fetch_logged_model, logged_model_artifacts
        from convs2s.serving.pyfunc import translator_from_artifacts

        arts = logged_model_artifacts(fetch_logged_model(settings.model, settings.tracking_uri))
        translator = translator_from_artifacts(arts, "cpu", settings.search)
    else:
        translator = load_for_inference(settings.checkpoints,
                                        SearchConfig.from_dict(settings.search), "cpu",
                                        spm_model=settings.spm_model)
    cfg = translator.search
    if settings.gpus_per_replica and cfg.precision == "int8":  # a replica holding a GPU
        # searches on it: int8 runs on CPUs (resolve_precision: the fallback, else an error)
        resolve_precision(cfg.precision, "cuda", cfg.precision_fallback)
    del translator
    gc.collect()


def train(argv: list[str] | None = None) -> int:
    """python -m convs2s train: the training loop without Ray (convs2s.train.local)."""
    from convs2s.train.local import main as train_main

    return train_main(argv)


COMMANDS = {"translate": translate, "serve": serve, "train": train, "average": average,
            "score": score,
            "attention": attention, "import-fairseq": import_fairseq,
            "export-fairseq": export_fairseq}


def main(argv: list[str] | None = None) -> int:
    """python -m convs2s <command> ...: one of COMMANDS. As a command (no argv), the Ray
    commands' console keeps Ray's harmless lines in its log files (convs2s.console)."""
    command_line = argv is None
    argv = sys.argv[1:] if argv is None else argv
    usage = (f"usage: python -m convs2s {{{','.join(COMMANDS)}}} ...  (--help after a command "
             "for its flags)")
    if argv[:1] in (["--help"], ["-h"]):  # asked for: on stdout, exit 0
        print(usage)
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(usage, file=sys.stderr)
        return 2
    if command_line and (argv[0] == "serve" or "--actors" in argv):
        from convs2s.console import harmless_ray_lines_dropped

        with harmless_ray_lines_dropped(2), harmless_ray_lines_dropped(1):
            return COMMANDS[argv[0]](argv[1:])
    return COMMANDS[argv[0]](argv[1:])
