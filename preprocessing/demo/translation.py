"""Translation sentence shapes of the synthetic demo corpus: transitive, ditransitive,
intransitive, copula and existential templates, their target shares, and the realizers that
turn a shape's decoded values into an (English, French) pair.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Callable

from preprocessing.demo.lexicon import ADJECTIVES, ADVERBS, NOUNS, TIMES, Noun
from preprocessing.demo.phrases import (
    ETRE,
    LOCATIVE,
    NAME_SUBJECTS,
    PP_KINDS,
    PREPS,
    PRONOUNS,
    THIRD_PERSON,
    Subject,
    as_subject,
    en_be,
    en_np,
    en_pp,
    en_sentence,
    en_verb,
    fr_np,
    fr_pp,
    fr_sentence,
    fr_verb,
    np_subject,
)
from preprocessing.demo.spaces import (
    ALL_DETS,
    EXIST_DETS,
    EXIST_NEG_DETS,
    NONE,
    PP_DETS,
    SUBJ_DETS,
    VERB_DETS,
    Choice,
    Product,
    Union,
    adjective_combos,
    adjectives_of,
    np_space,
    subject_space,
)
from preprocessing.demo.verbs import VERBS, Verb


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
        ids = adjectives_of(noun, n_adj)
        preds = tuple(a for a in ADJECTIVES if noun.matches(a.pred))
        if ids and preds:
            groups.setdefault((ids, preds), []).append(noun)
    return Union([Product(Choice(ns), Choice(SUBJ_DETS), adjective_combos(ids), Choice(preds))
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
