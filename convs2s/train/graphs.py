"""CUDA graphs for the training step: the model's forward through the fused loss and its
backward, captured once per batch shape and replayed (`torch.cuda.make_graphed_callables`).

Why: at the paper's 3,000 tokens per GPU the bf16 step is bound by launching its kernels one by
one from Python, not by the GPU (docs/benchmarks.md, "The GPU step on an H200"); a replay
launches a whole captured forward or backward at once. What a capture needs, and where it
comes from:

- a few fixed shapes: batches padded to them (`convs2s.train.collate.static_shape`, `pad_to`);
- no shape that depends on the data: the fused loss's static-shape form, a mask of the target
  tokens instead of their gathered rows (`convs2s.model.loss.output_layer_loss`);
- no host wait inside the step (tests/test_train_step.py checks it in CUDA's sync-debug mode);
- autocast around the forward only, without its cache of weight casts (a cast kept from the
  capture would go stale); the backward runs outside it, as the eager step's `.backward()` does
  (captured under autocast, the float32 attention products' gradients would be bf16 ones).

    graphed = CudaGraphedLoss(model)        # model on a CUDA device, in training mode
    loss, nll = graphed(src, lengths, prev, target=target, label_smoothing=0.1,
                        target_rows=mask)  # a padded batch: mask = target.reshape(-1) != PAD
    (loss * scale).backward()               # the captured backward, then the .grad sums

It is called as the model is by `convs2s.train.update.train_update`. Each new (shape, label
smoothing, precision) is captured on its first call, up to `max_shapes` captures; a shape past
them steps eagerly (`eager_steps`). A change of the dropout rates (`set_dropout`, the dropout
chosen by `train.dropout_by_passes`) drops the captures made with the old ones. All captures
share one memory pool: what a replay computes lives only until its backward has run, so a
graphed forward must be followed by its backward before the next graphed forward (as in
`train_update`; another forward before that, of any shape, is an error: one of the same shape
would overwrite that graph's own buffers). What stays per shape is the
graph's own buffers: the activations its forward saves for the backward and a float32 gradient
of every parameter (about 1 GiB for the paper's En-Fr model), so each capture costs about one
eager step's memory: `static_shape` keeps the shapes few and `max_shapes` bounds them. Outside
training (eval mode, or no gradient) the model runs eagerly. Parameters are read where they
live, so the optimizer's in-place steps are seen by every replay; dropout draws fresh masks at
each replay (the CUDA generator's offsets advance with the graph).

Gradients: the captured backward leaves its results in the graph's own buffers, and autograd
would adopt such a buffer as a parameter's `.grad` when it has none; the next replay of the
same graph (a second micro-batch of that shape in one update) would then overwrite the first
one's gradient. So before a forward finds the gradients set to None (by the optimizer's
`zero_grad`), it gives every parameter a zeroed `.grad`, views of one buffer (a single fill),
and autograd adds into them. A parameter the loss does not reach gets a zero gradient, not
None.
"""

from __future__ import annotations

import contextlib
import gc

import torch
from torch import nn


class _LossOf(nn.Module):
    """The model's training forward with the loss arguments fixed, as a module of tensor
    arguments only (what `make_graphed_callables` captures). Shares the model's parameters."""

    def __init__(self, model: nn.Module, label_smoothing: float, dtype: torch.dtype | None):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.dtype = dtype  # the forward's autocast dtype, None: float32

    def forward(self, src_tokens, src_lengths, prev_output_tokens, target, target_rows):
        autocast = torch.autocast("cuda", dtype=self.dtype, cache_enabled=False) \
            if self.dtype else contextlib.nullcontext()
        with autocast:
            return self.model(src_tokens, src_lengths, prev_output_tokens, target=target,
                              label_smoothing=self.label_smoothing, target_rows=target_rows)


class CudaGraphedLoss(nn.Module):
    """The model's forward through the fused loss, replayed from one CUDA graph per batch
    shape; see the module docstring."""

    def __init__(self, model: nn.Module, warmup_iters: int = 3, max_shapes: int = 16):
        super().__init__()
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, it is on {device}; "
                             "train without them on this device")
        self.model = model
        self.warmup_iters = warmup_iters
        # Captures kept at most: each holds its shape's saved activations and a float32
        # gradient of every parameter until the run ends; a shape past the cap steps eagerly
        # (`eager_steps` counts them), so memory stays bounded however varied the data.
        self.max_shapes = max_shapes
        self.eager_steps = 0
        self._rates: tuple | None = None  # the dropout rates the kept captures were made with
        # looked up once, not at every forward (the step is host-bound: convs2s.model.network
        # keeps its dropout rates as numbers on the modules, `set_dropout` changes them)
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._with_dropout = [m for m in model.modules()
                              if isinstance(getattr(m, "dropout", None), (int, float))
                              and not isinstance(m.dropout, bool)]
        self._graphed: dict[tuple, nn.Module] = {}
        self._grad_buffers: dict[torch.dtype, torch.Tensor] = {}  # the .grad views' storage
        self._pool = torch.cuda.graph_pool_handle()  # shared by every capture
        self._pending: tuple | None = None  # the shape whose backward has not run yet

    @property
    def captured_shapes(self) -> int:
        return len(self._graphed)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, target=None,
                label_smoothing: float = 0.0, target_rows=None):
        if target is None or not (self.model.training and torch.is_grad_enabled()):
            return self.model(src_tokens, src_lengths, prev_output_tokens, target=target,
                              label_smoothing=label_smoothing, target_rows=target_rows)
        if target_rows is None or target_rows.dtype != torch.bool:
            raise ValueError("a CUDA-graphed step takes batches padded to a static shape, whose "
                             "target rows are a mask (convs2s.train.collate.pad_to)")
        dev = src_tokens.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        args = (src_tokens, src_lengths, prev_output_tokens, target, target_rows)
        rates = tuple(float(m.dropout) for m in self._with_dropout)
        if rates != self._rates:  # a new dropout (dropout_by_passes): the old captures go
            self._graphed.clear()
            # (each capture is a reference cycle: make_graphed_callables's forward refers to
            # its module; without a collection their static gradients and pool stayed held,
            # the new captures on top of them)
            gc.collect()
            torch.cuda.empty_cache()
            self._rates = rates
        key = (tuple(src_tokens.shape), tuple(target.shape), float(label_smoothing), dtype,
               rates)
        if key not in self._graphed and len(self._graphed) >= self.max_shapes:
            self.eager_steps += 1  # (in the caller's autocast, as the eager step)
            return self.model(src_tokens, src_lengths, prev_output_tokens, target=target,
                              label_smoothing=label_smoothing, target_rows=target_rows)
        # Not even of the same shape: its replay would overwrite the outputs and saved
        # activations the pending backward still reads (wrong gradients, no error).
        if self._pending is not None:
            same = "the same batch shape" if self._pending == key else "another batch shape"
            raise RuntimeError(f"a CUDA-graphed forward of {same} before the backward of the "
                               "last one: the replay would overwrite what that backward "
                               "reads (graphs reuse their buffers and share one memory pool); "
                               "call backward on each loss first (as train_update does)")
        graphed = self._graphed.get(key)
        if graphed is None:
            graphed = self._capture(args, float(label_smoothing), dtype)
            self._graphed[key] = graphed
        self._grads_in_place()
        loss, nll = graphed(*args)
        self._pending = key
        loss.register_hook(self._backward_ran)
        return loss, nll.detach()

    def _backward_ran(self, grad: torch.Tensor) -> None:
        self._pending = None

    def _grads_in_place(self) -> None:
        """Zeroed `.grad`s, views of one buffer per dtype, where the optimizer left None (see
        the module docstring)."""
        params = self._params
        missing = [p for p in params if p.grad is None]
        if not missing:
            return
        if len(missing) < len(params):  # some kept theirs: fill only the others
            for p in missing:
                p.grad = torch.zeros_like(p)
            return
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, group in by_dtype.items():
            n = sum(p.numel() for p in group)
            flat = self._grad_buffers.get(dtype)
            if flat is None or flat.numel() != n:
                flat = self._grad_buffers[dtype] = torch.empty(n, dtype=dtype,
                                                               device=group[0].device)
            flat.zero_()
            offset = 0
            for p in group:
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()

    def _capture(self, args: tuple, label_smoothing: float, dtype) -> nn.Module:
        """Warm up and capture the forward and backward for these argument shapes. The sample
        arguments are copies: the graph keeps them as its input buffers, and each call copies
        the batch's tensors into them."""
        samples = tuple(a.clone() for a in args)
        module = _LossOf(self.model, label_smoothing, dtype)
        # The warm-up passes run in training mode, and their dropout draws move the CUDA
        # generator: a run resumed from a checkpoint captures its shapes at other updates than
        # the run that went on, and would draw other masks from there. The generator is put
        # back where the step found it: a capture draws nothing, each replay its masks.
        rng = torch.cuda.get_rng_state(samples[0].device)
        # Out of the step's autocast (whose weight-cast cache a capture refuses): `_LossOf`
        # enters its own around the forward, and the backward is captured outside it.
        with torch.autocast("cuda", enabled=False):
            graphed = torch.cuda.make_graphed_callables(
                module, samples, num_warmup_iters=self.warmup_iters, allow_unused_input=True,
                pool=self._pool)
        torch.cuda.set_rng_state(rng, samples[0].device)
        return graphed
