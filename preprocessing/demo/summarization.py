"""Summarization shapes of the synthetic demo corpus: a long Gigaword-style sentence (lowercased,
tokenized) -> its core clause as a headline: subject and object heads (numbers kept), verb in
headline tense (past -> present, future -> "to" + verb), and the place; leads, modifiers,
relative clauses, adverbs and times go.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

from preprocessing.demo.phrases import (
    FIVE,
    FOUR,
    HER,
    HIS,
    NAME_SUBJECTS,
    SOME,
    THE,
    THE_PL,
    THEIR,
    THIS,
    THREE,
    TWO,
    A,
    Det,
    Subject,
    en_np,
)
from preprocessing.demo.spaces import NONE, VERB_DETS, Choice, Product, Union, np_space
from preprocessing.demo.verbs import VERBS

LEADS = ["as expected ,", "according to witnesses ,", "in a surprise move ,", "despite the rain ,",
         "after a long day ,", "for the first time ,", "according to the police ,",
         "in a rare move ,", "once again ,", "as planned ,"]
TRAILERS = [", police said", ", witnesses said", ", officials said", ", the mayor said",
            ", local media reported", ", neighbors said", ", reports said"]
DOC_ADVERBS = ("carefully quickly quietly finally suddenly proudly happily slowly secretly "
               "reportedly").split()
DOC_TIMES = {"past": ["yesterday", "last week", "on monday", "on tuesday", "on friday",
                      "last night", "this morning", "last month"],
             "fut": ["tomorrow", "next week", "on monday", "on friday", "next month",
                     "this weekend", "next year"],
             "perf": ["this week", "today", "this year", "this month", "recently"]}
DOC_SUBJ_DETS = (THE, THE_PL, A, THIS, HIS, HER, THEIR, TWO, THREE)
DOC_OBJ_DETS = (THE, THE_PL, A, SOME, HIS, HER, THEIR, TWO, THREE, FOUR, FIVE)
DOC_SMALL_DETS = (THE, A, HIS, HER, THEIR)
DOC_PLACE_DETS = (THE, THIS, HIS, HER, THEIR)
DOC_LOC = {"in": "i", "at": "a", "near": "L"}
_PARTICLE_WORDS = max(len(v.particle.split()) for v in VERBS)


@cache
def _verb_object_space(n_adj: int, dets: tuple[Det, ...]):
    return Union([Product(Choice([v]), np_space(v.obj, n_adj, next(
        (VERB_DETS[f] for f in v.flags if f in VERB_DETS), dets)))
                  for v in VERBS if v.kind == "T" and "s" not in v.flags])  # no "has quietly liked"


@cache
def _doc_slot(kind: str):
    places = lambda n: np_space("L", n, DOC_PLACE_DETS)  # noqa: E731
    return {"lead": Choice(LEADS), "trailer": Choice(TRAILERS),
            "from": Union([places(0), places(1)]),
            "with": np_space("w", 1, DOC_SMALL_DETS),
            "rel": _verb_object_space(0, DOC_SMALL_DETS),
            "adverb": Choice(DOC_ADVERBS), "for": np_space("PA", 0, (THE, THE_PL, HIS, HER, THEIR)),
            "loc": Union([Product(Choice([p]), Union([np_space(pred, n, DOC_PLACE_DETS)
                                                      for n in (0, 1)]))
                          for p, pred in DOC_LOC.items()]),
            "time": Union([Product(Choice([t]), Choice(DOC_TIMES[t])) for t in DOC_TIMES]),
            "notime": Product(Choice(DOC_TIMES), NONE)}.get(kind, NONE)


@dataclass(frozen=True)
class DocShape:
    template: str
    lead: str  # "", lead, trailer
    subj: str  # name, np0, np1, np2
    mod: str  # "", from, with, rel
    adverb: bool
    n_obj: int
    objmod: bool
    loc: bool
    time: bool

    def max_words(self) -> int:
        lead = {"": 0, "lead": max(len(x.split()) for x in LEADS),
                "trailer": max(len(x.split()) for x in TRAILERS)}[self.lead]
        subj = 1 if self.subj == "name" else 2 + int(self.subj[-1])
        mod = {"": 0, "from": 4, "with": 4, "rel": 5 + _PARTICLE_WORDS}[self.mod]
        verb = 2 + self.adverb + _PARTICLE_WORDS
        return (lead + subj + mod + verb + 2 + self.n_obj + 3 * self.objmod + 4 * self.loc
                + 2 * self.time + 1)


def _head(np_or_name) -> tuple[str, bool]:
    """Headline form of a noun phrase (noun, with its number if any) and whether it is plural."""
    if isinstance(np_or_name, Subject):
        return np_or_name.en.lower(), False
    noun, det, _ = np_or_name
    noun_form = noun.en_pl if det.plural else noun.en
    return (f"{det.en} {noun_form}" if det.key == "num" else noun_form), det.plural


def _summary(shape: DocShape, values) -> tuple[str, str]:
    lead, subj, mod, adverb, (tense, time), (v, obj), objmod, loc = values
    head, plural = _head(subj)
    doc = [lead if shape.lead == "lead" else "",
           subj.en.lower() if isinstance(subj, Subject) else en_np(subj)]
    if shape.mod == "rel":
        rel_verb, rel_obj = mod
        doc += [", who", rel_verb.en_past, rel_verb.particle, en_np(rel_obj), ","]
    elif shape.mod:
        doc += [shape.mod, en_np(mod)]
    adverb = adverb or ""
    if tense == "past":
        doc += [adverb, v.en_past]
    elif tense == "fut":
        doc += ["will", adverb, v.en]
    else:
        doc += ["have" if plural else "has", adverb, v.en_pp]
    doc += [v.particle, en_np(obj), f"for {en_np(objmod)}" if objmod else "",
            f"{loc[0]} {en_np(loc[1])}" if loc else "", time or "",
            lead if shape.lead == "trailer" else "", "."]
    verb = f"to {v.en}" if tense == "fut" else v.en if plural else v.en_3sg
    place = f"{loc[0]} {_head(loc[1])[0]}" if loc else ""
    headline = [head, verb, v.particle, _head(obj)[0], place]
    return " ".join(w for w in doc if w), " ".join(w for w in headline if w)


REALIZE = {"summary": _summary}  # template -> realizer

SUMMARY_W = {"lead": {"": 50, "lead": 25, "trailer": 25},
             "subj": {"name": 20, "np0": 40, "np1": 30, "np2": 10},
             "mod": {"": 30, "from": 25, "with": 15, "rel": 30}, "adverb": {False: 50, True: 50},
             "n_obj": {0: 50, 1: 40, 2: 10}, "objmod": {False: 60, True: 40},
             "loc": {False: 40, True: 60}, "time": {False: 40, True: 60}}
MAX_DOC_WORDS = 30


def summarization_shapes():
    for combo in itertools.product(*(w.items() for w in SUMMARY_W.values())):
        shape = DocShape("summary", *(value for value, _ in combo))
        optional = (bool(shape.lead) + bool(shape.mod) + shape.adverb + shape.objmod + shape.loc
                    + shape.time)
        if optional < 3 or shape.max_words() > MAX_DOC_WORDS:  # long, but within 30 words
            continue
        subj = Choice(NAME_SUBJECTS) if shape.subj == "name" else np_space(
            "P", int(shape.subj[-1]), DOC_SUBJ_DETS)
        space = Product(_doc_slot(shape.lead), subj, _doc_slot(shape.mod),
                        _doc_slot("adverb" if shape.adverb else ""),
                        _doc_slot("time" if shape.time else "notime"),
                        _verb_object_space(shape.n_obj, DOC_OBJ_DETS),
                        _doc_slot("for" if shape.objmod else ""),
                        _doc_slot("loc" if shape.loc else ""))
        yield Fraction(math.prod(w for _, w in combo)), shape, space
