"""Training meters: sums kept on the device between log intervals, reduced over the ranks only
when a log line is due, plus the human-readable progress line (updates/s, tokens/s, loss, ETA).

    meter = TrainMeter(comm, device)
    meter.add(stats, batches)                          # every update: no host sync
    if update % log_interval == 0:
        metrics = meter.read(lr)                       # all ranks (collective), then reset
        print(progress_line(epoch, update, metrics, eta_s))
"""

from __future__ import annotations

import math
import resource
import time

import torch

from convs2s.train.collate import Batch
from convs2s.train.comm import Comm
from convs2s.train.update import UpdateStats


class TrainMeter:
    """Accumulates one log interval of training statistics."""

    def __init__(self, comm: Comm, device: torch.device):
        self.comm, self.device = comm, device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), device=self.device)
        self.nll_sum = torch.zeros((), device=self.device)
        self.grad_norm = torch.zeros((), device=self.device)
        self.updates = 0
        self.tokens = 0  # target tokens over all ranks (known on the host from the data)
        self.real = 0  # local non-pad source + target tokens
        self.slots = 0  # local padded source + target slots computed on
        self.elapsed = 0.0  # seconds of training in this interval (validation excluded)
        self.start: float | None = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def pause(self) -> None:
        """Stop the clock (validation and checkpoints do not count as training time), once the
        work queued on a GPU is done (it is training time; rare: at validations and
        checkpoints)."""
        if self.start is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.elapsed += time.perf_counter() - self.start
            self.start = None

    def resume(self) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def add(self, stats: UpdateStats, batches: list[Batch]) -> None:
        self.loss_sum += stats.loss_sum
        self.nll_sum += stats.nll_sum
        self.grad_norm += stats.grad_norm.float()
        self.updates += 1
        self.tokens += stats.ntokens
        for b in batches:
            self.real += b.ntokens + b.src_ntokens
            self.slots += b.padded_tokens

    def read(self, lr: float) -> dict[str, float]:
        """Metrics of the interval, identical on every rank (a collective: call on all ranks)."""
        sums = torch.stack([self.loss_sum, self.nll_sum]).double()
        self.comm.sum_tensor(sums)
        real, slots = self.comm.sum_ints([self.real, self.slots])
        loss, nll = (sums / max(self.tokens, 1)).tolist()
        self.pause()
        elapsed = max(self.elapsed, 1e-9)
        metrics = {
            "train/loss": loss,
            "train/nll": nll,
            "train/ppl": math.exp(min(nll, 50.0)),
            "train/lr": lr,
            "train/gnorm": float(self.grad_norm) / max(self.updates, 1),
            "train/updates_per_s": self.updates / elapsed,
            "train/tokens_per_s": self.tokens / elapsed,
            "train/padding_efficiency": real / max(slots, 1),
            "train/peak_mem_mb": peak_memory_mb(self.device),
        }
        self.reset()
        return metrics

    def state_dict(self) -> dict:
        """This rank's interval so far, for a checkpoint (gathered from every rank, as the RNG
        states are): a run resumed from it on as many ranks logs its next line over the whole
        interval, bit for bit as the uninterrupted run does (a fresh meter averaged only the
        updates since the resume)."""
        elapsed = self.elapsed + (time.perf_counter() - self.start if self.start else 0.0)
        return {"loss_sum": float(self.loss_sum), "nll_sum": float(self.nll_sum),
                "grad_norm": float(self.grad_norm), "updates": self.updates,
                "tokens": self.tokens, "real": self.real, "slots": self.slots,
                "elapsed": elapsed}

    def load_state_dict(self, state: dict) -> None:
        """This rank's interval as `state_dict` saved it (the float32 sums exactly: a float32
        value is a Python float without rounding)."""
        self.loss_sum.fill_(state["loss_sum"])
        self.nll_sum.fill_(state["nll_sum"])
        self.grad_norm.fill_(state["grad_norm"])
        self.updates, self.tokens = int(state["updates"]), int(state["tokens"])
        self.real, self.slots = int(state["real"]), int(state["slots"])
        self.elapsed = float(state["elapsed"])


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated GPU memory since the last reset, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def format_eta(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def progress_line(epoch: int, update: int, metrics: dict[str, float], eta_s: float) -> str:
    return (f"epoch {epoch} | update {update} | {metrics['train/updates_per_s']:.2f} upd/s | "
            f"{metrics['train/tokens_per_s']:.0f} tok/s | loss {metrics['train/loss']:.3f} | "
            f"ppl {metrics['train/ppl']:.1f} | lr {metrics['train/lr']:.3g} | "
            f"gnorm {metrics['train/gnorm']:.3f} | ETA epoch {format_eta(eta_s)}")
