"""The convolution of a ConvS2S block (paper §3.2) as one matrix multiply over k-frame windows,
and its incremental form for decoding (§5.3): the same (C_out, k * C_in) weight serves both.

    layer = conv(c_in, 2 * c_out, kernel=3, causal=True, dropout=0.1)  # weight-normed Conv
    y = layer(x)                                   # B x T x C_in -> B x T x 2C_out
    use_native_conv(model)                         # the full pass by the library's convolution
    buf = layer.init_buffer(n, device, dtype)      # the causal left padding
    y_t, buf = layer.step(x_t, buf)                # one frame per row, O(1) in the prefix

Imports only torch (the model's and the search's rule).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm


class _Windows(torch.autograd.Function):
    """B x T x C -> (B*T) x (k*C): row t holds the k frames of the padded input starting at t.

    Forward is pad + unfold + one copy. The hand-written backward adds k shifted slices of the
    gradient, cheaper than autograd's zero-filled unfold_backward followed by the pad slice.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, k: int, left: int, right: int) -> torch.Tensor:
        B, T, C = x.shape
        ctx.shape, ctx.k, ctx.left = (B, T, C), k, left
        x = F.pad(x, (0, 0, left, right))  # B x (T + k - 1) x C, zeros outside
        return x.unfold(1, k, 1).transpose(2, 3).reshape(B * T, k * C)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (B, T, C), k, left = ctx.shape, ctx.k, ctx.left
        grad = grad.view(B, T, k, C)
        # Frame j of window t is input position t + j - left: input t gets grad[t + left - j, j].
        gx = grad[:, :, left].clone()  # B x T x C
        for j in range(k):
            s = left - j
            if j == left or abs(s) >= T:
                continue
            # add_ on the slice (not `+=`, whose setitem copies the slice onto itself again)
            if s > 0:
                gx[:, : T - s].add_(grad[:, s:, j])
            else:
                gx[:, -s:].add_(grad[:, : T + s, j])
        return gx, None, None, None


class Conv(nn.Module):
    """1-D convolution over time on B x T x C inputs, computed as one matmul over k frames.

    The weight is stored (C_out, k, C_in) so that `weight.view(C_out, k * C_in)` multiplies a
    window of k consecutive frames laid out time-major: the same matrix serves the full forward
    (after unfolding) and the incremental step (on a buffer of the last k frames, §5.3).
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, causal: bool, dropout: float):
        super().__init__()
        self.c_in, self.c_out, self.kernel, self.causal = c_in, c_out, kernel, causal
        self.weight = nn.Parameter(torch.empty(c_out, kernel, c_in))
        self.bias = nn.Parameter(torch.zeros(c_out))
        # An int8 inference copy (`convs2s.inference.quantize`) replaces the float matmul by this
        # module.
        self.int8: nn.Module | None = None
        # The full pass by the library's convolution instead of windows + GEMM
        # (`use_native_conv`); the incremental step is the same matmul either way.
        self.native = False
        # Appendix A: a conv feeding a GLU, after dropout: N(0, sqrt(4p / (k * C_in))).
        nn.init.normal_(self.weight, 0.0, math.sqrt(4.0 * (1.0 - dropout) / (kernel * c_in)))
        # Causal (decoder): k-1 frames of left context only. Encoder: centred window.
        self.pad = (kernel - 1, 0) if causal else ((kernel - 1) // 2, kernel // 2)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution's one GEMM: (..., k * C_in) windows -> (..., C_out)."""
        if self.int8 is not None:
            return self.int8(x)
        return F.linear(x, self.weight.reshape(self.c_out, -1), self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # B x T x C_in -> B x T x C_out
        B, T, _ = x.shape
        if self.native and self.int8 is None:
            return self._native(x)
        if self.kernel > 1:
            # The k-frame windows copied once into a (B*T) x (k*C_in) matrix: the whole
            # convolution is then a single large GEMM.
            x = _Windows.apply(x, self.kernel, *self.pad)
        return self.matmul(x).view(B, T, -1)

    def _native(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` as one 2-D convolution over a 1 x T image in channels-last layout: the
        B x T x C input and the (C_out, k, C_in) weight are already NHWC / OHWI views, so
        nothing is copied and no k-frame windows are written (cuDNN's implicit GEMM on a GPU).
        The same sums as the windows' GEMM, in another order: equal to float32 rounding."""
        left, right = self.pad
        if left != right:  # causal or an even kernel: the library pads both sides alike
            x, left = F.pad(x, (0, 0, left, right)), 0
        y = F.conv2d(x.transpose(1, 2).unsqueeze(2),  # B x C_in x 1 x T, channels-last
                     self.weight.permute(0, 2, 1).unsqueeze(2),  # C_out x C_in x 1 x k, OHWI
                     self.bias, padding=(0, left))
        return y.squeeze(2).transpose(1, 2)  # B x T x C_out

    def init_buffer(self, n: int, device, dtype) -> torch.Tensor | None:
        """`step`'s history before the first frame: N x (k-1) x C_in zeros, exactly the causal
        left padding of `forward` (None for k = 1)."""
        return None if self.kernel == 1 else torch.zeros(
            n, self.kernel - 1, self.c_in, device=device, dtype=dtype)

    def step(self, x: torch.Tensor, buffer: torch.Tensor | None):
        """Causal conv of one new frame per row (§5.3): x N x 1 x C_in, buffer N x (k-1) x C_in
        (the last k-1 inputs) -> N x 1 x C_out and the next buffer. The window [buffer, x] is
        the last row of `forward`'s unfolded matrix: same weight, one small matmul."""
        if self.kernel > 1:
            window = torch.cat([buffer, x], dim=1)  # N x k x C_in: shift x in
            buffer = window[:, 1:]  # keep the last k-1 frames for the next step
            x = window.reshape(window.shape[0], 1, -1)  # N x 1 x (k * C_in), time-major
        return self.matmul(x), buffer


def use_native_conv(model: nn.Module, on: bool = True) -> int:
    """Compute every `Conv`'s full pass of `model` by the library's convolution (`on`) or by
    k-frame windows and one GEMM (the default); returns how many convolutions it set.

    The windows cost memory traffic: the padded input, a copy k times its size and, backward,
    k shifted adds (12 GiB of a 24,000-token En-Fr bf16 step, counted by
    `benchmarks.step_traffic`), which a GPU's implicit-GEMM convolution does not write. On the
    2-core CPU the windows were faster (docs/benchmarks.md), so they stay the default; parameters
    and checkpoints are the same either way.

    On: cuDNN's float32 convolutions exact (process-wide), as the windows' GEMM and every
    matrix product are by PyTorch's default: its convolutions default to TF32 (about 1e-3
    relative error), which would make a float32 run's numbers depend on `conv`. (bf16 runs
    are not affected.)"""
    if on:
        torch.backends.cudnn.allow_tf32 = False
    n = 0
    for m in model.modules():
        if isinstance(m, Conv):
            m.native, n = on, n + 1
    return n


def conv(c_in: int, c_out: int, kernel: int, causal: bool, dropout: float) -> nn.Module:
    """Weight-normed Conv (one gain per output channel, the norm taken over k and C_in)."""
    return weight_norm(Conv(c_in, c_out, kernel, causal, dropout), dim=0)
