"""From an index to a pair of the synthetic demo corpus: a keyed permutation of the indices of a
seed, shape quotas (each shape's share of the indices), and decoding inside a shape.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from functools import cache

from preprocessing.demo import summarization, translation
from preprocessing.demo.summarization import summarization_shapes
from preprocessing.demo.translation import translation_shapes

# Sentence template -> the function that realizes a decoded shape as a pair.
REALIZE = {**translation.REALIZE, **summarization.REALIZE}

_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64 finalizer: a fixed, well-mixing bijection of 64-bit integers."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class IndexPermutation:
    """Keyed bijection of [0, n): a 6-round Feistel network on 2^bits >= n with cycle walking
    (re-apply until the value falls inside [0, n); at most 4 tries on average)."""

    def __init__(self, n: int, seed: int, salt: int):
        bits = max(2, (n - 1).bit_length())
        bits += bits & 1
        self.n, self.half, self.mask = n, bits // 2, (1 << (bits // 2)) - 1
        self.keys = [_mix64(_mix64((seed & _M64) ^ salt) + r) for r in range(6)]

    def __call__(self, i: int) -> int:
        k = i
        while True:
            left, right = k >> self.half, k & self.mask
            for key in self.keys:
                left, right = right, left ^ (_mix64(right ^ key) & self.mask)
            k = (left << self.half) | right
            if k < self.n:
                return k


def _allocate(weights: list[int], sizes: list[int], total: int) -> list[int]:
    """Indices per shape: shares proportional to weight, but never more than a shape's size
    (those are used in full and their remaining share goes to the others: water filling)."""
    counts, active, remaining = [0] * len(weights), set(range(len(weights))), total
    while active:
        wsum = sum(weights[i] for i in active)
        full = [i for i in active if sizes[i] * wsum <= remaining * weights[i]]
        if not full:
            for i in active:
                counts[i] = remaining * weights[i] // wsum
            break
        for i in full:
            counts[i], remaining = sizes[i], remaining - sizes[i]
            active.discard(i)
    return counts


def _coprime_stride(size: int) -> int:
    """A stride near size / golden ratio with gcd(stride, size) = 1: x -> x * stride mod size is
    a bijection that spreads a shape's first `count` codes over its whole space."""
    stride = size * 6180339887 // 10**10 | 1
    while math.gcd(stride, size) != 1:
        stride += 1
    return stride


class Corpus:
    """All pairs of one task: index -> (shape, code inside the shape) -> realized pair."""

    def __init__(self, task: str, shapes, total: int, salt: int):
        shapes = [(w, shape, space) for w, shape, space in shapes if space.size]
        scale = math.lcm(*{w.denominator for w, _, _ in shapes})
        counts = _allocate([int(w * scale) for w, _, _ in shapes],
                           [space.size for _, _, space in shapes], total)
        used = [(c, shape, space) for c, (_, shape, space) in zip(counts, shapes) if c]
        self.task, self.salt = task, salt
        self.shapes = [(shape, space) for _, shape, space in used]
        self.starts = list(itertools.accumulate([0] + [c for c, _, _ in used]))
        self.size = self.starts.pop()
        self.strides = [1 if c == space.size else _coprime_stride(space.size)
                        for c, _, space in used]

    def pairs(self, seed: int, start: int, count: int) -> list[tuple[str, str]]:
        try:  # ints, or integer types such as numpy.int64 (never floats)
            seed, start, count = (operator.index(x) for x in (seed, start, count))
        except TypeError:
            types = ", ".join(type(x).__name__ for x in (seed, start, count))
            raise TypeError(f"demo {self.task}: seed, start and count must be int, "
                            f"got {types}") from None
        if start < 0 or count < 0 or start + count > self.size:
            raise ValueError(f"demo {self.task}: indices [{start}, {start + count}) are outside "
                             f"[0, {self.size}); use 0 <= start and start + count <= {self.size}")
        permute = _permutation(self.size, seed, self.salt)
        out = []
        for i in range(start, start + count):
            k = permute(i)
            b = bisect.bisect_right(self.starts, k) - 1
            shape, space = self.shapes[b]
            values = space.decode((k - self.starts[b]) * self.strides[b] % space.size)
            out.append(REALIZE[shape.template](shape, values))
        return out


@cache
def _permutation(n: int, seed: int, salt: int) -> IndexPermutation:
    return IndexPermutation(n, seed, salt)


TARGET_SIZE = 4_000_000_000  # indices per seed (distinct pairs); shapes share it by weight


@cache
def corpus(task: str) -> Corpus:
    """The corpus of `task` ("translation" or "summarization"), built once per process."""
    if task == "translation":
        return Corpus(task, translation_shapes(), TARGET_SIZE, salt=0x7472616E73)
    if task == "summarization":
        return Corpus(task, summarization_shapes(), TARGET_SIZE, salt=0x73756D6D61)
    raise ValueError(f"demo: unknown task {task!r}; use 'translation' or 'summarization'")


def translation_pairs(seed: int, start: int, count: int) -> list[tuple[str, str]]:
    """(English, French) pairs number start .. start+count-1 of the synthetic corpus of `seed`."""
    return corpus("translation").pairs(seed, start, count)


def summarization_pairs(seed: int, start: int, count: int) -> list[tuple[str, str]]:
    """(document, headline) pairs number start .. start+count-1 of the synthetic corpus."""
    return corpus("summarization").pairs(seed, start, count)
