"""`demo`: an embedded, SYNTHETIC English->French corpus (and a summarization corpus) that the
project generates itself from a small bilingual grammar. It is NOT real data; it is one more
source of the preprocessing pipeline (`--source demo`, read by `preprocessing.reading`).

Why it exists: the workflows and tests need a default corpus that works offline, has no licence,
costs nothing to produce, and that a small ConvS2S model learns to high BLEU in minutes on a CPU,
so that "the pipeline trains and the score goes up" is a meaningful check. Real corpora (WMT,
Gigaword) come from the Hugging Face hub or ../shared/data instead.

Translation (`translation_pairs`): the grammar (~220 nouns, ~70 adjectives, ~100 verb senses, 30
names) covers French determiners with elision and contraction (l'homme, du, au, aux, cet, mon
école), gender and number agreement of determiners, adjectives and être participles, adjectives
before or after the noun (le vieil homme heureux), conjugation in the present, passé composé
(avoir and être), future and imperfect (English "was eating"), ne ... pas with de after negation
(pas de pomme), il y a, prepositional phrases and time adverbials. Each English sentence has
exactly one translation ("you" = tu, "you all" = vous, "they" = ils), so the mapping is
learnable. Sentences have 4 to about 22 words (mean 10).

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
others (`pairs._allocate`). Within a shape, the used codes are spread over its space by a stride
coprime with its size, so every combination of words can occur.

Modules, from words to pairs: `lexicon` (nouns, adjectives, names, adverbs, times), `verbs`
(verb senses and conjugation), `phrases` (noun phrases, subjects, verb forms, French
orthography), `spaces` (enumerable spaces of noun phrases), `translation` and `summarization`
(sentence shapes and their realizers), `pairs` (index -> pair), `vocabulary` (word types).

    python -m preprocessing.demo [--task translation|summarization] [--seed 1] [--count 10]
"""

from preprocessing.demo.pairs import Corpus, corpus, summarization_pairs, translation_pairs
from preprocessing.demo.vocabulary import VOCABULARY_SIZE, word_types, words

# The version of the generated pairs. Preprocessing manifests fingerprint the demo source with
# it (a new version redoes the stages that read it), and benchmarks/preprocess.py keys its
# corpus cache on it. Bump it with any change that changes a generated pair: tests/test_demo.py
# pins a digest of a sample of pairs to this version and fails until both are updated.
DEMO_VERSION = 1

__all__ = ["DEMO_VERSION", "VOCABULARY_SIZE", "Corpus", "corpus", "summarization_pairs",
           "translation_pairs", "word_types", "words"]
