"""The element-wise work between a block's matrix products (§3.2-§3.4), as four functions that
the blocks call through a table: eager by default, compiled together on request (`fuse_regions`).

    block output, no attention:  (GLU(y) + r) * sqrt(.5)                  glu_residual
    attention query:             ((W h + b) + g) * sqrt(.5), in float32   attention_query
    attention weights:           softmax(d . z + mask), and times sqrt(m)  attention_weights
    block output, attention:     ((W c + b + h) * sqrt(.5) + r) * sqrt(.5) attention_residual

Eager, each is two to five kernels, each a pass over B x T x C values in memory, forward and
backward; compiled (`torch.compile`, dynamic shapes), each is one kernel forward and about one
backward. The functions are shared by every block, so a few graphs serve all 30 blocks of the
paper's models: the En-Fr model's compile took 41 s on a 2-core CPU, where the whole model's
took 219 s (docs/benchmarks.md).
The table is per model (`Block.fused`, `Attention.fused`): `fuse_regions(model, backend)` sets
the compiled one, `fuse_regions(model, None)` the eager one; parameters and checkpoints do not
change. The compiled table runs only where autograd records (training): validation and the
search keep the eager functions, and a whole-model compile (`torch.compile` of the model)
traces the eager ones, which it fuses itself.

Imports only torch.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

SQRT_HALF = math.sqrt(0.5)  # §3.4: halves the variance of a sum of two equal-variance terms


def glu_residual(y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """A block without attention: conv output y N x T x 2C -> (GLU(y) + residual) * sqrt(.5),
    N x T x C (§3.2). In place after the GLU (eager: its output is not saved)."""
    return F.glu(y, dim=-1).add_(residual).mul_(SQRT_HALF)


def attention_query(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """d = (W h + b + g) * sqrt(.5) (§3.3), from a = W h + b and the target embedding g,
    N x T x E, in float32: the scores are float32 even under autocast (bf16 scores lose the
    ranking). Out of place, then in place: a linear layer's 3-D output is a view, and in-place
    ops on views cost autograd extra copies (CopySlices)."""
    return torch.add(a, g).mul_(SQRT_HALF).float()


def attention_weights(scores: torch.Tensor, mask_bias: torch.Tensor, scale: torch.Tensor,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """scores B x KT x S (float32), mask_bias B x 1 x S (-inf at source padding), scale
    B x 1 x 1 = sqrt(m) for m true source tokens (§3.4) -> the attention weights (float32,
    padding 0) and the weights times the scale in `dtype`, for the product with the values.
    Scaling the weights (S per row) rather than the context (E per row, after the product) is
    the same sum with the scale applied first: a pass over S instead of E values a row."""
    attn = torch.softmax(scores + mask_bias, dim=-1)
    return attn, (attn * scale).to(dtype)


def attention_residual(o: torch.Tensor, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """A block with attention: the attention's output projection o = W c + b, its input h (the
    GLU output) and the block's residual, N x T x C -> ((o + h) * sqrt(.5) + residual) *
    sqrt(.5): the attention's own residual (§3.3), then the block's (§3.2)."""
    return torch.add(o, h).mul_(SQRT_HALF).add_(residual).mul_(SQRT_HALF)


REGIONS = ("glu_residual", "attention_query", "attention_weights", "attention_residual")
EAGER = SimpleNamespace(**{name: globals()[name] for name in REGIONS}, backend="")

_compiled: dict[str, SimpleNamespace] = {}  # backend -> its table (one compile per process)


def _when_recording(compiled, eager):
    """`compiled` where autograd records and no whole-model compile is tracing, else `eager`
    (validation and the search: no second, inference-mode compile)."""
    def call(*args):
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            return compiled(*args)
        return eager(*args)
    call.__name__ = eager.__name__
    return call


def dynamic_shape_settings() -> None:
    """The process-wide settings (torch's, as its own are) under which this project's graphs
    are compiled with dynamic shapes: the rates (dropout, label smoothing) as constants
    (`specialize_float`), and no duck sizing. torch gives input sizes that are equal at the
    first call one symbol and guards on their equality: a first batch whose source and target
    are as long (common, and the rule with static shapes' rounded lengths; the memory probe
    steps such shapes first) made the next batch whose are not compile everything again (the
    whole model's compile takes minutes on a GPU). A one-sentence batch still compiles once
    more (torch specializes sizes 0 and 1; its size-oblivious setting is for export only)."""
    import torch.fx.experimental._config as fx_config

    torch._dynamo.config.specialize_float = True
    fx_config.use_duck_shape = False


def compiled_regions(backend: str) -> SimpleNamespace:
    """The four functions compiled with `backend` (dynamic shapes: a capture serves every batch
    shape and block width), made once per process and backend. A name torch.compile does not
    know is a ValueError here, before the first step, rather than inside it."""
    dynamic_shape_settings()  # (each time: the functions compile at their first calls)
    if backend not in _compiled:
        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(f"fuse={backend!r} is not a torch.compile backend; give one of "
                             f"{', '.join(sorted(known))}")
        _compiled[backend] = SimpleNamespace(backend=backend, **{
            name: _when_recording(torch.compile(fn, backend=backend, dynamic=True), fn)
            for name, fn in vars(EAGER).items() if name != "backend"})
    return _compiled[backend]


def fuse_regions(model: nn.Module, backend: str | None) -> int:
    """Give every module of `model` that has a `fused` table (`Block`, `Attention`) the
    functions compiled with `backend` ("inductor"; "aot_eager" captures without generating
    code, for checks), or the eager ones with None / ""; returns how many modules it set."""
    table = compiled_regions(backend) if backend else EAGER
    n = 0
    for m in model.modules():
        if hasattr(m, "fused"):
            m.fused, n = table, n + 1
    return n
