"""The synthetic `demo` corpus: determinism, distinctness, the version its pairs are pinned to,
size, lengths, French grammar and its command line.

Run: `.venv/bin/python -m pytest tests/test_demo.py -q`  (fast: no Ray, a few seconds)
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import pytest

from preprocessing import demo
from preprocessing.demo.lexicon import ADJECTIVES, NOUNS
from preprocessing.demo.pairs import IndexPermutation, _allocate
from preprocessing.demo.phrases import (
    HIS,
    MY,
    NAME_SUBJECTS,
    PRONOUNS,
    SOME,
    THE,
    THE_PL,
    THIS,
    THREE,
    A,
    fr_sentence,
    np_subject,
)
from preprocessing.demo.summarization import MAX_DOC_WORDS, DocShape, _summary
from preprocessing.demo.translation import (
    Shape,
    _copula,
    _existential,
    _intransitive,
    _transitive,
)
from preprocessing.demo.verbs import VERBS

N_SAMPLE = 20_000


@pytest.fixture(scope="module")
def translation():
    return demo.translation_pairs(seed=3, start=0, count=N_SAMPLE)


@pytest.fixture(scope="module")
def summarization():
    return demo.summarization_pairs(seed=3, start=0, count=N_SAMPLE)


# --- determinism and distinctness -------------------------------------------------------------


@pytest.mark.parametrize("make", [demo.translation_pairs, demo.summarization_pairs])
def test_a_block_equals_the_concatenation_of_its_sub_blocks(make):
    whole = make(11, 1_000, 300)
    parts = make(11, 1_000, 100) + make(11, 1_100, 1) + make(11, 1_101, 199) + make(11, 0, 0)
    assert whole == parts
    assert make(11, 1_150, 1)[0] == whole[150]  # pair i depends on (seed, i) only


def test_pairs_are_the_same_in_another_process_with_another_hash_seed():
    # Ray generates index blocks in worker processes: the corpus must not depend on the process.
    code = ("from preprocessing import demo; print(repr("
            "demo.translation_pairs(5, 123456, 20) + demo.summarization_pairs(5, 7, 20)))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    here = demo.translation_pairs(5, 123456, 20) + demo.summarization_pairs(5, 7, 20)
    assert out.stdout.strip() == repr(here)


# DEMO_VERSION and the pairs it stands for: a digest of the first 2,000 translation and
# summarization pairs of seed 1. Preprocessing manifests and benchmark caches key on the version.
PINNED_VERSION = 1
PINNED_DIGEST = "9b7b020a02faf78ab20149e7359ca88569e218da1b809e74b1ff2e94d4d7e147"


def test_the_generated_pairs_are_pinned_to_demo_version():
    pairs = demo.translation_pairs(1, 0, 2_000) + demo.summarization_pairs(1, 0, 2_000)
    digest = hashlib.sha256("\n".join(f"{s}\t{t}" for s, t in pairs).encode()).hexdigest()
    if digest != PINNED_DIGEST:
        bump = (f"bump DEMO_VERSION in preprocessing/demo/__init__.py to "
                f"{PINNED_VERSION + 1}, then " if demo.DEMO_VERSION == PINNED_VERSION else "")
        pytest.fail(f"the generated demo pairs changed: {bump}pin PINNED_VERSION = "
                    f"{max(demo.DEMO_VERSION, PINNED_VERSION + 1)} and PINNED_DIGEST = "
                    f"{digest!r} in tests/test_demo.py (preprocessed demo data and benchmark "
                    "caches are keyed on DEMO_VERSION, so stale ones would be reused)")
    assert demo.DEMO_VERSION == PINNED_VERSION, (
        f"DEMO_VERSION is {demo.DEMO_VERSION} but the pairs are those pinned for version "
        f"{PINNED_VERSION}: pin PINNED_VERSION = {demo.DEMO_VERSION} in tests/test_demo.py")


def test_the_command_line_prints_pairs():
    out = subprocess.run([sys.executable, "-m", "preprocessing.demo", "--seed", "5", "--start",
                          "123456", "--count", "2"], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)), timeout=120)
    (en, fr), second = demo.translation_pairs(5, 123456, 2)
    assert out.stdout.startswith(f"{en}\n  -> {fr}\n{second[0]}\n  -> {second[1]}\n# ")
    assert "distinct pairs per seed" in out.stdout


def test_translation_pairs_are_distinct_and_sources_too(translation):
    assert len(set(translation)) == len(translation)
    # one translation per English sentence: no English sentence occurs twice either
    assert len({en for en, _ in translation}) == len(translation)


def test_summarization_documents_are_distinct(summarization):
    assert len({doc for doc, _ in summarization}) == len(summarization)


def test_disjoint_index_ranges_share_no_sentence(translation):
    train = {en for en, _ in translation}
    test = {en for en, _ in demo.translation_pairs(3, N_SAMPLE, 5_000)}
    assert not train & test


def test_seeds_give_different_corpora():
    a, b = demo.translation_pairs(1, 0, 2_000), demo.translation_pairs(2, 0, 2_000)
    assert sum(x == y for x, y in zip(a, b)) == 0
    assert len(set(a) & set(b)) < 10  # two random draws from > 10^9 pairs barely meet


def test_each_corpus_has_at_least_a_billion_distinct_pairs():
    assert demo.corpus("translation").size >= 10**9
    assert demo.corpus("summarization").size >= 10**9
    last = demo.corpus("translation").size - 1
    assert len(demo.translation_pairs(0, last, 1)) == 1


def test_index_permutation_is_a_bijection():
    for n, seed in [(1, 0), (2, 5), (1000, 1), (4097, 2), (12345, 99)]:
        perm = IndexPermutation(n, seed, salt=7)
        assert sorted(perm(i) for i in range(n)) == list(range(n))


def test_allocation_respects_sizes_and_total():
    counts = _allocate(weights=[5, 3, 2], sizes=[10, 10**9, 10**9], total=10**6)
    assert counts[0] == 10  # a small shape is used in full...
    assert counts[1] + counts[2] <= 10**6 - 10  # ...and its share goes to the others
    assert abs(counts[1] / counts[2] - 3 / 2) < 1e-6


def test_bad_arguments_fail_with_a_clear_message():
    size = demo.corpus("translation").size
    with pytest.raises(ValueError, match="outside"):
        demo.translation_pairs(1, size - 1, 2)
    with pytest.raises(ValueError, match="outside"):
        demo.translation_pairs(1, -1, 2)
    with pytest.raises(TypeError, match="must be int"):
        demo.translation_pairs(1, 0.0, 2)
    with pytest.raises(ValueError, match="unknown task"):
        demo.corpus("poetry")


def test_lexicon_keeps_english_unambiguous():
    # Distinctness and one-translation-per-sentence need distinct English forms: "the fish"
    # (singular = plural) or an adjective that is also a noun would make two choices look alike.
    noun_forms = [f for n in NOUNS for f in (n.en, n.en_pl)]
    assert all(n.en != n.en_pl for n in NOUNS)
    assert len(set(noun_forms)) == len(noun_forms)
    adjectives = [a.en for a in ADJECTIVES]
    assert len(set(adjectives)) == len(adjectives)
    assert not set(adjectives) & set(noun_forms)
    assert len({n.en for n in NAME_SUBJECTS}) == len(NAME_SUBJECTS)


# --- size of the language and of the sentences ------------------------------------------------


def test_hundreds_of_word_types_on_each_side(translation):
    assert len(NOUNS) >= 150 and len(ADJECTIVES) >= 50 and len(VERBS) >= 60
    assert demo.VOCABULARY_SIZE["en"] >= 500 and demo.VOCABULARY_SIZE["fr"] >= 500
    used_en = {w for en, _ in translation for w in demo.words(en)}
    used_fr = {w for _, fr in translation for w in demo.words(fr)}
    assert len(used_en) >= 500 and len(used_fr) >= 800  # really generated, not only listed


def test_generated_words_are_all_known_word_types(translation, summarization):
    types = demo.word_types()
    assert {w for en, _ in translation for w in demo.words(en)} <= types["en"]
    assert {w for _, fr in translation for w in demo.words(fr)} <= types["fr"]
    assert {w for pair in summarization for s in pair for w in demo.words(s)} <= \
        types["summarization"]


def test_sentence_lengths(translation, summarization):
    for en, fr in translation:
        assert 4 <= len(demo.words(en)) <= 30 and 4 <= len(demo.words(fr)) <= 30, (en, fr)
    for doc, headline in summarization:
        assert 8 <= len(doc.split()) <= MAX_DOC_WORDS, doc
        assert 3 <= len(headline.split()) <= 10 and len(headline) < len(doc), (doc, headline)
    ratio = [len(en.split()) / len(fr.split()) for en, fr in translation]
    assert sum(1 / 1.5 <= r <= 1.5 for r in ratio) / len(ratio) > 0.99  # the paper's filter


def test_every_template_and_tense_occurs(translation):
    english = [en for en, _ in translation]
    for pattern in [r"^There (is|are|was|were|will be) ", r"^(?!There).* (am|is|are)( not)? \w",
                    r" to (the|a|an|my|his|her|their|two|three|[A-Z]\w+) ", r" will ",
                    r" did not ", r" (was|were) \w+ing\b", r" (does|do) not "]:
        assert sum(bool(re.search(pattern, en)) for en in english) > 50, pattern


# --- orthography and grammar of every generated sentence --------------------------------------

VOWEL_START = r"(?!(?:hibou|hiboux|huit|onze)\b)[aeiouyàâéèêîôœh]"


def test_french_orthography_holds_in_generated_text(translation):
    for en, fr in translation:
        assert fr[0].isupper() and fr.endswith(".") and en[0].isupper() and en.endswith(".")
        low = fr.lower()
        assert not re.search(rf"\b(le|la|je|ne|de) {VOWEL_START}", low), fr  # missing elision
        assert not re.search(r"(^|\s)(à|de) (le|les) ", low), fr  # missing contraction
        assert not re.search(rf"\bce {VOWEL_START}", low), fr  # cet homme
        assert not re.search(rf"\b(ma|sa) {VOWEL_START}", low), fr  # mon école
        if re.search(r"\bn(e |')", low):  # ne ... pas
            assert " pas " in low, fr


def test_english_articles_in_generated_text(translation):
    for en, _ in translation:
        assert not re.search(r"\ba [aeiou]", en.lower().replace("a useful", "")), en
        assert not re.search(r"\ban [^aeiou]", en.lower()), en


def test_grammar_phenomena_occur_in_generated_text(translation):
    french = " ".join(fr for _, fr in translation).lower()
    etre = "(allé|venu|parti|sorti|arrivé|entré|resté|retourné|tombé)"
    for pattern in ["l'", " au ", " aux ", " du ", " des ", " cet ", "n'", " pas de ", " pas d'",
                    " de (grands|petits|belles|jeunes) ", " vieil ", " bel ", " mon [éeao]",
                    f" sont {etre}es ", f" est {etre}e ", f" sont {etre}s ", "j'ai ", " nous ",
                    " vous ", " ils ", "ions ", "aient ", "il y a ", "il n'y a pas", "seront"]:
        assert re.search(pattern, french), pattern


# --- hand-verified examples of the grammar, written as specifications -------------------------

N = {n.en: n for n in NOUNS}
ADJ = {a.en: a for a in ADJECTIVES}
V = {(v.en + (f"_{v.particle}" if v.particle else ""), v.kind): v for v in VERBS}
NAME = {s.en: s for s in NAME_SUBJECTS}
I, YOU, HE, SHE, WE, YOU_ALL, THEY = PRONOUNS


def np(noun, det=THE, *adjectives):
    return (N[noun], det, tuple(ADJ[a] for a in adjectives))


def say(subject, verb, tense, obj, neg=False, pp=None, time=None):
    shape = Shape("transitive", V[verb, "T"], neg)
    return _transitive(shape, (subject, (tense, time), obj, pp))


def say_intransitive(subject, verb, tense, pp, neg=False):
    shape = Shape("intransitive", V[verb, "I"], neg)
    return _intransitive(shape, (subject, (tense, None), None, pp))


def be(subject, adjective, tense, neg=False, time=None):
    return _copula(Shape("copula", neg=neg), ((subject, ADJ[adjective]), (tense, time), None))


def there(np_, tense, pp, neg=False):
    return _existential(Shape("existential", neg=neg), (np_, (tense, None), pp))


def test_elision_of_articles_pronouns_and_ne():
    assert say(I, "see", "pres", np("man")) == ("I see the man.", "Je vois l'homme.")
    assert say(I, "like", "pres", np("school")) == ("I like the school.", "J'aime l'école.")
    assert say(HE, "like", "pres", np("hotel"), neg=True) == (
        "He does not like the hotel.", "Il n'aime pas l'hôtel.")
    assert say(I, "see", "pres", np("owl")) == ("I see the owl.", "Je vois le hibou.")  # h aspiré


def test_contractions_of_a_and_de_with_the_article():
    assert say(NAME["Peter"], "talk_to", "pres", np("boy")) == (
        "Peter talks to the boy.", "Pierre parle au garçon.")
    assert say(NAME["Peter"], "talk_to", "pres", np("child", THE_PL)) == (
        "Peter talks to the children.", "Pierre parle aux enfants.")
    assert say(NAME["Peter"], "talk_to", "pres", np("child")) == (
        "Peter talks to the child.", "Pierre parle à l'enfant.")  # elision before contraction
    assert say(SHE, "come_from", "past", np("village")) == (
        "She came from the village.", "Elle est venue du village.")
    assert say(NAME["Paul"], "play", "pres", np("piano")) == (
        "Paul plays the piano.", "Paul joue du piano.")
    assert say_intransitive(THEY, "sleep", "pres", ("near", np("tree", THE_PL))) == (
        "They sleep near the trees.", "Ils dorment près des arbres.")
    assert say_intransitive(THEY, "sleep", "pres", ("near", np("tree", A))) == (
        "They sleep near a tree.", "Ils dorment près d'un arbre.")


def test_adjective_position_and_agreement():
    see = lambda obj: say(I, "see", "pres", obj)[1]  # noqa: E731
    assert see(np("man", THE, "old")) == "Je vois le vieil homme."
    assert see(np("woman", THE, "old")) == "Je vois la vieille femme."
    assert see(np("dog", THE_PL, "old")) == "Je vois les vieux chiens."
    assert see(np("car", THE_PL, "beautiful", "red")) == "Je vois les belles voitures rouges."
    assert say(I, "see", "pres", np("man", A, "old", "happy")) == (
        "I see a happy old man.", "Je vois un vieil homme heureux.")
    assert see(np("tree", SOME, "big")) == "Je vois de grands arbres."  # des -> de before adj
    assert see(np("man", THIS)) == "Je vois cet homme."
    assert see(np("school", MY)) == "Je vois mon école."
    assert say(I, "see", "pres", np("umbrella", A)) == (
        "I see an umbrella.", "Je vois un parapluie.")


def test_negation():
    assert say(NAME["Mary"], "eat", "past", np("apple", A), neg=True) == (
        "Mary did not eat an apple.", "Marie n'a pas mangé de pomme.")
    assert say(I, "eat", "fut", np("apple", SOME), neg=True) == (
        "I will not eat apples.", "Je ne mangerai pas de pommes.")
    assert say(WE, "like", "pres", np("cake"), neg=True) == (
        "We do not like the cake.", "Nous n'aimons pas le gâteau.")  # definite article stays
    assert there(np("bird", A), "pres", ("in", np("garden")), neg=True) == (
        "There is no bird in the garden.", "Il n'y a pas d'oiseau dans le jardin.")
    assert there(np("tree", SOME, "big"), "past", ("near", np("house")), neg=True) == (
        "There were no big trees near the house.",
        "Il n'y avait pas de grands arbres près de la maison.")


def test_conjugation():
    cake = np("cake")
    assert [say(p, "finish", "pres", cake)[1] for p in PRONOUNS] == [
        "Je finis le gâteau.", "Tu finis le gâteau.", "Il finit le gâteau.",
        "Elle finit le gâteau.", "Nous finissons le gâteau.", "Vous finissez le gâteau.",
        "Ils finissent le gâteau."]
    assert say(YOU_ALL, "eat", "fut", cake) == ("You all will eat the cake.",
                                                "Vous mangerez le gâteau.")
    assert say(WE, "eat", "prog", cake) == ("We were eating the cake.", "Nous mangions le gâteau.")
    assert say(HE, "eat", "prog", cake) == ("He was eating the cake.", "Il mangeait le gâteau.")
    assert say(YOU, "drink", "past", np("coffee")) == ("You drank the coffee.",
                                                       "Tu as bu le café.")
    assert say(I, "throw", "prog", np("ball"))[1] == "Je lançais le ballon."
    assert say(THEY, "go_to", "fut", np("market")) == ("They will go to the market.",
                                                      "Ils iront au marché.")
    girls = np_subject(np("girl", THE_PL))
    assert say(girls, "go_to", "past", np("market")) == (
        "The girls went to the market.", "Les filles sont allées au marché.")  # être agrees
    assert be(SHE, "happy", "pres", time=("today", "aujourd'hui")) == (
        "She is happy today.", "Elle est heureuse aujourd'hui.")
    assert be(THEY, "tired", "past", neg=True) == ("They were not tired.",
                                                   "Ils n'étaient pas fatigués.")
    assert be(I, "sad", "fut") == ("I will be sad.", "Je serai triste.")


def test_french_orthography_rules_directly():
    assert fr_sentence(["il ne y a pas de oiseau près de le arbre"]) == \
        "Il n'y a pas d'oiseau près de l'arbre."
    assert fr_sentence(["je habite à le hôtel de les enfants"]) == \
        "J'habite à l'hôtel des enfants."


def test_summary_keeps_the_core_clause_in_headline_style():
    shape = DocShape("summary", lead="lead", subj="np1", mod="rel", adverb=True, n_obj=1,
                          objmod=True, loc=True, time=True)
    values = ("as expected ,", np("farmer", THE, "old"), (V["sell", "T"], np("horse", HIS)),
              "carefully", ("past", "yesterday"), (V["repair", "T"], np("chair", THREE, "broken")),
              np("child", THE_PL), ("in", np("kitchen", THE, "dark")))
    assert _summary(shape, values) == (
        "as expected , the old farmer , who sold his horse , carefully repaired three broken "
        "chairs for the children in the dark kitchen yesterday .",
        "farmer repairs three chairs in kitchen")
    future = values[:4] + (("fut", None),) + values[5:]
    assert _summary(shape, future)[1] == "farmer to repair three chairs in kitchen"


def test_headline_words_come_from_the_document(summarization):
    for doc, headline in summarization:
        doc_words = set(doc.split())
        verb_words = {"to"} | {w for v in VERBS for w in (v.en, v.en_3sg)}
        assert all(w in doc_words or w in verb_words for w in headline.split()), (doc, headline)
