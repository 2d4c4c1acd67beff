"""Word types of the synthetic demo corpus: every word form its grammar can produce (a test
checks generated text against them), and the word tokenizer that counts them.
"""

from __future__ import annotations

import re

from preprocessing.demo.lexicon import ADJECTIVES, ADVERBS, NAMES, NOUNS, TIMES
from preprocessing.demo.phrases import AVOIR, ETRE, FIVE, FOUR, PREPS, PRONOUNS
from preprocessing.demo.spaces import ALL_DETS, VERB_DETS
from preprocessing.demo.summarization import DOC_ADVERBS, DOC_TIMES, LEADS, TRAILERS
from preprocessing.demo.verbs import VERBS, Verb

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
