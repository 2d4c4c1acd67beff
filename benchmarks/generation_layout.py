"""Throughput layouts for translating a test set on this machine: how many sentences a search
batch holds, a token budget per batch, and whether the cores serve one process with as many
torch threads or one Ray actor each (a shard of the sentences per actor, one thread each).

Every layout translates the same sentences with the same trained model, settings and precision
through the Translator (`convs2s.inference.translate.load_for_inference`, what `python -m convs2s
translate`, the evaluation jobs and the MLflow model run), text in and text out. Layouts are
timed in alternated rounds (each once per round, in turn), so a change of the machine's speed
reaches all of them alike; the table gives medians, BLEU (which must not move: batching only
changes which sentences share a batch) and the best layout for this machine.

    python -m benchmarks.generation_layout --checkpoint RUN/train/best \\
        --test ../shared/data/multi30k test_2016_flickr en de --beam 5 --precision int8 \\
        --batch-sentences 32 64 128 256 --max-tokens 1500 3000 --repeats 3

--reference-python PYTHON (the scratch environment of scripts/fairseq_fixtures.sh) also times
the reference implementation's generator in every round, last, on the same weights
(`convs2s.io.fairseq.export_fairseq`) and sentences: float32, batches of up to 128
sentences sorted by length, as its own generator batches them, in both layouts: one process
with every core's thread, and one single-thread process per core on a length-balanced shard
each (started together; the layout's time is the slower shard's timed pass). It is given
token ids and returns token ids, so its rows leave out the text work that every layout of ours
includes (encoding, decoding, detokenizing): its times are lower bounds, and each layout's
speed over the reference's faster layout a conservative ratio.

Writes benchmarks/results/generation_layout_<test>_<precision>_beam<k>.json (or --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from benchmarks.corpus import read_pairs
from benchmarks.machine import load_average, machine_info, wait_for_quiet
from benchmarks.report import RESULTS_DIR, format_table, write_result
from convs2s.config import INFERENCE_PRECISIONS


@dataclass(frozen=True)
class Layout:
    """One way to spend the machine's cores on a test set."""

    processes: int  # 1: this process; n > 1: n Ray actors, a shard each
    threads: int  # torch threads per process
    max_sentences: int
    max_tokens: int = 0  # 0: no token budget

    @property
    def name(self) -> str:
        where = "1 process" if self.processes == 1 else f"{self.processes} Ray actors"
        budget = f", <= {self.max_tokens} tokens" if self.max_tokens else ""
        return f"{where} x {self.threads} threads, <= {self.max_sentences} sentences{budget}"


def layouts(cores: int, batch_sentences: list[int], max_tokens: list[int]) -> list[Layout]:
    """Batch sizes on one process with every core; token budgets at the largest batch size;
    then one single-thread actor per core at each batch size (when there are 2+ cores)."""
    out = [Layout(1, cores, n) for n in batch_sentences]
    out += [Layout(1, cores, max(batch_sentences), t) for t in max_tokens if t > 0]
    if cores > 1:
        out += [Layout(cores, 1, n) for n in batch_sentences]
    return out


def shards(lines: list[str], n: int) -> list[list[int]]:
    """Line indices dealt round-robin in order of length: each shard gets as much work."""
    order = sorted(range(len(lines)), key=lambda i: -len(lines[i].split()))
    return [order[k::n] for k in range(n)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.generation_layout",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="a trained model's directory")
    p.add_argument("--test", nargs=4, metavar=("DIR", "NAME", "SRC", "TGT"), required=True,
                   help="the test set: folder, file stem, source and target language")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--precision", choices=INFERENCE_PRECISIONS, default="fp32")
    p.add_argument("--shortlist", type=Path, help="vocabulary selection's lexical table")
    p.add_argument("--shortlist-frequent", type=int, default=1000)
    p.add_argument("--shortlist-per-source", type=int, default=0)
    p.add_argument("--max-len-a", type=float, default=1.2)
    p.add_argument("--max-len-b", type=int, default=10)
    p.add_argument("--batch-sentences", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--max-tokens", type=int, nargs="*", default=[1500, 3000],
                   help="token budgets to try at the largest batch size")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--limit", type=int, default=0, help="the first N sentences only (checks)")
    p.add_argument("--reference-python", type=Path, metavar="PYTHON",
                   help="also time the reference implementation's generator with this "
                        "interpreter (its scratch environment) in every round")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--max-load", type=float, default=1.0)
    p.add_argument("--out", type=Path)
    p.add_argument("--replace", action="store_true")
    return p.parse_args(argv)


def search_config(args, layout: Layout):
    from convs2s.config import SearchConfig

    return SearchConfig(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                        max_sentences=layout.max_sentences, max_tokens=layout.max_tokens,
                        precision=args.precision,
                        shortlist=str(args.shortlist) if args.shortlist else None,
                        shortlist_frequent=args.shortlist_frequent,
                        shortlist_per_source=args.shortlist_per_source)


class ShardWorker:
    """A Ray actor holding one loaded model (one thread, one CPU reserved): translates the
    shards it is sent, batched as each call says."""

    def __init__(self, checkpoint: str, search, threads: int):
        import torch

        from convs2s.inference.translate import load_for_inference

        torch.set_num_threads(threads)
        self.translator = load_for_inference([checkpoint], search)

    def translate(self, lines: list[str], max_sentences: int, max_tokens: int) -> list[str]:
        import torch

        tr = self.translator
        tr.search = tr.search.replace(max_sentences=max_sentences, max_tokens=max_tokens)
        with torch.inference_mode():
            return tr.translate(lines)


def reference_runner(args, translator, src: list[str], processes: int):
    """() -> (seconds, texts in input order): the reference implementation's generator on the
    ids our translator would search (its codec and truncation), batched as its generator
    batches (sorted by length, up to 128 sentences), in `processes` processes of
    cores / processes threads on length-balanced shards; decoded to text outside the timing."""
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.generation import ReferenceGenerator, make_batches
    from convs2s.config import EOS

    ids = [translator.encode(line, i)[0] for i, line in enumerate(src)]
    settings = argparse.Namespace(threads=max(1, args.cores // processes),
                                  max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    parts = []  # (generator, input index of each hypothesis in its output order)
    for part in shards(src, processes):
        batches = make_batches([ids[i] for i in part], [0] * len(part), 0, 128, 0)
        gen = ReferenceGenerator(args.reference_python, args.checkpoint, batches, settings,
                                 Path(tempfile.mkdtemp(prefix="layout-reference-")))
        parts.append((gen, [part[j] for b in batches for j in b[2]]))

    def run() -> tuple[float, list[str]]:
        with ThreadPoolExecutor(len(parts)) as pool:  # the processes run side by side
            done = list(pool.map(lambda p: p[0](args.beam), parts))
        out = [""] * len(src)
        for (_, order), (_, hyps) in zip(parts, done):
            for i, h in zip(order, hyps):
                out[i] = translator.codec.decode([t for t in h["tokens"].tolist() if t != EOS])
        return max(sec for sec, _ in done), out

    return run


def main(argv: list[str] | None = None) -> int:
    import ray
    import sacrebleu
    import torch

    from convs2s.inference.translate import load_for_inference

    args = parse_args(argv)
    folder, name, src_lang, tgt_lang = args.test
    pairs = read_pairs(Path(folder), [name], src_lang, tgt_lang)
    pairs = pairs[:args.limit] if args.limit > 0 else pairs
    src, refs = [s for s, _ in pairs], [t for _, t in pairs]
    quiet = (wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet
             else {"quiet": None})
    load_before = load_average()
    todo = layouts(args.cores, args.batch_sentences, args.max_tokens)
    # The same model loaded once per in-process layout (a Translator holds its settings) and
    # once per actor; loading is outside the timing, as a server loads once.
    local = {lay: load_for_inference([args.checkpoint], search_config(args, lay))
             for lay in todo if lay.processes == 1}
    # One actor per core, each holding the model once, for every actor layout (an actor
    # keeps its CPU while it lives: more actors than cores would wait for ever).
    actors = []
    n_actors = max((lay.processes for lay in todo), default=1)
    if n_actors > 1:
        ray.init(num_cpus=args.cores, include_dashboard=False, log_to_driver=False)
        remote = ray.remote(num_cpus=1)(ShardWorker)
        one = Layout(n_actors, 1, max(args.batch_sentences))
        actors = [remote.remote(str(args.checkpoint), search_config(args, one), 1)
                  for _ in range(n_actors)]
        ray.get([a.translate.remote(src[:4], 8, 0) for a in actors])  # loaded and warm
    for lay, tr in local.items():  # warm: first-call allocations and kernel choice
        torch.set_num_threads(lay.threads)
        tr.translate(src[:8])
    ref_layouts = ([Layout(1, args.cores, 128)]
                   + ([Layout(args.cores, 1, 128)] if args.cores > 1 else [])
                   if args.reference_python else [])
    reference = {lay: reference_runner(args, next(iter(local.values())), src, lay.processes)
                 for lay in ref_layouts}

    def run_once(lay: Layout) -> tuple[float, list[str]]:
        t0 = time.perf_counter()
        if lay.processes == 1:
            torch.set_num_threads(lay.threads)
            with torch.inference_mode():
                out = local[lay].translate(src)
        else:
            parts = shards(src, lay.processes)
            # actor and shard paired the same way every round; results in input order
            done = ray.get([a.translate.remote([src[i] for i in part], lay.max_sentences,
                                               lay.max_tokens)
                            for a, part in zip(actors, parts)])
            out = [""] * len(src)
            for part, texts in zip(parts, done):
                for i, text in zip(part, texts):
                    out[i] = text
        return time.perf_counter() - t0, out

    times: dict[Layout, list[float]] = {lay: [] for lay in todo}
    outputs: dict[Layout, list[str]] = {}
    ref_times: dict[Layout, list[float]] = {lay: [] for lay in reference}
    ref_out: dict[Layout, list[str]] = {}
    for r in range(args.repeats):
        for lay in todo:
            sec, outputs[lay] = run_once(lay)
            times[lay].append(sec)
            print(f"round {r + 1}: {lay.name}: {sec:.2f} s", file=sys.stderr)
        for lay, run_reference in reference.items():  # last in each round, as in generation
            sec, ref_out[lay] = run_reference()
            ref_times[lay].append(sec)
            print(f"round {r + 1}: reference implementation, {lay.processes} x "
                  f"{lay.threads} threads: {sec:.2f} s", file=sys.stderr)
    if actors:
        ray.shutdown()
    first = outputs[todo[0]]
    rows = []
    for lay in todo:
        sec = median(times[lay])
        rows.append({"layout": lay.name, "processes": lay.processes, "threads": lay.threads,
                     "max_sentences": lay.max_sentences, "max_tokens": lay.max_tokens,
                     "seconds": sec, "seconds_all": times[lay],
                     "sentences_per_s": len(src) / sec,
                     "bleu": round(sacrebleu.corpus_bleu(outputs[lay], [refs]).score, 2),
                     "same_as_first": sum(a == b for a, b in zip(outputs[lay], first))})
    best = max(rows, key=lambda r: r["sentences_per_s"])
    default = next((r for r in rows if r["processes"] == 1 and r["max_sentences"] == 128
                    and not r["max_tokens"]), rows[0])
    results = {"rows": rows, "best": best["layout"],
               "best_over_default": best["sentences_per_s"] / default["sentences_per_s"],
               "default": default["layout"], "sentences": len(src)}
    if reference:
        ref_rows = []
        for lay in reference:
            sec = median(ref_times[lay])
            ref_rows.append({
                "layout": "reference implementation (fp32, ids in and out), "
                          + (f"{lay.processes} processes" if lay.processes > 1 else "1 process")
                          + f" x {lay.threads} threads, <= 128 sentences",
                "processes": lay.processes, "threads": lay.threads,
                "max_sentences": 128, "max_tokens": 0, "seconds": sec,
                "seconds_all": ref_times[lay], "sentences_per_s": len(src) / sec,
                "bleu": round(sacrebleu.corpus_bleu(ref_out[lay], [refs]).score, 2),
                "same_as_first": sum(a == b for a, b in zip(ref_out[lay], first))})
        fastest = min(ref_rows, key=lambda r: r["seconds"])
        for r in rows + ref_rows:  # medians over the reference's best median, same rounds
            r["over_reference"] = fastest["seconds"] / r["seconds"]
        rows += ref_rows
        results["reference"] = fastest["layout"]
        results["best_over_reference"] = best["over_reference"]
    print(format_table(rows, [("layout", "layout"), ("sentences_per_s", "sentences/s"),
                              ("seconds", "seconds"), ("bleu", "BLEU"),
                              ("same_as_first", "same outputs")]
                       + ([("over_reference", "x reference")] if reference else [])))
    print(f"best on this machine: {best['layout']} "
          f"({results['best_over_default']:.2f}x the default: {default['layout']}"
          + (f"; {results['best_over_reference']:.2f}x the reference implementation)"
             if reference else ")"))
    out = args.out or RESULTS_DIR / (f"generation_layout_{name}_{args.precision}"
                                     f"{'_shortlist' if args.shortlist else ''}"
                                     f"_beam{args.beam}.json")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                if k not in ("out", "replace")}
    path = write_result(out, "generation_layout", settings, machine_info(torch.device("cpu")),
                        load_before, load_average(), quiet, results,
                        notes=["seconds: translating the whole test set, text in and out, "
                               "model loading excluded; medians of alternated rounds"],
                        replace=args.replace)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
