"""Token-level cross-entropy for ConvS2S, summed over non-padding target tokens.

The paper (§4.2) normalizes gradients by the number of non-padding target tokens; the
training loop divides the *sum* returned here by the token count of the whole update (all
micro-batches on all ranks), so that a data-parallel update equals the single-process update on
the union of the batches. Optional label smoothing follows the reference implementation:

    loss = (1 - eps - eps/(V-1)) * nll + eps/(V-1) * sum_v(-log p_v)

    loss_sum, nll_sum = sequence_loss(logits, target, label_smoothing=0.1)  # float32 scalars
    loss_sum, nll_sum = output_layer_loss(hidden, weight, bias, target, 0.1)  # fused, training

`sequence_loss` is the plain definition (scoring, tests); training uses `output_layer_loss`,
the output layer fused with the loss, chunk by chunk, with the same values and gradients.

Computed in float32 whatever the autocast dtype of the logits (bf16 log-probabilities lose the
small differences the loss is made of).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from convs2s.config import PAD


def sequence_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                  pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """logits B x T x V, target B x T -> (training loss sum, nll sum), float32 scalars.

    Both are sums over the non-pad target tokens; with label_smoothing=0 they are equal.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    with torch.autocast(device_type=logits.device.type, enabled=False):
        flat_logits = logits.reshape(-1, logits.size(-1)).float()  # (B*T) x V
        flat_target = target.reshape(-1)  # B*T
        if label_smoothing == 0.0:
            # Fused log-softmax + gather: no B*T x V log-probability tensor is kept.
            nll = F.cross_entropy(flat_logits, flat_target, ignore_index=pad, reduction="sum")
            return nll, nll.detach()
        lprobs = F.log_softmax(flat_logits, dim=-1)  # (B*T) x V
        keep = flat_target != pad  # B*T
        nll = -lprobs.gather(1, flat_target.unsqueeze(1)).squeeze(1)[keep].sum()
        smooth = -lprobs.sum(dim=-1)[keep].sum()
        eps_i = label_smoothing / (lprobs.size(-1) - 1)
        loss = (1.0 - label_smoothing - eps_i) * nll + eps_i * smooth
        return loss, nll.detach()


# --- the output layer and the loss fused (training) ---------------------------------------------

# Logits per chunk. CPU: about 1M float32 values (4 MB), so that a chunk stays in cache while it
# is normalized and turned into its gradient (2**20 was the fastest of 2**19 ... 2**23 for the
# iwslt_de_en output layer on the 2-core dev box: 2.1x the unfused path). CUDA: 64M values
# (256 MB in float32), a few large GEMMs per batch and a bounded temporary.
CHUNK_VALUES = {"cpu": 2**20, "cuda": 2**26}
# ... but never fewer rows than this: with a 40k vocabulary, 26-row chunks made the GEMMs run at
# half speed (measured: 3.7 s against 2.0 s with >= 104 rows for a 3,500-token batch).
MIN_CHUNK_ROWS = 128


def chunk_rows(device_type: str, vocab_size: int) -> int:
    return max(MIN_CHUNK_ROWS, CHUNK_VALUES.get(device_type, CHUNK_VALUES["cpu"]) // vocab_size)


def chunk_loss(logits: torch.Tensor, tc: torch.Tensor, eps: float, eps_i: float,
               with_grad: bool, keep: torch.Tensor | None = None):
    """One chunk of `_output_loss` after its GEMM: logits c x V (the compute dtype), targets
    c x 1 -> the nll sum and the smoothing sum (float32 scalars; None without smoothing) and,
    with `with_grad`, d(loss)/d(logits) = softmax - q in the logits' dtype (c x V) and its
    column sums (V, float32: the bias gradient); else None, None. `keep` (c x 1 bool): the
    rows that count, the others give zero loss and gradient (the masked variant).

    Eager, this is about ten passes over the c x V values (the float32 copy, the log-softmax,
    the sums, exp, the shift, the cast back), each its own kernel; compiled
    (`compile_loss_chunks`), the element-wise work fuses into a few kernels. On a GPU at the
    paper's 40k vocabulary these passes are an estimated tenth of a 24,000-token bf16 step.
    """
    lp = torch.log_softmax(logits.float(), dim=-1)  # c x V, float32 (see the module docstring)
    if keep is None:
        nll = -lp.gather(1, tc).sum()
        smooth = -lp.sum() if eps > 0 else None
    else:  # (where, not a product: a dropped row's values never reach the sums)
        nll = -torch.where(keep, lp.gather(1, tc), 0.0).sum()
        smooth = -torch.where(keep, lp.sum(1, keepdim=True), 0.0).sum() if eps > 0 else None
    if not with_grad:
        return nll, smooth, None, None
    hit = -(1.0 - eps - eps_i)  # q puts 1 - eps - eps_i more on the target than elsewhere
    if torch.compiler.is_compiling():
        # out of place, the target as a compare: one fused element-wise kernel
        vocab = torch.arange(lp.shape[1], device=lp.device)
        g = torch.where(vocab == tc, lp.exp() + (hit - eps_i), lp.exp() - eps_i)
        if keep is not None:
            g = torch.where(keep, g, 0.0)
    else:
        g = lp.exp_()  # softmax, in place (eager: no second c x V float32 buffer)
        if eps_i > 0:
            g.sub_(eps_i)
        g.scatter_add_(1, tc, g.new_full(tc.shape, hit))
        if keep is not None:
            g.masked_fill_(~keep, 0.0)
    g = g.to(logits.dtype)
    return nll, smooth, g, g.sum(0, dtype=torch.float32)


_compiled: dict[str, object] = {}  # device type -> `chunk_loss` compiled for it


def compile_loss_chunks(backend: str | None, devices: tuple[str, ...] = ("cuda",)) -> None:
    """Compile `chunk_loss` with `backend` (dynamic shapes: one capture for every chunk's row
    count) for the chunks computed on `devices`, or go back to eager everywhere with None.
    Process-wide, like the custom operator it serves; the whole-model compile
    (`convs2s.train.update.compile_for_training`) calls it, because the model's graph sees the
    fused loss as one opaque operator.

    CUDA only by default: on the CPU the compiled chunks made the float32 `iwslt_de_en` step
    slower (0.86-0.92x, docs/benchmarks.md); there a chunk is about 1M values, in cache, and
    ATen's own log-softmax is already vectorized.
    """
    _compiled.clear()
    if not backend:
        return
    from convs2s.model.fused import dynamic_shape_settings

    dynamic_shape_settings()  # (the rates as constants, no duck sizing: as the model's)
    fn = torch.compile(chunk_loss, backend=backend, dynamic=True)
    _compiled.update({d: fn for d in devices})


def compiled_chunk_devices() -> list[str]:
    """The device types whose chunks `compile_loss_chunks` compiled (results record it)."""
    return sorted(_compiled)


# The fused kernel is a custom operator (torch.library.custom_op): autograd calls its backward,
# and torch.compile sees one opaque node whose outputs it knows from `_output_loss_fake`. Traced
# through, its Python loop over the chunks of the n non-pad rows would fix n in the graph, and a
# compiled step would be captured again for every batch's token count.
@torch.library.custom_op("convs2s::output_loss", mutates_args=())
def _output_loss(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                 target: torch.Tensor, rows: torch.Tensor, label_smoothing: float,
                 with_grad: bool, compute_dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits = h W^T + b and the label-smoothed loss, chunk by chunk over the non-pad rows.
    `rows` holds their flat indices (n), or is a mask over all N rows (bool): then every row
    is computed and the pad rows are masked out (see `output_layer_loss`).

    The loss is the end of the graph, so d(loss)/d(logits) = softmax - q (q: the smoothed
    target distribution) is known as soon as a chunk's log-probabilities are: the forward
    computes the gradients of h's non-pad rows, W and b right away and the backward only
    scales them. No N x V logits, log-probabilities or their gradients are ever stored; padded
    rows cost nothing. h N x C (N = B*T), weight V x C, bias V, target N, rows n (the non-pad
    rows) -> (loss, nll) float32 scalars and, with `with_grad`, the unscaled gradients
    (n x C in compute_dtype, V x C and V in float32; else empty).
    """
    cdt = compute_dtype
    masked = rows.dtype == torch.bool
    with torch.autocast(device_type=h.device.type, enabled=False):
        if masked:  # every row, n = N: no shape depends on the data
            hr, tr = h.to(cdt), target  # N x C, N
        else:
            hr, tr = h.index_select(0, rows).to(cdt), target.index_select(0, rows)  # n x C, n
        w, b = weight.to(cdt), bias.to(cdt)
        n, V = hr.shape[0], w.shape[0]
        eps = label_smoothing
        eps_i = eps / (V - 1)
        nll_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        smooth_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        none = h.new_empty(0, dtype=torch.float32)
        grad_h, grad_w, grad_b = none, none.clone(), none.clone()
        if with_grad:
            grad_h = torch.empty_like(hr)  # n x C
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=h.device)
            grad_b = torch.zeros(V, dtype=torch.float32, device=h.device)
        step = chunk_rows(h.device.type, V)
        chunk = _compiled.get(h.device.type, chunk_loss)
        for r0 in range(0, n, step):
            # (the targets copied out of `tr`: as a view, a compiled chunk would guard on the
            # size of its base, and capture again when the rows no longer fit in one chunk)
            hc, tc = hr[r0:r0 + step], tr[r0:r0 + step, None].clone()  # c x C, c x 1
            keep = rows[r0:r0 + step, None].clone() if masked else None  # c x 1
            nll, smooth, g, gb = chunk(torch.addmm(b, hc, w.t()), tc, eps, eps_i, with_grad,
                                       keep)
            nll_sum += nll
            if smooth is not None:
                smooth_sum += smooth
            if not with_grad:
                continue
            torch.mm(g, w, out=grad_h[r0:r0 + step])
            if cdt == torch.float32:
                grad_w.addmm_(g.t(), hc)
            else:
                grad_w += torch.mm(g.t(), hc).float()
            grad_b += gb
        loss = (1.0 - eps - eps_i) * nll_sum + eps_i * smooth_sum if eps > 0 \
            else nll_sum.clone()
    return loss, nll_sum, grad_h, grad_w, grad_b


@_output_loss.register_fake
def _output_loss_fake(h, weight, bias, target, rows, label_smoothing, with_grad, compute_dtype):
    # What the kernel returns, by shape and dtype only (torch.compile's tracing)
    loss, nll = (h.new_empty((), dtype=torch.float32) for _ in range(2))
    if not with_grad:
        return (loss, nll, *(h.new_empty(0, dtype=torch.float32) for _ in range(3)))
    return (loss, nll, h.new_empty((rows.shape[0], h.shape[1]), dtype=compute_dtype),
            h.new_empty(weight.shape, dtype=torch.float32),
            h.new_empty(bias.shape, dtype=torch.float32))


def _output_loss_setup(ctx, inputs, output):
    h, weight, _, _, rows, *_ = inputs
    _, nll, grad_h, grad_w, grad_b = output
    ctx.save_for_backward(rows, grad_h, grad_w, grad_b)
    ctx.h_shape, ctx.h_dtype, ctx.w_dtype, ctx.w_shape = h.shape, h.dtype, weight.dtype, \
        weight.shape
    ctx.mark_non_differentiable(nll, grad_h, grad_w, grad_b)


def _output_loss_backward(ctx, grad_loss, *_):
    rows, grad_h, grad_w, grad_b = ctx.saved_tensors
    if grad_w.numel() == 0 and ctx.w_shape.numel():  # (called with with_grad=False: no
        # gradients were computed, and index_copy_ would fail on shapes, or return wrong ones)
        raise RuntimeError("convs2s::output_loss was called with with_grad=False on inputs "
                           "that require gradients: it computed none to go backward with; "
                           "call output_layer_loss, which passes with_grad as autograd needs")
    # Scaled in float32 (a bf16-rounded scale would differ from the weights' by up to 0.4%),
    # out of place (a second backward must not scale the saved gradients twice).
    gh = (grad_h.float() * grad_loss).to(ctx.h_dtype)
    if rows.dtype != torch.bool:  # (masked: every row's, zero at the pad rows already)
        gh = gh.new_zeros(ctx.h_shape).index_copy_(0, rows, gh)  # zero at the pad rows
    return (gh, (grad_w * grad_loss).to(ctx.w_dtype), (grad_b * grad_loss).to(ctx.w_dtype),
            None, None, None, None, None)


_output_loss.register_autograd(_output_loss_backward, setup_context=_output_loss_setup)


def output_layer_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      target: torch.Tensor, label_smoothing: float = 0.0, pad: int = PAD,
                      target_rows: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """sequence_loss(F.linear(hidden, weight, bias), target, label_smoothing), fused.

    hidden B x T x C (the input of the output layer), weight V x C, bias V, target B x T ->
    (training loss sum, nll sum), float32 scalars; the same values and gradients as the unfused
    pair, in a fraction of the time and memory (see `_output_loss`). Under autocast the matmuls
    run in the autocast dtype and the log-softmax in float32, as in the unfused path.
    `target_rows` (n, on hidden's device): the flat indices of target's non-pad tokens when the
    caller knows them (`Batch.target_rows`); else they are found here, which on a GPU makes the
    host wait for the device.

    `target_rows` as a bool mask over the N rows (`target != pad`, what `collate.pad_to` gives):
    compute every row and mask the pad rows out. No tensor's shape then depends on how many
    tokens the batch holds and nothing waits for the device, as a CUDA graph capture requires
    (batches padded to one shape replay one graph); the price is the output layer's work on
    the pad rows.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    with_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (hidden, weight, bias))
    dev = hidden.device.type
    cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight.dtype
    target = target.reshape(-1)
    if target_rows is None:  # found here: on a GPU nonzero waits for the device (a sync)
        target_rows = target.ne(pad).nonzero().squeeze(1)
    loss, nll, *_ = _output_loss(hidden.reshape(-1, hidden.shape[-1]), weight, bias, target,
                                 target_rows, float(label_smoothing), with_grad, cdt)
    return loss, nll
