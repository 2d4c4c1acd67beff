"""Training throughput: target tokens per second of the real training step, against the
machine's matmul peak measured in the same run.

One step is `convs2s.train.update.train_update` (forward, loss, backward, gradient renormalization,
Nesterov SGD step: exactly what the training loop calls) on one token-budget batch. Batches are
real newstest sentences, BPE-encoded and cut the way the `batches/` preprocessing stage cuts
them (n_sentences * max(src_len, tgt_len) <= --max-tokens, about 3,500 target tokens at 4000).
After --warmup steps, --steps steps are timed one by one; the result is the median per-step rate.
Each timed step records its host time too (until the step's Python call returns, before the
device is waited for: on a GPU, how long the host takes to launch the step's work).
FLOPs are analytic (benchmarks/flops.py: 3 x forward matmul FLOPs of the real tokens), so the
achieved FLOP/s over the peak of the step's dtype (float32, or bf16 with --dtype bf16) says how
close the step runs to what the hardware can do.

    python -m benchmarks.training --preset iwslt_de_en --vocab 8000 --steps 20
    python -m benchmarks.training --preset wmt14_en_de --steps 5 --warmup 1
    python -m benchmarks.training --preset wmt14_en_de --device cuda --dtype bf16 --steps 50
    python -m benchmarks.training --preset iwslt_de_en --dtype bf16   # CPUs with native bf16
    python -m benchmarks.training --preset iwslt_de_en --profile 3     # + where the time goes
    python -m benchmarks.training --preset wmt14_en_fr --device cuda --dtype bf16 \
        --max-tokens 3000 --static-shapes 8 --cuda-graphs   # one CUDA graph per batch shape
    python -m benchmarks.training --preset iwslt_de_en --dump-batches b.json   # then the
    /tmp/fairseq-ref-venv/bin/python scripts/fairseq_training_speed.py --batches b.json \\
        --arch fconv_iwslt_de_en --vocab 8000 --threads 2 --out ref.json   # reference's step

Writes benchmarks/results/training_<preset>_<device>.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import threading
import resource
import tempfile
import time
import traceback
from pathlib import Path
from statistics import median

import numpy as np
import torch

from benchmarks.corpus import (
    DATA_DIR,
    encode,
    length_stats,
    read_pairs,
    token_budget_batches,
    train_joint_bpe,
)
from benchmarks.flops import TRAIN_MULTIPLIER, batch_flops, decoder_flops, encoder_flops
from benchmarks.machine import (
    datasheet_peak,
    load_average,
    machine_info,
    matmul_peak,
    matmul_rate,
    synchronize,
    wait_for_quiet,
)
from benchmarks.report import RESULTS_DIR, format_table, write_result
from benchmarks.step_profile import operator_profile, phase_breakdown
from convs2s.train.collate import collate_lists, pad_to, static_shape
from convs2s.config import PAD, PRESETS, TrainConfig
from convs2s.model.network import ConvS2S
from convs2s.train.optim import build_optimizer
from convs2s.train.comm import Comm
from convs2s.model.loss import compile_loss_chunks, compiled_chunk_devices
from convs2s.train.update import apply_step_settings, compile_for_training, train_update

DEFAULT_VOCAB = {"iwslt_de_en": 8000, "tiny": 1000, "small": 1000}  # others: 40k (paper §4.1)
# The paper's update (GPUs x the token budget per GPU), as the workflows' presets state it
# (workflows/wmt14_en_fr.py, wmt14_en_de.py: update_tokens; not imported, they need Ray). A
# budget counts padded tokens; one benchmark step is one update of --max-tokens.
PAPER_UPDATE = {"wmt14_en_fr": (8, 3000), "wmt14_en_de": (1, 4000)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="iwslt_de_en", choices=sorted(PRESETS))
    p.add_argument("--vocab", type=int, default=0,
                   help="joint vocabulary of the model (0: 8000 for iwslt_de_en, else 40000)")
    p.add_argument("--bpe-vocab", type=int, default=8000,
                   help="BPE trained on the newstest text: sets the sentence lengths")
    p.add_argument("--data", type=Path, default=DATA_DIR, help="the small real corpora")
    p.add_argument("--max-tokens", type=int, default=4000, help="batch token budget")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16 autocast (on a CPU: fast only where it has native bf16 matrix "
                        "products, e.g. AVX-512 BF16 or AMX)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N steps and record the top operators")
    p.add_argument("--profile-shapes", action="store_true",
                   help="with --profile: also the largest input-shape groups of the top "
                        "operators that are not matrix products (which copies and casts cost)")
    p.add_argument("--peak-sizes", type=int, nargs="+", default=None,
                   help="square matmul sizes for the peak (default 1024 2048; GPU 4096 8192)")
    p.add_argument("--max-load", type=float, default=1.5,
                   help="wait until the 1-minute load average is below this ...")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="... for at most this long (0: do not wait)")
    p.add_argument("--dump-batches", type=Path, default=None, metavar="JSON",
                   help="also write the timed batches (token ids) for the reference "
                        "implementation's step: scripts/fairseq_training_speed.py")
    p.add_argument("--compile", default="", metavar="BACKEND",
                   help="torch.compile the model through the loss (TrainConfig.compile), e.g. "
                        "inductor; the warmup steps include the compile")
    p.add_argument("--compile-loss", default="", metavar="BACKEND",
                   help="torch.compile only the fused loss's element-wise chunk work "
                        "(convs2s.model.loss.compile_loss_chunks; --compile does it too, on "
                        "CUDA), the model eager: what fusing the loss alone buys, for a "
                        "compile of seconds")
    p.add_argument("--compile-mode", default="", metavar="MODE",
                   help="with --compile: torch.compile's mode, e.g. reduce-overhead (CUDA "
                        "graphs, one per batch shape: give --static-shapes)")
    p.add_argument("--fuse", default="", metavar="BACKEND",
                   help="compile the blocks' element-wise work as four shared functions and, on "
                        "CUDA, the loss's chunks (TrainConfig.fuse; convs2s.model.fused): a "
                        "compile of under a minute, the model's products eager")
    p.add_argument("--conv", choices=["windows", "native"], default="windows",
                   help="the convolutions' full pass: k-frame windows and one GEMM, or the "
                        "library's convolution (TrainConfig.conv; cuDNN on a GPU)")
    p.add_argument("--static-shapes", type=int, default=0, metavar="M",
                   help="pad every batch to a static shape (convs2s.train.collate.pad_to: "
                        "lengths rounded up to a multiple of M, the budget's sentence count "
                        "for them; the loss masked, not gathered), and step each shape once "
                        "before the timed steps; flops are counted on the unpadded batches")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay the forward and backward from CUDA graphs, one per batch shape "
                        "the run steps, each captured (about a step's memory each; "
                        "convs2s.train.graphs; needs --static-shapes and a CUDA device)")
    p.add_argument("--compile-deadline", type=float, default=0.0, metavar="SECONDS",
                   help="with --compile: if the first step is still compiling this long "
                        "after the start, print the compile's phases so far and every "
                        "thread's stack, and exit 3 (0: no deadline)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--resample", type=int, default=0, metavar="N",
                   help="draw N sentence pairs from the corpus with replacement before the "
                        "batches are cut: large budgets filled as a large corpus fills them "
                        "(0: the corpus as it is)")
    p.add_argument("--out", type=Path, default=None, help="result JSON path")
    p.add_argument("--replace", action="store_true",
                   help="overwrite the result file if it exists (default: keep it and write "
                        "<name>-<time>.json beside it)")
    args = p.parse_args(argv)
    if args.compile_deadline and not (args.compile and args.warmup):
        p.error("--compile-deadline watches the compile in the first warm-up step: give "
                "--compile and --warmup 1 or more")
    if args.fuse and (args.compile or args.compile_loss):
        p.error("--fuse compiles the blocks' element-wise work and, on CUDA, the loss's chunks; "
                "--compile compiles the whole model: give one of them")
    if args.compile_mode and not args.compile:
        p.error("--compile-mode needs --compile BACKEND")
    if args.compile_mode in ("reduce-overhead", "max-autotune") and not args.static_shapes:
        p.error(f"--compile-mode {args.compile_mode} records a CUDA graph per batch shape, and "
                "nearly every batch is a shape of its own: give --static-shapes M")
    if args.cuda_graphs and not (args.static_shapes and args.device.startswith("cuda")):
        p.error("--cuda-graphs needs --static-shapes M and a CUDA --device")
    if args.cuda_graphs and args.compile:
        p.error("--cuda-graphs captures the eager step: for CUDA graphs with --compile, give "
                "--compile-mode reduce-overhead instead")
    args.vocab = args.vocab or DEFAULT_VOCAB.get(args.preset, 40_000)
    return args


def make_batches(args, workdir: Path):
    """Token-budget batches of real De-En newstest sentences (ids < bpe vocab <= model vocab).
    `args.resample` N: N pairs drawn from them with replacement (seeded) before the cut, so that
    large budgets are cut as from a large corpus: 6,003 sentences make ten 24,000-token batches,
    each holding lengths far apart (filled 0.58-0.93), where the paper's corpus fills them as
    full as 3,000-token ones; only the batches the run steps are kept."""
    pairs = read_pairs(args.data / "wmt14-en-de", ["newstest2013", "newstest2014"], "de", "en")
    sp = train_joint_bpe(pairs, min(args.bpe_vocab, args.vocab), workdir)
    src, tgt = encode(sp, [s for s, _ in pairs]), encode(sp, [t for _, t in pairs])
    info = {"corpus": "wmt14-en-de newstest2013+2014, De->En", "bpe_vocab": sp.get_piece_size(),
            "src_len": length_stats(src), "tgt_len": length_stats(tgt)}
    resample = getattr(args, "resample", 0)  # (other benchmarks' arguments have none)
    if resample:
        drawn = np.random.default_rng(args.seed).integers(0, len(src), size=resample)
        src, tgt = [src[i] for i in drawn], [tgt[i] for i in drawn]
        info["resampled_to"] = resample
    batches = token_budget_batches(src, tgt, args.max_tokens, args.seed)
    if resample:
        batches = batches[:args.warmup + args.steps + args.profile]
    # real tokens over the slots their padded batches hold (source and target together)
    slots = sum(len(s) * (max(map(len, s)) + max(map(len, t))) for s, t in batches)
    info.update(batches=len(batches), fill=round(sum(
        sum(map(len, s)) + sum(map(len, t)) for s, t in batches) / slots, 4))
    return batches, info


# The compile's phases, as torch's dynamo timers name them (seconds summed over compiles): the
# frontend traces the model (bytecode_tracing), AOT autograd makes the joint graph and splits it
# (aot_trace_joint_graph, ...), inductor lowers each half and generates and builds its kernels
# (compile_fx_inner; compile_file and async_compile.wait are the C++ / Triton builds).
COMPILE_PHASES = ("_compile.compile_inner", "compile_attempt_0", "compile_attempt_1",
                  "bytecode_tracing", "create_aot_dispatcher_function", "aot_collect_metadata",
                  "aot_trace_joint_graph", "compile_fx.<locals>.fw_compiler_base",
                  "compile_fx.<locals>.bw_compiler", "compile_fx_inner", "GraphLowering.codegen",
                  "compile_file", "async_compile.wait", "PyCodeCache.load_by_key_path")


def compile_phases() -> dict:
    """Seconds per compile phase so far (torch's own timers, summed over attempts and graphs;
    a phase still running, which torch lists before it ends, is "running"); {} where this torch
    has no such timers."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return {}
    return {k: round(sum(v), 2) if v else "running"
            for k, v in list(compilation_time_metrics.items()) if k in COMPILE_PHASES}


class CompileWatchdog:
    """With `--compile-deadline`: if the compiling step has not finished `seconds` after the
    benchmark started (the clock an outer time limit counts on), print the compile phases timed
    so far and every thread's stack, then end the process (exit 3), so that a compile cut off
    by that limit still says where its time went."""

    def __init__(self, seconds: float):
        self.done = threading.Event()
        self.seconds = seconds
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        if self.done.wait(self.seconds):
            return
        phases = compile_phases()
        if self.done.is_set():  # the step ended as the deadline passed
            return
        print(f"compile deadline: the first step is still compiling {self.seconds:.0f} s after "
              f"the start; phases timed so far (s): {json.dumps(phases)}; where each thread "
              "is:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(3)


def run(args: argparse.Namespace, on_timed=None) -> dict:
    watchdog = CompileWatchdog(args.compile_deadline) \
        if args.compile and args.compile_deadline else None  # counts from the start
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    cfg = PRESETS[args.preset]()
    with tempfile.TemporaryDirectory() as tmp:
        batches, data_info = make_batches(args, Path(tmp))
    if args.dump_batches is not None:
        args.dump_batches.write_text(json.dumps([[src, tgt] for src, tgt in batches]))
    batches = [collate_lists(s, t) for s, t in batches]
    # what the step trains on: the batches, or padded to static shapes (the flops and token
    # counts of the timed rows stay the unpadded batches')
    stepped_batches = [pad_to(b, *static_shape(b, args.max_tokens, args.static_shapes))
                       for b in batches] if args.static_shapes else batches
    shape_of = lambda i: (tuple(stepped_batches[i % len(batches)].src_tokens.shape),  # noqa: E731
                          tuple(stepped_batches[i % len(batches)].target.shape))
    # the shapes the run steps: warm-up, timed and profiled steps (with --cuda-graphs, each
    # gets its capture: a shape past the graphs' cap would step eagerly inside the timing)
    stepped_shapes = len({shape_of(i) for i in range(args.warmup + args.steps + args.profile)})
    model = ConvS2S(cfg, args.vocab, args.vocab).to(device).train()
    train_cfg = TrainConfig(precision=args.dtype, compile=args.compile, conv=args.conv,
                            fuse=args.fuse)
    apply_step_settings(model, train_cfg)  # as the Trainer does
    optimizer = build_optimizer(model.parameters(), train_cfg)
    comm = Comm()
    stepped = compile_for_training(model, args.compile, mode=args.compile_mode or None) \
        if args.compile else model  # as the Trainer does with TrainConfig.compile
    if args.cuda_graphs:
        from convs2s.train.graphs import CudaGraphedLoss

        stepped = CudaGraphedLoss(model, max_shapes=stepped_shapes)
    if args.compile_loss and not args.compile:  # on this device, the CPU included
        compile_loss_chunks(args.compile_loss, devices=(device.type,))

    def step(i: int):
        stats = train_update(stepped, optimizer, [stepped_batches[i % len(batches)]], train_cfg,
                             comm, device)
        if stats is None:
            raise RuntimeError("train_update returned None for a non-empty batch")
        return stats

    peak_sizes = tuple(args.peak_sizes) if args.peak_sizes else None
    quiet = wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet else {}
    load_before = load_average()
    peak_before = matmul_peak(device, dtype, peak_sizes)
    warmup_s = []  # each untimed step's seconds: with --compile the first holds the compile
    for i in range(args.warmup):
        t0 = time.perf_counter()
        step(i)
        synchronize(device)
        warmup_s.append(time.perf_counter() - t0)
        if watchdog is not None:
            watchdog.done.set()  # the compile is in the first step (one dynamic graph)
    timed = range(args.warmup, args.warmup + args.steps)
    # Static shapes: each timed shape stepped once first (its graph), and each profiled one
    # (no graph is captured under the profiler). The convolutions by cuDNN too: it plans each
    # new input shape (about 0.1 s a shape for this model's ~30 convolutions, forward and
    # backward), which all but every 3,000-token batch is, and the windows' GEMMs do not.
    # On a GPU every timed batch is stepped once first, whatever the settings: its first use
    # paid allocator growth and library plans inside the timing (24,000-token steps of 94.5-
    # 228.5 ms the first time, 92.6-96.6 ms the second, on the H200 of 2026-11-27)
    shape_warmup_s = []
    if args.static_shapes or args.conv == "native" or device.type == "cuda":
        seen = {shape_of(i) for i in range(args.warmup)}
        for i in range(args.warmup, args.warmup + args.steps + args.profile):
            if shape_of(i) not in seen:
                seen.add(shape_of(i))
                t0 = time.perf_counter()
                step(i)
                synchronize(device)
                shape_warmup_s.append(time.perf_counter() - t0)
    eager_before = stepped.eager_steps if args.cuda_graphs else 0
    rows, losses = [], []
    for i in timed:
        b = batches[i % len(batches)]
        t0 = time.perf_counter()
        stats = step(i)
        host = time.perf_counter() - t0  # the step's Python call returned: its work launched
        synchronize(device)
        dt = time.perf_counter() - t0
        fl = batch_flops(cfg, args.vocab, b.src_lengths.tolist(),
                         b.target.ne(PAD).sum(1).tolist())
        rows.append({"seconds": dt, "host_seconds": host, "tgt_tokens": b.ntokens,
                     "src_tokens": b.src_ntokens, "sentences": b.nsentences,
                     "useful_flops": TRAIN_MULTIPLIER * fl["useful"],
                     "padded_flops": TRAIN_MULTIPLIER * fl["padded"]})
        losses.append(float(stats.loss_sum) / stats.ntokens)
    timed_eager = stepped.eager_steps - eager_before if args.cuda_graphs else 0
    peak_after = matmul_peak(device, dtype, peak_sizes)
    load_after = load_average()
    # The model's dominant product: (tokens) x (k * C_in) @ (k * C_in) x (2 C), its own shape.
    c, k = cfg.decoder_layers[0]
    gemm = matmul_rate(int(median(r["tgt_tokens"] for r in rows)), k * c, 2 * c, device, dtype)
    peak = max(peak_before["flops"], peak_after["flops"])
    peak_best = max(peak_before["flops_best"], peak_after["flops_best"])
    def output(profile: dict) -> dict:
        """The result, with `profile` (written before the profile runs, and again after)."""
        rate = lambda key: median(r[key] / r["seconds"] for r in rows)  # noqa: E731
        total_s = sum(r["seconds"] for r in rows)
        mean_src = float(np.mean([r["src_tokens"] / r["sentences"] for r in rows]))
        datasheet = datasheet_peak(torch.cuda.get_device_name(device)
                                   if device.type == "cuda" else None, args.dtype)
        paper = PAPER_UPDATE.get(args.preset)
        results = {
            "preset": args.preset, "vocab": args.vocab, "dtype": args.dtype,
            "compile": args.compile,
            "compile_loss": args.compile_loss, "conv": args.conv, "fuse": args.fuse,
            # whether this run's chunks ran compiled (on its device)
            "compiled_loss_on": [d for d in compiled_chunk_devices() if d == device.type],
            "parameters": sum(p.numel() for p in model.parameters()),
            "data": data_info,
            "steps": len(rows), "median_step_s": median(r["seconds"] for r in rows),
            # until the step's call returned, before the device wait: on a GPU, a host time near
            # the step time says the host's launches set the pace
            "median_host_step_s": median(r["host_seconds"] for r in rows),
            "warmup_step_s": [round(x, 3) for x in warmup_s],
            # (every compile: the model's, the loss's chunks', the blocks' fused work)
            "compile_phases_s": compile_phases() if args.compile or args.compile_loss or args.fuse
            else {},
            "compile_mode": args.compile_mode, "static_shapes": args.static_shapes,
            "cuda_graphs": stepped.captured_shapes if args.cuda_graphs else 0,  # graphs captured
            # timed steps of a shape past the graphs' cap, stepped eagerly (0: every one replayed)
            "cuda_graphs_eager_timed_steps": timed_eager,
            "cuda_graphs_eager_steps": stepped.eager_steps if args.cuda_graphs else 0,  # all steps
            "stepped_shapes": stepped_shapes,
            "shape_warmup_step_s": [round(x, 3) for x in shape_warmup_s],
            "timed_shapes": len({shape_of(i) for i in timed}),
            # token slots computed on over those of the unpadded batches (1: no padding added)
            "padding_factor": sum(stepped_batches[i % len(batches)].padded_tokens for i in timed)
            / sum(batches[i % len(batches)].padded_tokens for i in timed),
            "tgt_tokens_per_step": float(np.mean([r["tgt_tokens"] for r in rows])),
            # one step is one update here: its real target tokens beside the paper's update, a
            # budget of padded tokens (8 GPUs x 3,000 for En-Fr)
            "update": {"tgt_tokens_per_update": float(np.mean([r["tgt_tokens"] for r in rows])),
                       "max_tokens_per_update": args.max_tokens,
                       "paper_update": {"gpus": paper[0], "max_tokens_per_gpu": paper[1],
                                        "max_tokens": paper[0] * paper[1]} if paper else None},
            "tgt_tokens_per_s": rate("tgt_tokens"),
            "tgt_tokens_per_s_overall": sum(r["tgt_tokens"] for r in rows) / total_s,
            "flops_per_tgt_token": {  # forward, at the timed batches' mean source length
                "encoder_per_src_token": encoder_flops(cfg),
                "decoder": decoder_flops(cfg, args.vocab, mean_src),
                "train_per_tgt_token": float(np.sum([r["useful_flops"] for r in rows])
                                             / np.sum([r["tgt_tokens"] for r in rows]))},
            "achieved_flops": rate("useful_flops"),
            "achieved_flops_padded": rate("padded_flops"),
            "peak_flops": peak, "peak_flops_best": peak_best,
            "peak": {"before": peak_before, "after": peak_after},
            "model_gemm_flops": gemm["median"],
            "fraction_of_peak": rate("useful_flops") / peak,
            # the same rate against the GPU's datasheet peak (dense) beside the measured one
            "datasheet_peak": datasheet,
            "fraction_of_datasheet_peak": rate("useful_flops") / datasheet["flops"]
            if datasheet else None,
            "measured_peak_of_datasheet": peak / datasheet["flops"] if datasheet else None,
            # Fastest step over fastest matmul: the less load-sensitive pair on a busy machine.
            "tgt_tokens_per_s_best": max(r["tgt_tokens"] / r["seconds"] for r in rows),
            "fraction_of_peak_best": max(r["useful_flops"] / r["seconds"] for r in rows)
            / peak_best,
            "fraction_of_peak_padded": rate("padded_flops") / peak,
            "loss_first_last": [losses[0], losses[-1]],
            "max_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "profile": profile,
            "per_step": rows,
        }
        if device.type == "cuda":
            results["max_gpu_memory_gib"] = round(
                torch.cuda.max_memory_allocated(device) / 2**30, 2)
            # what the captures hold (CUDA graphs: convs2s.train.memory_fit charges each one
            # its step's peak less the weights, which a lease is to check)
            results["gpu_memory_reserved_gib"] = round(
                torch.cuda.memory_reserved(device) / 2**30, 2)
        return {"machine": machine_info(device), "load_before": load_before,
                "load_after": load_after, "quiet": quiet, "results": results}

    if on_timed is not None:  # the timed figures on disk before the profile: a step cut
        # off inside it (its limit, the lease's) keeps them
        on_timed(output({"pending": "the profile runs after the timing"} if args.profile
                        else {}))
    profile = {}
    if args.profile:  # where the time goes: operators, then the step's phases
        first = args.warmup + args.steps
        flops = sum(TRAIN_MULTIPLIER * batch_flops(
            cfg, args.vocab, b.src_lengths.tolist(), b.target.ne(PAD).sum(1).tolist())["padded"]
            for b in (batches[(first + i) % len(batches)] for i in range(args.profile)))
        try:  # (after the timing: a profile that fails keeps the timed figures, and says why)
            profile = operator_profile(lambda i: step(first + i), args.profile, flops,
                                       shapes=args.profile_shapes)
            # the phases of the step as it runs: with --cuda-graphs, the replayed forward and
            # backward (the eager model otherwise; a compiled model would compile again)
            profile["phases_ms"] = phase_breakdown(stepped if args.cuda_graphs else model,
                                                   optimizer, stepped_batches, train_cfg, device,
                                                   args.profile)
        except Exception as err:  # noqa: BLE001 - any failure of the profiler's own code
            traceback.print_exc()
            profile = {**profile, "error": f"{type(err).__name__}: {err}"}

    return output(profile)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    path = args.out or RESULTS_DIR / f"training_{args.preset}_{torch.device(args.device).type}.json"
    written = {}

    def save(out: dict) -> Path:
        """The result file: written once the steps are timed, again with the profile (the same
        file: a new name only where a recorded result was there before this run)."""
        notes = []
        load = out["load_before"][:1] + out["load_after"][:1]
        if load and max(load) > args.max_load:
            notes.append(f"measured under load (1-minute load average {load}): figures are low")
        written["path"] = write_result(
            written.get("path", path), "training",
            {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            out["machine"], out["load_before"], out["load_after"], out["quiet"],
            out["results"], notes, replace=args.replace or "path" in written)
        return written["path"]

    out = run(args, on_timed=save)
    path = save(out)
    r = out["results"]
    load = out["load_before"][:1] + out["load_after"][:1]
    print(format_table([{
        "preset": r["preset"], "device": f"{args.device} {args.dtype}",
        "tok/step": r["tgt_tokens_per_step"], "step s": r["median_step_s"],
        "tgt tok/s": r["tgt_tokens_per_s"], "GFLOP/s": r["achieved_flops"] / 1e9,
        "peak GFLOP/s": r["peak_flops"] / 1e9,
        "of peak": f"{100 * r['fraction_of_peak']:.1f}%",
        "load": "/".join(f"{x:g}" for x in load)}],
        [(k, k) for k in ("preset", "device", "tok/step", "step s", "tgt tok/s", "GFLOP/s",
                          "peak GFLOP/s", "of peak", "load")]))
    print(f"host time {1e3 * r['median_host_step_s']:.1f} ms of a "
          f"{1e3 * r['median_step_s']:.1f} ms step (medians)")
    if r["datasheet_peak"]:
        d = r["datasheet_peak"]
        print(f"{100 * r['fraction_of_datasheet_peak']:.1f}% of the {d['gpu']}'s datasheet "
              f"{d['dtype']} peak, {d['flops'] / 1e12:,.0f} TFLOP/s (measured here: "
              f"{r['peak_flops'] / 1e12:,.0f})")
    if r["profile"].get("error"):
        print(f"the profile failed: {r['profile']['error']} (the timed figures above stand)")
    elif r["profile"]:
        p = r["profile"]
        rate = (f"{p['matmul_flops'] / 1e9:,.0f} GFLOP/s" if p.get("matmul_flops") is not None
                else "no product run by an operator the host saw (graph replay)")
        # (the share of the operators' time: on a GPU of its busy time, not of the step)
        of = "GPU-busy time" if "kernels_per_step" in p else "the operators' time"
        print(f"products (matmuls, convolutions): {p['matmul_share']:.1%} of {of} "
              f"({p['busy_ms_per_step']:.1f} ms a step) at {rate}; phases (ms, each timed "
              f"alone, synchronized: an upper bound): {p['phases_ms']}")
        if "kernels_per_step" in p:
            print(f"GPU busy {p['busy_ms_per_step']:.1f} ms of a {1e3 * r['median_step_s']:.1f} ms "
                  f"step; {p['kernels_per_step']:,.0f} kernels, {p['launches_per_step']:,.0f} "
                  f"launches, {p['graph_launches_per_step']:g} graph launches, "
                  f"{p['host_syncs_per_step']:g} host syncs a step")
        for row in p["ops"][:12]:
            print(f"  {row['share']:6.1%}  {row['self_ms_per_step']:9.1f} ms/step  {row['op']}")
        print(f"{p['copies_per_step']:,.0f} copies and casts a step (aten::copy_); the most "
              "costly by caller:")
        for row in p["copies_by_caller"][:6]:
            print(f"  {row['calls']:7,.0f} calls  {row['ms_per_step']:9.1f} ms/step  "
                  f"{row['caller']}")
    print(f"result: {path}")
    return out


if __name__ == "__main__":
    main()
