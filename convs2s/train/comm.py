"""The training world's collectives, in torch only (torch.distributed): one rank's view of the
world, with a CPU (gloo) side group for host-side counts.

    comm = Comm.create()                   # the torch.distributed world, or a single process
    n_total = comm.sum_ints([n_local])[0]  # host integers: no wait on the GPU
    comm.sum_tensor(t)                     # device tensors, over the training backend
    hosts = comm.gather_objects(host_info) # small Python objects from every rank
    path = comm.broadcast_object(path)     # rank 0's object on every rank
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Comm:
    """Collectives of the training world; a CPU (gloo) group carries the host-side counts so that
    reducing them never waits for the GPU."""

    world_size: int = 1
    rank: int = 0
    cpu_group: object = None  # gloo process group for host integers (None: default group)

    @classmethod
    def create(cls) -> Comm:
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        return cls(dist.get_world_size(), dist.get_rank(), group)

    def sum_ints(self, values: list[int]) -> list[int]:
        """Sum host integers over the ranks (gloo, CPU): no device synchronization."""
        if self.world_size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, group=self.cpu_group)
        return t.tolist()

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a device tensor over the ranks (the training backend: gloo or nccl), in place."""
        if self.world_size > 1:
            dist.all_reduce(t)
        return t

    def broadcast_object(self, obj, src: int = 0):
        """Rank `src`'s `obj` (a small Python object) on every rank, over the CPU group."""
        if self.world_size == 1:
            return obj
        shared = [obj]
        dist.broadcast_object_list(shared, src=src, group=self.cpu_group)
        return shared[0]

    def barrier(self) -> None:
        """Every rank waits for the others, over the CPU group (no GPU work or NCCL watchdog:
        a rank may wait there while rank 0 writes a checkpoint to a bucket)."""
        if self.world_size > 1:
            dist.barrier(group=self.cpu_group)

    def gather_objects(self, obj) -> list:
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out
