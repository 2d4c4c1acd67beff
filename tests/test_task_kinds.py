"""Each task kind's table is the one place its metrics are defined: what it scores, how the
scores are signed, its headline and its summary columns; the CLI reads the same table."""

import json

import pytest

from convs2s import cli
from convs2s.metrics.task_kinds import KINDS, RUN_METRICS, SUMMARIZATION, TRANSLATION, task_kind

HYPS = ["the cat sat on the mat .", "a dog runs in the park ."]
REFS = ["the cat sat on a mat .", "a dog is running in the park ."]


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_a_kind_scores_exactly_its_metrics_and_names_a_headline_among_them(kind):
    metrics = kind.score(HYPS, REFS, "en")
    # (bleu_diacritics is a Romanian target's alone)
    assert tuple(sorted(metrics)) == tuple(sorted(set(kind.metrics) - {"bleu_diacritics"}))
    assert kind.headline in kind.metrics and set(kind.shown) <= set(kind.metrics)
    assert kind.shown[0] == kind.headline  # the summary's first column is the headline
    assert not set(kind.metrics) & set(RUN_METRICS)  # speed is the run's, never the model's
    assert all(isinstance(v, float) for v in metrics.values())
    assert kind.signatures("en") and all(kind.signatures("en").values())


def test_translation_and_summarization_headlines():
    assert TRANSLATION.headline == "bleu" and SUMMARIZATION.headline == "rouge1_f"
    assert TRANSLATION.score(REFS, REFS, "en")["bleu"] == pytest.approx(100.0)


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown task kind 'qa'.*translation, summarization"):
        task_kind("qa")


@pytest.mark.parametrize("name", list(KINDS))
def test_the_score_command_prints_the_tables_metrics_and_signatures(name, tmp_path, capsys):
    (tmp_path / "h").write_text("".join(h + "\n" for h in HYPS), encoding="utf-8")
    (tmp_path / "r").write_text("".join(r + "\n" for r in REFS), encoding="utf-8")
    assert cli.main(["score", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"),
                     "--lang", "en", "--task", name, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    kind = task_kind(name)
    assert out["metrics"] == kind.score(HYPS, REFS, "en")
    assert out["signatures"] == kind.signatures("en")


def test_the_translation_note_names_the_papers_metric_for_each_pair():
    # §4.3: "case-sensitive tokenized BLEU, except for WMT'16 English-Romanian where we use
    # detokenized BLEU". The note is printed under every translation summary, whatever the pair.
    detok, tok = TRANSLATION.note.split("; ")
    assert detok.startswith("bleu: ") and "detokenized" in detok and "En-Ro" in detok
    assert tok.startswith("bleu_tokenized: ") and "-a" in tok
    assert "En-De" in tok and "En-Fr" in tok and "En-Ro" not in tok


def test_a_chinese_target_has_no_tokenized_bleu_and_each_kind_says_what_it_cannot_score():
    """bleu_tokenized is the one metric a target language may lack (Moses does not segment
    Chinese, Japanese or Korean); a kind names a target it cannot score on this machine
    before a run trains (TaskKind.language_problem), and summarization scores any."""
    zh = ["我今天去公园散步了。", "这家餐厅的菜很好吃。"]
    assert TRANSLATION.optional == ("bleu_tokenized", "bleu_diacritics")
    metrics = TRANSLATION.score(zh[::-1], zh, "zh")
    assert set(metrics) == set(TRANSLATION.metrics) - {"bleu_tokenized", "bleu_diacritics"}
    assert set(TRANSLATION.score(zh, zh, "ro")) == set(TRANSLATION.metrics)
    assert "tok:zh" in TRANSLATION.signatures("zh")["bleu"]
    assert TRANSLATION.language_problem("zh") is None
    assert TRANSLATION.language_problem("fr") is None
    assert SUMMARIZATION.language_problem("ja") is None
    # their scores changed on their own: stored ones are computed again, no other language's
    assert [TRANSLATION.scoring_for(x) for x in ("zh", "ja", "ko")] == \
        [TRANSLATION.scoring_version + 1] * 3
    assert TRANSLATION.scoring_for("fr") == TRANSLATION.scoring_for(None) == 2
    assert SUMMARIZATION.scoring_for("zh") == SUMMARIZATION.scoring_version
    # a code with a region, script or capitals is scored by its base's rules since its own
    # next version (zh-Hant was 13a's, ro-RO without the normalization): its scores are redone
    assert [TRANSLATION.scoring_for(x) for x in ("zh-Hant", "ZH", "ro-RO", "de-DE")] == \
        [TRANSLATION.scoring_version + 2, TRANSLATION.scoring_version + 2,
         TRANSLATION.scoring_version + 1, TRANSLATION.scoring_version + 1]
