"""Vocabulary selection by batch size: what a shortlist costs a search of one sentence.

Vocabulary selection (`--shortlist`, convs2s/inference/shortlist.py) cuts the output layer per
search batch to the union of the batch's sentences' candidates plus the `frequent` most frequent
target pieces. Its quality was measured with batches of up to 128 sentences; online serving
often searches one sentence at a time, where the union is far smaller. This benchmark translates
one source file in every setting of

    precisions x {no shortlist, shortlist with each --frequent} x {128 sentences a batch, 1}

(`SearchConfig.max_sentences`), scores each with sacreBLEU (13a), counts the hypotheses that
differ from the first precision's full-vocabulary batched output, times each pass (one pass
after a short warm-up), records the shortlist's size per sentence and gives a paired bootstrap
95% interval of each setting's BLEU difference from that baseline.

    python -m benchmarks.shortlist_batching --checkpoint RUN/train/best \\
        --shortlist DATA/shortlist/KEY/shortlist.npz --src val.en --ref val.de \\
        [--frequent 1000,2000] [--precisions fp32,int8] [--out FILE]

Use a validation split: the test sets are for the project's scores, not for decisions.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.machine import load_average, machine_info, wait_for_quiet
from benchmarks.report import (RESULTS_DIR, add_result_args, format_table, read_sentences,
                               write_result)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.shortlist_batching",
                                description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (RUN/train/best)")
    p.add_argument("--shortlist", required=True, type=Path, help="the data's shortlist.npz")
    p.add_argument("--src", required=True, type=Path, help="source text (.gz too)")
    p.add_argument("--ref", required=True, type=Path, help="reference text (.gz too)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--frequent", default="1000,2000",
                   help="comma-separated --shortlist-frequent values (1000: the README's "
                        "example; 2000: the default)")
    p.add_argument("--precisions", default="fp32,int8")
    p.add_argument("--batch-sentences", type=int, default=128,
                   help="the batched setting's SearchConfig.max_sentences (128, the default)")
    p.add_argument("--limit", type=int, default=None, help="the first N lines only")
    p.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap resamples")
    add_result_args(p)
    return p.parse_args(argv)


def counting(translator, sizes: list) -> None:
    """Record (sentences, shortlist size) of each batch the translator's shortlist cuts."""
    table = translator.shortlist
    cut = table.for_batch

    def for_batch(src_tokens, *args, **kwargs):
        ids = cut(src_tokens, *args, **kwargs)
        sizes.append((int(src_tokens.shape[0]), int(ids.numel())))
        return ids

    table.for_batch = for_batch


def bootstrap(bleu, ref: list[str], outputs: dict, base: str, resamples: int) -> dict:
    """Each setting's BLEU minus the baseline's over `resamples` paired resamples of the
    sentences -> its 95% interval. Per-sentence n-gram statistics once, summed per resample
    (sacreBLEU's own corpus arithmetic)."""
    import numpy as np

    stats = {k: np.asarray(bleu._extract_corpus_statistics(v, [ref]), dtype=np.int64)
             for k, v in outputs.items()}
    picks = np.random.default_rng(12345).integers(0, len(ref), size=(resamples, len(ref)))

    def scores(st):
        return np.array([bleu._compute_score_from_stats(t.tolist()).score
                         for t in st[picks].sum(axis=1)])

    base_scores = scores(stats[base])
    out = {}
    for label in outputs:
        if label != base:
            d = np.sort(scores(stats[label]) - base_scores)
            out[label] = [round(float(d[int(0.025 * resamples)]), 2),
                          round(float(d[int(0.975 * resamples) - 1]), 2)]
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch
    from sacrebleu.metrics import BLEU

    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference

    src, ref = read_sentences(args.src, args.limit), read_sentences(args.ref, args.limit)
    if len(src) != len(ref):
        raise SystemExit(f"{args.src} has {len(src)} lines, {args.ref} {len(ref)}")
    quiet = wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet else {}
    load_before = load_average()
    bleu, rows, outputs = BLEU(), [], {}
    lists = [None] + [int(f) for f in args.frequent.split(",")]
    for precision in args.precisions.split(","):
        for frequent in lists:
            cfg = SearchConfig(beam=args.beam, precision=precision,
                               shortlist=str(args.shortlist) if frequent else None,
                               shortlist_frequent=frequent or 1000)
            translator = load_for_inference([args.checkpoint], cfg, "cpu")
            sizes: list[tuple[int, int]] = []
            if frequent:
                counting(translator, sizes)
            translator.translate(src[:16], cfg)  # warm-up (kernels, allocator)
            for batching, n in (("batched", args.batch_sentences), ("one", 1)):
                sizes.clear()
                t0 = time.perf_counter()
                hyps = translator.translate(src, cfg.replace(max_sentences=n))
                seconds = time.perf_counter() - t0
                label = f"{precision}/{f'shortlist{frequent}' if frequent else 'full'}/{batching}"
                outputs[label] = hyps
                row = {"setting": label, "precision": precision, "frequent": frequent,
                       "max_sentences": n, "seconds": round(seconds, 2),
                       "sentences_per_s": round(len(src) / seconds, 1),
                       "bleu": round(bleu.corpus_score(hyps, [ref]).score, 2)}
                if sizes:  # pieces the output layer keeps, per sentence searched
                    row["shortlist_per_sentence"] = round(
                        sum(b * c for b, c in sizes) / sum(b for b, _ in sizes), 1)
                rows.append(row)
                print(row, flush=True)
    load_after = load_average()
    base = rows[0]["setting"]
    intervals = bootstrap(bleu, ref, outputs, base, args.bootstrap)
    for row in rows:
        row["differ_from_baseline"] = sum(a != b for a, b in zip(outputs[row["setting"]],
                                                                outputs[base]))
        row["bleu_vs_baseline"] = round(row["bleu"] - rows[0]["bleu"], 2)
        row["bleu_vs_baseline_95"] = intervals.get(row["setting"])
    print(format_table(rows, [("setting", "setting"), ("bleu", "BLEU"),
                              ("bleu_vs_baseline", "vs base"),
                              ("differ_from_baseline", "differ"),
                              ("sentences_per_s", "sent/s"),
                              ("shortlist_per_sentence", "pieces kept")]))
    results = {"sentences": len(src), "baseline": base,
               "bleu_signature": str(bleu.get_signature()), "rows": rows}
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    path = write_result(args.out or RESULTS_DIR / "shortlist_batching.json",
                        "shortlist_batching", settings, machine_info(torch.device("cpu")),
                        load_before, load_after, quiet, results,
                        ["one timed pass per setting: a speed, not a speed comparison"],
                        args.replace)
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
