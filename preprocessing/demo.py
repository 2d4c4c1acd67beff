"""`demo`: an embedded, SYNTHETIC English->French corpus (and a summarization corpus) that the
project generates itself from a small bilingual grammar. It is NOT real data.

Why it exists: the workflows and tests need a default corpus that works offline, has no licence,
costs nothing to produce, and that a small ConvS2S model learns to high BLEU in minutes on a CPU,
so that "the pipeline trains and the score goes up" is a meaningful check. Real corpora (WMT,
Gigaword) come from the Hugging Face hub or ../shared/data instead.

Translation (`translation_pairs`): the grammar (words and inflections in
`preprocessing.demo_lexicon`: ~220 nouns, ~70 adjectives, ~100 verb senses, 30 names) covers
French determiners with elision and contraction (l'homme, du, au, aux, cet, mon école), gender and
number agreement of determiners, adjectives and être participles, adjectives before or after the
noun (le vieil homme heureux), conjugation in the present, passé composé (avoir and être), future
and imperfect (English "was eating"), ne ... pas with de after negation (pas de pomme), il y a,
prepositional phrases and time adverbials. Each English sentence has exactly one translation
("you" = tu, "you all" = vous, "they" = ils), so the mapping is learnable. Sentences have 4 to
about 22 words (mean 10).

Summarization (`summarization_pairs`), from the same lexicon, Gigaword-style (lowercased,
tokenized): a 10-30 word sentence with a lead or attribution, modifiers, a relative clause, an
adverb, PPs and a time -> a headline of its core clause: subject and object heads (numbers
kept), the verb in headline tense (past -> present, future -> "to" + verb) and the place.

Pair i of a seed is a pure function of (seed, i): the index goes through a keyed Feistel
permutation of [0, N) and is then decoded, as a mixed-radix number, into the choices of one
sentence shape. Decoding is a bijection, so pairs are distinct across all N = 4 * 10^9 indices of
a seed: disjoint index ranges (train / valid / test) never share a sentence, and any index block
can be generated on its own (e.g. by parallel Ray tasks), in any process.

Shapes (template, verb, with or without adjectives, PP, time, negation, ...) get target shares;
a shape whose space is smaller than its share is used in full and the rest is spread over the
others (`_allocate`). Within a shape, the used codes are spread over its space by a stride
coprime with its size, so every combination of words can occur.

Run: `python -m preprocessing.demo [--task translation|summarization] [--seed 1] [--count 10]`
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
import operator
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Callable

from preprocessing.demo_lexicon import (A, ADJECTIVES, ADVERBS, AVOIR, ETRE, FIVE, FOUR, HER,
                                        HIS, LOCATIVE, MY, MY_PL, NAME_SUBJECTS, NAMES, NOUNS,
                                        PP_KINDS, PREPS, PRONOUNS, SOME, THE, THE_PL, THEIR,
                                        THEIR_PL, THESE, THIRD_PERSON, THIS, THREE, TIMES, TWO,
                                        VERBS, Det, Noun, Subject, Verb, en_be, en_np, en_pp,
                                        en_sentence, en_verb, fr_np, fr_pp, fr_sentence, fr_verb,
                                        np_subject)

# ---------------------------------------------------------------------------------------------
# Enumerable spaces: a value <-> an integer in [0, size), bijectively.


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
def _adjectives_of(noun: Noun, n_adj: int) -> tuple[tuple[int, ...], ...]:
    """Adjective index tuples that may describe `noun`: (), (a,), or (French pre, French post)."""
    ok = [i for i, a in enumerate(ADJECTIVES) if noun.matches(a.pred)]
    if n_adj == 0:
        return ((),)
    if n_adj == 1:
        return tuple((i,) for i in ok)
    return tuple((i, j) for i in ok if ADJECTIVES[i].pre for j in ok if not ADJECTIVES[j].pre)


@cache
def _combos(ids: tuple[tuple[int, ...], ...]) -> Choice:
    return Choice(tuple(ADJECTIVES[i] for i in c) for c in ids)


@cache
def np_space(pred: str, n_adj: int, dets: tuple[Det, ...]) -> Union:
    """Noun phrases (noun, det, adjectives) of nouns matching `pred` with `n_adj` adjectives."""
    groups: dict[tuple, list[Noun]] = {}
    for noun in NOUNS:
        if noun.matches(pred) and _adjectives_of(noun, n_adj):
            groups.setdefault(_adjectives_of(noun, n_adj), []).append(noun)
    return Union([Product(Choice(ns), Choice(dets), _combos(ids)) for ids, ns in groups.items()])


def subject_space(kind: str, pred: str, pronouns=PRONOUNS):
    if kind == "pron":
        return Choice(pronouns)
    if kind == "name":
        return Choice(NAME_SUBJECTS)
    return np_space(pred, int(kind[-1]), SUBJ_DETS)


def as_subject(value) -> Subject:
    return value if isinstance(value, Subject) else np_subject(value)


# ---------------------------------------------------------------------------------------------
# Translation sentence shapes.


@cache
def pp_space(preps: tuple[str, ...], n_adj: int | None):
    if n_adj is None:
        return NONE
    return Union([Product(Choice([p]), np_space(PREPS[p][2], n_adj, PP_DETS)) for p in preps])


@cache
def tense_space(tenses: tuple[str, ...], with_time: bool):
    """(tense, (English, French) time adverbial or None); the adverbial fits the tense."""
    if not with_time:
        return Product(Choice(tenses), NONE)
    return Union([Product(Choice([t]), Choice(TIMES[t])) for t in tenses])


@dataclass(frozen=True)
class Shape:
    template: str
    verb: Verb | None = None
    neg: bool = False
    subj: str = ""  # pron, name, np0, np1, np2 (copula: pron3, pron12, ...)
    rec: str = ""  # ditransitive recipient kind


def _transitive(shape: Shape, values) -> tuple[str, str]:
    v, neg = shape.verb, shape.neg
    subj, (tense, time), obj, pp = values
    s = as_subject(subj)
    time = time or ("", "")
    en = [s.en, en_verb(v, tense, neg, s.who), en_np(obj), en_pp(pp), time[0]]
    fr = [s.fr, fr_verb(v, tense, neg, s), v.prep, *fr_np(obj, neg and not v.prep), *fr_pp(pp),
          time[1]]
    return en_sentence(en), fr_sentence(fr)


def _ditransitive(shape: Shape, values) -> tuple[str, str]:
    v, neg = shape.verb, shape.neg
    subj, (tense, time), obj, rec = values
    s, time = as_subject(subj), time or ("", "")
    rec = rec if isinstance(rec, Subject) else np_subject(rec)
    en = [s.en, en_verb(v, tense, neg, s.who), en_np(obj), "to", rec.en, time[0]]
    fr = [s.fr, fr_verb(v, tense, neg, s), *fr_np(obj, neg), "à", rec.fr, time[1]]
    return en_sentence(en), fr_sentence(fr)


def _intransitive(shape: Shape, values) -> tuple[str, str]:
    v, neg = shape.verb, shape.neg
    subj, (tense, time), adverb, pp = values
    s, time, adverb = as_subject(subj), time or ("", ""), adverb or ("", "")
    en = [s.en, en_verb(v, tense, neg, s.who), adverb[0], en_pp(pp), time[0]]
    fr = [s.fr, fr_verb(v, tense, neg, s), adverb[1], *fr_pp(pp), time[1]]
    return en_sentence(en), fr_sentence(fr)


def _copula(shape: Shape, values) -> tuple[str, str]:
    subj_adj, (tense, time), pp = values
    if isinstance(subj_adj[0], Subject):
        s, adj = subj_adj
    else:
        s, adj = np_subject(subj_adj[:3]), subj_adj[3]
    time, be = time or ("", ""), ETRE[tense][s.person]
    en = [s.en, en_be(tense, shape.neg, s.who), adj.en, en_pp(pp), time[0]]
    fr = [s.fr, f"ne {be} pas" if shape.neg else be, adj.fr(s.fem, s.plural), *fr_pp(pp), time[1]]
    return en_sentence(en), fr_sentence(fr)


def _existential(shape: Shape, values) -> tuple[str, str]:
    np, (tense, time), pp = values
    neg, time = shape.neg, time or ("", "")
    en = ["there", en_be(tense, False, "pl" if np[1].plural else "3s"), en_np(np, neg), en_pp(pp),
          time[0]]
    verb = {"pres": "a", "past": "avait", "fut": "aura"}[tense]  # il y a / avait / aura
    fr = ["il ne y", verb, "pas"] if neg else ["il y", verb]
    return en_sentence(en), fr_sentence([*fr, *fr_np(np, neg), *fr_pp(pp), time[1]])


def _shares(weights: dict) -> dict:
    """Relative weights -> shares that sum to 1."""
    return {k: Fraction(w, sum(weights.values())) for k, w in weights.items()}


# Target shares of sentence shapes (each factor independent of the others).
TEMPLATE_W = _shares({"transitive": 45, "intransitive": 20, "ditransitive": 10, "copula": 13,
                      "existential": 12})
SUBJ_W = _shares({"pron": 30, "name": 15, "np0": 30, "np1": 20, "np2": 5})
ADJ_W = _shares({0: 55, 1: 35, 2: 10})  # adjectives in an object noun phrase
PP_W = _shares({None: 50, 0: 30, 1: 20})  # no PP, PP without / with an adjective
PP_REQUIRED_W = _shares({0: 60, 1: 40})
RECIPIENT_W = _shares({"name": 30, "np0": 50, "np1": 20})
TIME_W = _shares({False: 60, True: 40})
NEG_W = _shares({False: 70, True: 30})
ADVERB_W = _shares({False: 60, True: 40})
COPULA_SUBJ_W = _shares({"pron3": 15, "pron12": 10, "name": 15, "np0": 35, "np1": 20, "np2": 5})
# An intransitive verb never takes a PP that repeats a particle of the same English verb used
# transitively ("arrive at the station" is arrive_at + object): the sentence would occur twice.
_PARTICLES = {(v.en, v.particle) for v in VERBS if v.kind != "I" and v.particle}


def _tense_splits(v: Verb, subj: str):
    """(tenses, pronouns, share): être participles agree, so past tense needs a known gender."""
    tenses = tuple(t for t in ("pres", "past", "fut", "prog")
                   if not (t == "prog" and "s" in v.flags) and not (t == "past" and "n" in v.flags))
    if not (v.etre and subj == "pron" and "past" in tenses):
        return [(tenses, PRONOUNS, Fraction(1))]
    rest = tuple(t for t in tenses if t != "past")
    return [(rest, PRONOUNS, Fraction(len(rest), len(tenses))),
            (("past",), THIRD_PERSON, Fraction(1, len(tenses)))]


TRANSITIVE_PREPS = LOCATIVE + ("with", "for")


def _verb_tails(template: str, v: Verb):
    """(weight, bare, recipient kind, slots) of what follows the verb: object and PP (bare: no
    adjective and no PP), object and recipient, or adverb and PP."""
    if template == "transitive":
        dets = next((VERB_DETS[f] for f in v.flags if f in VERB_DETS), ALL_DETS)
        for (n, wn), (pp, wp) in itertools.product(ADJ_W.items(), PP_W.items()):
            slots = [np_space(v.obj, n, dets), pp_space(TRANSITIVE_PREPS, pp)]
            yield wn * wp, n == 0 and pp is None, "", slots
    elif template == "ditransitive":
        for (n, wn), (rec, wr) in itertools.product(ADJ_W.items(), RECIPIENT_W.items()):
            recipients = (Choice(NAME_SUBJECTS) if rec == "name"
                          else np_space(v.rec, int(rec[-1]), ALL_DETS))
            yield wn * wr, False, rec, [np_space(v.obj, n, ALL_DETS), recipients]
    else:
        preps = tuple(p for k in v.obj for p in PP_KINDS[k]
                      if (v.en, PREPS[p][0]) not in _PARTICLES)
        for (adverb, wa), (pp, wp) in itertools.product(ADVERB_W.items(), PP_REQUIRED_W.items()):
            adverbs = Choice(ADVERBS[v.adverbs]) if adverb else NONE
            yield wa * wp, False, "", [adverbs, pp_space(preps, pp)]


def _verb_shapes(template: str, verbs: list[Verb]):
    """(weight, Shape, space) of every shape of a verb template."""
    base = TEMPLATE_W[template] / len(verbs)
    for v, (subj, ws), (time, wt), (neg, wn) in itertools.product(
            verbs, SUBJ_W.items(), TIME_W.items(), NEG_W.items()):
        for wx, bare, rec, tail in _verb_tails(template, v):
            if bare and subj in ("pron", "name") and not time:  # "I eat apples.": under 4 words
                continue
            for tenses, pronouns, share in _tense_splits(v, subj):
                space = Product(subject_space(subj, v.subj, pronouns), tense_space(tenses, time),
                                *tail)
                yield base * ws * wt * wn * wx * share, Shape(template, v, neg, subj, rec), space


@cache
def _copula_np_space(n_adj: int):
    """(noun, det, adjectives, predicate adjective) for "the old house is empty"."""
    groups: dict[tuple, list[Noun]] = {}
    for noun in NOUNS:
        ids = _adjectives_of(noun, n_adj)
        preds = tuple(a for a in ADJECTIVES if noun.matches(a.pred))
        if ids and preds:
            groups.setdefault((ids, preds), []).append(noun)
    return Union([Product(Choice(ns), Choice(SUBJ_DETS), _combos(ids), Choice(preds))
                  for (ids, preds), ns in groups.items()])


PERSON_ADJECTIVES = [a for a in ADJECTIVES if "P" in a.pred]


def _copula_subjects(kind: str):
    if kind == "pron3":
        return Product(Choice(THIRD_PERSON), Choice(PERSON_ADJECTIVES))
    if kind == "pron12":  # je, tu, nous, vous: gender unknown, so only invariable adjectives
        pronouns = [p for p in PRONOUNS if p not in THIRD_PERSON]
        return Product(Choice(pronouns), Choice([a for a in PERSON_ADJECTIVES if a.invariant]))
    if kind == "name":
        return Product(Choice(NAME_SUBJECTS), Choice(PERSON_ADJECTIVES))
    return _copula_np_space(int(kind[-1]))


def _copula_and_existential_shapes():
    tenses = ("pres", "past", "fut")
    for time, neg in itertools.product(TIME_W, NEG_W):
        w = TIME_W[time] * NEG_W[neg]
        for (kind, wk), (pp, wp) in itertools.product(COPULA_SUBJ_W.items(), PP_W.items()):
            if kind[:2] in ("pr", "na") and pp is None and not time:  # "He is happy."
                continue
            space = Product(_copula_subjects(kind), tense_space(tenses, time),
                            pp_space(LOCATIVE, pp))
            yield TEMPLATE_W["copula"] * w * wk * wp, Shape("copula", neg=neg, subj=kind), space
        for (n, wn), (pp, wp) in itertools.product(ADJ_W.items(), PP_REQUIRED_W.items()):
            dets = EXIST_NEG_DETS if neg else EXIST_DETS
            space = Product(np_space("PATFDL", n, dets), tense_space(tenses, time),
                            pp_space(LOCATIVE, pp))
            yield TEMPLATE_W["existential"] * w * wn * wp, Shape("existential", neg=neg), space


def translation_shapes():
    by_kind = {k: [v for v in VERBS if v.kind == k] for k in "TDI"}
    yield from _verb_shapes("transitive", by_kind["T"])
    yield from _verb_shapes("ditransitive", by_kind["D"])
    yield from _verb_shapes("intransitive", by_kind["I"])
    yield from _copula_and_existential_shapes()


REALIZE: dict[str, Callable] = {"transitive": _transitive, "ditransitive": _ditransitive,
                                "intransitive": _intransitive, "copula": _copula,
                                "existential": _existential}


# ---------------------------------------------------------------------------------------------
# Summarization: a long Gigaword-style sentence (lowercased, tokenized) -> its core clause as a
# headline: subject and object heads (numbers kept), verb in headline tense (past -> present,
# future -> "to" + verb), and the place; leads, modifiers, relative clauses, adverbs and times go.

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


REALIZE["summary"] = _summary
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


# ---------------------------------------------------------------------------------------------
# Word types: every word form the grammar can produce (a test checks generated text against it).

_ELIDED_PREFIX = re.compile(r"\b(l'|d'|j'|n'|qu')(?=\w)")


def words(sentence: str) -> list[str]:
    """Lowercased word tokens; French elided articles and pronouns (l', d', j', n') split off."""
    return _ELIDED_PREFIX.sub(r"\1 ", sentence.lower().rstrip(".")).split()


def _verb_words(v: Verb) -> tuple[set[str], set[str]]:
    """Forms of the tenses the verb is used in (no progressive for stative verbs, no simple past
    for read/read)."""
    en = {v.en, v.en_3sg, *v.particle.split()}
    fr = {*v.present, *(v.future(p) for p in range(6)), *v.prep.split()}
    if "n" not in v.flags:
        en.add(v.en_past)
        fr |= {v.agreed_participle(f, n) for f in (False, True) for n in (False, True)
               } if v.etre else {v.participle}
    if "s" not in v.flags:
        en.add(v.en_ing)
        fr |= {v.imperfect(p) for p in range(6)}
    return en, fr


def word_types() -> dict[str, frozenset[str]]:
    """{"en", "fr"}: word types of the translation corpus; "summarization": of its documents
    and headlines."""
    en = {w for n in NOUNS for w in (n.en, n.en_pl)} | {a.en for a in ADJECTIVES}
    fr = {w for n in NOUNS for f in (n.fr, n.fr_pl) for w in f.split()}
    fr |= {f for a in ADJECTIVES for f in (*a.forms, a.vowel_form)}
    en |= {e.lower() for e, _, _ in NAMES}
    fr |= {f.lower() for _, f, _ in NAMES}
    for v in VERBS:
        ve, vf = _verb_words(v)
        en, fr = en | ve, fr | vf
    for pairs in [*ADVERBS.values(), *TIMES.values()]:
        en |= {w for e, _ in pairs for w in e.lower().split()}
        fr |= {w for _, f in pairs for w in words(f)}
    for d in (*ALL_DETS, *VERB_DETS["D"], FOUR, FIVE):
        en |= {d.en} - {""}
        fr |= set(d.fr)
    en |= {"an", "no", "there", "to", "do", "does", "did", "not", "will", "was", "were", "am",
           "is", "are", "be"}
    fr |= {"l'", "d'", "de", "cet", "au", "aux", "du", "des", "j'", "n'", "ne", "pas", "y", "a",
           "avait", "aura", "à", *AVOIR, *(f for forms in ETRE.values() for f in forms)}
    for p in PRONOUNS:
        en |= set(p.en.lower().split())
        fr.add(p.fr)
    for e, f, _ in PREPS.values():
        en |= set(e.split())
        fr |= set(f.split())
    summary = {w for x in [*LEADS, *TRAILERS, *DOC_ADVERBS, *(t for ts in DOC_TIMES.values()
                                                               for t in ts)] for w in x.split()}
    summary |= {w for v in VERBS if v.kind == "T" for w in (v.en_past, v.en_pp)}
    summary |= {"who", "from", "has", "have", "."} | en
    return {"en": frozenset(en), "fr": frozenset(fr), "summarization": frozenset(summary)}


VOCABULARY_SIZE: dict[str, int] = {k: len(v) for k, v in word_types().items()}


# ---------------------------------------------------------------------------------------------
# From an index to a pair: keyed permutation, shape quotas, decoding.

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


def main() -> None:
    parser = argparse.ArgumentParser(description="Print pairs of the synthetic demo corpus.")
    parser.add_argument("--task", choices=["translation", "summarization"], default="translation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args()
    make = translation_pairs if args.task == "translation" else summarization_pairs
    for source, target in make(args.seed, args.start, args.count):
        print(f"{source}\n  -> {target}")
    print(f"# {corpus(args.task).size:,} distinct pairs per seed; word types: {VOCABULARY_SIZE}")


if __name__ == "__main__":
    main()
