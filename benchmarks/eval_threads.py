"""One evaluation job (workflows.evaluation.evaluate_job, no Ray) with 1 torch thread and with
--threads, in alternated rounds: sentences/s of each, and whether the hypotheses are the same.
This is what `share_cpus` does for a lone job on an idle node (its task takes all the CPUs).

    python -m benchmarks.eval_threads --checkpoint runs/fr-en/weights/best/model_00 \\
        --src .../text/test.fr --ref .../text/test.en --tgt-lang en --threads 2 --rounds 2

Writes benchmarks/results/eval_threads.json (or --out).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, write_result


def main(argv: list[str] | None = None) -> None:
    from convs2s.config import SearchConfig
    from workflows.evaluation import EvalJob, TestSet, evaluate_job

    p = argparse.ArgumentParser(prog="python -m benchmarks.eval_threads",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--tgt-lang", default="fr")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "eval_threads.json")
    p.add_argument("--replace", action="store_true")
    args = p.parse_args(argv)
    test = TestSet("test", args.src, args.ref, tgt_lang=args.tgt_lang)
    # outputs of at most 1.2 x |source| + 10 pieces, as the tests' short runs decode
    search = SearchConfig(beam=args.beam, max_len_a=1.2, max_len_b=10)
    load_before = load_average()
    rows, hyps = [], {}
    for r in range(args.rounds):
        for n in (1, args.threads):
            job = EvalJob("best", (args.checkpoint,), test, search, num_cpus=float(n))
            t0 = time.perf_counter()
            out = evaluate_job(job)
            rows.append({"round": r, "threads": n, "seconds": round(time.perf_counter() - t0, 2),
                         "sentences_per_second": round(out["metrics"]["sentences_per_second"], 1),
                         "bleu": round(out["metrics"]["bleu"], 2)})
            hyps.setdefault(n, out["hypotheses"])
    same = sum(a == b for a, b in zip(hyps[1], hyps[args.threads]))
    print(format_table(rows, [("round", "round"), ("threads", "threads"), ("seconds", "s"),
                              ("sentences_per_second", "sentences/s"), ("bleu", "BLEU")]))
    speed = {n: sum(r["sentences_per_second"] for r in rows if r["threads"] == n) / args.rounds
             for n in (1, args.threads)}
    ratio = speed[args.threads] / speed[1]
    print(f"{args.threads} threads: {ratio:.2f}x the sentences/s of 1; "
          f"{same} of {len(hyps[1])} hypotheses the same")
    path = write_result(args.out, "eval_threads", {k: str(v) for k, v in vars(args).items()},
                        machine_info(), load_before, load_average(), {},
                        {"rounds": rows, "speedup": round(ratio, 3), "same_hypotheses": same,
                         "sentences": len(hyps[1])}, replace=args.replace)
    print(f"result: {path}")


if __name__ == "__main__":
    main()
