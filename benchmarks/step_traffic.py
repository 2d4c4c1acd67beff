"""What one training update asks of the memory system, op by op, without a GPU: every ATen
operator the update dispatches (forward, backward, clipping, optimizer), its calls and the
bytes it reads and writes, matrix products apart from the rest.

On a GPU past a few thousand tokens per batch the step is GPU-bound and its non-matmul kernels
are memory-bound (docs/benchmarks.md, "The GPU step on an H200, 2026-11-27": matmuls 45% of
GPU-busy time at 18.6k tokens, copies and casts 14%). Their time is about their bytes over the
memory bandwidth, and each operator call is at least one kernel launch, so bytes and calls
counted here on the CPU predict which changes shorten the GPU step, before a GPU is lent. The
counts are of the CPU's dispatch under CPU autocast, whose casting rules are close to but not
the same as CUDA's; views (reshape, transpose, slices) move nothing and are not counted. The
matrix products are counted but not computed (zeros of their shape: which operators run does
not depend on the values); the fused output layer and loss is one custom operator here
(`convs2s::output_loss`), counted as one; the products inside it are zeros as well. The
paper's En-Fr model (40k vocabulary, bf16, a 3,000-token batch) is counted in about 10 s on an
AVX2 CPU without native bf16 (over 6 minutes when the loss's products were computed).

    python -m benchmarks.step_traffic --preset iwslt_de_en --max-tokens 2000 --dtype bf16
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map_only

from benchmarks.corpus import DATA_DIR
from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, write_result
from benchmarks.step_profile import MATMUL_OPS
from convs2s.config import PRESETS, TrainConfig
from convs2s.model import fused
from convs2s.model.conv import use_native_conv
from convs2s.model.network import ConvS2S
from convs2s.train.comm import Comm
from convs2s.train.optim import build_optimizer
from convs2s.train.update import train_update

# the convolutions (`TrainConfig.conv = "native"`) are products too: implicit GEMMs on a GPU
MATMULS = {op.split("::")[1] for op in MATMUL_OPS} | {"_weight_int8pack_mm", "convolution",
                                                      "convolution_backward"}
# A custom operator's CPU kernel, below the Python key of TorchDispatchMode (the count runs on
# the CPU only)
_CPU_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _where() -> str:
    """The code that asked for the operator: the autograd node running it in a backward pass,
    else the innermost project function on the Python stack."""
    node = torch._C._current_autograd_node()
    if node is not None:
        return f"backward of {node.name()}"
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if "/convs2s/" in path or "/torch/optim/" in path:
            return f"{path.split('/')[-2]}/{path.split('/')[-1]}:{f.f_code.co_name}"
        f = f.f_back
    return "?"


def _is_matmul(name: str) -> bool:
    """A matrix product, in place (`addmm_`) or not."""
    return name.rstrip("_") in MATMULS


def _zero_product(func, name: str, args, kwargs):
    """A matrix product not computed: zeros of its shape and dtype (read off the meta device);
    `out=`: the output zeroed; in place (`addmm_`, the float32 loss's weight gradient): the
    output left as it was. Which operators run and their sizes do not depend on the values, and
    a CPU without native bf16 would take minutes per update of the paper's models."""
    if name.endswith("_"):
        return args[0]
    if "out" in kwargs:
        return kwargs["out"].zero_()
    meta = func(*tree_map_only(torch.Tensor, lambda t: t.to("meta"), args),
                **tree_map_only(torch.Tensor, lambda t: t.to("meta"), kwargs))
    if name == "convolution":  # the kernels' layout, not the meta kernel's: the input's
        cl = args[0].is_contiguous(memory_format=torch.channels_last) and args[0].dim() == 4
        return torch.zeros(meta.shape, dtype=meta.dtype).contiguous(
            memory_format=torch.channels_last if cl else torch.contiguous_format)
    if name == "convolution_backward":  # the input's and the weight's gradients like them
        return tuple(None if m is None else torch.zeros_like(like) if like is not None
                     else torch.zeros(m.shape, dtype=m.dtype)
                     for m, like in zip(meta, (args[1], args[2], None)))
    return torch.zeros(meta.shape, dtype=meta.dtype)


class _ZeroProducts(TorchDispatchMode):
    """Runs every operator but the matrix products (`_zero_product`). Active inside a custom
    operator's kernel (the fused output layer and loss), whose own operators `Traffic` neither
    sees nor counts."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if _is_matmul(name):
            return _zero_product(func, name, args, kwargs)
        return func(*args, **kwargs)


class Traffic(TorchDispatchMode):
    """Counts calls and bytes per (operator, dtypes, where) while active."""

    def __init__(self):
        super().__init__()
        self.rows = defaultdict(lambda: {"calls": 0, "read": 0, "written": 0})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if _is_matmul(name):
            out = _zero_product(func, name, args, kwargs or {})
        elif func.namespace != "aten":
            # A custom operator (counted as one, below): its kernel's products zeros too (the
            # fused loss's with a 40k vocabulary took 6 minutes an update in bf16 on a CPU
            # without native bf16).
            # (redispatched past the Python key: called plainly, `_ZeroProducts` would take
            # the custom operator itself and run its kernel with no mode active)
            with _ZeroProducts():
                out = func.redispatch(_CPU_KERNEL, *args, **(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        in_ptrs = {t.untyped_storage().data_ptr() for t in ins if t.numel()}
        if not name.endswith("_") and outs and all(
                t.untyped_storage().data_ptr() in in_ptrs for t in outs):
            return out  # a view: no kernel, no bytes
        written = {t.untyped_storage().data_ptr(): _nbytes(t) for t in outs}
        dtypes = "->".join(sorted({str(t.dtype).split(".")[1] for t in ins}) or ["-"]) + \
            ("->" + str(outs[0].dtype).split(".")[1] if name in ("_to_copy", "copy_") and outs
             else "")
        row = self.rows[(name, dtypes, _where())]
        row["calls"] += 1
        row["read"] += sum(_nbytes(t) for t in ins if t.untyped_storage().data_ptr()
                           not in written or name.endswith("_"))
        row["written"] += sum(written.values())
        if name == "convolution_backward" and out[2] is not None:
            # its bias gradient is a column sum of the output's gradient, not a product
            bias = self.rows[("sum", dtypes, "bias of " + _where())]
            bias["calls"] += 1
            bias["read"] += _nbytes(args[0])
            bias["written"] += _nbytes(out[2])
        return out


# What each fused function's backward reads besides the gradients it is given: the indices of
# its tensor arguments (or a stand-in of the same size). The residual and query functions are
# scalings and sums, whose gradients need only the incoming gradient; the GLU's needs its input;
# the softmax's needs its output (as large as the scores) and the length scale.
_BACKWARD_READS = {"glu_residual": (0,), "attention_query": (), "attention_weights": (0, 2),
                   "attention_residual": ()}


class _FusedRegion(torch.autograd.Function):
    """One of `convs2s.model.fused`'s functions counted as the one kernel a compiler makes of
    it, forward and backward: forward, it reads its inputs and writes its outputs once;
    backward, it reads the gradients it is given (none for an unused output) and what
    `_BACKWARD_READS` says, and writes its inputs' gradients. What Inductor's fused kernel
    moves at best; the eager work inside is run, not counted."""

    @staticmethod
    def forward(ctx, fn, traffic, args, *tensors):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, unread
        with _disable_current_modes(), torch.enable_grad():
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            it = iter(leaves)
            out = fn(*(next(it) if isinstance(a, torch.Tensor) else a for a in args))
        outs = out if isinstance(out, tuple) else (out,)
        ctx.fn, ctx.traffic, ctx.leaves, ctx.outs = fn.__name__, traffic, leaves, outs
        _count_region(traffic, fn.__name__, tensors, outs)
        return tuple(o.detach() for o in outs) if isinstance(out, tuple) else out.detach()

    @staticmethod
    def backward(ctx, *grads):
        wanted = [t for t in ctx.leaves if t.requires_grad]
        pairs = [(o, g) for o, g in zip(ctx.outs, grads) if g is not None and o.requires_grad]
        with _disable_current_modes():
            got = iter(torch.autograd.grad([o for o, _ in pairs], wanted,
                                           [g for _, g in pairs], allow_unused=True))
        grads_in = [next(got) if t.requires_grad else None for t in ctx.leaves]
        saved = [ctx.leaves[i] for i in _BACKWARD_READS[ctx.fn]]
        _count_region(ctx.traffic, "backward of " + ctx.fn, [g for _, g in pairs] + saved,
                      [g for g in grads_in if g is not None])
        return (None, None, None, *grads_in)


def _count_region(traffic: "Traffic", where: str, ins, outs) -> None:
    dtypes = "->".join(sorted({str(t.dtype).split(".")[1] for t in ins}))
    row = traffic.rows[("fused", dtypes, where)]
    row["calls"] += 1
    row["read"] += sum(_nbytes(t) for t in ins)
    row["written"] += sum(_nbytes(t) for t in outs)


def counted_regions(traffic_of) -> SimpleNamespace:
    """A `fused` table for the model (`convs2s.model.fused.fuse_regions`'s kind) whose calls
    `_FusedRegion` counts into `traffic_of()` (the active `Traffic`)."""
    def counted(fn):
        def call(*args):
            return _FusedRegion.apply(fn, traffic_of(), args,
                                      *(a for a in args if isinstance(a, torch.Tensor)))
        return call
    return SimpleNamespace(backend="counted", **{
        name: counted(getattr(fused.EAGER, name)) for name in fused.REGIONS})


def count(model, optimizer, batch, train_cfg, device, fuse: bool = False) -> dict:
    """One update's operators under `Traffic`, after one uncounted update that builds the
    optimizer state (also under `Traffic`, whose matrix products are zeros: computed, the
    paper's models' bf16 products take tens of minutes on a CPU without native bf16). With
    `fuse`, each of `convs2s.model.fused`'s functions counts as one fused kernel
    (`_FusedRegion`): the traffic of the step `TrainConfig.fuse` compiles, at best."""
    comm = Comm()
    active: list[Traffic] = []
    if fuse:
        table = counted_regions(lambda: active[-1])
        for m in model.modules():
            if hasattr(m, "fused"):
                m.fused = table
    with Traffic() as t:
        active.append(t)
        train_update(model, optimizer, [batch], train_cfg, comm, device)
    with Traffic() as t:
        active.append(t)
        train_update(model, optimizer, [batch], train_cfg, comm, device)
    if fuse:
        fused.fuse_regions(model, None)
    rows = [{"op": op, "dtypes": dt, "where": where, **r, "matmul": _is_matmul(op)}
            for (op, dt, where), r in t.rows.items()]
    rows.sort(key=lambda r: -(r["read"] + r["written"]))
    other = [r for r in rows if not r["matmul"]]
    return {"ops_per_update": sum(r["calls"] for r in rows),
            "matmul_calls": sum(r["calls"] for r in rows if r["matmul"]),
            "non_matmul_bytes": sum(r["read"] + r["written"] for r in other),
            "cast_bytes": sum(r["read"] + r["written"] for r in other
                              if r["op"] in ("_to_copy", "copy_", "clone")),
            "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    import tempfile

    from benchmarks.training import DEFAULT_VOCAB, make_batches  # the step benchmark's batches
    from convs2s.train.collate import collate_lists

    p = argparse.ArgumentParser(prog="python -m benchmarks.step_traffic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="iwslt_de_en", choices=sorted(PRESETS))
    p.add_argument("--vocab", type=int, default=0,
                   help="model vocabulary (default: 8000 for iwslt_de_en, 40k for the paper's)")
    p.add_argument("--bpe-vocab", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--data", type=Path, default=DATA_DIR, help="the small real corpora")
    p.add_argument("--conv", choices=["windows", "native"], default="windows",
                   help="the convolutions' full pass (TrainConfig.conv)")
    p.add_argument("--fuse", action="store_true",
                   help="count each of the blocks' element-wise functions (convs2s.model.fused, "
                        "TrainConfig.fuse) as one kernel that reads its inputs and writes its "
                        "outputs once, forward and backward: the fused step's traffic at best")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None,
                   help="result JSON (default: benchmarks/results/step_traffic_<preset>_<dtype>"
                        ".json)")
    p.add_argument("--replace", action="store_true", help="overwrite the result file")
    args = p.parse_args(argv)
    args.vocab = args.vocab or DEFAULT_VOCAB.get(args.preset, 40_000)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        batches, info = make_batches(args, Path(tmp))
    src, tgt = max(batches, key=lambda b: sum(map(len, b[1])))  # the fullest batch
    batch = collate_lists(src, tgt)
    device = torch.device("cpu")
    model = ConvS2S(PRESETS[args.preset](), args.vocab, args.vocab).train()
    use_native_conv(model, args.conv == "native")
    train_cfg = TrainConfig(precision=args.dtype, conv=args.conv)
    optimizer = build_optimizer(model.parameters(), train_cfg)
    load_before = load_average()
    t0 = time.perf_counter()
    result = count(model, optimizer, batch, train_cfg, device, fuse=args.fuse)
    tokens = batch.ntokens
    result.update({"preset": args.preset, "dtype": args.dtype, "conv": args.conv,
                   "fuse": args.fuse,
                   "tgt_tokens": tokens,
                   "src_tokens": batch.src_ntokens, "seconds": time.perf_counter() - t0,
                   "data": info,
                   "non_matmul_bytes_per_tgt_token": result["non_matmul_bytes"] / tokens,
                   "cast_bytes_per_tgt_token": result["cast_bytes"] / tokens})
    print(f"{args.preset} {args.dtype}, {tokens} target tokens: {result['ops_per_update']:,} "
          f"operator calls ({result['matmul_calls']} matmuls); non-matmul traffic "
          f"{result['non_matmul_bytes'] / 2**20:,.0f} MiB "
          f"({result['non_matmul_bytes_per_tgt_token'] / 1024:,.1f} KiB a target token), casts "
          f"and copies {result['cast_bytes'] / 2**20:,.0f} MiB")
    for r in result["rows"][:15]:
        print(f"  {(r['read'] + r['written']) / 2**20:9,.1f} MiB {r['calls']:6}x  {r['op']} "
              f"({r['dtypes']})  {r['where']}")
    path = args.out or RESULTS_DIR / f"step_traffic_{args.preset}_{args.dtype}.json"
    path = write_result(path, "step_traffic",
                        {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                        machine_info(device), load_before, load_average(), {}, result,
                        replace=args.replace)
    print(f"result: {path}")
    return result


if __name__ == "__main__":
    main()
