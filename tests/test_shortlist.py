"""Vocabulary selection: the lexical table's counts are exact on a tiny corpus (preprocessing
/lexical.py, on Ray Data), a batch's shortlist holds the specials, the frequent targets and
each source token's candidates (convs2s.inference.shortlist), a search over the whole vocabulary
given as
a shortlist is the plain search, a trained model searched over its data's shortlists (float32
and int8) gives the whole vocabulary's hypotheses on most sentences, and a table of other data,
or with ids outside the model's vocabularies, is refused.

Run: .venv/bin/python -m pytest tests/test_shortlist.py -q
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from convs2s.config import EOS, PRESETS, SearchConfig
from convs2s.model.network import ConvS2S, inference_copy
from convs2s.metrics.scoring import read_lines
from convs2s.inference.search import generate, greedy
from convs2s.inference.shortlist import Shortlist, ShortlistError
from convs2s.inference.translate import load_for_inference
from preprocessing.lexical import (TABLE_FILE, best_targets_of, cooccurrence_block, pair_counts,
                                   token_counts, vocab_digest)

# Four encoded pairs (ids >= 4 are pieces; EOS ends each side).
PAIRS = [([4, 5, EOS], [10, 11, EOS]),
         ([4, 6, EOS], [10, 12, EOS]),
         ([5, 5, EOS], [11, 13, EOS]),  # 5 twice: counted once per sentence
         ([7, EOS], [14, EOS])]


def encoded(pairs, first_id=0) -> pa.Table:
    return pa.table({"id": list(range(first_id, first_id + len(pairs))),
                     "src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})


def counts_of(table: pa.Table) -> dict:
    return {(s, t): n for s, t, n in zip(*(table.column(c).to_pylist()
                                           for c in ("src", "tgt", "n")))}


def test_cooccurrence_counts_each_sentence_once_and_skips_specials():
    c = counts_of(cooccurrence_block(encoded(PAIRS)))
    assert c[(4, 10)] == 2 and c[(4, 11)] == 1 and c[(5, 11)] == 2 and c[(5, 13)] == 1
    assert c[(7, 14)] == 1 and (7, 10) not in c
    assert c[(4, -1)] == 2 and c[(5, -1)] == 2 and c[(-1, 10)] == 2 and c[(-1, 11)] == 2
    assert c[(-1, -1)] == 4  # pairs counted
    assert not [k for k in c if EOS in k]
    # every other pair (id % 2 == 0): pairs 0 and 2
    half = counts_of(cooccurrence_block(encoded(PAIRS), stride=2))
    assert half[(-1, -1)] == 2 and half[(4, 10)] == 1 and (6, 12) not in half


def test_the_stage_counts_tokens_and_pairs_apart_as_the_block_counts_them_together():
    """The stage's two passes (token rows summed by the driver, pair rows through the
    exchange) hold exactly the rows of `cooccurrence_block`; each pair row carries an id of
    its own, from its block's first id (the spill files are named by their rows' smallest),
    and its source token's bucket."""
    block = encoded(PAIRS, first_id=40)
    together = counts_of(cooccurrence_block(block))
    singles = counts_of(token_counts(block))
    pairs = pa.concat_tables(pair_counts(block, stride=1, n_buckets=3))
    assert {**singles, **counts_of(pairs)} == together
    assert all(s == -1 or t == -1 for s, t in singles)
    assert pairs.column("id").to_pylist() == [(40 << 32) + i for i in range(pairs.num_rows)]
    assert pairs.column("bucket").to_pylist() == [s % 3 for s in pairs.column("src").to_pylist()]
    half = pa.concat_tables(pair_counts(block, stride=2, n_buckets=1))  # ids 40, 42: 0 and 2
    assert counts_of(half) == {k: v for k, v in counts_of(cooccurrence_block(block, stride=2))
                               .items() if -1 not in k}


def test_a_blocks_pairs_are_counted_a_run_of_sentences_at_a_time(monkeypatch):
    """Runs of COUNT_CHUNK counted pairs are sorted apart (bounded memory): a pair in two runs
    is two rows whose counts add up, and the ids go on from run to run."""
    import preprocessing.lexical as lexical

    monkeypatch.setattr(lexical, "COUNT_CHUNK", 2)
    block = encoded(PAIRS, first_id=40)
    runs = list(pair_counts(block, stride=1, n_buckets=1))
    assert len(runs) == 2
    ids = pa.concat_tables(runs).column("id").to_pylist()
    assert ids == [(40 << 32) + i for i in range(len(ids))]
    summed = {}
    for t in runs:
        for key, n in counts_of(t).items():
            summed[key] = summed.get(key, 0) + n
    assert summed == {k: v for k, v in counts_of(cooccurrence_block(block)).items()
                      if -1 not in k}
    assert len(ids) == len(summed) + 1  # (5, 11) in both runs: sentences 0 and 2


def test_best_targets_rank_by_dice_over_the_summed_rows_of_each_source_token():
    # source 4: with 10 twice (c(10)=2; in two rows, as two blocks count it), with 11 once
    # (c(11)=2), with 12 once (c(12)=1); source 6, in the same bucket: 13 and 12 tie
    group = pa.table({"src": pa.array([4, 6, 4, 4, 6, 4], pa.int32()),
                      "tgt": pa.array([11, 13, 12, 10, 12, 10], pa.int32()),
                      "n": pa.array([1, 1, 1, 1, 1, 1], pa.int32())})
    src_counts, tgt_counts = np.zeros(20), np.zeros(20)
    src_counts[[4, 6]] = [2, 1]
    tgt_counts[[10, 11, 12, 13]] = [2, 2, 1, 1]
    out = best_targets_of(group, 2, tgt_counts, src_counts)
    # Dice for 4: 10 -> 2*2/4 = 1.0, 12 -> 2/3, 11 -> 2/4 (cut at k = 2); for 6: 12 and 13
    # both 2/2, the smaller id first
    assert out.column("src").to_pylist() == [4, 6]
    assert out.column("targets").to_pylist() == [[10, 12], [12, 13]]
    assert out.column("rows_in").to_pylist() == [6, 0]  # what it ranked, counted once
    assert out.column("targets").to_pylist() == best_targets_of(
        group.take([5, 4, 3, 2, 1, 0]), 2, tgt_counts, src_counts).column("targets").to_pylist()
    assert best_targets_of(group.slice(0, 0), 2, tgt_counts, src_counts).num_rows == 0


def test_the_in_memory_table_is_the_stages_table():
    from preprocessing.lexical import table_in_memory

    table, order = table_in_memory([s for s, _ in PAIRS], [t for _, t in PAIRS], 20, 2)
    assert table[4].tolist() == [10, 12] and table[7].tolist() == [14, -1]
    assert table[6].tolist() == [12, 10] and order[:6].tolist() == [0, 1, 2, 3, 10, 11]


@pytest.mark.slow
@pytest.mark.parametrize("exchange,block_bytes", [("files", None), ("ray", None), ("files", 64)])
def test_the_table_stage_counts_exactly_on_ray_data(ray_session, tmp_path, exchange,
                                                    block_bytes):
    """Exact counts either way; with `block_bytes`, Ray Data cuts each map's output into
    blocks of a few rows (as it cuts a real block's hundreds of MB of pair rows), and no
    piece's rows are lost (each used to overwrite the other pieces' spill file)."""
    import ray.data

    from preprocessing.lexical import build_table
    from preprocessing.parts import PartSink  # noqa: F401 - the stage's own part format
    import pyarrow.parquet as pq

    folder = tmp_path / "encoded"
    folder.mkdir()
    # two parts, as the encoded stage writes them
    pq.write_table(encoded(PAIRS[:2]), folder / "part-000000.parquet")
    pq.write_table(encoded(PAIRS[2:], first_id=2), folder / "part-000001.parquet")
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"pretend sentencepiece bytes")
    out = tmp_path / "out"
    out.mkdir()
    context = ray.data.DataContext.get_current()
    before = context.target_max_block_size
    try:
        if block_bytes:
            context.target_max_block_size = block_bytes
        meta = build_table(folder, spm, vocab_size=20, k=2, sample_pairs=100, rows=4,
                           out_dir=out, exchange=exchange)
    finally:
        context.target_max_block_size = before
    assert meta["pairs_counted"] == 4 and meta["stride"] == 1 and meta["k"] == 2
    if exchange == "files" and not block_bytes:  # every pair row of the two parts went
        # through the spill files: (4|5|6, 10|11|12) seen in part 0; 5-11, 5-13, 7-14 in part 1
        assert meta["pair_rows"] == 7 + 3
    assert sorted(p.name for p in out.iterdir()) == [TABLE_FILE]  # the spill files removed
    (out / ".pairs").mkdir()  # another count's spill files, or a stale one's: never read
    with pytest.raises(RuntimeError, match=r"\.pairs exists"):
        build_table(folder, spm, vocab_size=20, k=2, sample_pairs=100, rows=4, out_dir=out,
                    exchange=exchange)
    assert (out / ".pairs").is_dir()  # not this call's to remove
    assert meta["vocab_digest"] == vocab_digest(spm)
    with np.load(out / TABLE_FILE, allow_pickle=False) as z:
        table, order = z["table"], z["target_order"]
        assert json.loads(str(z["meta"]))["vocab_size"] == 20
    assert table.shape == (20, 2)
    assert table[4].tolist() == [10, 12]  # Dice 1.0, then 2/3 (12 only with 4) over 11's 1/2
    assert table[7].tolist() == [14, -1]  # one candidate only
    assert table[6].tolist() == [12, 10]  # 12: 2/2; 10: 2/3
    assert (table[[0, 1, 2, 3, 8]] == -1).all()  # specials and unseen tokens: none
    assert order[:4].tolist() == [0, 1, 2, 3] and order[4:6].tolist() == [10, 11]


def table_file(tmp_path, spm_bytes=b"spm", vocab=30, k=2) -> tuple:
    spm = tmp_path / "spm.model"
    spm.write_bytes(spm_bytes)
    table = np.full((vocab, k), -1, dtype=np.int32)
    table[5] = [20, 21]
    table[6] = [22, -1]
    order = np.concatenate([np.arange(4), np.arange(29, 3, -1)]).astype(np.int32)
    meta = {"vocab_digest": vocab_digest(spm), "vocab_size": vocab, "k": k}
    path = tmp_path / TABLE_FILE
    np.savez(path, table=table, target_order=order, meta=np.array(json.dumps(meta)))
    return path, spm


def test_a_batch_shortlist_holds_specials_frequent_and_candidates(tmp_path):
    path, spm = table_file(tmp_path)
    sl = Shortlist.load(path, spm, vocab_size=30)
    src = torch.tensor([[5, 6, EOS], [6, EOS, 1]])  # PAD = 1 at the end of row 2
    ids = sl.for_batch(src, frequent=3)
    assert ids.tolist() == [0, 1, 2, 3, 20, 21, 22, 27, 28, 29]
    assert sl.for_batch(src, frequent=0, per_source=1).tolist() == [0, 1, 2, 3, 20, 22]


def test_a_table_of_other_data_is_refused(tmp_path):
    path, _ = table_file(tmp_path)
    other = tmp_path / "other.model"
    other.write_bytes(b"another vocabulary")
    with pytest.raises(ShortlistError, match="another vocabulary.*use the shortlist/ table"):
        Shortlist.load(path, other)
    with pytest.raises(ShortlistError, match="covers 30 source tokens but the model has 40"):
        Shortlist.load(path, vocab_size=40)
    with pytest.raises(ShortlistError, match="does not exist"):
        Shortlist.load(tmp_path / "missing.npz")


def saved(tmp_path, table, order) -> Path:
    path = tmp_path / TABLE_FILE
    np.savez(path, table=np.array(table, dtype=np.int32),
             target_order=np.array(order, dtype=np.int32), meta=np.array(json.dumps({"k": 2})))
    return path


def test_a_table_is_checked_against_both_vocabularies_when_loaded(tmp_path):
    """Rows are source ids, candidates and target_order target ids: an id out of the model's
    vocabulary is refused in one line naming the file, not met later as an IndexError inside
    a search."""
    table = [[-1, -1]] * 4 + [[7, 5], [6, -1]]  # 6 source ids, candidates of 8 target ids
    order = [0, 1, 2, 3, 7, 6, 5, 4]
    path = saved(tmp_path, table, order)
    # one joint vocabulary (sentencepiece) of 6 pieces: candidates 6 and 7 are not in it
    with pytest.raises(ShortlistError, match="candidate 7 of source token 4 is not -1"):
        Shortlist.load(path, vocab_size=6)
    sl = Shortlist.load(path, vocab_size=6, target_vocab_size=8)
    assert sl.for_batch(torch.tensor([[4, 5]]), frequent=1).tolist() == [0, 1, 2, 3, 5, 6, 7]
    with pytest.raises(ShortlistError, match=r"covers 6 source tokens but the model has 8"):
        Shortlist.load(path, vocab_size=8, target_vocab_size=8)
    with pytest.raises(ShortlistError, match=rf"^{re.escape(str(path))}: candidate 7 of source "
                                             r"token 4 is not -1 \(none\) or a target id "
                                             r"below 7: use the shortlist/ table"):
        Shortlist.load(path, vocab_size=6, target_vocab_size=7)
    for bad_table, bad_order, says in (
            (table[:5] + [[6, -2]], order, "candidate -2 of source token 5 is not -1"),
            (table, order[:-1] + [8], "target_order holds id 8; it must list distinct target "
                                      "ids below 8"),
            (table, order[:-1] + [-1], "target_order holds id -1"),
            (table, order[:-1] + [5], "target_order holds an id twice"),
            ([0, 1, 2], order, "table must be 2-D and target_order 1-D integer arrays")):
        with pytest.raises(ShortlistError, match=re.escape(says)):
            Shortlist.load(saved(tmp_path, bad_table, bad_order), vocab_size=6,
                           target_vocab_size=8)
    # without the model's sizes: the ids that can never be right are still refused
    with pytest.raises(ShortlistError, match="candidate -2"):
        Shortlist.load(saved(tmp_path, table[:5] + [[6, -2]], order))


def test_the_whole_vocabulary_as_a_shortlist_is_the_plain_search():
    torch.manual_seed(0)
    V = 60
    net = inference_copy(ConvS2S(PRESETS["tiny"](), V, V))
    src = torch.randint(4, V, (3, 7))
    src[:, -1] = EOS
    lengths = torch.full((3,), 7)
    every = torch.arange(V)
    for search in (generate, greedy):
        plain = search([net], src, lengths, max_len_b=8)
        listed = search([net], src, lengths, max_len_b=8, vocab=every)
        for a, b in zip(plain, listed):
            assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
            assert a[0]["score"] == pytest.approx(b[0]["score"], abs=1e-5)
    # a real shortlist (positions != ids): outputs use only its tokens, greedy and beam,
    # incremental or not, and each token's log-prob is the full model's renormalized over it
    short = torch.cat([torch.arange(4), torch.arange(30, 45)])
    allowed = set(short.tolist())
    for search in (generate, greedy):
        inc = search([net], src, lengths, max_len_b=8, vocab=short)
        full = search([net], src, lengths, max_len_b=8, vocab=short, incremental=False)
        for a, b in zip(inc, full):
            assert set(a[0]["tokens"].tolist()) <= allowed
            assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
            assert a[0]["score"] == pytest.approx(b[0]["score"], abs=1e-4)
    h = greedy([net], src[:1], lengths[:1], max_len_b=8, vocab=short)[0][0]
    prefix = torch.cat([torch.tensor([EOS]), h["tokens"][:-1]])[None]
    with torch.no_grad():
        logits, _ = net.decode(prefix, net.encode(src[:1], lengths[:1]))
    renormed = torch.log_softmax(logits[0][:, short], dim=-1)  # T x C
    pos = {t: i for i, t in enumerate(short.tolist())}
    expected = renormed[torch.arange(len(h["tokens"])),
                        torch.tensor([pos[t] for t in h["tokens"].tolist()])]
    assert torch.allclose(h["positional_scores"], expected, atol=1e-5)
    with pytest.raises(ValueError, match="start with the special tokens"):
        generate([net], src, lengths, vocab=torch.arange(4, V))


def test_a_trained_model_with_a_shortlist_translates_like_the_whole_vocabulary(demo_trained,
                                                                               tmp_path):
    """The lexical table of the demo model's own training data (the shortlist stage's
    function on Ray Data): beam search over each batch's shortlist, in float32 and int8,
    gives the whole vocabulary's hypotheses on most sentences."""
    import pyarrow.parquet as pq

    from preprocessing.lexical import TABLE_FILE, build_table

    t = demo_trained
    encoded = Path(t.prep.root) / "encoded" / "train"
    rows = sum(pq.read_metadata(p).num_rows for p in encoded.glob("*.parquet"))
    meta = build_table(encoded, t.prep.spm_model, t.prep.vocab_size, k=20,
                       sample_pairs=100_000, rows=rows, out_dir=tmp_path)
    assert meta["pairs_counted"] == rows
    lines = read_lines(t.test_src)[:60]
    ckpt = [t.train.best_checkpoint]
    full = load_for_inference(ckpt, SearchConfig(beam=5)).translate(lines)
    for precision in ("fp32", "int8"):
        short = load_for_inference(ckpt, SearchConfig(
            beam=5, precision=precision, shortlist=str(tmp_path / TABLE_FILE),
            shortlist_frequent=100)).translate(lines)
        same = sum(a == b for a, b in zip(full, short))
        assert same >= 0.75 * len(lines), (precision, same)
