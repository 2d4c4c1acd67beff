"""One synchronous data-parallel update and validation, in torch only (torch.distributed, no Ray).

An update takes `update_freq` micro-batches on every rank. Before any forward pass the ranks
all-reduce their target-token counts (known from the data, no GPU sync), so every rank scales
its summed loss by world_size / N_total; DDP then averages the gradients over the ranks, giving

    grad = sum over all ranks and micro-batches of d(loss_sum) / N_total,

exactly the single-process update on the union of the batches (paper §4.2: gradients
normalized by the number of non-padding target tokens, multi-GPU gradients summed). Only the
last micro-batch synchronizes gradients (DDP `no_sync` for the others).

    comm = Comm.create()                  # world of torch.distributed (convs2s.train.comm)
    stats = train_update(model, optimizer, micro_batches, cfg, comm, device)
    if stats is None: ...                 # some rank ran out of data: the epoch ends everywhere
    loss, nll, ntok = validate(model, batches, comm, device)   # summed over all ranks
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from convs2s.train.collate import Batch
from convs2s.config import TrainConfig
from convs2s.model.conv import use_native_conv
from convs2s.model.fused import dynamic_shape_settings, fuse_regions
from convs2s.model.loss import compile_loss_chunks
from convs2s.train.optim import clip_gradients
from convs2s.precision import Precision, local_precision
from convs2s.train.comm import Comm


@dataclass
class UpdateStats:
    """Sums of one update on this rank, kept on the device until a log interval reads them."""

    loss_sum: torch.Tensor  # 0-d float32: training loss summed over local target tokens
    nll_sum: torch.Tensor  # 0-d float32: nll summed over local target tokens
    grad_norm: torch.Tensor  # 0-d: total gradient norm before renormalization
    ntokens: int  # target tokens of the update over all ranks (the normalizer)


def autocast_for(device: torch.device, cfg: TrainConfig):
    """The forward passes' context for `cfg.precision`: bf16 autocast or float32. A run's
    Trainer passes the precision its ranks agreed on ("bf16" / "fp32"), taken as it is (not
    probed again each micro-batch: the host and device queries of `local_precision`); "auto"
    is decided here for this process alone (benchmarks, single-process use)."""
    if cfg.precision in ("bf16", "fp32"):
        return Precision(cfg.precision, "decided").autocast(device)
    return local_precision(cfg.precision, device).autocast(device)


def apply_step_settings(model: torch.nn.Module, cfg: TrainConfig) -> tuple[int, int]:
    """`TrainConfig.conv` and `TrainConfig.fuse` on a fresh model, as the Trainer and
    `benchmarks.training` both set them: the library's convolution where `conv` is "native";
    with `fuse`, the blocks' element-wise work compiled (`convs2s.model.fused`) and, on CUDA,
    the loss's chunks; without it eager chunks, whatever this process compiled before (a
    `compile` run compiles them again in `compile_for_training`). Returns how many
    convolutions and how many blocks and attention layers it set."""
    compile_loss_chunks(cfg.fuse or None)
    fused = fuse_regions(model, cfg.fuse) if cfg.fuse else 0
    return use_native_conv(model, cfg.conv == "native"), fused


def compile_for_training(model: torch.nn.Module, backend: str,
                         fullgraph: bool = False, mode: str | None = None) -> torch.nn.Module:
    """The model through the fused loss as one graph with dynamic shapes (`TrainConfig.compile`):
    one compile serves every batch shape.

    Python floats (dropout rates, the sqrt(.5) scalings, label smoothing) are specialized, as
    they were by default before torch made them symbolic under `dynamic=True`: as symbols they
    cost the compile's frontend a second, discarded attempt (dynamo restarts when it turns
    them back into constants) and twice its time (the En-Fr model's graph through AOT
    autograd on the CPU: 96-103 s against 50 s, docs/benchmarks.md). A rate that changes mid-run
    (`train.dropout_by_passes`) recompiles once. The setting is process-wide (dynamo's config),
    as is the compile of the fused loss's chunks (`convs2s.model.loss.compile_loss_chunks`),
    which the model's graph sees as one opaque operator.
    `fullgraph` (tests): a graph break is an error instead of a split graph. `mode`:
    torch.compile's (Inductor), e.g. "reduce-overhead" for CUDA graphs, one recorded per
    batch shape: with batches padded to a few static shapes (`convs2s.train.collate.pad_to`),
    whose loss is masked rather than gathered, so no shape depends on the token count.
    """
    dynamic_shape_settings()
    compile_loss_chunks(backend)
    return torch.compile(model, backend=backend, dynamic=True, fullgraph=fullgraph,
                         **({"mode": mode} if mode else {}))


def train_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 micro_batches: list[Batch], cfg: TrainConfig, comm: Comm,
                 device: torch.device) -> UpdateStats | None:
    """Forward/backward over this rank's micro-batches, renormalize, step. None (and no step)
    when some rank has no batch left, so that all ranks stop together."""
    local_tokens = sum(b.ntokens for b in micro_batches)
    total_tokens, ranks_with_data = comm.sum_ints([local_tokens, int(bool(micro_batches))])
    if ranks_with_data < comm.world_size or total_tokens == 0:
        return None
    scale = comm.world_size / total_tokens  # DDP averages over ranks: this makes it a sum / N
    loss_sum = torch.zeros((), device=device)
    nll_sum = torch.zeros((), device=device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") \
            else model.no_sync()
        batch = batch.to(device)
        with sync:
            with autocast_for(device, cfg):  # output layer and loss fused: no B x T x V logits
                loss, nll = model(batch.src_tokens, batch.src_lengths, batch.prev_output_tokens,
                                  target=batch.target, label_smoothing=cfg.label_smoothing,
                                  target_rows=batch.target_rows)
            (loss * scale).backward()
        loss_sum += loss.detach()
        nll_sum += nll
    grad_norm = clip_gradients(model.parameters(), cfg.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateStats(loss_sum, nll_sum, grad_norm, total_tokens)


@torch.no_grad()
def validate(model: torch.nn.Module, batches: Iterable[Batch], comm: Comm, device: torch.device,
             cfg: TrainConfig) -> tuple[float, float, int]:
    """(loss sum, nll sum, target tokens) over this rank's batches, summed over all ranks."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for batch in batches:
        batch = batch.to(device)
        with autocast_for(device, cfg):
            loss, nll = model(batch.src_tokens, batch.src_lengths, batch.prev_output_tokens,
                              target=batch.target, label_smoothing=cfg.label_smoothing,
                              target_rows=batch.target_rows)
        sums[0] += loss
        sums[1] += nll
        sums[2] += batch.ntokens
    comm.sum_tensor(sums)
    model.train(was_training)
    loss, nll, ntok = sums.tolist()
    return loss, nll, int(ntok)
