"""What each kind of task is scored by: one table per kind, read by every consumer.

A workflow's *kind* (translation, summarization) decides how its outputs are scored, which
signatures describe the scores, which metric is the headline (the champion comparison, the log line,
the first column), and what the summary table shows. Orchestration, the evaluation tasks, `python -m
convs2s score` and the benchmarks read it from here, so a new metric is one edit: its function in
`convs2s.metrics.scoring` and its name in the kind's `metrics` (and `shown`, to print it).

    kind = task_kind("translation")
    metrics = kind.score(hyps, refs, "fr")   # {"bleu": ..., "bleu_tokenized": ..., ...}
    kind.headline                            # "bleu"

(A *kind* is not the preprocessing output's folder name, `PreprocessConfig.task`.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Figures of an evaluation run, not of the model: logged on the run only, never as the model's
# metrics on a test set (MLflow's Models view ranks models by those).
RUN_METRICS = ("seconds", "sentences_per_second", "sentences")


@dataclass(frozen=True)
class TaskKind:
    name: str
    metrics: tuple[str, ...]  # what `score` returns: the model's metrics on a test set
    headline: str  # the main metric (higher is better): champion, log lines, summary order
    shown: tuple[str, ...]  # the summary table's columns
    _score: Callable[[list[str], list[str], str], dict[str, float]]
    _signatures: Callable[[str], dict[str, str]]
    note: str = ""  # a line under the summary table that says what the numbers are
    # What a stored score was computed by: a workflow's rerun scores again a (job, test set)
    # pair whose record names another version (workflows/steps.py; a record without one is 1)
    scoring_version: int = 1
    # Metrics of `metrics` that some target languages have not (bleu_tokenized: Moses does not
    # segment Chinese, Japanese or Korean); every consumer reads a score's metrics by name
    optional: tuple[str, ...] = ()
    # Why the kind cannot score a target language here (a tokenizer's missing package), or
    # None: asked when a run is resolved, before it trains
    _problem: Callable[[str], str | None] | None = None
    # Target languages whose scoring changed on its own, and by how many versions: added to
    # `scoring_version` for them (`scoring_for`), so only their stored scores are redone
    language_versions: tuple[tuple[str, int], ...] = ()

    def scoring_for(self, tgt_lang: str | None) -> int:
        """The scoring version of a score on `tgt_lang`: the kind's, plus that language's own
        changes (a stored score with another version is computed again, workflows/steps.py).
        A code with a region, a script or capitals (zh-Hant, ro-RO, DE) is scored by its base
        language's rules since version 2 of its own (they were looked up by the whole code:
        13a for Chinese, no Romanian normalization, English's Moses prefixes)."""
        from convs2s.metrics.scoring import base_language

        lang = tgt_lang or ""
        base = base_language(lang)
        return self.scoring_version + dict(self.language_versions).get(base, 0) \
            + (1 if lang != base and self.language_versions else 0)  # (a kind whose scoring
        # reads the language: translation's)

    def score(self, hyps: list[str], refs: list[str], tgt_lang: str) -> dict[str, float]:
        """Every metric of `metrics` (those of `optional` where the target language has them)
        for line-aligned detokenized hypotheses and references."""
        out = self._score(hyps, refs, tgt_lang)
        # the table is the truth
        assert set(self.metrics) - set(self.optional) <= set(out) <= set(self.metrics), \
            (self.name, sorted(out))
        return out

    def language_problem(self, tgt_lang: str | None) -> str | None:
        """Why this kind cannot score `tgt_lang` on this machine (one line naming the fix),
        or None."""
        return self._problem(tgt_lang) if self._problem else None

    def signatures(self, tgt_lang: str) -> dict[str, str]:
        """How the scores were computed (tool, version, options), for run tags and reports."""
        return self._signatures(tgt_lang)


def _translation_score(hyps, refs, tgt_lang):
    from convs2s.metrics.scoring import score_translation

    return score_translation(hyps, refs, tgt_lang)


def _translation_signatures(tgt_lang):
    from convs2s.metrics.scoring import translation_signatures

    return translation_signatures(tgt_lang)


def _translation_problem(tgt_lang):
    from convs2s.metrics.scoring import bleu_problem

    return bleu_problem(tgt_lang)


def _summarization_score(hyps, refs, tgt_lang):
    from convs2s.metrics.scoring import score_summarization

    return score_summarization(hyps, refs)


def _summarization_signatures(tgt_lang):
    from convs2s.metrics.scoring import rouge_signature

    return {"rouge": rouge_signature()}


TRANSLATION = TaskKind(
    name="translation",
    metrics=("bleu", "bleu_tokenized", "chrf", "length_ratio", "bleu_diacritics"),
    headline="bleu",
    shown=("bleu", "bleu_tokenized", "chrf"),
    _score=_translation_score,
    _signatures=_translation_signatures,
    # One note for every pair (the summary does not know it): the paper scores WMT'14 with
    # tokenized BLEU and WMT'16 En-Ro with detokenized BLEU (§4.3).
    note="bleu: sacreBLEU (13a, or zh / ja / ko's own tokenizer, detokenized), the paper's "
         "metric for WMT'16 En-Ro; bleu_tokenized: Moses tokenizer.perl -a, the paper's for "
         "WMT'14 En-De / En-Fr",
    # 2: bleu_tokenized tokenizes as tokenizer.perl -a after ’ -> ' (1: sacremoses without -a).
    scoring_version=2,
    # zh / ja / ko +1: BLEU with their own tokenizer, no bleu_tokenized (13a before); every
    # other language's scores stayed the same
    # (ro: bleu_diacritics, added beside its scores, changed none of them: no new version, a
    # champion's scores stay comparable; stored ones lack it until scored again)
    language_versions=(("zh", 1), ("ja", 1), ("ko", 1)),
    optional=("bleu_tokenized", "bleu_diacritics"),
    _problem=_translation_problem,
)

SUMMARIZATION = TaskKind(
    name="summarization",
    metrics=tuple(f"rouge{t}_{k}" for k in "fpr" for t in ("1", "2", "L")) + ("length_ratio",),
    headline="rouge1_f",
    shown=("rouge1_f", "rouge2_f", "rougeL_f"),
    _score=_summarization_score,
    _signatures=_summarization_signatures,
    note="rouge*: rouge-score F1 (_f) / recall (_r) with Porter stemming, sentence mean, in %",
)

KINDS = {k.name: k for k in (TRANSLATION, SUMMARIZATION)}


def task_kind(name: str) -> TaskKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown task kind {name!r}: one of {', '.join(KINDS)}") from None
