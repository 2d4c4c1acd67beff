"""`python -m workflows.evaluation`: score training runs' checkpoints (best, weight average,
ensemble) and named checkpoints on test sets, as Ray tasks, each pair an MLflow child run
(`workflows.evaluation` holds the jobs, the tasks and the logging; this is its command line).

    python -m workflows.evaluation --run-dir runs/a runs/b --last-n 5 \\
        --test test PREP/text/<hash>/test.en PREP/text/<hash>/test.fr fr --parent-run-id <id>

Every check that needs no Ray runs first (one line, exit 2); --out is held (a lease) from then
to the end; on a cluster of several nodes --out, the runs and the test sets must be in folders
every node sees (checked once Ray is joined).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from convs2s.config import INFERENCE_PRECISIONS, SearchConfig, summarization_search
from convs2s.io.checkpoint import CheckpointError
from convs2s.metrics.task_kinds import task_kind
from convs2s.tracking.redact import redact_text, redact_uri
from convs2s.tracking.runs import resolve_tracking_uri, tracking_uri_problem
from storage import StorageError, local_copy, location, ray_join, shown, worker_path
from workflows.evaluation import EvalJob, EvaluationFailed, TestSet, evaluate_all, evaluation_jobs
from workflows.placement import NoRoomError, _check_room

log = logging.getLogger("workflows.evaluation")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workflows.evaluation",
                                description="Ensembling and averaging jobs, scored on Ray.")
    p.add_argument("--run-dir", nargs="+", default=[], help="training run directories")
    p.add_argument("--checkpoint", action="append", default=[], metavar="NAME=DIR",
                   help="also score one checkpoint directory as job NAME: e.g. a reference "
                        "model imported with `python -m convs2s import-fairseq` (repeatable); "
                        "it is logged as an MLflow model its scores link to")
    p.add_argument("--test", nargs=4, action="append", required=True,
                   metavar=("NAME", "SRC", "REF", "LANG"), help="a test set (repeatable)")
    p.add_argument("--summarization", action="store_true", help="score with ROUGE")
    p.add_argument("--last-n", type=int, default=5)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--precision", choices=INFERENCE_PRECISIONS, default="fp32",
                   help="weights the search multiplies with (convs2s.inference.quantize; "
                   "default fp32)")
    p.add_argument("--precision-fallback", choices=["fp32"],
                   help="where --precision cannot run on a job's machine: fp32, with a warning")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any other search setting (convs2s.config.SearchConfig), e.g. --set "
                        "lenpen=0.6 --set min_len=3 (repeatable; search.FIELD also read): a "
                        "trained run's length penalty tuned without training it again")
    p.add_argument("--num-cpus", type=float, default=1.0)
    p.add_argument("--num-gpus", type=float, default=0.0)
    p.add_argument("--attention-sentences", type=int, default=0, metavar="N",
                   help="per-layer attention pictures of the first N test sentences")
    p.add_argument("--tracking-uri")
    p.add_argument("--parent-run-id")
    p.add_argument("--out", default="eval")
    args = p.parse_args(argv)
    if problem := tracking_uri_problem(args.tracking_uri):
        p.error(problem)
    if not args.run_dir and not args.checkpoint:
        p.error("give --run-dir (training runs) or --checkpoint NAME=DIR (or both)")
    named = []
    for item in args.checkpoint:
        name, _, path = item.partition("=")
        if not name or not path or not Path(path, "checkpoint.pt").is_file():
            p.error(f"--checkpoint {shown(item)!r}: give NAME=DIR, DIR a checkpoint directory "
                    "(checkpoint.pt inside)")
        if name in dict(named):  # (both logged as models, then a traceback)
            p.error(f"--checkpoint {name}=...: two checkpoints named {name}; name each its own")
        named.append((name, str(Path(path).resolve())))
    for flag, value in (("--attention-sentences", args.attention_sentences),
                        ("--num-cpus", args.num_cpus), ("--num-gpus", args.num_gpus)):
        if value < 0:
            p.error(f"{flag} {value}: give a number >= 0")
    if args.last_n < 0:  # (0: no average; -1 averaged every checkpoint but the oldest)
        p.error(f"--last-n {args.last_n}: give a count of checkpoints >= 1, or 0 for none")
    if len({name for name, *_ in args.test}) < len(args.test):
        p.error("--test: each test set needs a name of its own (its scores are logged by it)")
    kind = "summarization" if args.summarization else "translation"
    for name, _, _, lang in args.test:  # (before any model loads: a tokenizer's package)
        if problem := task_kind(kind).language_problem(lang):
            p.error(f"--test {name}: {problem}")
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    asked = {"beam": args.beam, "precision": args.precision,
             "precision_fallback": args.precision_fallback}
    from storage.settings import Change, SettingError, apply_changes, read_value

    try:
        search = summarization_search(**asked) if args.summarization else SearchConfig(**asked)
        changes = []
        for item in args.set:
            key, eq, raw = item.partition("=")
            if not eq or not key.strip():
                raise SettingError(f"--set {item}: write FIELD=VALUE (e.g. --set lenpen=0.6)")
            changes.append(Change("search", key.strip().removeprefix("search."),
                                  read_value(raw), item))
        search = apply_changes(search, changes, "search",
                               {f"search.{k}": f"--{k.replace('_', '-')}"
                                for k in ("beam", "precision", "precision_fallback")})
    except (SettingError, ValueError) as err:  # (--beam 0: the search's own check)
        p.error(str(err))
    if search.nbest != 1:  # (a score is of one translation a sentence)
        p.error(f"--set nbest={search.nbest}: an evaluation scores one translation a sentence; "
                "n-best lists are `python -m convs2s translate --nbest N`'s")
    try:  # a path storage refuses ("s3:/bkt/x", a query) or a run without checkpoints: one
        # line before Ray starts, not a traceback (nor a failure in the scoring tasks)
        for flag, where in (*[("--run-dir", d) for d in args.run_dir],
                            *[(f"--test {t[0]}", f) for t in args.test for f in t[1:3]],
                            ("--out", args.out)):
            try:
                location(where)
            except StorageError as err:
                raise StorageError(f"{flag} {err}") from None
        # (absolute: the scoring tasks do not run in this folder, nor on this node)
        tests = [TestSet(n, worker_path(s), worker_path(r), lang, kind)
                 for n, s, r, lang in args.test]
        if location(args.out).is_file():  # (it was "[Errno 17] File exists")
            raise ValueError(f"--out {shown(args.out)} is a file: give a folder for the scores")
        from convs2s.metrics.scoring import text_lines

        for t in tests:  # (found by each scoring task, after Ray started and runs were made)
            counts = []
            for f in (t.src, t.ref):
                if not location(f).is_file():
                    raise FileNotFoundError(f"--test {t.name}: {f} does not exist")
                counts.append(len(text_lines(f"--test {t.name}:", local_copy(f))))
            if counts[0] != counts[1]:
                raise ValueError(f"--test {t.name}: {t.src} has {counts[0]:,} lines, {t.ref} "
                                 f"{counts[1]:,}: give a source and its references line by "
                                 "line")
        jobs = evaluation_jobs(args.run_dir, tests, args.last_n, search,
                               args.attention_sentences, num_cpus=args.num_cpus,
                               num_gpus=args.num_gpus) if args.run_dir else []
        if clash := {name for name, _ in named} & {j.name for j in jobs}:
            raise ValueError(f"--checkpoint {sorted(clash)[0]}=...: a job of --run-dir has that "
                             "name; name it otherwise")
    except (StorageError, FileNotFoundError, CheckpointError, ValueError) as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    uri = resolve_tracking_uri(args.tracking_uri)
    from storage.lease import LeaseHeld, LeaseLost, RunLease

    # --out held from here to the end, as a workflow holds its run folder: the weights staged
    # in <out>/weights are replaced whole and the hypotheses written over, so a second
    # evaluation on the same --out, or one into a running workflow's eval/ (outer), would
    # replace what the other's scoring tasks are reading
    lease = RunLease(args.out, command=f"{p.prog} --out {args.out}",
                     outer=location(args.out).parent, elsewhere="give another --out")
    try:
        lease.acquire()
    except (LeaseHeld, StorageError, OSError) as err:  # (a folder or bucket not writable too)
        print(f"{p.prog}: error: {redact_text(str(err))}", file=sys.stderr)
        return 2
    try:
        with lease:
            return _evaluate(p, args, jobs, named, tests, search, uri, lease.ref())
    except LeaseLost as err:  # --out taken over while it ran (its runs ended FAILED)
        print(f"{p.prog}: error: {redact_text(str(err))}", file=sys.stderr)
        return 1


def _evaluate(p, args, jobs: list, named: list, tests: list, search, uri: str, held) -> int:
    """`main` once its checks passed and --out is held (`held`, its LeaseRef): Ray, the named
    checkpoints' models, the scoring."""
    import ray

    if not ray.is_initialized():  # RAY_ADDRESS joined (one line where it cannot), else local
        try:
            log.info(ray_join.start_or_join(submit="python -m workflows.evaluation ..."))
        except ray_join.RayAddressError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    read = (*(f for t in tests for f in (t.src, t.ref)), *(c for j in jobs for c in j.checkpoints),
            *(c for _, c in named))  # (several nodes: the tasks read them, and --out's weights)
    if unseen := ray_join.node_not_seeing(args.out, also=read):
        p.error(f"{unseen[1]} is not shared: the node at {unseen[0]} does not see it, and "
                "scoring tasks run there; give --out, the runs and the test sets in folders "
                "every node mounts (NFS / EFS / a shared volume) or bucket URIs (s3://...)")
    if named:  # (before their models are logged)
        try:
            _check_room([(f"{named[0][0]} on {tests[0].name}", args.num_cpus, args.num_gpus)],
                        ray.nodes())
        except NoRoomError as err:
            p.error(str(err))
    for name, path in named:
        from mlflow.exceptions import MlflowException

        from convs2s.serving.pyfunc import log_translator

        try:
            served = log_translator([path], search, tracking_uri=uri, run_id=args.parent_run_id,
                                    experiment_name="convs2s", name=name)
        except MlflowException as err:  # MLflow's message quotes the URI, password and all
            p.error(f"--checkpoint {name}: its model could not be logged at {redact_uri(uri)}: "
                    f"{redact_text(str(err).splitlines()[0])[:300]}")
        except (CheckpointError, OSError, ValueError) as err:  # (cut short, a --set shortlist
            p.error(f"--checkpoint {name}: {redact_text(str(err))}")  # that is not there)
        jobs += [EvalJob(name, (path,), test, search, num_cpus=args.num_cpus,
                         num_gpus=args.num_gpus, attention_sentences=args.attention_sentences,
                         model_id=served.model_id) for test in tests]
    try:
        results = evaluate_all(jobs, uri, args.parent_run_id, args.out, lease=held)
    except NoRoomError as err:  # (a job no node of a local Ray can hold)
        p.error(str(err))
    except EvaluationFailed as err:  # each failed job's one line (its run marked FAILED)
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM taken as one: one line, no traceback
        print("\ninterrupted", file=sys.stderr)
        return 130
    for r in results:
        print(r.job.name, r.job.test_set.name,
              " ".join(f"{k}={v:.3f}" for k, v in sorted(r.metrics.items())), sep="\t")
    return 0
