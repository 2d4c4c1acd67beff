"""Enumerable spaces of the synthetic demo corpus: a value <-> an integer in [0, size),
bijectively (`Choice`, `Product`, `Union`), and the spaces of noun phrases and subjects.
"""

from __future__ import annotations

import bisect
import itertools
import math
from functools import cache

from preprocessing.demo.lexicon import ADJECTIVES, NOUNS, Noun
from preprocessing.demo.phrases import (
    FIVE,
    FOUR,
    HER,
    HIS,
    MY,
    MY_PL,
    NAME_SUBJECTS,
    PRONOUNS,
    SOME,
    THE,
    THE_PL,
    THEIR,
    THEIR_PL,
    THESE,
    THIS,
    THREE,
    TWO,
    A,
    Det,
)


class Choice:
    __slots__ = ("items", "size")

    def __init__(self, items):
        self.items = tuple(items)
        self.size = len(self.items)

    def decode(self, k):
        return self.items[k]


class Product:
    """Mixed-radix number: the first part is the lowest digit."""

    __slots__ = ("parts", "size")

    def __init__(self, *parts):
        self.parts = parts
        self.size = math.prod(p.size for p in parts)

    def decode(self, k):
        out = []
        for part in self.parts:
            k, r = divmod(k, part.size)
            out.append(part.decode(r))
        return tuple(out)


class Union:
    """Disjoint union; each part is as likely as its share of the size."""

    __slots__ = ("parts", "starts", "size")

    def __init__(self, parts):
        self.parts = [p for p in parts if p.size]
        self.starts = list(itertools.accumulate([0] + [p.size for p in self.parts]))
        self.size = self.starts.pop()

    def decode(self, k):
        i = bisect.bisect_right(self.starts, k) - 1
        return self.parts[i].decode(k - self.starts[i])


NONE = Choice([None])


# ---------------------------------------------------------------------------------------------
# Noun phrases and subjects.

ALL_DETS = (THE, THE_PL, A, SOME, THIS, THESE, MY, HIS, HER, THEIR, TWO, THREE)
# A bare plural subject reads as generic in English ("Writers hide boxes" = les écrivains), so
# subjects never take the indefinite plural.
SUBJ_DETS = tuple(d for d in ALL_DETS if d is not SOME)
VERB_DETS = {  # verb flag -> determiners of its object
    "D": (THE, THE_PL, THIS, THESE, MY, MY_PL, HIS, HER, THEIR, THEIR_PL),  # like, love: definite
    "P": (THE, A, THIS, MY, HIS, HER, THEIR),  # destinations: go to a market, the market
    "G": (THE, THIS, MY, HIS, HER, THEIR),  # instruments: jouer du piano
}
PP_DETS = (THE, THE_PL, A, THIS, MY, HIS, HER, THEIR)
EXIST_DETS, EXIST_NEG_DETS = (A, SOME, TWO, THREE, FOUR, FIVE), (A, SOME)


@cache
def adjectives_of(noun: Noun, n_adj: int) -> tuple[tuple[int, ...], ...]:
    """Adjective index tuples that may describe `noun`: (), (a,), or (French pre, French post)."""
    ok = [i for i, a in enumerate(ADJECTIVES) if noun.matches(a.pred)]
    if n_adj == 0:
        return ((),)
    if n_adj == 1:
        return tuple((i,) for i in ok)
    return tuple((i, j) for i in ok if ADJECTIVES[i].pre for j in ok if not ADJECTIVES[j].pre)


@cache
def adjective_combos(ids: tuple[tuple[int, ...], ...]) -> Choice:
    return Choice(tuple(ADJECTIVES[i] for i in c) for c in ids)


@cache
def np_space(pred: str, n_adj: int, dets: tuple[Det, ...]) -> Union:
    """Noun phrases (noun, det, adjectives) of nouns matching `pred` with `n_adj` adjectives."""
    groups: dict[tuple, list[Noun]] = {}
    for noun in NOUNS:
        if noun.matches(pred) and adjectives_of(noun, n_adj):
            groups.setdefault(adjectives_of(noun, n_adj), []).append(noun)
    return Union([Product(Choice(ns), Choice(dets), adjective_combos(ids))
                  for ids, ns in groups.items()])


def subject_space(kind: str, pred: str, pronouns=PRONOUNS):
    if kind == "pron":
        return Choice(pronouns)
    if kind == "name":
        return Choice(NAME_SUBJECTS)
    return np_space(pred, int(kind[-1]), SUBJ_DETS)


