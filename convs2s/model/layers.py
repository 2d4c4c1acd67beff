"""The paper's building blocks, shared by the encoder and the decoder (`convs2s.model.network`):
embeddings with positions (§3.1), weight-normalized linear layers and their initialization
(§3.5, appendix A), dropout (with a frame mask folded in), and gradient scaling (§3.4).
Imports only torch and `convs2s.config`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

from convs2s.config import PAD


def embedding(num: int, dim: int) -> nn.Embedding:
    """Lookup table, N(0, 0.1) with a zero padding row (§3.5); no weight norm on embeddings."""
    emb = nn.Embedding(num, dim, padding_idx=PAD)
    nn.init.normal_(emb.weight, 0.0, 0.1)
    with torch.no_grad():
        emb.weight[PAD].zero_()
    return emb


def make_positions(tokens: torch.Tensor) -> torch.Tensor:
    """Position ids PAD+1, PAD+2, ... counting only non-pad tokens; pads get PAD (a zero row).

    Counting only real tokens makes the encoder invariant to left or right padding.
    """
    mask = tokens.ne(PAD)  # B x T
    return torch.cumsum(mask, dim=1) * mask + PAD


def dropout(x: torch.Tensor, p: float, training: bool,
            keep: torch.Tensor | None = None) -> torch.Tensor:
    """Inverted dropout; with `keep` (broadcastable 0/1 float), also zeroes the frames where
    keep is 0, in the same multiply.

    On CPU, where random numbers come from one sequential generator, the keep mask is cut
    from random 64-bit integers, 16 bits per element: a quarter of the draws of
    `rand_like` (3.5x less generator time; dropout was ~6% of a CPU training step). The drop
    probability is p rounded to a multiple of 2**-16 (0.2 -> 0.199997), and the scale is exact
    for that probability, so the expectation of the output is x. (In bf16 / float16 the scale
    itself would round, 1/0.9 to 1.109375, and bias every output by the same -0.16%: there the
    products are scaled, each rounded to nearest.)"""
    if not training or p == 0.0:
        return x if keep is None else x * keep.to(x.dtype)
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        # (a compiled graph draws its own masks: the bit trick below is an eager-CPU saving,
        # and its in-place `random_` would break the graph)
        return F.dropout(x if keep is None else x * keep.to(x.dtype), p, True)
    dropped = round(p * 65536)  # of the 65536 values of a 16-bit draw
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # full 64 bits
    bits = bits.view(torch.int16)[:n].view(x.shape)  # uniform over -32768 .. 32767
    scale = 65536 / (65536 - dropped)
    mask = bits.ge(dropped - 32768).to(x.dtype)  # 0 or 1
    if keep is not None:
        mask.mul_(keep.to(x.dtype))  # on the mask, outside autograd
    if x.dtype in (torch.float32, torch.float64):
        return x * mask.mul_(scale)  # 0 or scale: one multiply of x in all
    return (x * mask).mul_(scale)  # (the product's backward needs only the mask)


def linear(n_in: int, n_out: int, dropout: float = 0.0) -> nn.Module:
    """Weight-normed Linear; init N(0, sqrt(p / n_in)) with retain prob. p = 1 - dropout.

    `dropout` is the dropout applied to this layer's *input* (appendix A.3): 0 where none is.
    """
    m = nn.Linear(n_in, n_out)
    nn.init.normal_(m.weight, 0.0, math.sqrt((1.0 - dropout) / n_in))
    nn.init.zeros_(m.bias)
    return weight_norm(m, dim=0)  # one gain per output unit; g starts at ||v|| so w = v at init


class GradMultiply(torch.autograd.Function):
    """Identity forward, gradient scaled by `scale` backward (§3.4: encoder gradient scaling)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None
