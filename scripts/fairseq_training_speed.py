"""The reference implementation's training step on given batches: run with the reference's own
interpreter (the scratch environment of scripts/fairseq_fixtures.sh), never the project's.

`python -m benchmarks.training --dump-batches batches.json ...` writes the batches it times
(token ids, EOS-terminated); this script times the reference's `fconv` model of the same
architecture on them: forward, label-smoothed loss summed over the target tokens, backward,
gradient clipping and a Nesterov SGD step (the reference recipe: momentum 0.99, clip 0.1),
float32 on the CPU, one step per batch, after untimed warm-up steps:

    python scripts/fairseq_training_speed.py --batches batches.json --arch fconv_iwslt_de_en \
        --vocab 8000 --steps 10 --warmup 2 --threads 2 --out result.json

The result holds each timed step's seconds and target tokens, and the median tokens/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace


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
    margs = argparse.Namespace(arch=args.arch, dropout=0.2, max_source_positions=1024,
                               max_target_positions=1024, encoder_embed_path=None,
                               decoder_embed_path=None, left_pad_source=True)
    ARCH_CONFIG_REGISTRY[args.arch](margs)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(
        margs, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.25, momentum=0.99, nesterov=True)
    pad, eos = d.pad(), d.eos()
    batches = json.loads(open(args.batches).read())

    def tensors(src, tgt):
        S, T = max(map(len, src)), max(map(len, tgt))
        s = torch.full((len(src), S), pad, dtype=torch.long)
        prev = torch.full((len(tgt), T), pad, dtype=torch.long)
        target = torch.full((len(tgt), T), pad, dtype=torch.long)
        for i, (a, b) in enumerate(zip(src, tgt)):
            s[i, S - len(a):] = torch.tensor(a)  # left padded, as the reference's task pads
            target[i, :len(b)] = torch.tensor(b)
            prev[i, :len(b)] = torch.tensor([eos] + b[:-1])
        return s, torch.tensor([len(a) for a in src]), prev, target

    def step(i):
        src, lengths, prev, target = tensors(*batches[i % len(batches)])
        out = model(src, lengths, prev)
        lprobs = model.get_normalized_probs(out, log_probs=True).view(-1, out[0].size(-1))
        loss, _ = label_smoothed_nll_loss(lprobs, target.view(-1, 1), args.label_smoothing,
                                          ignore_index=pad, reduce=True)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        return int(target.ne(pad).sum())

    for i in range(args.warmup):
        step(i)
    rows = []
    for i in range(args.warmup, args.warmup + args.steps):
        t0 = time.perf_counter()
        tokens = step(i)
        rows.append({"seconds": time.perf_counter() - t0, "tgt_tokens": tokens})
    with open(args.out, "w") as f:
        json.dump({"arch": args.arch, "threads": torch.get_num_threads(), "per_step": rows,
                   "tgt_tokens_per_s": statistics.median(r["tgt_tokens"] / r["seconds"]
                                                         for r in rows),
                   "torch": torch.__version__}, f)


if __name__ == "__main__":
    main()
