"""What static shapes cost: the batches of `benchmarks.training` (real newstest sentences cut
to a token budget) padded to `convs2s.train.collate.static_shape`, for several roundings: how
many shapes (CUDA graphs to capture: memory and capture time grow with them) and how many token
slots the step then computes on, over the unpadded batches' (the padding factor). No model is
run; the figures depend on the data and the budget only.

    python -m benchmarks.static_shapes --max-tokens 3000 24000 --multiples 8 16 32

Writes benchmarks/results/static_shapes.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, write_result
from benchmarks.training import make_batches
from benchmarks.training import parse_args as training_args
from convs2s.train.collate import collate_lists, pad_to, static_shape


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.static_shapes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, nargs="+", default=[3000, 24000])
    p.add_argument("--multiples", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--first", type=int, default=35,
                   help="also count the shapes of the first N batches (a benchmark's steps)")
    p.add_argument("--bpe-vocab", type=int, default=8000)
    p.add_argument("--data", type=Path, default=None, help="the small real corpora")
    p.add_argument("--out", type=Path, default=None, help="result JSON path")
    p.add_argument("--replace", action="store_true")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    for tokens in args.max_tokens:
        targs = training_args(["--max-tokens", str(tokens), "--bpe-vocab", str(args.bpe_vocab)]
                              + (["--data", str(args.data)] if args.data else []))
        with tempfile.TemporaryDirectory() as tmp:
            raw, _ = make_batches(targs, Path(tmp))
        batches = [collate_lists(s, t) for s, t in raw]
        slots = sum(b.padded_tokens for b in batches)
        for m in args.multiples:
            shapes = [static_shape(b, tokens, m) for b in batches]
            padded = sum(pad_to(b, *shape).padded_tokens for b, shape in zip(batches, shapes))
            rows.append({"max_tokens": tokens, "multiple": m, "batches": len(batches),
                         "shapes": len(set(shapes)),
                         f"shapes_first_{args.first}": len(set(shapes[:args.first])),
                         "padding_factor": round(padded / slots, 3),
                         "real_tokens_per_slot_unpadded": round(
                             sum(b.ntokens + b.src_ntokens for b in batches) / slots, 3)})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    before = load_average()
    rows = run(args)
    path = write_result(args.out or RESULTS_DIR / "static_shapes.json", "static_shapes",
                        {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                        machine_info(torch.device("cpu")), before, load_average(), {},
                        {"rows": rows},
                        replace=args.replace)
    print(format_table(rows, [(k, k) for k in rows[0]]))
    print(f"result: {path}")
    return rows


if __name__ == "__main__":
    main()
