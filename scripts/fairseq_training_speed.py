"""The reference implementation's training step on given batches: run with the reference's own
interpreter (the scratch environment of scripts/fairseq_fixtures.sh, or the wheels
scripts/fairseq_wheels.sh fetches for a GPU machine), never the project's.

`python -m benchmarks.training --dump-batches batches.json ...` writes the batches it times
(token ids, EOS-terminated); this script times the reference's `fconv` model of the same
architecture on them: forward, label-smoothed loss summed over the target tokens, backward,
gradient clipping and a Nesterov SGD step (the reference recipe: momentum 0.99, clip 0.1), one
step per batch, after untimed warm-up steps (on a GPU, also one untimed step of each timed
batch, as the project's benchmark takes). Each batch's padded tensors are built once, before
the timing; a timed step moves them to the device, as the project's step does, and on a GPU
ends with a synchronize. The optimizer is torch's SGD (foreach on a GPU), not the reference's
own per-parameter NAG loop: if anything, faster than the reference as it ships.

    python scripts/fairseq_training_speed.py --batches batches.json --arch fconv_iwslt_de_en \
        --vocab 8000 --steps 10 --warmup 2 --threads 2 --out result.json
    python scripts/fairseq_training_speed.py --batches b.json --arch fconv_wmt_en_fr \
        --vocab 40000 --device cuda --dtype bf16 --out ref.json     # one GPU

`--dtype bf16` runs the forward passes under bf16 autocast, the project's own bf16 mode (the
reference's `--bf16` instead trains a bf16 copy of the model behind float32 master weights).
The result holds each timed step's seconds and target tokens, the median tokens/s and all
timed tokens over all timed seconds (`tgt_tokens_per_s_overall`, what a comparison reads), a UTC
`created` stamp and the host under `machine` (CPU model and matmul flags, GPU name, named as
`benchmarks.machine.machine_info` names them, so a reference file says where it ran).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

# Copied from benchmarks/machine.py (this script runs in the reference's environment, without
# the project): the CPU features that decide the matmul rates, and the settings that cap them.
MATMUL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                "amx_int8", "amx_tile", "bf16", "i8mm", "asimddp")
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
              "CONVS2S_CPU_BF16")


def host(torch, device) -> dict:
    """The machine, with the keys `benchmarks.machine.machine_info` gives them: the CPU model
    and matmul flags from /proc/cpuinfo (None where unreadable), cores, and the GPU's name."""
    cpu, flags = None, None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and cpu is None:
                cpu = value.strip()
            elif key in ("flags", "Features") and flags is None:
                have = set(value.split())
                flags = [f for f in MATMUL_FLAGS if f in have]
            if cpu is not None and flags is not None:
                break
    except OSError:
        pass
    info = {"hostname": platform.node(), "platform": platform.platform(),
            "cpu": cpu or platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "cpu_flags": flags, "device": str(device),
            "torch_threads": torch.get_num_threads()}
    limits = {k: os.environ[k] for k in ISA_LIMITS if os.environ.get(k)}
    if limits:
        info["isa_limits"] = limits
    if device.type == "cuda":
        info["gpu"] = {"name": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    return info


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", required=True, help="JSON: [[src id lists], [tgt id lists]]")
    p.add_argument("--arch", default="fconv_iwslt_de_en")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: the forward passes under bf16 autocast")
    p.add_argument("--dropout", type=float, default=0.2,
                   help="the model's dropout (give the project preset's: 0.1 for En-Fr)")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    d = Dictionary()  # bos 0, pad 1, eos 2, unk 3, then the pieces: the project's ids
    for i in range(4, args.vocab):
        d.add_symbol(f"p{i}")
    margs = argparse.Namespace(arch=args.arch, dropout=args.dropout, max_source_positions=1024,
                               max_target_positions=1024, encoder_embed_path=None,
                               decoder_embed_path=None, left_pad_source=True)
    ARCH_CONFIG_REGISTRY[args.arch](margs)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(
        margs, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    device = torch.device(args.device)
    model = model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.25, momentum=0.99, nesterov=True)
    pad, eos = d.pad(), d.eos()
    batches = json.loads(open(args.batches).read())
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.dtype == "bf16" \
        else contextlib.nullcontext()

    def tensors(src, tgt):
        S, T = max(map(len, src)), max(map(len, tgt))
        s = torch.full((len(src), S), pad, dtype=torch.long)
        prev = torch.full((len(tgt), T), pad, dtype=torch.long)
        target = torch.full((len(tgt), T), pad, dtype=torch.long)
        for i, (a, b) in enumerate(zip(src, tgt)):
            s[i, S - len(a):] = torch.tensor(a)  # left padded, as the reference's task pads
            target[i, :len(b)] = torch.tensor(b)
            prev[i, :len(b)] = torch.tensor([eos] + b[:-1])
        return (s, torch.tensor([len(a) for a in src]), prev, target), sum(map(len, tgt))

    prepared = [tensors(*b) for b in batches]  # built once, outside the timing

    def step(i):
        cpu, tokens = prepared[i % len(prepared)]
        src, lengths, prev, target = (t.to(device) for t in cpu)
        with autocast:
            out = model(src, lengths, prev)
            lprobs = model.get_normalized_probs(out, log_probs=True).view(-1, out[0].size(-1))
            loss, _ = label_smoothed_nll_loss(lprobs, target.view(-1, 1), args.label_smoothing,
                                              ignore_index=pad, reduce=True)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return tokens

    for i in range(args.warmup):
        step(i)
    if device.type == "cuda":  # each timed batch stepped once first, as the project's
        # benchmark does on a GPU (its first use pays allocator growth and library plans)
        seen = {i % len(prepared) for i in range(args.warmup)}
        for i in range(args.warmup, args.warmup + args.steps):
            if i % len(prepared) not in seen:
                seen.add(i % len(prepared))
                step(i)
    rows = []
    for i in range(args.warmup, args.warmup + args.steps):
        t0 = time.perf_counter()
        tokens = step(i)
        rows.append({"seconds": time.perf_counter() - t0, "tgt_tokens": tokens})
    with open(args.out, "w") as f:
        json.dump({"arch": args.arch, "threads": torch.get_num_threads(), "device":
                   torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "dtype": args.dtype, "per_step": rows,
                   "tgt_tokens_per_s": statistics.median(r["tgt_tokens"] / r["seconds"]
                                                         for r in rows),
                   # all timed tokens over all timed seconds: what a comparison reads (a
                   # median of per-step rates ran 3-15% above it on the H200)
                   "tgt_tokens_per_s_overall": sum(r["tgt_tokens"] for r in rows)
                   / sum(r["seconds"] for r in rows),
                   "dropout": args.dropout,
                   "torch": torch.__version__,
                   "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "machine": host(torch, device)}, f)


if __name__ == "__main__":
    main()
