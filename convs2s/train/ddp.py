"""DDP's settings for a run of several ranks (`TrainConfig.ddp_bucket_mb`, `grad_compression`),
applied by both runtimes (`convs2s.train.runtime`) to the model they wrap.

- Buckets: DDP all-reduces the gradients in buckets of about `ddp_bucket_mb` MiB as the backward
  fills them, overlapping communication with the rest of the backward; PyTorch's default is 25.
  Larger buckets mean fewer, larger all-reduces (for slow links between nodes), smaller ones an
  earlier start.
- Compression: `grad_compression="bf16"` sends each bucket as bf16 (`bf16_all_reduce`: cast,
  divided by the world size, all-reduced, cast back into the float32 gradient; what PyTorch's
  `bf16_compress_hook` does, which a build without CUDA / NCCL 2.10+ or XCCL refuses, so
  gloo on CPUs runs the same code), half the bytes over the network for gradients rounded to
  8 bits of mantissa; the weights and the optimizer stay float32. The update is then the
  float32 one within bf16 rounding (tests/test_train_step.py).

    model = DistributedDataParallel(net, **ddp_kwargs(cfg))
    compress_gradients(model, cfg.grad_compression)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from convs2s.config import TrainConfig


def ddp_kwargs(cfg: TrainConfig) -> dict:
    """Keyword arguments of DistributedDataParallel for `cfg` (Ray Train's
    `prepare_model(parallel_strategy_kwargs=...)` passes them on)."""
    return {"bucket_cap_mb": cfg.ddp_bucket_mb}


def compress_gradients(model: nn.Module, how: str) -> nn.Module:
    """`model` with its gradients all-reduced as `how` says ("none", "bf16"); a model that is
    not DDP-wrapped (one rank) has nothing to send and is returned as it is."""
    if how == "none" or not isinstance(model, DistributedDataParallel):
        return model
    model.register_comm_hook(None, bf16_all_reduce)
    return model


def bf16_all_reduce(group, bucket):
    """A DDP communication hook: the bucket's (a dist.GradBucket) average over the ranks, sent
    as bf16; a future of the float32 buffer. (Unannotated: DDP checks a hook's annotations
    against the classes, and this module's are strings.)"""
    group = group or dist.group.WORLD
    buffer = bucket.buffer()  # float32, the bucket's gradients flattened
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return future.then(decompress)
