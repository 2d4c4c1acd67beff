"""`convs2s-translate` / `python -m convs2s translate`: text through one process (a stream,
a file, an object in a bucket), or a corpus through Ray Data actors (`--actors N`,
convs2s.serving.corpus). Bad input is refused before torch loads: in a fraction of a second,
not the seconds torch's import takes."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from convs2s.config import INFERENCE_PRECISIONS, SearchConfig
from storage import StorageError, check_storage, is_uri, location
from storage.scratch import scratch_dir

log = logging.getLogger("convs2s.inference.translate")


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
    if isinstance(p, Path) and p.exists() and not p.is_file():  # (a pipe, /dev/stdin: read
        # more than once to tell text, gzip and parquet apart; it was "does not exist")
        raise FileNotFoundError(f"input {path} is not a regular file (a pipe or a device): "
                                "give it on the standard input (leave --input out, or "
                                "--input -)")
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

    from convs2s.precision import runs_on_gpus

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if asked is None:
        return "cuda" if visible and runs_on_gpus(precision) else "cpu"
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
    target = Path(os.path.realpath(location(output)))  # (file:///PATH: PATH, not ./file:)
    if target.exists() and not target.is_file():
        return target, None
    return target, target.with_name(f"{target.name}.tmp-{os.getpid()}")


def _read_lines(path: str | None, column: str | None = None,
                non_utf8: dict | None = None) -> Iterator[str]:
    """Lines split on \\n only (as the scorer reads references). A line that is not UTF-8 is
    an empty line (its translation an empty line, as `--actors` gives it: the same outputs
    either way), counted in `non_utf8` ({"count", "first"}: the first one's line number). A
    named input (checked with `_check_input`) is read as --actors reads it: text, .gz or a
    parquet column (`convs2s.serving.inputs.input_lines`); it is opened here, so a .gz that is
    not gzip or a missing column is an InputError before anything loads."""
    if path in (None, "-"):
        raw = (line.rstrip(b"\n") for line in sys.stdin.buffer)

        def decoded(line: bytes) -> str | None:
            try:
                return line.decode("utf-8")
            except UnicodeDecodeError:
                return None

        lines = (decoded(line) for line in raw)
    else:
        from convs2s.serving.inputs import input_lines

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
    p.add_argument("--shortlist-per-source", type=int, default=d.shortlist_per_source,
                   metavar="K", help="candidates of each source token taken from the table "
                   "(its first K, the likeliest; 0: all it has)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when a GPU is "
                   "visible)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default: the CPUs this process may use; with "
                        "--actors: per actor, default 1)")
    p.add_argument("--buffer-size", type=int,
                   help="lines read, translated and written at a time (10,000)")
    p.add_argument("--print-attention", action="store_true",
                   help="verbose output with scores and attention alignments (S-, H-, P-, "
                        "A- lines as fairseq-generate prints them; the scores are natural "
                        "logs, where fairseq-generate's are base 2)")
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

    from convs2s.tracking.redact import redact_text

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
    from convs2s.inference.quantize import PrecisionError, resolve_precision
    from convs2s.inference.translate import load_for_inference
    from ray.exceptions import RayError

    from convs2s.precision import runs_on_gpus
    from convs2s.serving.corpus import translate_corpus
    from storage.lease import LeaseHeld
    from storage.signals import sigterm_as_ctrl_c

    failed = None  # the line of a translator's failure
    # (SIGTERM as Ctrl-C from the start: one while the model loaded or the input was cut into
    # parts, minutes for a large corpus, killed the command without a word)
    try:
        with sigterm_as_ctrl_c():
            if job.device == "cpu":  # the model and settings load here before any actor starts
                load_for_inference(args.checkpoint, search, "cpu", spm_model=args.spm_model)
            elif not runs_on_gpus(search.precision):
                # An actor holding a GPU searches on it, and int8 runs on CPUs: the fallback
                # (one warning), else one line now, not an error in every actor after Ray
                # reserved the GPUs (as `serve --gpus-per-replica` checks). (bf16's check needs
                # the actors' GPU.)
                resolve_precision(search.precision, "cuda", search.precision_fallback)
            manifest = translate_corpus(job)
    except (CheckpointError, PrecisionError, StorageError, LeaseHeld, OSError,
            ValueError) as err:  # (CorpusError, InputError: ValueErrors)
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
    untranslated = f.get("untranslated", {}).get("count", 0)  # (not in jobs made before)
    log.info("%s: %d lines in, %d out (%d empty, %d not UTF-8, %d cut to the model's "
             "positions%s); %s", args.output, manifest["lines_in"], manifest["lines_out"],
             f["empty"], f["non_utf8"]["count"], f["truncated"]["count"],
             f", {untranslated} with no finite translation: empty lines, listed in the "
             "manifest" if untranslated else "",
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
                              shortlist_frequent=args.shortlist_frequent,
                              shortlist_per_source=args.shortlist_per_source)
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
    except (OSError, ValueError, StorageError) as err:  # (CorpusError, InputError: ValueErrors)
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

    from storage.signals import sigterm_as_ctrl_c
    from convs2s.io.checkpoint import CheckpointError
    from convs2s.inference.quantize import PrecisionError
    from convs2s.inference.translate import format_translation, load_for_inference
    from convs2s.serving.inputs import InputError

    try:
        device = _inference_device(args.device, args.precision)
        translator = load_for_inference(args.checkpoint, search, device,
                                        spm_model=args.spm_model)
        target, tmp = _output_files(args.output)
        out = open(tmp or target, "w", encoding="utf-8") if args.output else sys.stdout
        if not args.output and (sys.stdout.encoding or "").lower().replace("-", "") != "utf8":
            sys.stdout.reconfigure(encoding="utf-8")  # translations are UTF-8 text, as files
            # are (a C / ASCII locale was a UnicodeEncodeError at the first non-ASCII word)
    except (CheckpointError, OSError, ValueError, PrecisionError, StorageError) as err:
        print(f"convs2s-translate: error: {err}", file=sys.stderr)
        return 2
    n, cut, t0 = 0, [], time.perf_counter()
    try:
        with torch.inference_mode(), sigterm_as_ctrl_c():  # (SIGTERM left the temporary file)
            for chunk in _chunks(lines, args.buffer_size or 10_000):
                # (attention only for --print-attention's alignments: a search keeps none else)
                for tr in translator.translate_full(chunk, attention=args.print_attention,
                                                    first_line=n):
                    out.write(format_translation(tr, n, args.nbest, args.print_attention))
                    n += 1
                    if tr.truncated:
                        cut.append(n)
                out.flush()
        if tmp:
            out.close()
            if is_uri(args.output):
                location(args.output).upload(tmp)
            else:
                os.replace(tmp, target)
    except BrokenPipeError:  # the reader left (`| head`): done, as other filters are
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no flush error)
        return 0
    except (OSError, InputError) as err:  # (a .gz found cut short)
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
    if cut:  # as the --actors job counts them (its manifest: failures.truncated)
        log.warning("%d line(s) longer than the model's positions were cut (first: line %d)",
                    len(cut), cut[0])
    if non_utf8["count"]:  # as the --actors job counts them (its manifest: failures.non_utf8)
        log.warning("%d line(s) of %s are not UTF-8 (first: line %d): each was translated as "
                    "an empty line", non_utf8["count"], args.input or "stdin",
                    non_utf8["first"])
    return 0
