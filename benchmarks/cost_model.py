"""Cost model: the paper's three translation tasks on 8, 64 and 128 GPUs, from this project's
measured figures where they exist and stated assumptions where they do not.

Per task (its workflow's `paper()`): training FLOPs per target token (benchmarks/flops.py),
parameters (the model built on the meta device), target tokens per epoch (the paper's pairs x
an assumed length), epochs (the workflow's lr recipe, or what the paper's days imply). Per scale
an update takes the longest of: compute, the ring all-reduce of float32 gradients (overlapped
with the backward pass by DDP) and, once benchmarks/streaming.py has a result, streaming a batch
per worker. Compute is PROJECTED (bf16 peak x --mfu) for the H100 and A100 rows; an H200 row is
added for each task whose paper model and token budget benchmarks.training measured on one H200
(--gpu-json): its compute time is that GPU's measured step, and only its scaling to n GPUs is
modelled. Preprocessing (measured pairs/s per CPU) and checkpoint saves (weights + NAG
momentum) are set against that.

    python -m benchmarks.cost_model
    python -m benchmarks.cost_model --mfu 0.5 --epochs wmt16_en_ro=20 --inter-node-gbit 400

Writes benchmarks/results/cost_model.json (or --out) and prints tables. Seconds, no data.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
from pathlib import Path

from benchmarks.flops import TRAIN_MULTIPLIER, decoder_flops, encoder_flops
from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, write_result
from convs2s.config import ModelConfig

TASKS = ("wmt14_en_fr", "wmt14_en_de", "wmt16_en_ro")  # workflows/<task>.py paper()
PAPER = "Gehring et al. 2017"  # cited by section (§N.M), written into the results' sources
# Per task: training pairs after the paper's filters (§4.1), and GPUs x days it trained; quoted.
PAPER_TASK = {
    "wmt14_en_fr": (35.5e6, f'{PAPER} §4.1 "This results in 35.5M sentence-pairs"',
                    8, 37.0, "docs/reference.md, Recipes: about 37 days on 8 GPUs"),
    "wmt14_en_de": (4.5e6, f'{PAPER} §4.1 "comprises 4.5M sentence pairs for training"',
                    1, 18.5, f'{PAPER} §5.1 "a single GPU over a period of 18.5 days"'),
    "wmt16_en_ro": (2.8e6, f'{PAPER} §4.1 "This results in 2.8M sentence pairs"',
                    1, 6.75, f'{PAPER} §5.1 "between 6 and 7.5 days" (midpoint)'),
}
# The one training speed the paper gives: 3624 target words/s on one GPU (§5.5; an M40, §4.2)
# for its ablation model (§5.4: 13 encoder layers k=3, 5 decoder layers k=5, 512 units,
# about 20K target words per batch after vocabulary selection).
PAPER_WORDS_PER_S = 3624
ABLATION = ModelConfig(embed_dim=512, encoder_layers=[(512, 3)] * 13,
                       decoder_layers=[(512, 5)] * 5, out_embed_dim=512)
GPU_PEAK = {"H100": 989e12, "A100": 312e12}  # dense bf16 FLOP/s, SXM datasheets
CKPT_BYTES_PER_PARAM = 8  # float32 weights + NAG momentum buffer
GRAD_BYTES_PER_PARAM = 4  # float32 gradients (parameters stay float32 under bf16 autocast)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cost_model",
                                description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--src-tokens-per-pair", type=float, default=30.0, help="ASSUMED mean BPE source length")
    a("--tgt-tokens-per-pair", type=float, default=30.0, help="ASSUMED mean BPE target length")
    a("--mfu", type=float, default=0.35, help="ASSUMED fraction of the GPU bf16 peak")
    a("--gpus", type=int, nargs="+", default=[8, 64, 128])
    a("--gpus-per-node", type=int, default=8)
    a("--intra-node-gbyte", type=float, default=200.0, help="ASSUMED NVLink all-reduce GB/s")
    a("--inter-node-gbit", type=float, default=100.0, help="ASSUMED network Gbit/s per node")
    a("--grad-compression", choices=["none", "bf16"], default="none",
      help="gradients all-reduced as float32 (none) or bf16 (TrainConfig.grad_compression: "
           "half the bytes)")
    a("--storage-gbyte", type=float, default=1.0, help="ASSUMED checkpoint write rate, GB/s")
    a("--cpus-per-node", type=int, default=64, help="ASSUMED CPUs per node for preprocessing")
    a("--paper-gpu-tflops", type=float, default=7.0, help="ASSUMED M40 fp32 peak (datasheet)")
    a("--bytes-per-batch", type=float, default=0.0,
      help="0: the preprocess run's output_mib if recorded, else the Arrow layout's size")
    a("--epochs", nargs="*", default=[], metavar="TASK=N", help="override a task's epochs")
    a("--training-json", type=Path, default=RESULTS_DIR / "training_wmt14_en_de_cpu_epyc.json")
    a("--preprocess-json", type=Path, default=RESULTS_DIR / "preprocess_epyc_40m.json")
    a("--streaming-json", type=Path, default=RESULTS_DIR / "streaming.json")
    a("--gpu-json", type=Path, nargs="*", default=[  # the latest lease (2026-11-27, H200)
        RESULTS_DIR / "gpu_checks_h200_20261127_reference" / f"training_{t}_cuda_bf16.json"
        for t in ("wmt14_en_fr", "wmt14_en_de")],
      help="benchmarks.training results on one GPU (bf16): measured compute for that task")
    a("--out", type=Path, default=None)
    a("--replace", action="store_true",
      help="overwrite the result file if it exists (default: keep it and write "
           "<name>-<time>.json beside it)")
    return p.parse_args(argv)


def rel(path: Path) -> str:
    root, path = RESULTS_DIR.parents[1], path.resolve()  # the repository
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def train_flops(cfg: ModelConfig, vocab: int, src: float, tgt: float) -> float:
    """Training FLOPs per target token: the encoder runs src/tgt source tokens per target."""
    return TRAIN_MULTIPLIER * (encoder_flops(cfg) * src / tgt + decoder_flops(cfg, vocab, src))


def parameters(cfg: ModelConfig, vocab: int) -> int:
    import torch

    from convs2s.model.network import ConvS2S
    with torch.device("meta"):  # shapes only: no memory, no initialization cost
        return sum(p.numel() for p in ConvS2S(cfg, vocab, vocab).parameters())


def recipe_epochs(train) -> int | None:
    """Epochs a "fixed" lr recipe runs (convs2s.train.optim); None for the schedules that
    follow the validation curve ("anneal", "plateau": they depend on the data)."""
    if train.lr_schedule != "fixed":
        return None
    from convs2s.train.optim import LRSchedule
    sched = LRSchedule(train)
    for epoch in range(1, train.max_epochs + 1):
        sched.end_epoch(epoch, None)
        if sched.should_stop():
            return epoch
    return train.max_epochs


def measured(args) -> dict:
    """The measured inputs (CPU training, preprocessing, streaming) with their files."""
    doc = json.loads(args.training_json.read_text())
    r = doc["results"]
    m = {"cpu": {"file": rel(args.training_json), "host": doc["machine"]["cpu"],
                 "preset": r["preset"], "vocab": r["vocab"], "tok_s": r["tgt_tokens_per_s"],
                 "fraction": r["fraction_of_peak"], "peak_flops": r["peak_flops"],
                 "tgt_per_batch": r["tgt_tokens_per_step"], "notes": doc.get("notes", []),
                 "max_tokens": doc["settings"]["max_tokens"],
                 "src_mean": r["data"]["src_len"]["mean"],
                 "tgt_mean": r["data"]["tgt_len"]["mean"]}}
    doc = json.loads(args.preprocess_json.read_text())
    run = max((x for x in doc["results"]["runs"] if x["mode"] == "ray"), key=lambda x: x["pairs"])
    m["prep"] = {"file": rel(args.preprocess_json), "pairs": run["pairs"], "cpus": run["cpus"],
                 "pairs_per_s": run["pairs_per_s"], "per_cpu": run["pairs_per_s"] / run["cpus"]}
    if "output_mib" in run:  # batches of the demo preset's max_tokens
        from preprocessing.config import demo
        # the batches stage's parquet (zstd) per batch, per token of the budget
        m["prep"]["bytes_per_budget_token"] = (run["output_mib"]["batches"] * 2**20
                                               / run["batches"] / demo().max_tokens)
    m["stream"] = None
    if args.streaming_json.exists():
        stream = json.loads(args.streaming_json.read_text())["results"]["stream"]
        m["stream"] = {"file": rel(args.streaming_json),
                       "batches_per_s": min(s["batches_per_s"] for s in stream),
                       "tok_s": min(s["target_tokens_per_s"] for s in stream)}
    m["gpu"] = {}
    for path in args.gpu_json:
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        r = doc["results"]
        m["gpu"][r["preset"]] = {
            "file": rel(path), "device": (doc["machine"].get("gpu") or {}).get("name", "?"),
            "vocab": r["vocab"], "max_tokens": doc["settings"]["max_tokens"],
            # the mean step (all timed tokens over all timed seconds): a time to train is a
            # sum of steps, and these steps have a long tail (En-Fr 3,000 tokens: median
            # 44.8 ms, mean 51.5); a result without the overall rate, its median
            "dtype": r["dtype"], "median_step_s": r["median_step_s"],
            "step_s": (r["tgt_tokens_per_step"] / r["tgt_tokens_per_s_overall"]
                       if r.get("tgt_tokens_per_s_overall") else r["median_step_s"]),
            "tgt_per_step": r["tgt_tokens_per_step"], "tok_s": r["tgt_tokens_per_s"],
            "fraction": r["fraction_of_peak"], "peak_flops": r["peak_flops"]}
    return m


def measured_gpu(t: dict, m: dict) -> dict | None:
    """The measured one-GPU run of this task's paper model, vocabulary and token budget."""
    g = m["gpu"].get(t["preset"])
    if g and g["vocab"] == t["vocab"] and g["max_tokens"] == t["max_tokens"] \
            and g["dtype"] == "bf16":
        return g
    return None


def task_inputs(name: str, args, m: dict, paper_flops_s: float) -> dict:
    wf = importlib.import_module(f"workflows.{name}").paper()
    cfg, vocab, max_tokens = wf.model, wf.preprocess.vocab_size, wf.preprocess.max_tokens
    src, tgt = args.src_tokens_per_pair, args.tgt_tokens_per_pair
    flops, params = train_flops(cfg, vocab, src, tgt), parameters(cfg, vocab)
    pairs, _, gpus, days, _ = PAPER_TASK[name]
    epoch_tokens = pairs * tgt
    # Target tokens per batch: the measured batches' count, pro rata for another max_tokens;
    # at most max_sentences pairs of `tgt` tokens where the preset caps sentences (En-Ro's 64:
    # its batches are far below the token budget)
    by_tokens = m["cpu"]["tgt_per_batch"] * max_tokens / m["cpu"]["max_tokens"]
    max_sentences = wf.preprocess.max_sentences
    per_batch = min(by_tokens, max_sentences * tgt) if max_sentences else by_tokens
    implied = gpus * days * 86400 * paper_flops_s / (flops * epoch_tokens)
    recipe, override = recipe_epochs(wf.train), dict(e.split("=") for e in args.epochs)
    epochs = float(override.get(name) or recipe or math.ceil(implied))
    source = ("--epochs" if name in override else "workflow lr recipe" if recipe
              else "paper days (implied)")
    if args.bytes_per_batch:
        bpb, bpb_kind = args.bytes_per_batch, "--bytes-per-batch"
    elif "bytes_per_budget_token" in m["prep"]:
        bpb = m["prep"]["bytes_per_budget_token"] * max_tokens * per_batch / by_tokens
        bpb_kind = "measured output_mib"
    else:  # BATCH_SCHEMA in Arrow: int32 tokens; per sentence an int64 id, two int32 offsets
        bpb = 4 * per_batch * (1 + src / tgt) + 16 * per_batch / tgt
        bpb_kind = "assumed (Arrow int32 layout, uncompressed)"
    same = name == m["cpu"]["preset"] and vocab == m["cpu"]["vocab"]
    # Other presets on the CPU: the measured fraction of the same CPU's peak.
    cpu_tok_s = m["cpu"]["tok_s"] if same else m["cpu"]["fraction"] * m["cpu"]["peak_flops"] / flops
    ckpt_bytes = params * CKPT_BYTES_PER_PARAM
    return {"task": name, "preset": _preset_name(cfg), "vocab": vocab, "max_tokens": max_tokens,
            "max_sentences": max_sentences, "params": params,
            "params_m": params / 1e6, "flops": flops, "gflop_per_tok": flops / 1e9,
            "pairs": pairs, "epoch_tokens": epoch_tokens, "tgt_per_batch": per_batch,
            "recipe_epochs": recipe, "implied_epochs": implied, "epochs": epochs,
            "epochs_source": source, "paper_gpu_days": gpus * days,
            "bytes_per_batch": bpb, "bytes_per_batch_source": bpb_kind,
            "ckpt_gb": ckpt_bytes / 1e9, "ckpt_s": ckpt_bytes / (args.storage_gbyte * 1e9),
            "ckpt_every": wf.train.checkpoint_interval,
            "cpu_days_per_epoch": epoch_tokens / cpu_tok_s / 86400,
            "cpu_basis": "measured" if same else "projected (measured fraction)"}


def _preset_name(cfg: ModelConfig) -> str | None:
    """The convs2s.config preset that builds this model (its dropout aside), if one does."""
    from convs2s.config import PRESETS

    for name, make in PRESETS.items():
        if make().replace(dropout=cfg.dropout) == cfg:
            return name
    return None


FORWARD_SHARE = 1 / 3  # of a training step's FLOPs (the backward pass: twice the forward's)


def grad_bytes(args) -> int:
    """Bytes a parameter's gradient takes in the all-reduce (convs2s.train.ddp)."""
    return 2 if getattr(args, "grad_compression", "none") == "bf16" else GRAD_BYTES_PER_PARAM


def scale_row(t: dict, gpu: str, n: int, args, m: dict) -> dict:
    g = measured_gpu(t, m) if gpu == "H200" else None
    if g:  # the measured step, pro rata for the task's mean batch
        compute_s = g["step_s"] * t["tgt_per_batch"] / g["tgt_per_step"]
    else:
        compute_s = t["tgt_per_batch"] * t["flops"] / (GPU_PEAK[gpu] * args.mfu)
    bw = (args.intra_node_gbyte * 1e9 if n <= args.gpus_per_node
          else args.inter_node_gbit * 1e9 / 8)  # the ring's slowest link
    times = {"compute": compute_s,
             "all-reduce": 2 * (n - 1) / n * grad_bytes(args) * t["params"] / bw}
    if m["stream"]:  # one batch per worker and update, prefetched: overlaps compute
        times["input"] = t["tgt_per_batch"] / m["stream"]["tok_s"]
    # DDP all-reduces gradient buckets as the backward pass makes them: it overlaps the
    # backward (about 2/3 of the compute), never the forward, so an update takes at least
    # forward + max(backward, all-reduce)
    bound = {**times, "all-reduce": FORWARD_SHARE * compute_s + times["all-reduce"]}
    update_s = max(bound.values())
    worst = max(bound, key=bound.get)
    linear_tok_s = n * t["tgt_per_batch"] / compute_s  # compute only: linear scaling
    hours = t["epoch_tokens"] * t["epochs"] / (n * t["tgt_per_batch"] / update_s) / 3600
    prep_pairs_s = m["prep"]["per_cpu"] * args.cpus_per_node * math.ceil(n / args.gpus_per_node)
    need = 1 / compute_s  # batches/s a GPU consumes when nothing else limits it
    return {"task": t["task"], "gpu": gpu, "n": n, "compute_ms": compute_s * 1e3,
            "allreduce_ms": times["all-reduce"] * 1e3, "update_ms": update_s * 1e3,
            "bottleneck": worst if worst == "compute" else f"{worst} {update_s / compute_s:.1f}x",
            "epoch_hours_linear": t["epoch_tokens"] / linear_tok_s / 3600,
            "hours_linear": t["epoch_tokens"] * t["epochs"] / linear_tok_s / 3600,
            "hours": hours, "gpu_hours": hours * n, "need_batches_s": need,
            "need_mb_s": need * t["bytes_per_batch"] / 1e6,
            "stream_over_need": m["stream"]["tok_s"] * compute_s / t["tgt_per_batch"]
            if m["stream"] else None,
            "prep_s": t["pairs"] / prep_pairs_s,
            "prep_over_need": prep_pairs_s / (linear_tok_s / args.tgt_tokens_per_pair),
            "ckpt_pct": 100 * t["ckpt_s"] / (t["ckpt_every"] * update_s)
            if t["ckpt_every"] else None,
            "basis": f"measured step ({g['file']}), modelled scaling" if g else "projected"}


def inputs_table(args, m: dict, paper_flops_s: float) -> list[dict]:
    c, pr, st = m["cpu"], m["prep"], m["stream"]
    rows = [
        ("src / tgt tokens per pair", f"{args.src_tokens_per_pair:g} / "
         f"{args.tgt_tokens_per_pair:g}", "assumed", "WMT news at 40k BPE; for comparison, "
         f"newstest2013+14 at 8k BPE: {c['src_mean']:.1f} / {c['tgt_mean']:.1f} ({c['file']})"),
        (f"CPU training, {c['preset']}", f"{c['tok_s']:.1f} tgt tok/s, {c['fraction']:.1%} of "
         f"{c['peak_flops'] / 1e9:.0f} GFLOP/s fp32", "measured", f"{c['file']} ({c['host']})"),
        ("target tokens per batch", f"{c['tgt_per_batch']:,.0f} at max_tokens "
         f"{c['max_tokens']}", "measured", f"{c['file']}; pro rata for another max_tokens"),
        ("preprocessing", f"{pr['pairs_per_s']:,.0f} pairs/s on {pr['cpus']} CPUs "
         f"({pr['pairs'] / 1e6:.1f}M pairs)", "measured",
         f"{pr['file']} (demo corpus); x {args.cpus_per_node} CPUs/node assumed linear"),
        ("input streaming", f"{st['tok_s']:,.0f} tgt tok/s per worker" if st
         else "not measured yet", "measured" if st else "-", st["file"] if st
         else f"{rel(args.streaming_json)} absent: left out of the bottleneck"),
        ("GPU throughput", f"bf16 peak H100 989, A100 312 TFLOP/s x MFU {args.mfu:g}",
         "projected", "datasheets"),
        *((f"GPU training, {p}", f"{g['tok_s']:,.0f} tgt tok/s bf16 at max_tokens "
           f"{g['max_tokens']} at the median step ({g['median_step_s'] * 1e3:.1f} ms, "
           f"{g['fraction']:.1%} of {g['peak_flops'] / 1e12:.0f} TFLOP/s); the mean step, "
           f"which the hours use: {g['step_s'] * 1e3:.1f} ms", "measured",
           f"{g['file']} ({g['device']})")
          for p, g in m["gpu"].items()),
        ("all-reduce bandwidth", f"{args.intra_node_gbyte:g} GB/s in a node, "
         f"{args.inter_node_gbit:g} Gbit/s per node between nodes", "assumed",
         f"ring: 2(n-1)/n x {grad_bytes(args)} B x params ({args.grad_compression} gradient "
         f"compression); {args.gpus_per_node} GPUs/node"),
        ("checkpoint write", f"{args.storage_gbyte:g} GB/s, 8 B/param", "assumed",
         "float32 weights + NAG momentum, every checkpoint_interval updates"),
        ("paper GPU speed", f"{paper_flops_s / 1e12:.2f} TFLOP/s = "
         f"{paper_flops_s / (args.paper_gpu_tflops * 1e12):.0%} of an M40", "paper + assumed",
         f"{PAPER} §5.5: {PAPER_WORDS_PER_S} words/s, ablation model of §5.4"),
    ]
    return [dict(zip(("input", "value", "kind", "source"), r)) for r in rows]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    load_before = load_average()
    m = measured(args)
    # The paper's achieved FLOP/s on one M40, from its ablation model's words/s.
    paper_flops_s = PAPER_WORDS_PER_S * train_flops(
        ABLATION, 20_000, args.src_tokens_per_pair, args.tgt_tokens_per_pair)
    tasks = [task_inputs(name, args, m, paper_flops_s) for name in TASKS]
    rows = [scale_row(t, gpu, n, args, m) for t in tasks
            for gpu in [*GPU_PEAK, *(["H200"] if measured_gpu(t, m) else [])] for n in args.gpus]
    inputs = inputs_table(args, m, paper_flops_s) + [{
        "input": "bytes per batch", "value": ", ".join(
            f"{t['task']} {t['bytes_per_batch'] / 1e3:.1f} kB" for t in tasks),
        "kind": tasks[0]["bytes_per_batch_source"], "source": m["prep"]["file"]
        if "bytes_per_budget_token" in m["prep"] else "preprocessing/batching.py BATCH_SCHEMA "
        f"({m['prep']['file']} has no output_mib)"}]
    notes = [f"{t}: pairs {PAPER_TASK[t][1]}; time {PAPER_TASK[t][4]}" for t in TASKS]
    notes += [f"CPU training run: {x}" for x in m["cpu"]["notes"]]
    results = {"inputs": inputs, "tasks": tasks, "scales": rows,
               "paper_flops_per_s": paper_flops_s, "measured": m}
    path = args.out or RESULTS_DIR / "cost_model.json"
    path = write_result(path, "cost_model", {k: str(v) if isinstance(v, Path) else v
                                      for k, v in vars(args).items()},
                 machine_info(), load_before, load_average(), {}, results, notes,
                 replace=args.replace)
    print(format_table(inputs, [(k, k) for k in ("input", "value", "kind", "source")]) + "\n")
    print(format_table(tasks, [
        ("task", "task"), ("params_m", "params M"), ("gflop_per_tok", "train GFLOP/tok"),
        ("epoch_tokens", "tgt tok/epoch"), ("tgt_per_batch", "tok/batch"),
        ("recipe_epochs", "recipe ep"), ("implied_epochs", "paper-implied ep"),
        ("epochs", "epochs"), ("epochs_source", "epochs from"),
        ("paper_gpu_days", "paper GPU-days"), ("ckpt_gb", "ckpt GB"), ("ckpt_s", "save s"),
        ("cpu_days_per_epoch", "CPU days/ep"), ("cpu_basis", "CPU basis")]) + "\n")
    key = [("task", "task"), ("gpu", "gpu"), ("n", "GPUs")]
    print(format_table(rows, key + [
        ("compute_ms", "compute ms"), ("allreduce_ms", "all-reduce ms"),
        ("bottleneck", "bound by"), ("epoch_hours_linear", "h/epoch lin"),
        ("hours_linear", "hours lin"), ("hours", "hours"), ("gpu_hours", "GPU-h"),
        ("basis", "basis")]) + "\n")
    shown = [{**r, "stream_over_need": r["stream_over_need"] or "not measured"} for r in rows]
    print(format_table(shown, key + [
        ("need_batches_s", "batches/s/GPU"), ("need_mb_s", "MB/s/GPU"),
        ("stream_over_need", "stream/need"), ("prep_s", "prep s"),
        ("prep_over_need", "prep/need"), ("ckpt_pct", "ckpt %"), ("basis", "basis")]))
    print(f"\nwrote {rel(path)}")
    return results


if __name__ == "__main__":
    main()
