"""Preprocessing building blocks without Ray: special ids, cleaning, filters, batch cutting,
batch-shard determinism, dedupe, stage atomicity, presets.

    .venv/bin/python -m pytest tests/test_preprocessing.py -q
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from ray.data.datasource import WriteResult

from preprocessing import config as pconfig
from preprocessing.batching import BATCH_SCHEMA, add_window, batch_stats, batch_window, cut_batches
from preprocessing.cleaning import CLEAN_SCHEMA, clean_stats, dedupe_group, drop_reason, normalize
from preprocessing.encoding import ids_array
from preprocessing.exchange import _gather, _scatter, read_spill, write_spill
from preprocessing.parts import PartSink
from preprocessing.errors import PreprocessError
from preprocessing.stages import finished, stage_output, write_manifest
from preprocessing.vocab import BOS, EOS, PAD, UNK


def test_special_ids_match_the_model_package():
    from convs2s import config as model_config

    assert (BOS, PAD, EOS, UNK) == (0, 1, 2, 3)
    assert (BOS, PAD, EOS, UNK) == (model_config.BOS, model_config.PAD, model_config.EOS,
                                    model_config.UNK)


def test_the_bpe_learns_from_every_sampled_sentence_however_long(tmp_path):
    """sentencepiece skips a sentence past max_sentence_length without a word: one of 80,000
    bytes (max_line_bytes lets it through) was left out of the BPE, its characters unknown."""
    import sentencepiece as spm

    from preprocessing.vocab import train_bpe

    short = [f"word{i} and more words here" for i in range(300)]
    rare = "\u03a9" * 40_000  # 80,000 bytes, the only place Omega appears
    train_bpe(pa.table({"src": short + [rare], "tgt": short + ["x"]}), tmp_path / "spm", 300,
              character_coverage=1.0)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    assert sp.piece_to_id("\u03a9") != sp.unk_id()


@pytest.mark.parametrize("raw, clean", [
    ("Cafe\u0301", "Caf\u00e9"),  # combining accent -> NFC precomposed
    ("  a \t b\u00a0c\u3000d  ", "a b c d"),  # tabs, NBSP, ideographic space, edges
    ("zero\u200bwidth\u00adsoft\ufeffbom", "zerowidthsoftbom"),  # format characters removed
    ("bell\x07 esc\x1b[0m", "bell esc[0m"),  # C0 controls removed
    ("line\u2028sep\x85nel", "line sep nel"),  # Unicode line breaks become spaces
    ("priv\ue000ate", "private"),
    # the zero-width non-joiner and joiner spell words (Persian, Indic scripts, emoji): kept
    ("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
     "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"),
    ("\u0915\u094d\u200d\u0937", "\u0915\u094d\u200d\u0937"),
    # sentencepiece's word mark is a space, as the model reads it
    ("a\u2581b \u2581c\u2581", "a b c"), ("\u2581 \u2581\u2581", ""),
    ("", ""), (None, ""),
])
def test_normalize(raw, clean):
    assert normalize(raw) == clean


def test_normalized_text_is_nfc_also_where_a_deleted_character_parted_a_letter_and_accent():
    import unicodedata

    for raw in ("e\u200b\u0301", "Cafe\x07\u0301 ok", "a\ufeff\u030a\u00ad"):
        clean = normalize(raw)
        assert unicodedata.is_normalized("NFC", clean) and normalize(clean) == clean
    assert normalize("e\u200b\u0301") == "\u00e9"


def test_a_side_of_sentencepieces_word_marks_alone_is_dropped_as_empty():
    """U+2581 encodes to no pieces: such a side trained as a sentence of EOS alone."""
    assert drop_reason(normalize("\u2581"), normalize("Hallo"), 175, 1.5) == "empty"
    assert drop_reason(normalize("Hello"), normalize("\u2581 \u2581"), 175, 1.5) == "empty"


def test_length_and_ratio_filters_at_their_limits():
    w = lambda n: " ".join(["w"] * n)  # noqa: E731
    assert drop_reason(w(175), w(175), 175, 1.5) is None
    assert drop_reason(w(176), w(175), 175, 1.5) == "too_long"
    assert drop_reason(w(2), w(3), 175, 1.5) is None  # 3 / 2 = 1.5 is not over 1.5
    assert drop_reason(w(2), w(4), 175, 1.5) == "ratio"
    assert drop_reason(w(2), w(40), 175, None) is None  # summarization: ratio off
    assert drop_reason(w(500), w(1), None, None) is None
    assert drop_reason("", w(1), 175, 1.5) == "empty"


def test_a_side_written_without_spaces_is_measured_in_characters_without_a_ratio_filter():
    """Chinese, Japanese, Thai ... put no spaces between words: counted in whitespace words, a
    sentence is one word, so the ratio filter dropped nearly every en-zh pair and max_len never
    cut a side. Such a side counts each character of its script as a word (a run of Latin
    letters or digits as one), and a pair with such a side is not ratio-filtered; other pairs
    are filtered as before."""
    import pyarrow as pa

    from preprocessing.cleaning import clean_block, length, unspaced

    assert unspaced("zh") and unspaced("zh-Hant") and unspaced("ja") and unspaced("th")
    assert not unspaced("ko") and not unspaced("en") and not unspaced(None)  # (Korean: spaces)
    assert length("猫今天坐在垫子上。", True) == 9
    assert length("東京 は 2020 年 Tokyo です", True) == 8
    en = ["The cat sat on the mat today .", "I like green tea .", "a",
          "Officials said on Tuesday that the new bridge would open to traffic next year "
          "after a delay of several months ."]
    zh = ["猫今天坐在垫子上。", "我喜欢绿茶。", "字" * 5000,
          "官员周二表示，新大桥将在推迟数月后于明年通车。"]

    def reasons(tgt_lang, tgt):
        table = pa.table({"id": pa.array(range(len(en)), pa.int64()),
                          "translation": pa.StructArray.from_arrays(
                              [pa.array(en), pa.array(tgt)], names=["en", tgt_lang]),
                          "error": pa.array([None] * len(en), pa.string())})
        return clean_block(table, src_lang="en", tgt_lang=tgt_lang, row_shape="translation",
                           max_len=175, max_len_ratio=1.5,
                           max_line_bytes=1 << 20)["reason"].to_pylist()

    assert reasons("zh", zh) == [None, None, "too_long", None]
    # the same text under a spaced language's code: one "word" a side, as before (the
    # 5,000-character line passes as one word)
    assert reasons("fr", zh) == ["ratio", "ratio", None, "ratio"]


def test_cut_batches_covers_every_row_within_budget():
    rng = np.random.default_rng(0)
    for max_tokens, max_sentences in [(4000, None), (300, 16), (64, 1000)]:
        lengths = np.sort(rng.integers(1, 120, size=2000))
        bounds, stop = cut_batches(lengths, max_tokens, max_sentences)
        assert stop == int(np.searchsorted(lengths, max_tokens, side="right"))
        covered = [i for a, b in bounds for i in range(a, b)]
        assert covered == list(range(stop))  # every batchable row once, in order
        for a, b in bounds:
            assert (b - a) * lengths[b - 1] <= max_tokens
            assert max_sentences is None or b - a <= max_sentences
            # greedy: the next row would not have fitted
            if b < stop:
                assert (b - a + 1) * lengths[b] > max_tokens or b - a + 1 > (max_sentences or 1e9)


def encoded_group(n: int, seed: int = 0) -> pa.Table:
    """A synthetic window of encoded rows (as the batches stage receives it)."""
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, 100, size=rng.integers(1, 60))) + [EOS] for _ in range(n)]
    tgt = [list(rng.integers(4, 100, size=rng.integers(1, 60))) + [EOS] for _ in range(n)]
    return pa.table({"id": pa.array(np.arange(n) * 7 + 3, pa.int64()),
                     "src": pa.array(src, pa.list_(pa.int32())),
                     "tgt": pa.array(tgt, pa.list_(pa.int32())),
                     "src_len": pa.array([len(s) for s in src], pa.int32()),
                     "tgt_len": pa.array([len(t) for t in tgt], pa.int32()),
                     "window": pa.array([5] * n, pa.int64())})


def sink_writes(tables: list[pa.Table], out_dir, **kw) -> dict:
    """Run PartSink as Ray's write operator does, one write task per table; summed counts."""
    out_dir.mkdir(exist_ok=True)
    sink = PartSink(str(out_dir), **kw)
    returns = [sink.write([t], None) for t in tables]
    sink.on_write_complete(WriteResult(num_rows=0, size_bytes=0, write_returns=returns))
    return sink.totals


BATCH_SINK = {"part_key": "window", "schema": BATCH_SCHEMA, "stats_fn": batch_stats,
              "key_digits": 6}


def test_batch_window_rows_once_within_budget_and_independent_of_input_order(tmp_path):
    group = encoded_group(600)
    outs = []
    for k, perm in enumerate([np.arange(600), np.random.default_rng(1).permutation(600)]):
        rows = batch_window(group.take(perm), max_tokens=500, max_sentences=20, seed=3)
        stats = sink_writes([rows], tmp_path / str(k), **BATCH_SINK)
        outs.append((tmp_path / str(k) / "part-000005.parquet").read_bytes())
    assert outs[0] == outs[1]  # same rows in another order -> byte-identical shard
    table = pq.read_table(tmp_path / "0" / "part-000005.parquet")
    assert table.schema.equals(BATCH_SCHEMA)
    ids = [i for b in table["id"].to_pylist() for i in b]
    assert sorted(ids) == group["id"].to_pylist()
    by_id = {r["id"]: r for r in group.to_pylist()}
    for b in table.to_pylist():
        longest = max(max(len(s), len(t)) for s, t in zip(b["src"], b["tgt"]))
        assert len(b["id"]) <= 20 and len(b["id"]) * longest <= 500
        assert b["padded_tokens"] == len(b["id"]) * longest
        assert b["src_tokens"] == sum(len(s) for s in b["src"])
        assert [by_id[i]["src"] for i in b["id"]] == b["src"]
    assert stats["batches"] == table.num_rows and stats["rows_kept"] == stats["rows_in"] == 600


def test_sentence_over_the_budget_is_dropped_and_counted(tmp_path):
    rows = batch_window(encoded_group(50), max_tokens=40, max_sentences=None, seed=0)
    stats = sink_writes([rows], tmp_path, **BATCH_SINK)
    table = pq.read_table(tmp_path / "part-000005.parquet")
    kept = sum(len(b) for b in table["id"].to_pylist())
    assert kept == stats["rows_kept"] and 0 < kept < 50 and stats["rows_in"] == 50
    assert stats["drop_over_max_tokens"] == 50 - kept


def test_a_sentence_longer_than_the_models_positions_is_dropped_and_counted(tmp_path):
    """A side of more pieces than the model's positions (a URL or base64 blob of one "word"
    passes the word filters) would stop training at its batch: the cut drops it, counted."""
    group = encoded_group(80)
    lengths = np.maximum(group["src_len"].to_numpy(), group["tgt_len"].to_numpy())
    limit = int(np.sort(lengths)[60])  # about a quarter of the sentences are longer
    rows = batch_window(group, max_tokens=4000, max_sentences=None, seed=0,
                        max_positions=limit)
    stats = sink_writes([rows], tmp_path, **BATCH_SINK)
    table = pq.read_table(tmp_path / "part-000005.parquet")
    kept = [i for b in table["id"].to_pylist() for i in b]
    longer = set(group["id"].to_numpy()[lengths > limit].tolist())
    assert longer and not longer & set(kept)
    assert stats["drop_over_max_positions"] == len(longer)
    assert stats["rows_kept"] + len(longer) == stats["rows_in"] == 80
    assert stats["longest_src"] <= limit and stats["longest_tgt"] <= limit


def test_a_sentence_over_the_positions_and_the_budget_counts_as_over_the_positions(tmp_path):
    """Drop reasons are checked in order (cleaning.py): the model's positions before the token
    budget, since no budget lets the model take such a sentence."""
    group = encoded_group(80)
    lengths = np.maximum(group["src_len"].to_numpy(), group["tgt_len"].to_numpy())
    limit = int(np.sort(lengths)[60])
    rows = batch_window(group, max_tokens=limit, max_sentences=None, seed=0,
                        max_positions=limit)
    stats = sink_writes([rows], tmp_path, **BATCH_SINK)
    assert stats["drop_over_max_positions"] == int((lengths > limit).sum())
    assert "drop_over_max_tokens" not in stats


def test_a_part_written_by_two_write_tasks_is_an_error(tmp_path):
    """Two tasks writing one part file would lose rows: the sink refuses instead."""
    rows = batch_window(encoded_group(60), max_tokens=500, max_sentences=20, seed=0)
    with pytest.raises(RuntimeError, match=r"parts \[5\] were written by two write tasks"):
        sink_writes([rows.slice(0, 2), rows.slice(2)], tmp_path, **BATCH_SINK)


def test_spill_exchange_gives_each_key_exactly_its_rows(tmp_path, monkeypatch):
    """Each key's rows, file order then row order; a group of keys is one ranged read of each
    file that holds a row of them, and a file holding none of them is not read (in a bucket,
    each read is a request: each key's task read every file's footer and record batch)."""
    from preprocessing import exchange

    tables = [pa.table({"id": [4, 1, 9, 6], "k": [2, 0, 2, 1]}),
              pa.table({"id": [3, 8], "k": [0, 2]})]
    paths = [str(tmp_path / f"{i}.arrow") for i in range(2)]
    spills = [(p, write_spill(t, "k", 4, p)) for t, p in zip(tables, paths)]
    assert read_spill(spills, 0)["id"].to_pylist() == [1, 3]  # file order, then row order
    assert read_spill(spills, 1)["id"].to_pylist() == [6]
    assert read_spill(spills, 2)["id"].to_pylist() == [4, 9, 8]
    assert read_spill(spills, 3) is None  # no row has key 3: nothing of it in any file
    assert spills[1][1][1] == spills[1][1][2]  # (file 1 holds no row of key 1: no bytes)
    opened = []
    real = exchange.filesystem_of
    monkeypatch.setattr(exchange, "filesystem_of", lambda p: opened.append(p) or real(p))
    keys = exchange.read_keys(spills, 0, 4)
    assert sorted(keys) == [0, 1, 2] and opened == paths  # one read a file for all four keys
    opened.clear()
    assert exchange.read_keys(spills, 1, 2)[1]["id"].to_pylist() == [6]
    assert opened == paths[:1]  # file 1 holds no row of key 1: not read
    with pytest.raises(ValueError, match="outside"):
        write_spill(pa.table({"k": [4]}), "k", 4, str(tmp_path / "bad.arrow"))


def test_scatter_gather_windows_equal_batching_each_whole_window(tmp_path):
    """The file exchange gives every window the same shard as batching that window from all
    rows at once (what Ray's groupby and the plain-process benchmark do), whichever keys a
    gather task reads together."""
    from preprocessing import exchange

    rows = add_window(encoded_group(900).drop_columns(["window"]), n_windows=3, seed=3)
    (tmp_path / "spill").mkdir()
    kw = {"max_tokens": 500, "max_sentences": 30, "seed": 3}
    scattered = []
    for a, n in [(500, 400), (0, 500)]:  # two encoded parts (in any order)
        scattered += _scatter(rows.slice(a, n), key="window", n_keys=3,
                              spill_dir=str(tmp_path / "spill")).to_pylist()
    b = sink_writes([batch_window(rows.filter(pc.equal(rows["window"], w)), **kw)
                     for w in range(3)], tmp_path / "b", **BATCH_SINK)
    for per_read in (1, 2, 4):
        groups = exchange.gather_groups(scattered, 3, per_read)
        assert len(groups) == -(-3 // per_read)
        gathered = [t for g in groups
                    for t in _gather(pa.Table.from_pylist([g]), fn=batch_window, fn_kwargs=kw)]
        a = sink_writes(gathered, tmp_path / f"a{per_read}", **BATCH_SINK)
        assert a == b and a["rows_in"] == 900
        names = sorted(p.name for p in (tmp_path / f"a{per_read}").iterdir())
        assert names == sorted(p.name for p in (tmp_path / "b").iterdir()) and len(names) == 3
        assert all((tmp_path / f"a{per_read}" / n).read_bytes()
                   == (tmp_path / "b" / n).read_bytes() for n in names)


def test_ids_array_appends_eos():
    arr, lengths = ids_array([[5, 6], [], [7]])
    assert arr.to_pylist() == [[5, 6, EOS], [EOS], [7, EOS]] and list(lengths) == [3, 1, 2]


def test_dedupe_keeps_the_lowest_id(tmp_path):
    group = pa.table({"id": [9, 2, 5, 7], "src": ["a", "a", "b", ""], "tgt": ["x", "x", "y", ""],
                      "reason": [None, None, None, "empty"], "bucket": [1, 1, 1, 1]})
    stats = sink_writes([dedupe_group(group)], tmp_path, part_key="bucket", schema=CLEAN_SCHEMA,
                        stats_fn=clean_stats, key_digits=6)
    kept = pq.read_table(tmp_path / "part-000001.parquet")
    assert kept["id"].to_pylist() == [2, 5] and kept.schema.equals(CLEAN_SCHEMA)
    assert stats == {"rows_in": 4, "rows_kept": 2, "drop_duplicate": 1, "drop_empty": 1,
                     "src_words": 2, "tgt_words": 2}


def test_a_stage_manifest_that_cannot_be_read_is_an_error_not_a_stage_to_run_again(
        tmp_path, s3, monkeypatch):
    """Only a missing manifest means "not finished": one that cannot be read (a 403 once
    credentials rotated, a timeout, a shared folder's permissions) was taken for none, ran the
    stage again and replaced what other runs read."""
    import json

    from storage import location

    assert finished(tmp_path / "none", "c", "i") is None
    (tmp_path / "odd" / "manifest.json").mkdir(parents=True)  # (an OSError on any host)
    with pytest.raises(PreprocessError, match=r"cannot read .*odd/manifest.json "
                                              r"\(IsADirectoryError.*credentials and permissions"):
        finished(tmp_path / "odd", "c", "i")
    stage = location("s3://convs2s-test/spec-manifest/clean/train")
    (stage / "manifest.json").write_text(json.dumps({"config_hash": "c",
                                                      "input_fingerprint": "i"}))
    assert finished(stage, "c", "i")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the store stops answering
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(PreprocessError, match=r"cannot read s3://convs2s-test/spec-manifest/"
                                              r"clean/train/manifest.json"):
        finished(stage, "c", "i")


def test_stage_output_is_atomic(tmp_path):
    stage = tmp_path / "task" / "clean" / "train"
    with pytest.raises(ValueError):
        with stage_output(stage) as tmp:
            (tmp / "part-0.parquet").write_text("half")
            raise ValueError("killed midway")
    assert not stage.exists() and not list(stage.parent.iterdir())
    # A leftover of a hard kill (no cleanup ran) is removed by the next run, never reused.
    (stage.parent / ".train.partial-dead").mkdir()
    (stage.parent / ".train.partial-dead" / "part-9.parquet").write_text("stale")
    with stage_output(stage) as tmp:
        (tmp / "part-0.parquet").write_text("new")
        write_manifest(tmp, {"stage": "clean/train", "config_hash": "c", "input_fingerprint": "i",
                             "rows_in": 3, "rows_kept": 2, "dropped": {"empty": 1}})
    assert sorted(p.name for p in stage.parent.iterdir()) == ["train"]
    assert sorted(p.name for p in stage.iterdir()) == ["manifest.json", "part-0.parquet"]
    assert finished(stage, "c", "i") and not finished(stage, "c", "other input")
    with pytest.raises(RuntimeError, match="rows_in 3 != kept 1 \\+ dropped 1"):
        write_manifest(tmp_path, {"stage": "x", "rows_in": 3, "rows_kept": 1,
                                  "dropped": {"empty": 1}})


def test_presets_follow_the_paper():
    fr, ro, giga = pconfig.wmt14_en_fr(), pconfig.wmt16_en_ro(), pconfig.gigaword()
    assert (fr.max_len, fr.max_len_ratio, fr.vocab_size, fr.max_tokens) == (175, 1.5, 40_000, 4000)
    assert (fr.hub_repo, fr.hub_config) == ("wmt/wmt14", "fr-en")
    assert ro.max_len == 175 and ro.max_len_ratio is None and ro.hub_config == "ro-en"
    assert giga.vocab_size == 30_000 and giga.max_len_ratio is None
    assert giga.hub_revision == "refs/convert/parquet" and giga.row_shape == "columns"
    assert pconfig.demo().source == "demo" and pconfig.demo().vocab_size <= 2000
    for make in pconfig.PRESETS.values():
        assert make().splits["train"] == "train"
    with pytest.raises(ValueError, match="train"):
        pconfig.PreprocessConfig(task="x", splits={"valid": "v"})
    # A split's name is a folder's and a file's: no path (../x named a folder outside the
    # stage, which publishing it replaced, deleting what was there)
    for bad in ("../../victim", ".", "..", "a/b", "", "-x"):
        with pytest.raises(ValueError, match="split names are letters, digits"):
            pconfig.PreprocessConfig(task="x", splits={"train": "t", bad: "t"})
    for good in ("test_2016_flickr", "newstest2014", "valid.2", "dev-1"):
        assert good in pconfig.PreprocessConfig(task="x", splits={"train": "t", good: "t"}).splits


# --- runs sharing one storage volume -------------------------------------------------------------


def test_other_data_or_settings_get_their_own_folder_beside_the_others(tmp_path):
    """The data folder is keyed by what decides the training data: another vocabulary or
    another training source is another folder; where it goes, how many encoders, an added
    evaluation split and the batch cut are not (each cut is a folder inside it)."""
    from preprocessing.pipeline import cut_key, data_dir

    base = pconfig.demo().replace(root=str(tmp_path / "a"))
    here = data_dir(base)
    assert data_dir(base.replace(max_tokens=base.max_tokens // 2, max_sentences=7,
                                 shuffle_window=99)) == here
    assert len({cut_key(base), cut_key(base.replace(max_tokens=base.max_tokens // 2)),
                cut_key(base.replace(max_sentences=7)),
                cut_key(base.replace(shuffle_window=99))}) == 4
    assert here.parent == tmp_path / "a" / "demo" and len(here.name) == 12
    assert data_dir(base.replace(vocab_size=500)) != here
    assert data_dir(base.replace(demo_rows={**base.demo_rows, "train": 999})) != here
    assert data_dir(base.replace(encode_tasks=3, exchange="ray")) == here
    assert data_dir(base.replace(splits={**base.splits, "extra": "test"})) == here
    assert data_dir(base.replace(root=str(tmp_path / "b"))).name == here.name


def test_a_bucket_stage_being_published_is_left_alone_by_another_run(s3, monkeypatch):
    """In a bucket a stage's publish copies object by object (minutes for a large stage): its
    partial prefix names its owner until the copy is done, so another run of the same stage
    (another process) starting meanwhile leaves it alone, and the publish completes."""
    import subprocess
    import sys

    from preprocessing import stages
    from storage import location

    stage = location("s3://convs2s-test/spec-stages/encoded/train")
    publish = stages.publish_dir

    def another_run_starts_meanwhile(src, dest, **kwargs):
        subprocess.run([sys.executable, "-c", "import sys; from preprocessing.stages import "
                        "remove_stale_leftovers as r; sys.exit(len(r(sys.argv[1])))",
                        str(dest)], check=True, timeout=120)  # (exit 0: it removed nothing)
        publish(src, dest, **kwargs)

    monkeypatch.setattr(stages, "publish_dir", another_run_starts_meanwhile)
    with stage_output(stage) as tmp:
        (tmp / "part-0.parquet").write_bytes(b"rows")
        write_manifest(tmp, {"stage": "encoded/train"})
    assert sorted(n for n, _ in stage.files()) == ["manifest.json", "part-0.parquet"]
    assert stage.parent.glob(".train.partial-*") == []  # its own partial prefix: removed


def test_only_provably_stale_leftovers_are_removed(tmp_path):
    """A starting stage removes `.old-*` folders and partial folders whose writer is gone; a
    live run's partial folder, or another host's, is left alone."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from preprocessing.stages import OWNER_FILE, remove_stale_leftovers
    from storage.processes import machine_id, pid_namespace

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    host = socket.gethostname()
    owners = {"dead": {"host": host, "pid": dead_pid}, "live": {"host": host,
                                                              "pid": os.getppid()},
              "remote": {"host": host + "-other", "pid": 1}, "mine": {"host": host,
                                                                    "pid": os.getpid()},
              # a container on this host (host networking): its pids are not ours to look up
              "container": {"host": host, "pidns": "pid:[1]", "pid": dead_pid},
              # another machine with this host name (EC2's default names repeat across VPCs)
              "twin": {"host": host, "boot": "another-machine", "pidns": pid_namespace(),
                       "pid": dead_pid}}
    stage = tmp_path / "encoded" / "train"
    stage.parent.mkdir(parents=True)
    for name, owner in owners.items():
        (stage.parent / f".train.partial-{name}").mkdir()
        (stage.parent / f".train.partial-{name}" / OWNER_FILE).write_text(json.dumps(owner))
    (stage.parent / ".train.partial-nameless").mkdir()
    (stage.parent / ".train.old-1234").mkdir()
    removed = {p.name for p in remove_stale_leftovers(stage)}
    assert removed == {".train.old-1234", ".train.partial-dead", ".train.partial-mine",
                       ".train.partial-nameless"}
    assert sorted(p.name for p in stage.parent.iterdir()) == [
        ".train.partial-container", ".train.partial-live", ".train.partial-remote",
        ".train.partial-twin"]
    with stage_output(stage) as tmp:  # a new stage: its folder names its owner from the start
        assert json.loads((tmp / OWNER_FILE).read_text()) == {
            "host": host, "boot": machine_id(), "pidns": pid_namespace(), "pid": os.getpid()}
        write_manifest(tmp, {"stage": "encoded/train"})
    assert not (stage / OWNER_FILE).exists() and (stage / "manifest.json").is_file()
    assert (stage.parent / ".train.partial-live").is_dir()  # still left alone


# A run of one stage in another process (python -c): it writes `part-0.parquet` holding TEXT and
# a manifest (config "c", input "i"). With PAUSE `mkdir:NAME` it stops right after making a
# folder whose name holds NAME, with `unlink:NAME` right before removing such a file, and says
# "paused"; then a line "crash" on its stdin ends it at once (no cleanup runs), any other line
# lets it go on.
_STAGE_RUN = """
import os, pathlib, sys
from preprocessing.stages import stage_output, write_manifest

stage, text, pause = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def wait():
    print("paused", flush=True)
    if sys.stdin.readline().strip() == "crash":
        os._exit(3)

method, _, name = pause.partition(":")
if method:
    real = getattr(pathlib.Path, method)
    def paused(self, *args, **kwargs):
        if name in self.name and method == "unlink":
            wait()
        out = real(self, *args, **kwargs)
        if name in self.name and method == "mkdir":
            wait()
        return out
    setattr(pathlib.Path, method, paused)
with stage_output(stage) as tmp:
    (tmp / "part-0.parquet").write_text(text)
    write_manifest(tmp, {"stage": "clean/train", "config_hash": "c", "input_fingerprint": "i"})
"""


def _stage_run(stage, text: str, pause: str = ""):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", _STAGE_RUN, str(stage), text, pause],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _paused(run) -> None:
    assert run.stdout.readline().strip() == "paused", "the run ended before its pause"


def _crash(run) -> None:
    run.stdin.write("crash\n")
    run.stdin.flush()
    assert run.wait(timeout=120) == 3  # (waited for: a dead child's pid is free, no zombie)


def test_a_stage_being_renamed_into_place_is_left_alone_by_another_run(tmp_path, monkeypatch):
    """Another run of the same stage (another process: a sweep's variants, two workflows on
    one data key) may start at any moment, also while this run renames its finished folder
    into place or moves an earlier output aside: it removes nothing of this run's, which
    finishes with its output in place."""
    import pathlib
    import subprocess
    import sys

    stage = tmp_path / "clean" / "train"
    rename = pathlib.Path.rename

    def another_run_starts_first(self, target):
        if self.parent == stage.parent:
            subprocess.run([sys.executable, "-c", "import sys; from preprocessing.stages import "
                            "remove_stale_leftovers as r; r(sys.argv[1])", str(stage)],
                           check=True, timeout=120)
        return rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", another_run_starts_first)
    for config in ("first", "other settings"):  # the second replaces the first's output
        with stage_output(stage) as tmp:
            (tmp / "part-0.parquet").write_text(config)
            write_manifest(tmp, {"stage": "clean/train", "config_hash": config,
                                 "input_fingerprint": "i"})
        assert finished(stage, config, "i") and (stage / "part-0.parquet").read_text() == config
        assert sorted(p.name for p in stage.iterdir()) == ["manifest.json", "part-0.parquet"]
    assert sorted(p.name for p in stage.parent.iterdir()) == ["train"]


def test_two_runs_finishing_one_stage_together_keep_the_first_ones_output(tmp_path,
                                                                         monkeypatch):
    """Two runs of one stage (same config and input) that finish together: the one whose
    rename into place comes second finds the other's output there, keeps it and drops its
    own (same settings, same rows); neither fails, and nothing is left beside the stage."""
    import pathlib

    stage = tmp_path / "clean" / "train"
    rename, other = pathlib.Path.rename, []

    def the_other_run_finishes_first(self, target):
        if self.name.startswith(".train.partial-") and pathlib.Path(target) == stage \
                and not other:
            other.append(_stage_run(stage, "the other run's"))
            assert other[0].wait(timeout=120) == 0
        return rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", the_other_run_finishes_first)
    with stage_output(stage) as tmp:
        (tmp / "part-0.parquet").write_text("this run's")
        write_manifest(tmp, {"stage": "clean/train", "config_hash": "c", "input_fingerprint": "i"})
    assert other and (stage / "part-0.parquet").read_text() == "the other run's"
    assert finished(stage, "c", "i")
    assert sorted(p.name for p in stage.parent.iterdir()) == ["train"]
    assert sorted(p.name for p in stage.iterdir()) == ["manifest.json", "part-0.parquet"]


def test_a_partial_folder_being_made_is_left_alone_and_removed_once_its_run_is_killed(tmp_path):
    """A run killed between making its partial folder and naming its owner in it leaves a
    folder that the next run removes; while that run lives, its folder is left alone."""
    from preprocessing.stages import remove_stale_leftovers

    stage = tmp_path / "clean" / "train"
    run = _stage_run(stage, "rows", pause="mkdir:.new")
    try:
        _paused(run)
        (being_made,) = stage.parent.iterdir()
        assert remove_stale_leftovers(stage) == [] and being_made.is_dir()
    finally:
        _crash(run)
    assert remove_stale_leftovers(stage) == [being_made]
    assert list(stage.parent.iterdir()) == []


def test_a_run_killed_right_after_renaming_its_stage_into_place_leaves_it_finished(tmp_path):
    """Killed after the rename into place, before it removed its owner file: the stage is
    finished (its manifest says so), the leftover owner file is no data (parts are
    `part-*.parquet`), and a rerun of other settings replaces the folder as a whole."""
    from preprocessing.stages import OWNER_FILE, part_paths

    stage = tmp_path / "clean" / "train"
    run = _stage_run(stage, "rows", pause=f"unlink:{OWNER_FILE}")
    _paused(run)
    _crash(run)
    assert finished(stage, "c", "i") and (stage / OWNER_FILE).is_file()
    assert part_paths(stage) == [str(stage / "part-0.parquet")]
    with stage_output(stage) as tmp:
        write_manifest(tmp, {"stage": "clean/train", "config_hash": "c2",
                             "input_fingerprint": "i"})
    assert sorted(p.name for p in stage.iterdir()) == ["manifest.json"]
    assert sorted(p.name for p in stage.parent.iterdir()) == ["train"]


@pytest.mark.parametrize("name", ["block_rows", "shuffle_window", "spm_sample_pairs",
                                  "max_line_bytes"])
@pytest.mark.parametrize("value", [0, -5, 2.5])
def test_sizes_that_must_be_positive_integers_are_refused_when_set(name, value):
    """A block, window, sample or line size of 0 or less is refused with the setting named,
    before any stage runs (a shuffle_window of 0 was a ZeroDivisionError in the batches
    stage, after clean, spm and encode; a block_rows of 0 read the whole split as one
    block)."""
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got {value}"):
        pconfig.demo().replace(**{name: value})


def test_a_dataset_whose_constructor_a_ctrl_c_cut_short_is_collected_without_a_traceback(
        monkeypatch):
    """A Ctrl-C inside Ray Data's Dataset.__init__ (before it sets its executor attribute)
    left an instance whose __del__ printed "Exception ignored in ... AttributeError" under the
    run's "interrupted" line (a suite run's Ctrl-C test caught it): with the pipeline's
    default, such an instance is collected quietly."""
    import gc
    import sys

    import ray.data

    from storage.signals import quiet_interrupted_datasets

    # as Ray Data has it: no class-level default (the pipeline's import set one already)
    monkeypatch.delattr(ray.data.Dataset, "_current_executor", raising=False)
    quiet_interrupted_datasets()
    raised = []
    before = sys.unraisablehook
    sys.unraisablehook = raised.append
    try:
        cut_short = object.__new__(ray.data.Dataset)  # what the interrupted __init__ left
        del cut_short
        gc.collect()
    finally:
        sys.unraisablehook = before
    assert raised == []


def test_the_evaluation_text_leaves_out_a_cell_past_the_line_limit_as_a_text_line():
    """A parquet or jsonl cell past max_line_bytes: cleaning drops it as line_too_long, as the
    reader marks a text file's line past it, but the evaluation text kept the cell (80,000
    characters) where it left the text line out: the same test set scored on other references
    by its file format."""
    from preprocessing.cleaning import _clean_batch, normalize_block

    table = pa.table({"id": pa.array([0, 1], pa.int64()), "en": ["a cat .", "x" * 80_000],
                      "de": ["eine katze .", "y"], "error": pa.array([None, None], pa.string())})
    out = normalize_block(table, src_lang="en", tgt_lang="de", row_shape="columns",
                          max_line_bytes=65_536)
    assert out["reason"].to_pylist() == [None, "line_too_long"]
    assert out["src"].to_pylist() == ["a cat .", ""]
    # the cleaning stage's own verdict on the same cells
    assert _clean_batch(table, "en", "de", "columns", 250, None, 65_536)[3] == \
        [None, "line_too_long"]
