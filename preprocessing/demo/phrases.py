"""Phrases of the synthetic demo corpus: determiners, noun phrases, subjects, verb forms,
prepositional phrases, and French orthography (elision, contraction) on the joined sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from preprocessing.demo.lexicon import NAMES, NO_ELISION, VOWELS, en_vowel_initial, fr_vowel_initial
from preprocessing.demo.verbs import Verb


@dataclass(frozen=True)
class Det:
    key: str  # def, indef, dem, poss, num
    plural: bool
    en: str  # "" for the bare English plural ("apples" = "des pommes")
    fr: tuple[str, str, str]  # masculine singular, feminine singular, plural


def _det(key, plural, en, fr):
    return Det(key, plural, en, tuple(fr.split("/")))


THE, THE_PL = _det("def", False, "the", "le/la/les"), _det("def", True, "the", "le/la/les")
A, SOME = _det("indef", False, "a", "un/une/des"), _det("indef", True, "", "un/une/des")
THIS, THESE = _det("dem", False, "this", "ce/cette/ces"), _det("dem", True, "these", "ce/cette/ces")
MY, MY_PL = _det("poss", False, "my", "mon/ma/mes"), _det("poss", True, "my", "mon/ma/mes")
HIS, HER = _det("poss", False, "his", "son/sa/ses"), _det("poss", False, "her", "son/sa/ses")
THEIR, THEIR_PL = (_det("poss", False, "their", "leur/leur/leurs"),
                   _det("poss", True, "their", "leur/leur/leurs"))
TWO, THREE, FOUR, FIVE = (_det("num", True, e, f"{f}/{f}/{f}") for e, f in
                          (("two", "deux"), ("three", "trois"), ("four", "quatre"),
                           ("five", "cinq")))


def en_np(np, negative: bool = False) -> str:
    noun, det, adjs = np
    words = [a.en for a in sorted(adjs, key=lambda a: a.rank)]  # big red, happy old
    words.append(noun.en_pl if det.plural else noun.en)
    if negative:  # there is no cat
        article = "no"
    elif det.key == "indef" and not det.plural:
        article = "an" if en_vowel_initial(words[0]) else "a"
    else:
        article = det.en
    return f"{article} {' '.join(words)}" if article else " ".join(words)


def fr_np(np, negative: bool = False) -> list[str]:
    """French noun phrase; `negative`: indefinite article after ne ... pas becomes de."""
    noun, det, adjs = np
    fem, plural = noun.fem, det.plural
    head = noun.fr_pl if plural else noun.fr
    vowel = fr_vowel_initial(head)
    pre = [a.fr(fem, plural, vowel) for a in adjs if a.pre]  # un vieil arbre
    post = [a.fr(fem, plural) for a in adjs if not a.pre]
    first = pre[0] if pre else head
    if det.key == "indef" and (negative or (plural and pre)):  # pas de chat, de grands arbres
        article = "de"
    elif plural:
        article = det.fr[2]
    elif det.key == "dem" and not fem and fr_vowel_initial(first):
        article = "cet"
    elif det.key == "poss" and fem and fr_vowel_initial(first):  # mon école
        article = det.fr[0]
    else:
        article = det.fr[1] if fem else det.fr[0]
    return [article, *pre, head, *post]


class Subject(NamedTuple):
    en: str
    fr: str
    person: int  # 0..5 = je tu il nous vous ils
    fem: bool
    plural: bool
    who: str  # English agreement: 1s, 2, 3s, pl


# English "you" is French "tu" and "you all" is "vous", so each English sentence has one
# translation; "they" is "ils" (the French default for a group of unknown gender).
PRONOUNS = [Subject(en, fr, person, fem, person >= 3, who) for en, fr, person, fem, who in (
    ("I", "je", 0, False, "1s"), ("you", "tu", 1, False, "2"), ("he", "il", 2, False, "3s"),
    ("she", "elle", 2, True, "3s"), ("we", "nous", 3, False, "pl"),
    ("you all", "vous", 4, False, "pl"), ("they", "ils", 5, False, "pl"))]
THIRD_PERSON = PRONOUNS[2:4] + PRONOUNS[6:]  # gender known: être participles can agree
NAME_SUBJECTS = [Subject(e, f, 2, fem, False, "3s") for e, f, fem in NAMES]


def np_subject(np) -> Subject:
    noun, det, _ = np
    return Subject(en_np(np), " ".join(fr_np(np)), 5 if det.plural else 2, noun.fem, det.plural,
                   "pl" if det.plural else "3s")


def as_subject(value) -> Subject:
    """A pronoun or name subject as is; a noun phrase (noun, det, adjectives) as a subject."""
    return value if isinstance(value, Subject) else np_subject(value)


AVOIR = ("ai", "as", "a", "avons", "avez", "ont")
ETRE = {"pres": ("suis", "es", "est", "sommes", "êtes", "sont"),
        "past": ("étais", "étais", "était", "étions", "étiez", "étaient"),  # imperfect
        "fut": ("serai", "seras", "sera", "serons", "serez", "seront")}


def en_verb(v: Verb, tense: str, neg: bool, who: str) -> str:
    third = who == "3s"
    if tense == "pres":
        words = f"{'does' if third else 'do'} not {v.en}" if neg else (v.en_3sg if third else v.en)
    elif tense == "past":
        words = f"did not {v.en}" if neg else v.en_past
    elif tense == "fut":
        words = f"will not {v.en}" if neg else f"will {v.en}"
    else:  # progressive past = French imperfect
        be = "was" if who in ("1s", "3s") else "were"
        words = f"{be} not {v.en_ing}" if neg else f"{be} {v.en_ing}"
    return f"{words} {v.particle}" if v.particle else words


def fr_verb(v: Verb, tense: str, neg: bool, s: Subject) -> str:
    p = s.person
    if tense == "past":  # passé composé
        aux, part = (ETRE["pres"] if v.etre else AVOIR)[p], v.participle
        if v.etre:
            part = v.agreed_participle(s.fem, s.plural)  # elle est partie, ils sont venus
        return f"ne {aux} pas {part}" if neg else f"{aux} {part}"
    form = {"pres": v.present[p], "fut": v.future(p)}.get(tense) or v.imperfect(p)
    return f"ne {form} pas" if neg else form


def en_be(tense: str, neg: bool, who: str) -> str:
    if tense == "fut":
        return "will not be" if neg else "will be"
    if tense == "pres":
        be = {"1s": "am", "3s": "is"}.get(who, "are")
    else:
        be = "was" if who in ("1s", "3s") else "were"
    return f"{be} not" if neg else be


# French orthography on the joined sentence: the article elides first (à l'école must not become
# "au école"), then à/de contract with le/les, then je/ne/de elide (j'ai, n'y, d'un).
_BEFORE_VOWEL = "(?=(?!(?:%s)\\b)[%s])" % ("|".join(NO_ELISION), VOWELS + VOWELS.upper())
_ARTICLE_ELISION = re.compile(r"(?<![\w'])(?:le|la) " + _BEFORE_VOWEL)
_CONTRACTION = re.compile(r"(?<![\w'])(à le|à les|de le|de les|de des|de de) ")
_CONTRACTED = {"à le": "au ", "à les": "aux ", "de le": "du ", "de les": "des ", "de des": "de ",
               "de de": "de "}
_ELISION = re.compile(r"(?<![\w'])(je|ne|de|que) " + _BEFORE_VOWEL)


def fr_sentence(parts: list[str]) -> str:
    """Join French words with elision and contraction, capitalize, add the full stop."""
    text = " ".join(p for p in parts if p)
    text = _ARTICLE_ELISION.sub("l'", text)
    text = _CONTRACTION.sub(lambda m: _CONTRACTED[m.group(1)], text)
    text = _ELISION.sub(lambda m: m.group(1)[:-1] + "'", text)
    return text[0].upper() + text[1:] + "."


def en_sentence(parts: list[str]) -> str:
    text = " ".join(p for p in parts if p) + "."
    return text[0].upper() + text[1:]


PREPS = {  # key: English, French, nouns it takes
    "in": ("in", "dans", "ic"), "on": ("on", "sur", "s"), "under": ("under", "sous", "n"),
    "near": ("near", "près de", "PALk"), "behind": ("behind", "derrière", "PALk"),
    "front": ("in front of", "devant", "PALk"), "next": ("next to", "à côté de", "PALk"),
    "at": ("at", "à", "a"), "with": ("with", "avec", "PA"), "for": ("for", "pour", "PA"),
}
LOCATIVE = ("in", "on", "under", "near", "behind", "front", "next", "at")
PP_KINDS = {"L": LOCATIVE, "W": ("with",), "F": ("for",)}


def en_pp(pp) -> str:
    return f"{PREPS[pp[0]][0]} {en_np(pp[1])}" if pp else ""


def fr_pp(pp) -> list[str]:
    return [PREPS[pp[0]][1], *fr_np(pp[1])] if pp else []
