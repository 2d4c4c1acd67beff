"""Generation speed, the paper's Table 3 on this hardware: newstest2012 + newstest2013 En-Fr
(6,003 sentences), BPE-encoded, sorted by length and batched up to 128 sentences, searched with
beam 1 (greedy) and beam 5; sentences per second and seconds for the whole set. Incremental
decoding (paper §5.3: cached conv inputs, O(1) per step) is compared with recomputing the whole
prefix at every step on the same sentences.

Without --checkpoint the model has random weights and every hypothesis is exactly --out-len
tokens long (min_len = max_len, so EOS is forced there and nowhere else): every run does the
same work whatever the weights. --out-len 0 takes per batch the mean BPE length of the
reference translations (the work a trained model would do). With --checkpoint the trained
model decodes freely (--max-len-a/--max-len-b) with its own sentencepiece model, and the
result adds sacreBLEU against the references.

    python -m benchmarks.generation --preset iwslt_de_en --limit 128 --out-len 40   # CPU target
    python -m benchmarks.generation --preset iwslt_de_en --limit 128 --out-len 50 \\
        --beams 5 --full-prefix-limit 128                                 # incremental vs full
    python -m benchmarks.generation --preset wmt14_en_fr --device cuda --dtype bf16  # Table 3
    python -m benchmarks.generation --checkpoint runs/wmt14_en_fr/best --device cuda
    python -m benchmarks.generation --checkpoint CKPT --test ../shared/data/multi30k \\
        test_2016_flickr en de --dtype fp32 bf16 int8 --repeats 3  # real outputs, with BLEU

Several --dtype values load the same weights once per dtype (`convs2s.inference.quantize`) and time
them in alternated rounds: their speed ratios come from the same minutes of the same machine.

--limit N searches a seeded uniform sample of N sentences (realistic lengths, not the
shortest); seconds for 6,003 sentences are then extrapolated and labelled so. Writes
benchmarks/results/generation_<preset>_<device>.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import numpy as np
import torch

from benchmarks.corpus import DATA_DIR, encode, length_stats, read_pairs, train_joint_bpe
from benchmarks.flops import decoder_flops, encoder_flops
from benchmarks.machine import load_average, machine_info, matmul_peak, synchronize, wait_for_quiet
from benchmarks.report import RESULTS_DIR, format_table, write_result
from convs2s.config import EOS, INFERENCE_PRECISIONS, PAD, PRESETS, SearchConfig
from convs2s.model.network import ConvS2S, inference_copy
from convs2s.inference.quantize import for_inference
from convs2s.inference.search import generate, greedy

TABLE3_SETS = ["newstest2012", "newstest2013"]  # 3,003 + 3,000 = the paper's 6,003 sentences
TABLE3_SENTENCES = 6003
DEFAULT_VOCAB = {"iwslt_de_en": 8000, "tiny": 1000, "small": 1000}  # others: 40k (paper §4.1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.generation",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="wmt14_en_fr", choices=sorted(PRESETS))
    p.add_argument("--vocab", type=int, default=0,
                   help="model vocabulary, random weights (0: 8000 for iwslt_de_en, else 40000)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="a trained checkpoint directory instead of random weights")
    p.add_argument("--bpe-vocab", type=int, default=16000,
                   help="BPE trained on the test sets (random weights): sets source lengths")
    p.add_argument("--data", type=Path, default=DATA_DIR, help="the small real corpora")
    p.add_argument("--limit", type=int, default=0,
                   help="search a seeded sample of this many sentences (0: all 6,003)")
    p.add_argument("--batch-sentences", type=int, default=128)
    p.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    p.add_argument("--out-len", type=int, default=0,
                   help="random weights: output tokens per hypothesis (0: per batch, the mean "
                        "reference length)")
    p.add_argument("--max-len-a", type=float, default=1.2, help="checkpoint: max len a*|x|+b")
    p.add_argument("--max-len-b", type=int, default=10)
    p.add_argument("--full-prefix-limit", type=int, default=0,
                   help="also time full-prefix recomputation on a sample of this many "
                        "sentences, against incremental decoding on the same ones (0: skip)")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed rounds (each times every --dtype once); the median is kept")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", nargs="+", choices=INFERENCE_PRECISIONS, default=["fp32"],
                   help="weights to search with (convs2s.inference.quantize): fp32; bf16 (fast "
                   "where "
                        "the hardware has native bf16: GPUs, CPUs with AVX-512 BF16 or AMX); "
                        "int8 (CPU). Several: each timed in every round, alternating")
    p.add_argument("--reference-python", type=Path, default=None, metavar="PYTHON",
                   help="with --checkpoint: also time the reference implementation's generator "
                        "(this interpreter of a scratch environment with fairseq, see "
                        "scripts/fairseq_fixtures.sh) on the same weights (exported with "
                        "convs2s.io.fairseq) and batches, in the same rounds")
    p.add_argument("--shortlist", type=Path, default=None, metavar="NPZ",
                   help="also time each --dtype with vocabulary selection, this lexical table "
                        "(the checkpoint's data: preprocessing --shortlist K)")
    p.add_argument("--shortlist-k", type=int, default=0, metavar="K",
                   help="without --shortlist: count a table of K candidates per source token "
                        "on the benchmark's own sentence pairs (random weights: sizes only)")
    p.add_argument("--shortlist-frequent", type=int, default=2000,
                   help="most frequent target tokens always in a batch's shortlist")
    p.add_argument("--shortlist-per-source", type=int, default=0,
                   help="candidates taken per source token (0: all the table has)")
    p.add_argument("--test", nargs=4, metavar=("DIR", "NAME", "SRC", "TGT"), default=None,
                   help="search DIR/NAME.SRC (.gz too) and score against DIR/NAME.TGT instead "
                        "of newstest2012+2013 En-Fr (e.g. ../shared/data/multi30k "
                        "test_2016_flickr en de with a Multi30k checkpoint)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads")
    p.add_argument("--peak-sizes", type=int, nargs="+", default=None,
                   help="square matmul sizes for the peak (default 1024 2048; GPU 4096 8192)")
    p.add_argument("--max-load", type=float, default=1.5,
                   help="wait until the 1-minute load average is below this ...")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="... for at most this long (0: do not wait)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="result JSON path")
    p.add_argument("--replace", action="store_true",
                   help="overwrite the result file if it exists (default: keep it and write "
                        "<name>-<time>.json beside it)")
    args = p.parse_args(argv)
    if args.reference_python is not None and args.checkpoint is None:
        p.error("--reference-python compares trained weights: give --checkpoint")
    args.vocab = args.vocab or DEFAULT_VOCAB.get(args.preset, 40_000)
    return args


def load_model(args, device: torch.device, precision: str):
    """(inference model at `precision`, text codec or None, description). A checkpoint brings
    its own text pipeline: its sentencepiece model, or an imported reference model's Moses +
    BPE (`python -m convs2s import-fairseq`: Table 3 on the paper's own En-Fr model)."""
    if args.checkpoint is not None:  # loaded as everything else loads it for inference
        from convs2s.inference.translate import load_for_inference

        translator = load_for_inference([args.checkpoint], SearchConfig(precision=precision),
                                        device=device)
        (net,), codec = translator.models, translator.codec
        meta = net.meta
        return net, codec, {"checkpoint": str(args.checkpoint), "update": meta["update"],
                            "text": codec.kind, "imported_from": meta.get("imported_from"),
                            "parameters": _parameters(net)}
    torch.manual_seed(args.seed)
    model = ConvS2S(PRESETS[args.preset](), args.vocab, args.vocab)
    # Weight norm folded once, as the translator and the reference do for generation.
    net = for_inference(inference_copy(model).to(device), precision)
    return net, None, {"random_weights": True, "parameters": _parameters(net)}


def _parameters(net) -> int:
    """Weights of the model, int8 layers included (their float copies: the same count)."""
    from convs2s.model.conv import Conv
    from convs2s.inference.quantize import Int8Linear

    in_convs = {id(m.int8) for m in net.modules() if isinstance(m, Conv)}  # counted as Conv
    return sum(p.numel() for p in net.parameters()) + sum(
        m.weight.numel() + m.bias.numel() for m in net.modules()
        if isinstance(m, Int8Linear) and id(m) not in in_convs)


def make_batches(src: list[list[int]], ref_lens: list[int], limit: int, size: int, seed: int):
    """Sorted by source length and cut into batches of up to `size`: (src B x S, lengths B,
    indices, mean reference length) per batch; `limit` > 0 takes a seeded sample first."""
    idx = np.arange(len(src))
    if 0 < limit < len(src):
        idx = np.sort(np.random.default_rng(seed).choice(len(src), limit, replace=False))
    idx = sorted(idx.tolist(), key=lambda i: (len(src[i]), i))
    out = []
    for a in range(0, len(idx), size):
        rows = idx[a:a + size]
        S = max(len(src[i]) for i in rows)
        tokens = torch.full((len(rows), S), PAD, dtype=torch.long)  # B x S, right-padded
        for b, i in enumerate(rows):
            tokens[b, :len(src[i])] = torch.tensor(src[i])
        lengths = torch.tensor([len(src[i]) for i in rows])
        out.append((tokens, lengths, rows, round(float(np.mean([ref_lens[i] for i in rows])))))
    return out


@dataclass
class Setting:
    """What one row of the table searches with: a model at a dtype, and optionally vocabulary
    selection (a shortlist per batch, computed inside the timed pass as the Translator does)."""

    label: str  # "fp32", "int8", "int8+shortlist", ...
    dtype: str
    net: object
    shortlist: object = None  # convs2s.inference.shortlist.Shortlist
    frequent: int = 0
    per_source: int = 0  # 0: all the table has

    def vocab(self, tokens: torch.Tensor):
        return None if self.shortlist is None else self.shortlist.for_batch(
            tokens, self.frequent, self.per_source or None)


def search(setting, batch, beam: int, incremental: bool, args, device) -> list[dict]:
    """Best hypothesis per sentence of one batch."""
    net = setting.net
    tokens, lengths, _, ref_len = batch
    if args.checkpoint is not None:
        lens = {"max_len_a": args.max_len_a, "max_len_b": args.max_len_b, "min_len": 1}
    else:  # exactly n tokens + EOS per hypothesis: fixed work
        n = args.out_len or ref_len
        lens = {"max_len_a": 0.0, "max_len_b": n, "min_len": n}
    src, src_len = tokens.to(device), lengths.to(device)
    vocab = setting.vocab(tokens)
    if beam == 1:
        hyps = greedy([net], src, src_len, incremental=incremental, vocab=vocab, **lens)
    else:
        hyps = generate([net], src, src_len, beam_size=beam, incremental=incremental,
                        vocab=vocab, **lens)
    return [h[0] for h in hyps]


def timed_pass(setting, batches, beam, incremental, args, device) -> tuple[list[float], list]:
    """Seconds for all batches, once per --repeats, after an untimed warm-up on a few
    sentences (first-call allocations and kernel selection)."""
    (times, hyps), = timed_rounds([setting], batches, beam, incremental, args, device)
    return times, hyps


def timed_rounds(nets, batches, beam, incremental, args, device, reference=None
                 ) -> list[tuple[list, list]]:
    """(seconds per round, hypotheses) per setting: --repeats rounds, each timing every one
    once in turn (alternated, so that a change of the machine's speed reaches all alike),
    after an untimed warm-up of each on a few sentences. `reference(beam) -> (seconds,
    hypotheses)`: the reference implementation, timed last in each round."""
    tokens, lengths, rows, ref_len = batches[0]
    for net in nets:
        search(net, (tokens[:8], lengths[:8], rows[:8], ref_len), beam, incremental, args,
               device)
    out = [([], []) for _ in nets]
    for _ in range(args.repeats):
        for net, (times, hyps) in zip(nets, out):
            synchronize(device)
            t0 = time.perf_counter()
            hyps[:] = [h for b in batches for h in search(net, b, beam, incremental, args,
                                                           device)]
            synchronize(device)
            times.append(time.perf_counter() - t0)
        if reference is not None:
            if len(out) == len(nets):
                out.append(([], []))
            sec, hyps = reference(beam)
            out[-1][0].append(sec)
            out[-1][1][:] = hyps
    return out


class ReferenceGenerator:
    """The reference implementation's generator on the same trained weights and batches, run
    by scripts/fairseq_generation_speed.py with the reference's own interpreter."""

    def __init__(self, python: Path, checkpoint: Path, batches, args, workdir: Path):
        from convs2s.io.fairseq import export_fairseq

        self.python, self.args, self.workdir = python, args, workdir
        self.archive = export_fairseq(checkpoint, workdir / "archive")  # same weights, ids
        self.batches_file = workdir / "batches.json"
        self.batches_file.write_text(json.dumps(
            [[tokens[b, :n].tolist() for b, n in enumerate(lengths.tolist())]
             for tokens, lengths, _, _ in batches]))
        self.script = Path(__file__).resolve().parents[1] / "scripts" / \
            "fairseq_generation_speed.py"

    def __call__(self, beam: int) -> tuple[float, list[dict]]:
        out = self.workdir / f"reference_beam{beam}.json"
        a = self.args
        cmd = [str(self.python), str(self.script), "--archive", str(self.archive),
               "--batches", str(self.batches_file), "--beam", str(beam), "--threads",
               str(a.threads), "--max-len-a", str(a.max_len_a), "--max-len-b", str(a.max_len_b),
               "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"the reference generator failed ({' '.join(cmd[:2])}):\n"
                               f"{proc.stderr[-3000:]}")
        res = json.loads(out.read_text())
        hyps = [{"tokens": torch.tensor(h)} for batch in res["hypotheses"] for h in batch]
        return res["seconds"], hyps


def work_flops(cfg, vocab: int, batches, hyps: list[dict], beam: int) -> float:
    """Analytic forward FLOPs of a pass: the encoder once per source token, the decoder once per
    hypothesis row and step at the batch's padded source length (rows that finished early are
    counted as they leave)."""
    total, k = 0.0, 0
    for tokens, lengths, rows, _ in batches:
        B, S = tokens.shape
        steps = sum(len(hyps[k + b]["tokens"]) for b in range(B))
        k += B
        total += encoder_flops(cfg) * B * S + decoder_flops(cfg, vocab, S) * steps * beam
    return total


def row(mode: str, beam: int, times: list[float], batches, hyps, flops: float) -> dict:
    """One table row: the median of the timed passes, and the fastest one."""
    n = sum(len(b[2]) for b in batches)
    out_tokens = sum(len(h["tokens"]) for h in hyps)
    seconds = median(times)
    return {"mode": mode, "beam": beam, "sentences": n, "seconds": seconds,
            "seconds_best": min(times), "sentences_per_s": n / seconds,
            "sentences_per_s_best": n / min(times), "output_tokens_per_s": out_tokens / seconds,
            "mean_output_tokens": out_tokens / n, "achieved_flops": flops / seconds,
            "achieved_flops_best": flops / min(times),
            "seconds_for_6003": TABLE3_SENTENCES * seconds / n,
            "extrapolated": n != TABLE3_SENTENCES}


def bleu(sp, hyps: list[dict], rows: list[int], refs: list[str]) -> float:
    import sacrebleu

    text = [sp.decode([t for t in h["tokens"].tolist() if t != EOS]) for h in hyps]
    return sacrebleu.corpus_bleu(text, [[refs[i] for i in rows]]).score


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.test:
        folder, name, src_lang, tgt_lang = args.test
        pairs = read_pairs(Path(folder), [name], src_lang, tgt_lang)
        corpus = f"{Path(folder).name} {name}, {src_lang}->{tgt_lang}"
    else:
        pairs = read_pairs(args.data / "wmt14-en-fr", TABLE3_SETS, "en", "fr")
        corpus = "wmt14-en-fr " + " + ".join(TABLE3_SETS) + ", En->Fr"
    dtypes = list(dict.fromkeys(args.dtype))
    loaded = {d: load_model(args, device, d) for d in dtypes}  # the same weights, each dtype
    net, sp, model_info = loaded[dtypes[0]]
    if sp is None:
        from convs2s.io.text_codec import SentencePieceCodec

        with tempfile.TemporaryDirectory() as tmp:
            sp = SentencePieceCodec(train_joint_bpe(pairs, min(args.bpe_vocab, args.vocab),
                                                    Path(tmp)))
    src = encode(sp, [s for s, _ in pairs])
    cut = net.max_positions - 1  # as the translator does for over-long lines
    src = [s if len(s) <= net.max_positions else s[:cut] + [EOS] for s in src]
    ref_lens = [len(t) - 1 for t in encode(sp, [t for _, t in pairs])]  # without EOS
    batches = make_batches(src, ref_lens, args.limit, args.batch_sentences, args.seed)
    order = [i for b in batches for i in b[2]]
    cfg, V = net.cfg, net.tgt_vocab_size
    nets = [Setting(d, d, loaded[d][0]) for d in dtypes]
    shortlist = load_shortlist(args, sp, pairs, V)
    if shortlist is not None:  # each dtype again, with vocabulary selection
        nets += [Setting(f"{d}+shortlist", d, loaded[d][0], shortlist, args.shortlist_frequent,
                         args.shortlist_per_source) for d in dtypes]
        model_info["shortlist"] = output_layer_times(net, batches, shortlist, args, device)
    dtypes = [x.label for x in nets]

    peak_sizes = tuple(args.peak_sizes) if args.peak_sizes else None
    quiet = wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet else {}
    load_before = load_average()
    # int8 rows are set against the float32 peak (no int8 peak is measured)
    peaks = {d: matmul_peak(device, torch.bfloat16 if d == "bf16" else torch.float32,
                            peak_sizes) for d in dict.fromkeys(
                                "bf16" if d.startswith("bf16") else "fp32" for d in dtypes)}
    workdir = Path(tempfile.mkdtemp(prefix="generation-reference-"))
    reference = ReferenceGenerator(args.reference_python, args.checkpoint, batches, args,
                                   workdir) if args.reference_python else None
    try:
        rows, scores, identical = _timed_beams(args, nets, dtypes, batches, order, pairs, sp,
                                               src, ref_lens, cfg, V, device, reference)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = load_average()
    for r in rows:
        peak = peaks["bf16" if r["dtype"].startswith("bf16") else "fp32"]
        r["fraction_of_peak"] = r["achieved_flops"] / peak["flops"]
        r["fraction_of_peak_best"] = r["achieved_flops_best"] / peak["flops_best"]
    return _results(args, rows, scores, identical, dtypes, V, model_info, corpus, sp, src,
                    order, batches, peaks, device, load_before, load_after, quiet)


def load_shortlist(args, sp, pairs, V: int):
    """The lexical table of --shortlist (the checkpoint's data), or with --shortlist-k one
    counted on the benchmark's own sentence pairs (random weights: only its sizes matter)."""
    from convs2s.inference.shortlist import Shortlist

    if args.shortlist is not None:
        from convs2s.io.text_codec import codec_files

        spm_file = codec_files(args.checkpoint)[0] if args.checkpoint is not None else None
        return Shortlist.load(args.shortlist, spm_file, vocab_size=V)
    if not args.shortlist_k:
        return None
    from preprocessing.lexical import table_in_memory

    table, order = table_in_memory(encode(sp, [s for s, _ in pairs]),
                                   encode(sp, [t for _, t in pairs]), V, args.shortlist_k)
    return Shortlist(torch.from_numpy(table.astype(np.int64)),
                     torch.from_numpy(order.astype(np.int64)),
                     {"k": args.shortlist_k, "counted_on": "the benchmark's own pairs"})


def output_layer_times(net, batches, shortlist, args, device) -> dict:
    """The output layer of one decoding step (batch_sentences x the largest beam rows): the
    whole vocabulary against each batch's shortlist (milliseconds, median of the batches)."""
    fc3 = net.decoder.fc3
    w = fc3.weight  # float in an int8 copy too: a shortlist multiplies float rows
    x = torch.randn(args.batch_sentences * max(args.beams), w.shape[1], device=device,
                    dtype=w.dtype)
    full, short, sizes = [], [], []
    with torch.inference_mode():
        for tokens, _, _, _ in batches:
            ids = shortlist.for_batch(tokens, args.shortlist_frequent,
                                      args.shortlist_per_source or None).to(device)
            rows = (w.index_select(0, ids), fc3.bias.index_select(0, ids))
            sizes.append(ids.numel())
            for out, (weight, bias) in ((full, (w, fc3.bias)), (short, rows)):
                torch.addmm(bias, x, weight.t())  # warm
                synchronize(device)
                t0 = time.perf_counter()
                for _ in range(5):
                    torch.addmm(bias, x, weight.t())
                synchronize(device)
                out.append((time.perf_counter() - t0) / 5 * 1e3)
    return {"vocab": w.shape[0], "shortlist_mean": float(np.mean(sizes)),
            "shortlist_max": int(max(sizes)), "rows": x.shape[0],
            "full_ms": median(full), "shortlist_ms": median(short),
            "speedup": median(full) / median(short)}


def _timed_beams(args, nets, dtypes, batches, order, pairs, sp, src, ref_lens, cfg, V, device,
                 reference):
    """Every beam: the dtypes (and the reference) in alternated rounds; the full-prefix
    comparison on a subset when asked. -> rows, BLEU per setting, identical shares."""
    rows, scores, identical = [], {}, {}
    with torch.inference_mode():
        for beam in args.beams:
            timed = timed_rounds(nets, batches, beam, True, args, device, reference)
            if reference is not None:  # the reference: its own row, its outputs against ours
                sec, ref_hyps = timed[-1]
                rows.append({"dtype": "reference fp32", **row(
                    "reference implementation", beam, sec, batches, ref_hyps,
                    work_flops(cfg, V, batches, ref_hyps, beam))})
                scores[f"reference beam{beam}"] = bleu(sp, ref_hyps, order,
                                                       [t for _, t in pairs])
                identical[f"beam{beam}"] = sum(
                    a["tokens"].tolist() == b["tokens"].tolist()
                    for a, b in zip(timed[0][1], ref_hyps)) / len(ref_hyps)
            for d, (sec, hyps) in zip(dtypes, timed):
                rows.append({"dtype": d, **row("incremental", beam, sec, batches, hyps,
                                               work_flops(cfg, V, batches, hyps, beam))})
                if args.checkpoint is not None:
                    key = f"beam{beam}" if d == "fp32" else f"{d} beam{beam}"
                    scores[key] = bleu(sp, hyps, order, [t for _, t in pairs])
            if args.full_prefix_limit:
                n = min(args.full_prefix_limit, len(order))
                sub = batches if n == len(order) else make_batches(
                    src, ref_lens, n, args.batch_sentences, args.seed + 1)
                for mode, inc in (("incremental (subset)", True), ("full-prefix", False)):
                    if inc and sub is batches:
                        continue  # the same sentences were just timed
                    sec, hyps = timed_pass(nets[0], sub, beam, inc, args, device)
                    rows.append({"dtype": dtypes[0], **row(
                        mode, beam, sec, sub, hyps, work_flops(cfg, V, sub, hyps, beam))})
    return rows, scores, identical


def _results(args, rows, scores, identical, dtypes, V, model_info, corpus, sp, src, order,
             batches, peaks, device, load_before, load_after, quiet) -> dict:
    speedups = {}
    for beam in args.beams:
        full = [r for r in rows if r["beam"] == beam and r["mode"] == "full-prefix"]
        inc = [r for r in rows if r["beam"] == beam and r["mode"].startswith("incremental")
               and r["dtype"] == dtypes[0] and full
               and r["sentences"] == full[0]["sentences"]]
        if full and inc:
            speedups[f"beam{beam}"] = full[0]["seconds"] / inc[-1]["seconds"]
            speedups[f"beam{beam}_best"] = full[0]["seconds_best"] / inc[-1]["seconds_best"]
    ratios = {}  # speed ratios of rows timed in the same rounds ("a/b": a is that much faster)
    for beam in args.beams:
        inc = [r for r in rows if r["beam"] == beam and r["mode"] == "incremental"]
        ref = [r for r in rows if r["beam"] == beam and r["mode"] == "reference implementation"]
        for r in inc[1:]:  # each dtype over the first
            ratios[f"{r['dtype']}/{inc[0]['dtype']} beam{beam}"] = \
                inc[0]["seconds"] / r["seconds"]
        for r in inc if ref else []:  # each dtype over the reference
            ratios[f"{r['dtype']}/reference beam{beam}"] = ref[0]["seconds"] / r["seconds"]
    results = {"preset": cfg_name(args), "vocab": V, "dtype": dtypes, **model_info,
               "data": {"corpus": corpus, "bpe_vocab": sp.src_size,
                        "src_len": length_stats(src), "searched": len(order),
                        "batches": len(batches)},
               "peak_flops": peaks[next(iter(peaks))]["flops"], "peak": peaks, "runs": rows,
               "speedup_incremental_vs_full_prefix": speedups, "speedup_over_first_dtype":
               ratios, "bleu": scores,
               # the share of sentences whose best hypothesis is the reference's, token for
               # token (the first --dtype against the reference's float32)
               "identical_to_reference": identical}
    return {"machine": machine_info(device), "load_before": load_before,
            "load_after": load_after, "quiet": quiet, "results": results}


def cfg_name(args) -> str:
    return "checkpoint" if args.checkpoint is not None else args.preset


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = run(args)
    r = out["results"]
    device = torch.device(args.device).type
    path = args.out or RESULTS_DIR / f"generation_{cfg_name(args)}_{device}.json"
    notes = []
    load = out["load_before"][:1] + out["load_after"][:1]
    if load and max(load) > args.max_load:
        notes.append(f"measured under load (1-minute load average {load}): figures are low")
    if any(x["extrapolated"] for x in r["runs"]):
        notes.append("seconds_for_6003 is extrapolated from the searched sample where "
                     "extrapolated is true")
    path = write_result(path, "generation", {k: str(v) if isinstance(v, Path) else v
                                      for k, v in vars(args).items()},
                 out["machine"], out["load_before"], out["load_after"], out["quiet"], r, notes,
                 replace=args.replace)
    table = [{**x, "of peak": f"{100 * x['fraction_of_peak']:.1f}%",
              "6003 s": f"{x['seconds_for_6003']:,.1f}{'*' if x['extrapolated'] else ''}"}
             for x in r["runs"]]
    print(format_table(table, [("mode", "mode"), ("dtype", "weights"), ("beam", "beam"),
                               ("sentences", "sentences"),
                               ("mean_output_tokens", "out tok"), ("seconds", "seconds"),
                               ("sentences_per_s", "sent/s"),
                               ("sentences_per_s_best", "best sent/s"), ("of peak", "of peak"),
                               ("6003 s", "6,003 sent. s")]))
    for beam, s in r["speedup_incremental_vs_full_prefix"].items():
        print(f"incremental vs full-prefix, {beam}: {s:.1f}x faster")
    for key, x in r["speedup_over_first_dtype"].items():
        print(f"speed {key}: {x:.2f}x")
    for key, x in r["identical_to_reference"].items():
        print(f"identical to the reference's outputs, {key}: {100 * x:.1f}% of sentences")
    for beam, s in r["bleu"].items():
        print(f"sacreBLEU {beam}: {s:.2f}")
    print(f"(* extrapolated)  load {'/'.join(f'{x:g}' for x in load)}  result: {path}")
    return out


if __name__ == "__main__":
    main()
