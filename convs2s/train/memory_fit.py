"""Whether the data's token budget fits the GPU's memory, known before the first update.

Batches are cut before training (`preprocessing`: n sentences x max(S, T) <= max_tokens), so
the largest step a run will take is known from its data (`WorstStep`). On a GPU each rank runs
that step once (forward, fused loss, backward, in the run's precision) before training starts.
If it runs out of memory, or its peak plus what an update adds (the optimizer's state, the
gradients kept between micro-batches) is over what this process may use, the run stops with the
largest budget whose worst step fits, found by
bisection on the same probe (issue 37: "a --max-tokens a GPU's memory cannot hold fails before
training with the largest budget that fits"), instead of an out-of-memory error hours into an
epoch, when a long batch first comes.

    worst = WorstStep.of_data(files_folder, max_positions)   # from the batches' manifest
    check_fits(net, worst, precision, device, label_smoothing, extra_bytes,  # BudgetTooLarge
               static_shapes, max_positions)  # the padded steps, with static shapes
    agree_on_fit(comm, error)   # every rank raises if any rank's check failed (a collective)

With static shapes (`TrainConfig.static_shapes`, and CUDA graphs over them) a step runs on its
batch padded (`convs2s.train.collate.static_dims`: lengths rounded up, sentence counts up a
ladder), and the masked loss computes every row, pad rows included: short sentences padded
to the multiple take up to about 4.6 times the budget's token slots on each side at 3,000
tokens (1,720 x 8 for 1,500 pairs of one piece and EOS; 1,101 x 8, 2.9 times, under
preprocessing's default cap of 1,024 pairs a batch). The probe then runs the largest padded
steps the budget can give (`WorstStep.stepped_shapes`).

Every rank of a world ends the same way: if one rank's GPU cannot hold the budget, all raise
the same `BudgetTooLarge` (the others would otherwise wait in the first all-reduce for ever).
Under Ray Train the workers then return the message instead of raising it, so that Ray Train
does not restart the group `max_failures` times only to probe and fail again; the driver
raises it (`convs2s.train.launch.fit`), and a workflow prints it in one line (exit 2).

On the CPU nothing is checked (a host's memory is not a fixed card's, and the operating system
swaps before it refuses).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from convs2s.config import EOS
from convs2s.train.collate import Batch, collate_lists, pad_to, static_dims
from convs2s.train.data import read_manifest

# The share of what this process may use that the probed step may reach: the allocator's
# fragmentation, cuBLAS workspaces and the varying shapes of real batches need the rest.
HEADROOM = 0.92
STEP = 500  # the largest fitting budget is reported to this many tokens
# The shortest side a batch can have, EOS included: cleaning drops empty sentences
# (preprocessing/cleaning.py), so every side holds a piece and EOS. Static shapes pad the
# shortest the most (a length of 2 rounds up to 8).
MIN_LENGTH = 2


class BudgetTooLarge(ValueError):
    """The data's token budget does not fit this GPU; the message names the largest that does."""


def agree_on_fit(comm, error: BudgetTooLarge | None) -> None:
    """A collective over `comm` (`convs2s.train.comm.Comm`): raise `BudgetTooLarge` on every
    rank when any rank's check failed, with the first failing rank's message (and how many
    other ranks failed too), so that no rank goes on to wait for the ones that stopped."""
    errors = comm.gather_objects(None if error is None else str(error))
    failed = [(rank, msg) for rank, msg in enumerate(errors) if msg is not None]
    if not failed:
        return
    rank, msg = failed[0]
    where = f"rank {rank} of {len(errors)}: " if len(errors) > 1 else ""
    more = f" ({len(failed) - 1} other rank(s) too)" if len(failed) > 1 else ""
    raise BudgetTooLarge(f"{where}{msg}{more}")


@dataclass(frozen=True)
class WorstStep:
    """The most memory a batch of the data can take. A batch holds n pairs with
    n x max(S, T) <= max_tokens (the budget's own measure), so each side holds at most the budget
    in tokens and the attention n x S x T at most the budget x min(S, T): pairs of the shorter
    of the two longest lengths on both sides, as many as the budget takes, reach all three."""

    max_tokens: int
    longest_src: int  # pieces, EOS included
    longest_tgt: int
    max_sentences: int | None = None  # the batches' cap on pairs (preprocessing's), if any

    def shape(self, budget: int | None = None) -> tuple[int, int, int]:
        """(sentences, S, T) of the worst batch under `budget` (default: the data's own;
        sentences longer than a smaller budget would not be in its batches at all)."""
        budget = budget or self.max_tokens
        m = min(self.longest_src, self.longest_tgt, budget)
        return max(1, self._most(budget // m)), m, m

    def _most(self, n: int) -> int:
        """`n` pairs, or the batches' cap where that is fewer (a batch never holds more)."""
        return min(n, self.max_sentences) if self.max_sentences else n

    def stepped_shapes(self, budget: int | None = None, static_shapes: int = 0,
                       max_len: int | None = None) -> list[tuple[tuple, tuple]]:
        """[(batch shape, shape stepped)] of the largest steps under `budget`, each shape
        (sentences, S, T). Without static shapes: the one worst batch, stepped as it is. With
        them (`static_shapes`: the multiple; `max_len`: the model's max_positions, as the
        Trainer pads): each length L the budget allows gives its largest batch (budget // L
        sentences, at most `max_sentences`; both sides as long as the data's longest allow),
        padded as training pads
        it; a step's memory grows about linearly in its token slots n x (S + T) and its
        attention n x S x T, so over these the most it takes is at a corner of their upper
        hull in that plane: those corners (two or three, from the many short sentences to the
        few long ones) are the steps returned."""
        budget = budget or self.max_tokens
        if not static_shapes:
            return [(self.shape(budget),) * 2]
        steps = {}
        for length in range(MIN_LENGTH, max(MIN_LENGTH, min(
                max(self.longest_src, self.longest_tgt), budget)) + 1):
            n, s, t = max(1, self._most(budget // length)), min(length, self.longest_src), \
                min(length, self.longest_tgt)
            padded = static_dims(n, s, t, budget, static_shapes, max_len)
            sentences, src_len, tgt_len = padded
            cost = (sentences * (src_len + tgt_len), sentences * src_len * tgt_len)
            if cost not in steps:  # the first (shortest) batch to pad to it
                steps[cost] = ((n, s, t), padded)
        return [steps[c] for c in _upper_hull(list(steps))]

    @classmethod
    def of_data(cls, batches_folder, max_positions: int) -> WorstStep | None:
        """From the manifest preprocessing wrote beside the batches (`max_tokens`, `longest`,
        `max_sentences`);
        None when it does not say (batches cut before the longest sentence was recorded)."""
        manifest = read_manifest(batches_folder)
        longest = manifest.get("longest") or {}
        if not manifest.get("max_tokens") or not longest.get("src") or not longest.get("tgt"):
            return None
        cap = manifest.get("max_sentences")
        return cls(int(manifest["max_tokens"]), min(int(longest["src"]), max_positions),
                   min(int(longest["tgt"]), max_positions), int(cap) if cap else None)


def _upper_hull(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The corners of the upper-right hull of `points` (x, y >= 0), by ascending x: where the
    largest a x + b y (a, b >= 0) can be."""
    best_y, front = -1, []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):  # the points no other exceeds
        if y > best_y:
            front.append((x, y))
            best_y = y
    hull: list[tuple[int, int]] = []
    for p in reversed(front):  # ascending x, descending y: keep the right turns only
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1])
                                  - (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0])) >= 0:
            hull.pop()
        hull.append(p)
    return hull


def probe_batches(worst: WorstStep, src_vocab: int, tgt_vocab: int, budget: int | None = None,
                  static_shapes: int = 0, max_len: int | None = None,
                  seed: int = 0) -> list[Batch]:
    """The batches of `worst.stepped_shapes`: random pieces, every sentence full length, padded
    as training pads them with static shapes (`pad_to`: appended sentences, the target rows a
    mask, so the loss computes every row as the training step's does)."""
    rng = np.random.default_rng(seed)
    out = []
    for (n, s, t), padded in worst.stepped_shapes(budget, static_shapes, max_len):
        src = rng.integers(4, src_vocab, size=(n, s))
        tgt = rng.integers(4, tgt_vocab, size=(n, t))
        src[:, -1] = tgt[:, -1] = EOS
        batch = collate_lists(src.tolist(), tgt.tolist())
        out.append(pad_to(batch, *padded) if static_shapes else batch)
    return out


def describe_steps(worst: WorstStep, budget: int | None = None, static_shapes: int = 0,
                   max_len: int | None = None) -> str:
    """The probed steps in words, for the messages."""
    steps = [f"{n:,} x {s} / {t}" for _, (n, s, t) in
             worst.stepped_shapes(budget, static_shapes, max_len)]
    words = " and ".join([", ".join(steps[:-1]), steps[-1]] if len(steps) > 1 else steps)
    return words + " sentences x source / target pieces" + (
        f", padded to static shapes of {static_shapes}" if static_shapes else "")


def probe_peak(net: torch.nn.Module, batch: Batch, autocast, device: torch.device,
               label_smoothing: float) -> int:
    """Peak bytes allocated on `device` over one forward, fused loss and backward of `batch`
    (the gradients are dropped after). Raises torch.cuda.OutOfMemoryError when it does not fit."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    batch = batch.to(device)
    try:
        with autocast:
            loss, _ = net(batch.src_tokens, batch.src_lengths, batch.prev_output_tokens,
                          target=batch.target, label_smoothing=label_smoothing,
                          target_rows=batch.target_rows)
        loss.backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    finally:
        loss = None
        net.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def largest_fitting(fits: Callable[[int], bool], below: int, step: int = STEP) -> int:
    """The largest multiple of `step` under `below` for which `fits` holds, assuming a smaller
    budget never takes more memory (bisection); 0 when not even `step` fits."""
    lo, hi = 0, (below - 1) // step  # fits(lo * step) holds (0: trivially), fits(> hi) unknown
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * step):
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def usable_bytes(device: torch.device) -> tuple[float, int]:
    """(bytes this process may use on the GPU, the GPU's total): what is free and what its
    allocator holds, within the allocator's limit (torch.cuda.set_per_process_memory_fraction,
    1 unless set), times HEADROOM."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 1.0)(device)
    return HEADROOM * min(free + torch.cuda.memory_reserved(device), fraction * total), total


def graph_shapes_that_fit(peak: int, param_bytes: int, extra_bytes: int, usable: float,
                          cap: int) -> int:
    """How many step shapes CUDA graphs may capture (convs2s.train.graphs, at most `cap`, at
    least 1): each capture keeps about what the worst step holds beyond the weights (its
    saved activations and a gradient of every parameter), beside the run's `peak` (weights
    included) and the update's `extra_bytes`, within `usable`. `peak`: `check_fits`'s with the
    run's static shapes, i.e. of the largest padded step, the most a capture can keep."""
    per_capture = max(peak - param_bytes, 1)
    room = usable - peak - extra_bytes
    return max(1, min(cap, 1 + int(room // per_capture)))


def check_fits(net, worst: WorstStep, precision, device: torch.device, label_smoothing: float,
               extra_bytes: int = 0, static_shapes: int = 0,
               max_len: int | None = None) -> int | None:
    """Run the data's worst steps once on `device` (a GPU; the CPU is not checked: None) and
    return their peak bytes; raise `BudgetTooLarge`, naming the largest budget that fits, when
    one runs out of memory or its peak plus `extra_bytes` (what an update adds) is over
    HEADROOM of what this process may use. `static_shapes`, `max_len`: the run's padding
    (`TrainConfig.static_shapes`, the model's max_positions), whose padded steps are the
    worst (`WorstStep.stepped_shapes`)."""
    if device.type != "cuda":
        return None
    usable, total = usable_bytes(device)
    autocast = precision.autocast(device)
    was_training = net.training
    net.train()  # dropout masks are part of what backward keeps

    def peak_at(budget: int | None) -> int | None:
        batches = probe_batches(worst, net.src_vocab_size, net.tgt_vocab_size, budget,
                                static_shapes, max_len)
        try:
            return max(probe_peak(net, batch, autocast, device, label_smoothing)
                       for batch in batches)
        except torch.cuda.OutOfMemoryError:
            pass
        except RuntimeError as err:  # a library's own allocation failing (cuBLAS, cuDNN)
            if "out of memory" not in str(err).lower() and "ALLOC_FAILED" not in str(err):
                raise
        torch.cuda.empty_cache()  # the failed step's blocks, freed with its traceback
        return None

    try:
        peak = peak_at(None)
        if peak is not None and peak + extra_bytes <= usable:
            return peak
        best = largest_fitting(lambda b: (p := peak_at(b)) is not None and
                               p + extra_bytes <= usable, worst.max_tokens)
    finally:
        net.train(was_training)
    need = "ran out of memory" if peak is None else \
        f"need {(peak + extra_bytes) / 2**30:.1f} GiB"
    name = torch.cuda.get_device_name(device)
    fix = (f"the largest budget that fits is {best:,} tokens: cut the batches again with "
           f"--max-tokens {best} (a workflow, or python -m preprocessing); the cleaned, BPE "
           "and encoded stages are reused, and a workflow accumulates the micro-batches that "
           "keep its update (saying so where no number does exactly; python -m convs2s train: "
           "--update-freq)") if best else \
        f"not even {STEP} tokens fit: use a smaller model or a GPU with more memory"
    raise BudgetTooLarge(
        f"the data's token budget ({worst.max_tokens:,} tokens a batch) does not fit on "
        f"{name} ({total / 2**30:.0f} GiB, {usable / 2**30:.1f} GiB usable by this process): "
        f"its largest steps ({describe_steps(worst, None, static_shapes, max_len)}) {need} "
        f"(forward, loss and backward in {precision.name}, plus "
        f"{extra_bytes / 2**30:.1f} GiB an update adds); {fix}")
