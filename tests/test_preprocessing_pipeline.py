"""The preprocessing pipeline end to end on real Ray Data, with the newstest files of
../shared/data (skipped when absent) and the embedded demo corpus.

    timeout 900 .venv/bin/python -m pytest tests/test_preprocessing_pipeline.py -q

One newstest run (module fixture) is checked from several sides; a hub-shaped parquet copy of
the same files must give the same encoded rows and byte-identical batch shards; a run killed
(SIGKILL) in the middle of a stage and rerun must give the same bytes again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import cpu_holders, kill_when
from convs2s.console import alarming_lines
from preprocessing.cleaning import normalize
from preprocessing.config import PreprocessConfig
from preprocessing.errors import PreprocessError
from preprocessing.pipeline import data_dir, run_pipeline, shortlist_key
from preprocessing.vocab import BOS, EOS, PAD, UNK, load

NEWSTEST = {"train": "newstest2012", "valid": "newstest2013", "test": "newstest2014"}


def newstest_cfg(shared_data: Path, root: Path, **kw) -> PreprocessConfig:
    args = dict(task="newstest", source=str(shared_data / "wmt14-en-fr"), splits=dict(NEWSTEST),
                vocab_size=800, block_rows=1000, shuffle_window=1500, root=str(root))
    return PreprocessConfig(**{**args, **kw})


def lines(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def read_rows(folder: str) -> list[dict]:
    """All rows of a stage folder's parts, sorted by id (read without Ray)."""
    tables = [pq.read_table(p) for p in sorted(Path(folder).glob("part-*.parquet"))]
    return sorted(pa.concat_tables(tables).to_pylist(), key=lambda r: r["id"])


def stage_folder(out, stage: str, split: str) -> str:
    """A split's folder in `stage` (clean, encoded): an evaluation split's name carries a key
    of its input (`split_folder`), as its batches folder's does."""
    return f"{out.root}/{stage}/{Path(out.batches[split]).name}"


def part_bytes(folder: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).glob("part-*.parquet"))}


@pytest.fixture(scope="module")
def newstest(ray_session, shared_data, tmp_path_factory):
    cfg = newstest_cfg(shared_data, tmp_path_factory.mktemp("prep"))
    return cfg, run_pipeline(cfg)


def independent_drops(src_lines: list[str], tgt_lines: list[str]) -> dict[str, int]:
    """The paper's filters re-counted directly on the raw files (newstest text is clean)."""
    counts = {}
    for s, t in zip(src_lines, tgt_lines):
        ls, lt = len(s.split()), len(t.split())
        reason = ("empty" if not ls or not lt else "too_long" if max(ls, lt) > 175
                  else "ratio" if max(ls, lt) / min(ls, lt) > 1.5 else None)
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def test_filters_drop_exactly_the_violating_pairs(newstest, shared_data):
    cfg, out = newstest
    for split, name in NEWSTEST.items():
        en, fr = (lines(shared_data / "wmt14-en-fr" / f"{name}.{x}") for x in ("en", "fr"))
        m = out.manifests[f"clean/{split}"]
        assert m["rows_in"] == len(en) == m["rows_kept"] + sum(m["dropped"].values())
        assert m["dropped"] == independent_drops(en, fr)
        kept = [r["id"] for r in read_rows(stage_folder(out, "clean", split))]
        assert m["rows_kept"] == len(kept) == len(set(kept))
        # each stage takes every row the one before it kept (none lost between stages)
        kept_before = m["rows_kept"]
        for stage in ("encoded", "batches"):
            sm = out.manifests[f"{stage}/{split}"]
            assert sm["rows_in"] == kept_before, (stage, sm["rows_in"], kept_before)
            kept_before = sm["rows_kept"]


def test_every_kept_pair_is_in_exactly_one_batch_within_budget(newstest):
    cfg, out = newstest
    for split in NEWSTEST:
        encoded = {r["id"]: r for r in read_rows(stage_folder(out, "encoded", split))}
        clean_ids = [r["id"] for r in read_rows(stage_folder(out, "clean", split))]
        assert sorted(encoded) == clean_ids
        batched, longest_src, longest_tgt = [], 0, 0
        for b in read_rows(out.batches[split]):
            longest = max(max(len(s), len(t)) for s, t in zip(b["src"], b["tgt"]))
            assert len(b["id"]) * longest == b["padded_tokens"] <= cfg.max_tokens
            longest_src = max([longest_src] + [len(s) for s in b["src"]])
            longest_tgt = max([longest_tgt] + [len(t) for t in b["tgt"]])
            assert len(b["id"]) <= cfg.max_sentences
            for i, s, t in zip(b["id"], b["src"], b["tgt"]):
                assert (s, t) == (encoded[i]["src"], encoded[i]["tgt"])
            batched += b["id"]
        assert sorted(batched) == clean_ids  # once each: no loss, no duplicate
        m = out.manifests[f"batches/{split}"]
        assert 0.5 < m["padding_efficiency"] <= 1.0
        # the longest sentences, which with the budget give the data's largest training step
        # (convs2s.train.memory_fit), over all the split's parts
        assert m["longest"] == {"src": longest_src, "tgt": longest_tgt}


def _bpe_sample() -> list:
    """The BPE sample (500 of 3,000 pairs of a 12-word language) as sample_pairs hands it on:
    ObjectRefs of the cleaned rows' blocks."""
    import ray

    from preprocessing.vocab import sample_pairs

    words = "the a cat dog sat on mat red blue green house tree".split()
    rows = [(" ".join(words[(i + j) % len(words)] for j in range(3 + i % 5)),
             " ".join(words[(i * 7 + j) % len(words)] for j in range(2 + i % 4)))
            for i in range(3000)]
    ds = ray.data.from_arrow(pa.table({"id": pa.array(range(len(rows)), pa.int64()),
                                       "src": [s for s, _ in rows], "tgt": [t for _, t in rows]}))
    return sample_pairs(ds, len(rows), 500, seed=3)


def test_the_bpe_is_learned_from_inside_a_sweep_trials_placement_group(ray_session, tmp_path):
    """A sweep variant of another vocabulary preprocesses inside its trial, a Ray Tune actor
    whose placement group ({"CPU": 0}) captures its child tasks: the BPE task asks for a CPU
    no bundle of it has, and failed there ("cannot fit into any bundles"). It is scheduled
    on the cluster, as the evaluation tasks are."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from preprocessing.pipeline import _LEARN_BPE

    blocks = _bpe_sample()

    @ray.remote(num_cpus=0)
    def trial(blocks):  # (the trial's own Ray Data reads are scheduled by Ray Data itself)
        return ray.get(_LEARN_BPE.remote(blocks, 500, str(tmp_path / "spm"), 300, 1.0))

    group = placement_group([{"CPU": 0, "memory": 100 * 2**20}])  # as a sweep's trial's
    ray.get(group.ready(), timeout=60)
    try:
        inside = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
        assert ray.get(trial.options(scheduling_strategy=inside).remote(blocks),
                       timeout=120) == 500
    finally:
        remove_placement_group(group)
    assert (tmp_path / "spm.model").is_file()


def test_the_bpe_sample_stays_in_the_object_store_and_a_task_learns_the_drivers_model(
        ray_session, tmp_path):
    """The sample is handed on as ObjectRefs and sentencepiece learns in a Ray task (a
    cluster's driver runs on its head node): the model is the one a driver would learn from
    the k rows with the smallest hash, byte for byte."""
    import ray

    from preprocessing.pipeline import _LEARN_BPE
    from preprocessing.vocab import smallest, train_bpe

    blocks = _bpe_sample()
    assert all(isinstance(b, ray.ObjectRef) for b in blocks)
    assert ray.get(_LEARN_BPE.remote(blocks, 500, str(tmp_path / "task"), 300, 1.0)) == 500
    sample = smallest(ray.get(blocks), 500)
    assert sample.num_rows == 500 and sample["h"].to_pylist() == sorted(sample["h"].to_pylist())
    train_bpe(sample, tmp_path / "driver", 300, 1.0)
    assert (tmp_path / "task.model").read_bytes() == (tmp_path / "driver.model").read_bytes()


def test_batch_rows_survive_ray_data_read_parquet(newstest):
    _, out = newstest
    expected = {tuple(b["id"]): b for b in read_rows(out.batches["valid"])}
    ds = ray_data_read(out.batches["valid"])
    n = 0
    for row in ds.iter_rows():  # one batch-row at a time, as a training worker iterates
        want = expected[tuple(int(i) for i in row["id"])]
        assert [[int(x) for x in s] for s in row["src"]] == want["src"]
        assert [[int(x) for x in t] for t in row["tgt"]] == want["tgt"]
        assert int(row["padded_tokens"]) == want["padded_tokens"]
        n += 1
    assert n == len(expected)
    batch = next(iter(ds.iter_batches(batch_size=1, batch_format="numpy")))
    assert len(batch["src"]) == 1 and len(batch["src"][0]) == len(batch["id"][0])


def ray_data_read(folder: str):
    """`ray.data.read_parquet` on the session's Ray once both its CPUs are free. Its first
    operator, ListFiles, runs as a task on one CPU and starts a footer-reader actor, which
    needs a free CPU to be placed: beside anything else that holds the other CPU of the
    2-CPU session, the read waits for it (a CI run waited 1,800 s, the whole no-progress
    timeout, its ListFiles task active and nothing read). A CPU still taken after 60 s
    fails here, naming what holds it."""
    import ray

    from workflows.evaluation import _free_cpus_per_node

    assert _free_cpus_per_node(settle_s=60), \
        f"the session's CPUs are still taken after 60 s, by {cpu_holders()}"
    return ray.data.read_parquet(folder)


def test_bpe_round_trips_newstest_and_uses_project_ids(newstest, shared_data):
    _, out = newstest
    sp = load(out.spm_model)
    assert (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id()) == (BOS, PAD, EOS, UNK)
    assert sp.get_piece_size() == out.vocab_size == 800
    for name in NEWSTEST.values():
        for lang in ("en", "fr"):
            texts = [normalize(x) for x in lines(shared_data / "wmt14-en-fr" / f"{name}.{lang}")]
            decoded = sp.decode(sp.encode(texts))
            assert decoded == texts
    clean = read_rows(stage_folder(out, "clean", "test"))[:200]
    encoded = {r["id"]: r for r in read_rows(stage_folder(out, "encoded", "test"))}
    for r in clean:
        src = encoded[r["id"]]["src"]
        assert src[-1] == EOS and BOS not in src and encoded[r["id"]]["src_len"] == len(src)
        assert sp.decode(src[:-1]) == r["src"]


def test_eval_text_is_every_line_in_order_unfiltered(newstest, shared_data):
    _, out = newstest
    for split in ("valid", "test"):
        for path, lang in zip(out.text[split], ("en", "fr")):
            raw = lines(shared_data / "wmt14-en-fr" / f"{NEWSTEST[split]}.{lang}")
            assert lines(Path(path)) == [normalize(x) for x in raw]
        assert out.manifests[f"clean/{split}"]["dropped"]  # some pairs filtered, none here


def test_rerun_skips_finished_stages(newstest):
    cfg, out = newstest
    stamps = {p: p.stat().st_mtime_ns for p in Path(out.root).rglob("*") if p.is_file()}
    again = run_pipeline(cfg)  # (no stage ran: every file keeps its time, none is added)
    assert again.manifests == out.manifests
    assert {p: p.stat().st_mtime_ns for p in Path(out.root).rglob("*") if p.is_file()} == stamps


def test_the_lexical_table_is_a_stage_beside_the_same_data(newstest):
    """With shortlist_per_source the pipeline adds shortlist/ to the same data folder (the
    other stages are reused, not rebuilt) and the table holds, for newstest's frequent source
    tokens, their k best targets by Dice over sentence counts, counted here again from the
    encoded rows."""
    from collections import Counter

    import numpy as np

    cfg, out = newstest
    with_table = run_pipeline(cfg.replace(shortlist_per_source=8))
    assert with_table.root == out.root  # the same data key: only a stage is added
    for stage in ("clean/train", "spm", "encoded/train", "batches/train"):
        assert with_table.manifests[stage] == out.manifests[stage]
    m = with_table.manifests["shortlist"]
    key = shortlist_key(cfg.replace(shortlist_per_source=8))
    assert with_table.shortlist == str(Path(out.root) / "shortlist" / key / "shortlist.npz")
    assert m["k"] == 8 and m["pairs_counted"] == out.manifests["encoded/train"]["rows_kept"]
    with np.load(with_table.shortlist, allow_pickle=False) as z:
        table = z["table"]
    assert table.shape == (out.vocab_size, 8)
    assert m["sources_with_candidates"] > 0.5 * out.vocab_size

    # The Dice table recounted by hand: each pair counts each token (and token pair) once;
    # the 4 special ids are never counted.
    rows = read_rows(f"{out.root}/encoded/train")
    pairs = [({s for s in r["src"] if s >= 4}, {t for t in r["tgt"] if t >= 4}) for r in rows]
    c_src = Counter(s for src, _ in pairs for s in src)
    c_tgt = Counter(t for _, tgt in pairs for t in tgt)
    frequent = [s for s, _ in c_src.most_common(20)]
    both = {s: Counter() for s in frequent}
    for src, tgt in pairs:
        for s in src & both.keys():
            both[s].update(tgt)
    for s in frequent:
        dice = {t: 2.0 * n / (c_src[s] + c_tgt[t]) for t, n in both[s].items()}
        expected = sorted(dice, key=lambda t: (-dice[t], t))[:8]
        assert table[s].tolist() == expected, s

    # Another k is a table of its own beside it: the k=8 table, whose path a translation job
    # or a logged model may hold, is not rebuilt under that path (it was, in place).
    before = Path(with_table.shortlist).stat().st_mtime_ns
    other = run_pipeline(cfg.replace(shortlist_per_source=4))
    assert Path(other.shortlist).parent != Path(with_table.shortlist).parent
    with np.load(other.shortlist, allow_pickle=False) as z:
        assert z["table"].shape == (out.vocab_size, 4)
    assert Path(with_table.shortlist).stat().st_mtime_ns == before
    assert run_pipeline(cfg.replace(shortlist_per_source=8)).manifests["shortlist"] == m


def test_a_data_folder_moved_elsewhere_is_read_where_it_is_now(newstest, tmp_path):
    """Prepared data moved (or copied to another bucket) keeps its stages, and the output
    names the files where the folder is now: the BPE model, the evaluation text, the lexical
    table and the vocabulary the encoded and batches stages name. They named the old place,
    which a move had removed."""
    import shutil

    cfg, _ = newstest
    cfg = cfg.replace(shortlist_per_source=8)
    before = run_pipeline(cfg)  # (builds the table when no earlier test did)
    first = tmp_path / "first"
    shutil.copytree(cfg.root, first)
    copied = run_pipeline(cfg.replace(root=str(first)))
    moved_to = tmp_path / "moved"
    first.rename(moved_to)  # the folder the copy's manifests were read from is gone
    out = run_pipeline(cfg.replace(root=str(moved_to)))
    assert copied.ran == () and out.ran == ()  # every stage kept: their keys hold no path
    root = str(moved_to / Path(before.root).relative_to(cfg.root))
    assert out.root == root
    named = [out.spm_model, out.shortlist, *(f for pair in out.text.values() for f in pair),
             *(out.manifests[k]["vocab_path"] for k in out.manifests
               if k.startswith(("encoded/", "batches/")))]
    for path in named:
        assert path.startswith(root + "/") and Path(path).is_file(), path
    assert out.manifests["spm"]["vocab_path"] == out.spm_model
    assert out.manifests["shortlist"]["table"] == out.shortlist
    assert [lines(Path(f)) for pair in out.text.values() for f in pair] == \
        [lines(Path(f)) for pair in before.text.values() for f in pair]
    load(out.spm_model)  # (the model itself, read back)
    # the same place again: the paths are the ones it wrote
    assert run_pipeline(cfg).manifests == before.manifests


def write_hub_layout(shared_data: Path, folder: Path) -> None:
    """newstest files as parquet laid out like hub wmt/wmt14 (fr-en/<split>-*.parquet)."""
    hub_names = {"train": "train", "valid": "validation", "test": "test"}
    (folder / "fr-en").mkdir(parents=True)
    for split, name in NEWSTEST.items():
        en, fr = (lines(shared_data / "wmt14-en-fr" / f"{name}.{x}") for x in ("en", "fr"))
        rows = [{"translation": {"en": s, "fr": t}} for s, t in zip(en, fr)]
        n_files = 2 if split == "train" else 1
        per = -(-len(rows) // n_files)
        for i in range(n_files):
            name = f"{hub_names[split]}-{i:05d}-of-{n_files:05d}.parquet"
            pq.write_table(pa.Table.from_pylist(rows[i * per:(i + 1) * per]),
                           folder / "fr-en" / name, row_group_size=700)


def test_hub_parquet_and_ray_groupby_give_the_same_rows_and_shards(newstest, shared_data,
                                                                   tmp_path):
    """Another reader (hub-shaped parquet, one read task per row group) and the other exchange
    (Ray Data's groupby shuffle instead of spill files) give byte-identical shards."""
    cfg, out = newstest
    write_hub_layout(shared_data, tmp_path / "hub")
    hub = run_pipeline(cfg.replace(source=str(tmp_path / "hub"),
                                   splits={"train": "train", "valid": "validation",
                                           "test": "test"},
                                   root=str(tmp_path / "out"), exchange="ray"))
    assert Path(hub.spm_model).read_bytes() == Path(out.spm_model).read_bytes()
    for split in NEWSTEST:
        assert (read_rows(stage_folder(hub, "encoded", split))
                == read_rows(stage_folder(out, "encoded", split)))
        assert part_bytes(hub.batches[split]) == part_bytes(out.batches[split])
    for split in ("valid", "test"):
        for a, b in zip(hub.text[split], out.text[split]):
            assert Path(a).read_bytes() == Path(b).read_bytes()


def test_the_hub_path_reads_a_mirror_and_a_run_pinned_to_its_commit_is_the_same_data(
        newstest, shared_data, tmp_path, monkeypatch):
    """The hub source end to end (the hub is not reachable here: a mirror on loopback serves
    the same layout through the hub's API, as `--hub-endpoint` names one): the rows and shards
    are the local files'. The data is the commit the revision resolved to: when the branch
    moves, the run pinned to its commit (`--set data.hub_revision=<sha>`) is the same folder,
    every stage up to date; a folder keyed by the revision's name (made before 2026-12-07) is
    found and kept."""
    from hub_mirror import HubMirror

    from preprocessing import pipeline

    cfg, out = newstest
    write_hub_layout(shared_data, tmp_path / "hub")
    old, new = "1" * 40, "2" * 40
    with HubMirror(tmp_path / "hub", {"main": old}) as hub:
        hub_cfg = cfg.replace(source="hub", hub_repo="wmt/wmt14", hub_config="fr-en",
                              hub_revision="main", root=str(tmp_path / "out"),
                              splits={"train": "train", "valid": "validation", "test": "test"})
        first = run_pipeline(hub_cfg, hub_endpoint=hub.url)
        reads = [r for r in hub.requests if "/resolve/" in r]
        assert reads and all(r.startswith(f"GET /datasets/wmt/wmt14/resolve/{old}/")
                             for r in reads)  # every read at the commit, not the branch
        for split in NEWSTEST:
            assert part_bytes(first.batches[split]) == part_bytes(out.batches[split])
        hub.commits["main"] = new  # the branch moves
        pinned = run_pipeline(hub_cfg.replace(hub_revision=old), hub_endpoint=hub.url)
        assert (pinned.root, pinned.ran, pinned.batches) == (first.root, (), first.batches)
        # as the code before made it: keyed by "main", cleaned under that name
        monkeypatch.setattr(pipeline, "_by_commit", lambda cfg: False)
        hub.commits["main"] = old
        before = run_pipeline(hub_cfg, hub_endpoint=hub.url)
        monkeypatch.undo()
        again = run_pipeline(hub_cfg, hub_endpoint=hub.url)
        # (the folder of this data keyed by name, made before, is taken over the one keyed by
        # commit: a run that trained from it refuses another folder's batches)
        assert Path(before.root).name != Path(first.root).name
        assert (again.root, again.ran) == (before.root, ())
        # that run's branch moves; pinned to its commit, it finds its folder by the name its
        # workflow recorded (workflow.json's data_keyed_by), every stage up to date
        hub.commits["main"] = new
        pinned_before = run_pipeline(hub_cfg.replace(hub_revision=old),
                                     hub_endpoint=hub.url, revision_names=("main",))
        assert (pinned_before.root, pinned_before.ran) == (before.root, ())
    # The hub gone (offline, a rate limit): data cleaned already is what its stages recorded,
    # every stage up to date (a run could not resume, go on or be scored without the hub);
    # data never cleaned is the hub's error, as before
    from workflows.cluster import free_port

    gone = f"http://127.0.0.1:{free_port()}"  # (nothing there)
    offline = run_pipeline(hub_cfg.replace(hub_revision=old), hub_endpoint=gone)
    assert (offline.root, offline.ran) == (first.root, ())
    # (main: the one commit its stages read; the folder keyed by its name, as above)
    assert run_pipeline(hub_cfg, hub_endpoint=gone).ran == ()
    with pytest.raises(PreprocessError, match="cannot reach the Hugging Face hub"):
        run_pipeline(hub_cfg.replace(hub_config="de-en"), hub_endpoint=gone)


def test_text_read_by_a_task_per_block_gives_the_same_stages_byte_for_byte(newstest, tmp_path,
                                                                           monkeypatch):
    """Large uncompressed text is read by a task per block of lines from byte offsets
    (`reading.line_index`; these files are small, so the threshold is set to 0): the same
    rows in every stage and the same batches byte for byte. (The cleaned and encoded parts
    are a block each, as a parquet source's are; one task's blocks were merged by Ray Data's
    output buffer into parts of up to 128 MiB.)"""
    from preprocessing import reading

    cfg, out = newstest
    monkeypatch.setattr(reading, "INDEX_BYTES", 0)
    indexed = run_pipeline(cfg.replace(root=str(tmp_path / "indexed")))
    for split in NEWSTEST:
        for stage in ("clean", "encoded"):
            assert read_rows(stage_folder(indexed, stage, split)) == \
                read_rows(stage_folder(out, stage, split)), (stage, split)
        assert len(part_bytes(stage_folder(indexed, "clean", "train"))) == 4  # 3,003 lines
        assert part_bytes(indexed.batches[split]) == part_bytes(out.batches[split])


def test_another_batch_cut_reuses_the_encoded_data_and_keeps_the_first_cut(newstest):
    """Another token budget on prepared data (`--set data.max_tokens=N`, to keep the paper's
    update on fewer GPUs): the cleaned, BPE and encoded stages are reused, only the batches
    are cut again, into a folder of their own; the first cut, which a run may be training
    from, stays as it was."""
    cfg, out = newstest
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # noqa: E731
    first = {split: part_bytes(out.batches[split]) for split in NEWSTEST}
    half = cfg.replace(max_tokens=cfg.max_tokens // 2)
    again = run_pipeline(half)
    assert again.root == out.root and again.spm_model == out.spm_model
    for stage in ("spm", *(f"{kind}/{split}" for kind in ("clean", "encoded")
                           for split in NEWSTEST)):
        # skipped, not redone: the manifest as written (its time included)
        assert same(again.manifests[stage], out.manifests[stage]), stage
    for split in NEWSTEST:
        assert Path(again.batches[split]).parent != Path(out.batches[split]).parent
        m, m0 = again.manifests[f"batches/{split}"], out.manifests[f"batches/{split}"]
        assert m["max_tokens"] == half.max_tokens and m["rows_kept"] == m0["rows_kept"]
        assert m["batches"] > m0["batches"]
        assert all(b["padded_tokens"] <= half.max_tokens for b in read_rows(again.batches[split]))
        assert part_bytes(out.batches[split]) == first[split]
    # the first budget again: its cut is found, nothing runs
    back = run_pipeline(cfg)
    assert back.batches == out.batches
    assert same(back.manifests, out.manifests)


def test_other_test_files_under_one_split_name_have_folders_of_their_own(newstest):
    """Two runs on the same training and validation data (one data folder) scoring other
    files named `test`: each split's cleaned, encoded and batched rows are in folders keyed by
    its input, so the second neither replaces the first's nor has the first's rows encoded
    under its manifest (folders named by the split alone were replaced by each run in turn), and
    the first run's rerun finds its own stages, nothing to redo."""
    cfg, out = newstest
    first = {kind: part_bytes(stage_folder(out, kind, "test")) for kind in ("clean", "encoded")}
    first["batches"] = part_bytes(out.batches["test"])
    other = run_pipeline(cfg.replace(splits={**NEWSTEST, "test": NEWSTEST["valid"]}))
    assert other.root == out.root  # the same data: only the test split's input differs
    assert Path(other.batches["test"]).name != Path(out.batches["test"]).name
    assert set(other.ran) == {"clean/test", "encoded/test", "batches/test"} | {
        s for s in other.ran if s.startswith("text/")}
    assert other.manifests["clean/test"]["rows_in"] == out.manifests["clean/valid"]["rows_in"]
    assert read_rows(stage_folder(other, "encoded", "test")) == \
        read_rows(stage_folder(out, "encoded", "valid"))
    for kind in ("clean", "encoded"):
        assert part_bytes(stage_folder(out, kind, "test")) == first[kind], kind
    assert part_bytes(out.batches["test"]) == first["batches"]
    again = run_pipeline(cfg)
    assert again.ran == () and again.batches == out.batches


KILLED_RUN = """
import json, sys, ray
from preprocessing.config import PreprocessConfig
from preprocessing.pipeline import run_pipeline
ray.init(address=sys.argv[1], log_to_driver=False)
run_pipeline(PreprocessConfig(**json.loads(sys.argv[2])))
"""


@pytest.mark.slow
def test_killed_stage_reruns_to_identical_shards(newstest, ray_session, tmp_path):
    cfg, out = newstest
    cfg2 = cfg.replace(root=str(tmp_path / "out"))
    task = data_dir(cfg2)  # <root>/<task>/<data key>
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, ray_session.get_runtime_context().gcs_address,
         json.dumps(cfg2.to_dict())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # SIGKILL the driver once the encoding stage has written its first part
    kill_when(proc, lambda: list(task.glob("encoded/.train.partial-*/part-*.parquet")),
              "encoding never started")
    killed_at = time.time_ns()
    assert not (task / "encoded" / "train").exists()  # the half-done stage is not "complete"
    again = run_pipeline(cfg2)
    assert not list(task.rglob(".*.partial-*"))
    for split in NEWSTEST:  # same input and seed -> byte-identical shards, rows once each
        assert part_bytes(again.batches[split]) == part_bytes(out.batches[split])
        assert (read_rows(stage_folder(again, "encoded", split))
                == read_rows(stage_folder(out, "encoded", split)))
    # stages finished before the kill were skipped, not redone
    assert (task / "clean" / "train" / "manifest.json").stat().st_mtime_ns < killed_at


def test_bad_rows_are_dropped_and_counted(ray_session, shared_data, tmp_path):
    en = lines(shared_data / "news-commentary-5k" / "nc-5k.en")[:300]
    fr = lines(shared_data / "news-commentary-5k" / "nc-5k.fr")[:300]
    pairs = [(s.encode(), t.encode()) for s, t in zip(en, fr)]
    pairs += [(b"caf\xe9 latin-1 bytes", b"caf\xc3\xa9"), (b"a NUL \x00 here", b"un NUL"),
              (b"x" * 70_000, b"trop long"), (b"", b"vide"), pairs[0], pairs[1]]
    (tmp_path / "bad.en").write_bytes(b"\n".join(p[0] for p in pairs) + b"\n")
    (tmp_path / "bad.fr").write_bytes(b"\n".join(p[1] for p in pairs) + b"\n")
    cfg = PreprocessConfig(task="bad", source=str(tmp_path), splits={"train": "bad"},
                           dedupe=True, vocab_size=400, root=str(tmp_path / "out"))
    out = run_pipeline(cfg)
    # Rows the reader accepts: the corpus, the empty pair and the two repeated pairs.
    plain_en, plain_fr = en + ["", en[0], en[1]], fr + ["vide", fr[0], fr[1]]
    expected = independent_drops(plain_en, plain_fr)
    survivors = [(s, t) for s, t in zip(plain_en, plain_fr) if not independent_drops([s], [t])]
    expected["duplicate"] = len(survivors) - len(set(survivors))
    expected.update(invalid_utf8=1, nul_byte=1, line_too_long=1)
    m = out.manifests["clean/train"]
    assert m["rows_in"] == len(pairs) and m["dropped"] == expected
    assert m["rows_kept"] == len(pairs) - sum(expected.values())


def test_evaluation_text_leaves_out_rows_without_a_pair_and_says_so(ray_session, shared_data,
                                                                     tmp_path, caplog):
    """The evaluation text is what is translated and scored. A TSV row without exactly one tab,
    a JSONL line that is no row, a line too long to read: none has a source and a reference to
    tell apart, so each is left out (never scored as the raw line, reference included, against
    an empty reference), counted by reason beside the other stages' drops and named by line in
    the log. A row that is not UTF-8 is still a pair: both sides are kept, U+FFFD for the bytes
    that are not, and counted."""
    en = lines(shared_data / "news-commentary-5k" / "nc-5k.en")[:300]
    fr = lines(shared_data / "news-commentary-5k" / "nc-5k.fr")[:300]
    (tmp_path / "train.en").write_text("\n".join(en) + "\n")
    (tmp_path / "train.fr").write_text("\n".join(fr) + "\n")
    (tmp_path / "test.tsv").write_bytes(b"\n".join([
        b"the house\tla maison", b"an extra tab\tthe reference\tnotes",
        b"caf\xe9 noir\tcaf\xc3\xa9",
        b"x" * 70_000 + b"\ttrop long", b"the last one\tle dernier"]) + b"\n")
    (tmp_path / "valid.jsonl").write_bytes(b"\n".join([
        json.dumps({"translation": {"en": "a small cat", "fr": "un petit chat"}}).encode(),
        b'{"translation": {"en": "no end", "fr": "sans fin"',
        b'{"translation": {"en": "caf\xe9 au lait", "fr": "caf\xc3\xa9 au lait"}}']) + b"\n")
    cfg = PreprocessConfig(task="evaltext", source=str(tmp_path), vocab_size=400,
                           splits={"train": "train", "valid": "valid", "test": "test"},
                           root=str(tmp_path / "out"))
    with caplog.at_level("INFO", logger="preprocessing"):
        out = run_pipeline(cfg)
    assert [lines(Path(p)) for p in out.text["test"]] == [
        ["the house", "caf\ufffd noir", "the last one"], ["la maison", "caf\u00e9", "le dernier"]]
    assert [lines(Path(p)) for p in out.text["valid"]] == [
        ["a small cat", "caf\ufffd au lait"], ["un petit chat", "caf\u00e9 au lait"]]
    m = out.manifests["text"]
    assert {k: m["splits"]["test"][k] for k in ("rows_in", "rows_kept", "dropped",
                                                  "left_out_rows", "kept_not_utf8")} == {
        "rows_in": 5, "rows_kept": 3, "dropped": {"bad_row": 1, "line_too_long": 1},
        "left_out_rows": [2, 4], "kept_not_utf8": 1}
    assert m["splits"]["valid"]["dropped"] == {"bad_row": 1}
    assert (m["rows_in"], m["rows_kept"], m["dropped"]) == (8, 5, {"bad_row": 2,
                                                                    "line_too_long": 1})
    said = [r.getMessage() for r in caplog.records]
    assert any("text/test (test): 2 of 5 rows left out" in x and "rows 2, 4" in x
               for x in said), said
    assert any(x.startswith("[text/") and "8 in, 5 kept, dropped: bad_row=2, line_too_long=1"
               in x for x in said), said
    from preprocessing.cli import summary

    assert "left out: bad_row=1, line_too_long=1" in summary(out).splitlines()[-1]


def test_bad_inputs_fail_with_clear_errors(ray_session, tmp_path):
    (tmp_path / "m.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "m.fr").write_text("un\ndeux\n")
    (tmp_path / "e.en").write_text("")
    (tmp_path / "e.fr").write_text("")
    base = PreprocessConfig(task="err", source=str(tmp_path), root=str(tmp_path / "out"),
                            vocab_size=300)
    with pytest.raises(PreprocessError,
                       match=r"line count mismatch: .*m\.en has 3 lines but .*m\.fr has 2"):
        run_pipeline(base.replace(splits={"train": "m"}))
    with pytest.raises(PreprocessError, match=r"e\.en is empty; a corpus file needs one"):
        run_pipeline(base.replace(splits={"train": "e"}))
    assert not list((tmp_path / "out").rglob("manifest.json"))  # no stage written as complete
    assert not list((tmp_path / "out").rglob(".*.partial-*"))


def test_rows_no_pair_can_be_read_from_say_what_the_first_line_holds(ray_session, tmp_path):
    """A .tsv of three columns (WikiMatrix's score, source, target) or a .jsonl of another
    shape had every row dropped as bad_row, and the error said "check the languages / row
    shape and the filters" with the counts as a Python dict: it names the first line's
    fields or keys and the shape this run reads."""
    (tmp_path / "w.tsv").write_text("".join(f"1.0{chr(9)}hello {i}{chr(9)}bonjour {i}\n"
                                            for i in range(20)))
    (tmp_path / "j.jsonl").write_text("".join(f'{{"en": "a {i}", "fr": "b {i}"}}\n'
                                              for i in range(20)))
    base = PreprocessConfig(task="err", source=str(tmp_path), root=str(tmp_path / "out"),
                            vocab_size=300, splits={"train": "w", "valid": "j"})
    with pytest.raises(PreprocessError) as err:
        run_pipeline(base)
    assert str(err.value).endswith(
        "all 20 rows were dropped (bad_row=20); " + f"{tmp_path / 'w.tsv'}'s first line has 3 "
        "tab-separated fields; a .tsv pair is en<TAB>fr, two fields (keep those two columns, "
        "e.g. `cut -f2,3`)"), err.value
    with pytest.raises(PreprocessError) as err:
        run_pipeline(base.replace(splits={"train": "j", "valid": "w"}))
    assert str(err.value).endswith(
        f"{tmp_path / 'j.jsonl'}'s first line has keys ['en', 'fr']; row_shape translation "
        'reads {"translation": {"en": ..., "fr": ...}}, row_shape columns (--set '
        'data.row_shape=columns) {"en": ..., "fr": ...}'), err.value


def test_an_error_raised_in_a_ray_task_reaches_the_cli_as_one_line(ray_session, tmp_path,
                                                                   monkeypatch, capsys):
    # Too large to count on the driver (threshold lowered here): the reading task finds the
    # mismatch, Ray wraps the error, and the command line still prints our one line.
    from preprocessing import sources
    from preprocessing.cli import main

    monkeypatch.setattr(sources, "PAIRING_CHECK_BYTES", 0)
    (tmp_path / "m.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "m.fr").write_text("un\ndeux\n")
    (tmp_path / "v.en").write_text("four\n")
    (tmp_path / "v.fr").write_text("quatre\n")
    out = tmp_path / "out"
    rc = main(["--task", "demo", "--source", str(tmp_path), "--out", str(out),
               "--split", "train=m", "--split", "valid=v", "--split", "test=v"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and "Traceback" not in err and "\x1b[" not in err, err
    assert len(errors) == 1 and errors[0].startswith("error: line count mismatch: "), err
    assert f"{tmp_path / 'm.fr'} ends after 2 lines but {tmp_path / 'm.en'} has more" in errors[0]
    assert not list(out.rglob("manifest.json"))  # nothing written as complete


def test_demo_source_runs_end_to_end(ray_session, tmp_path):
    from preprocessing import demo

    cfg = PreprocessConfig(task="demo", source="demo", vocab_size=500, spm_sample_pairs=2000,
                           splits={"train": "train", "valid": "valid"},
                           demo_rows={"train": 3000, "valid": 200}, block_rows=1000,
                           root=str(tmp_path))
    out = run_pipeline(cfg)
    assert out.manifests["clean/train"]["rows_in"] == 3000
    pairs = demo.translation_pairs(cfg.seed, 3000, 200)  # valid follows train's index range
    assert lines(Path(out.text["valid"][0])) == [normalize(s) for s, _ in pairs]
    assert sum(len(b) for b in [r["id"] for r in read_rows(out.batches["train"])]) == \
        out.manifests["batches/train"]["rows_kept"]


def test_a_split_whose_every_sentence_is_dropped_from_the_batches_stops_the_run(ray_session,
                                                                               tmp_path):
    """A token budget no sentence fits: the run stops, naming the split, its drops and the fix,
    where it published a batches folder with no batch (training then failed, "no parquet batch
    shards ... run preprocessing first"); the stages before it stay, its own output does not."""
    cfg = PreprocessConfig(task="demo", source="demo", vocab_size=500, spm_sample_pairs=400,
                           splits={"train": "train", "valid": "valid"},
                           demo_rows={"train": 400, "valid": 40}, block_rows=400, max_tokens=1,
                           root=str(tmp_path))
    with pytest.raises(PreprocessError, match=r"^batches/train ") as found:
        run_pipeline(cfg)
    encoded = json.loads((data_dir(cfg) / "encoded" / "train" / "manifest.json").read_text())
    n = encoded["rows_kept"]
    assert n > 300 and str(found.value) == (
        f"batches/train (demo: train): all {n:,} sentences were dropped (over_max_tokens={n:,}): "
        "not one fits a batch (max_tokens=1, in pieces with EOS); raise max_tokens (--set "
        "data.max_tokens=N) or max_positions (the model's) above the sentences' length in "
        "pieces, or check the split's input")
    assert not list((data_dir(cfg) / "batches").rglob("manifest.json"))
    assert not list((data_dir(cfg) / "batches").rglob("part-*.parquet"))
    assert not list(tmp_path.rglob(".*.partial-*"))


def _preprocess_from_the_command_line(ctx):
    """`python -m preprocessing` as a user runs it (its own local Ray, console to a pipe):
    French -> English cut from one file pair by line ranges. First Ctrl-C (SIGINT to its
    process group, as a terminal sends it) as the BPE stage starts, then the same command
    again. Shares nothing with the session's Ray: it runs in the background
    (tests/conftest.py, `Background`). Then SIGTERM to another run 2 s in. Returns (the
    interrupted run, its output folder, the rerun, the run sent SIGTERM); None without
    ../shared/data (the tests skip)."""
    import signal
    import threading
    from types import SimpleNamespace

    from conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        return None
    out = ctx.tmp_path_factory.mktemp("preprocessing_cli")
    env = {k: v for k, v in ctx.env.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, "-m", "preprocessing", "--task", "translation", "--src", "fr",
           "--tgt", "en", "--source", str(SHARED_DATA / "news-commentary-5k"),
           "--split", "train=nc-5k[:4500]", "--split", "valid=nc-5k[4500:4750]",
           "--split", "test=nc-5k[4750:]", "--vocab-size", "1000", "--out", str(out)]
    repo = Path(__file__).resolve().parents[1]
    proc = ctx.popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True)
    # (a run that hangs before its BPE stage, or after Ctrl-C, is killed: the tests then fail)
    deadline = threading.Timer(600, os.killpg, (proc.pid, signal.SIGKILL))
    deadline.start()
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "[spm] running" in line:  # the cleaning stages are done
                os.killpg(proc.pid, signal.SIGINT)
                break
        rest, _ = proc.communicate()
    finally:
        deadline.cancel()
    stopped = SimpleNamespace(returncode=proc.returncode, console="".join(seen) + rest)
    rerun = ctx.run(cmd, cwd=repo, env=env, timeout=600)
    # SIGTERM (`ray job stop`, a machine's shutdown) while Ray starts, in a folder of its own:
    # Ray's own handler, in place from the middle of `ray.init`, exited with status 15. Sent
    # once the command's Ray session folder appears (named with the driver's pid), not after
    # a fixed time, which on a slow host landed in the imports and on a fast one after Ray.
    sessions = Path(env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp") / "ray"  # (Ray's)
    termed = ctx.popen([*cmd[:-1], str(out) + "-sigterm"], cwd=repo, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline_s = time.monotonic() + 120
    while time.monotonic() < deadline_s and termed.poll() is None \
            and not list(sessions.glob(f"session_*_{termed.pid}")):
        time.sleep(0.05)
    starting = bool(list(sessions.glob(f"session_*_{termed.pid}")))
    termed.send_signal(signal.SIGTERM)
    try:
        console, _ = termed.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(termed.pid, signal.SIGKILL)
        console, _ = termed.communicate()
    sigterm = SimpleNamespace(returncode=termed.returncode, console=console, starting=starting)
    return stopped, out, rerun, sigterm


BACKGROUND_RUNS = {"preprocessing_cli": _preprocess_from_the_command_line}


@pytest.fixture(scope="module")
def preprocessing_cli(background):
    return background.result("preprocessing_cli")


@pytest.mark.slow
def test_the_command_line_takes_any_pair_and_its_console_is_the_stage_lines(shared_data,
                                                                             preprocessing_cli):
    """`python -m preprocessing` as a user runs it (`_preprocess_from_the_command_line`); the
    console holds the stage lines and the summary, Ray Data's per-dataset INFO lines stay in
    Ray's log folder."""
    _, _, proc, _ = preprocessing_cli
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("train", "valid", "test")}
    assert rows == {"train": "4,500", "valid": "250", "test": "250"}, proc.stdout
    err = proc.stderr.splitlines()
    assert not [line for line in err if "Starting execution of Dataset" in line
                or "Execution plan" in line or "\r" in line], proc.stderr[-3000:]
    assert len(err) < 60, "\n".join(err)
    assert not alarming_lines(proc.stdout + proc.stderr), proc.stderr[-3000:]
    # Ray's own banner is not there (its ANSI colours in a pipe): one line names its log folder
    (ray,) = [line for line in err if " Ray: " in line]
    assert " Ray: local instance, " in ray and ray.endswith(" (Ray Data's in ray-data/)"), ray
    logs = ray.removesuffix(" (Ray Data's in ray-data/)").rsplit(": ", 1)[1]
    assert Path(logs, "ray-data", "ray-data.log").is_file(), ray
    assert not [line for line in err if "Started a local Ray instance" in line]


@pytest.mark.slow
def test_ctrl_c_stops_the_command_line_in_one_line_and_the_same_command_goes_on(
        shared_data, preprocessing_cli):
    """Ctrl-C as the BPE stage starts (`_preprocess_from_the_command_line`): exit 130 and one
    line naming where the finished stages are, no KeyboardInterrupt traceback; the same
    command then skips exactly the stages that had finished (the cleaning ones at least) and
    runs the rest."""
    stopped, out, rerun, _ = preprocessing_cli
    assert stopped.returncode == 130, stopped.console[-3000:]
    assert "Traceback" not in stopped.console and "KeyboardInterrupt" not in stopped.console, \
        stopped.console[-3000:]
    (said,) = [line for line in stopped.console.splitlines() if line.startswith("interrupted")]
    before = stopped.console.split(said)[0]  # the stages it ran: their lines, nothing alarming
    assert "[clean/train] done in" in before and not alarming_lines(before), before[-3000:]
    assert said == (f"interrupted: finished stages are kept under {out}; the same command goes "
                    "on from there")
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    def stages(console: str, what: str) -> set[str]:
        return set(re.findall(r"\[(\S+)\] " + what, console))

    finished = stages(stopped.console, "done in")
    assert {"clean/train", "clean/valid", "clean/test"} <= finished, stopped.console[-3000:]
    assert stages(rerun.stderr, "up to date, skipped") == finished, rerun.stderr[-3000:]
    assert stages(rerun.stderr, "running") == stages(rerun.stderr, "done in") - finished
    assert "spm" in stages(rerun.stderr, "done in") | finished


def test_gigawords_test_split_spells_unknown_words_as_its_training_data(ray_session, shared_data,
                                                                       tmp_path):
    """Gigaword's training data writes an unknown word `<unk>`, its test split (Rush et al.'s
    pairs) `UNK` ("japan 's nec corp. and UNK computer corp. ..."): the model would meet `UNK`
    in a test document as pieces of text it never saw there. The preset maps it to the
    training data's spelling in every split, in the cleaned rows and in the text it scores;
    only whole words (`UNKNOWN` stays)."""
    from preprocessing import config as pconfig

    sample = shared_data / "gigaword-sample"
    docs, titles = lines(sample / "article.txt")[:400], lines(sample / "title.txt")[:400]
    assert any("<unk>" in d for d in docs)  # the training data's spelling
    (tmp_path / "train.document").write_text("\n".join(docs) + "\n")
    (tmp_path / "train.summary").write_text("\n".join(titles) + "\n")
    (tmp_path / "test.document").write_text(
        "japan 's nec corp. and UNK computer corp. of the united states said wednesday they "
        "had agreed to join forces in supercomputer sales .\nthe UNKNOWN soldier UNK .\n")
    (tmp_path / "test.summary").write_text("nec UNK in computer sales tie-up\nan UNK\n")
    cfg = pconfig.gigaword().replace(source=str(tmp_path), splits={"train": "train",
                                                                   "test": "test"},
                                     vocab_size=400, spm_sample_pairs=400,
                                     root=str(tmp_path / "out"))
    assert cfg.token_map == {"UNK": "<unk>"}
    out = run_pipeline(cfg)
    src, tgt = (Path(p).read_text().splitlines() for p in out.text["test"])
    assert src == ["japan 's nec corp. and <unk> computer corp. of the united states said "
                   "wednesday they had agreed to join forces in supercomputer sales .",
                   "the UNKNOWN soldier <unk> ."]
    assert tgt == ["nec <unk> in computer sales tie-up", "an <unk>"]
    rows = pa.concat_tables([pq.read_table(p) for p in
                             sorted(Path(stage_folder(out, "clean", "test")).glob("*.parquet"))])
    assert "UNK " not in " ".join(rows["src"].to_pylist()) + " "
    assert normalize("a UNK b", {"UNK": "<unk>"}) == "a <unk> b" == \
        normalize("a\u00a0<unk>  b", {"UNK": "<unk>"})
    # The map is part of the data's key (data without one keeps the key it had before the
    # setting existed: an unset map is left out of it).
    assert data_dir(cfg.replace(token_map={})) != data_dir(cfg)
    with pytest.raises(ValueError, match="token_map maps whole words to whole words"):
        cfg.replace(token_map={"two words": "x"})


@pytest.mark.slow
def test_sigterm_while_ray_starts_stops_the_command_line_as_ctrl_c(shared_data,
                                                                  preprocessing_cli):
    """SIGTERM to `python -m preprocessing` (`_preprocess_from_the_command_line`) while Ray
    starts (once its session folder appears): the same one line as Ctrl-C, exit 130, no
    traceback (Ray's own SIGTERM handler, in place from the middle of `ray.init`, exited with
    status 15)."""
    *_, sigterm = preprocessing_cli
    assert sigterm.starting, "the command's Ray session never appeared"
    assert sigterm.returncode == 130, sigterm.console[-3000:]
    assert "Traceback" not in sigterm.console and "SystemExit" not in sigterm.console
    (said,) = [line for line in sigterm.console.splitlines() if line.startswith("interrupted")]
    assert said.startswith("interrupted: finished stages are kept under "), said


@pytest.mark.parametrize("kind", ["dashboard", "dead head"])
def test_a_ray_address_the_command_line_cannot_join_is_one_line(tmp_path, kind):
    """`python -m preprocessing` joins RAY_ADDRESS as every Ray command of the project does
    (`storage.ray_join`): an address it cannot join stops it at once with one `error:` line,
    the password hidden, exit 2 (it was Ray's traceback, or minutes of Ray's connection
    retries and C++ warnings)."""
    from workflows.cluster import free_port

    port = free_port()
    address = (f"http://admin:s3cret@127.0.0.1:{port}" if kind == "dashboard"
               else f"127.0.0.1:{port}")
    env = {**os.environ, "RAY_ADDRESS": address, "CONVS2S_RAY_JOIN_WAIT_S": "1"}
    proc = subprocess.run([sys.executable, "-m", "preprocessing", "--task", "demo", "--out",
                           str(tmp_path / "out")], cwd=Path(__file__).resolve().parents[1],
                          env=env, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: RAY_ADDRESS=") and "s3cret" not in lines[0]
    assert "unset RAY_ADDRESS to run on this machine" in lines[0]
    if kind == "dashboard":
        assert "ray job submit --working-dir . -- python -m preprocessing" in lines[0]
    else:
        assert "nothing answers at" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing started


def test_on_several_nodes_preprocessing_asks_each_for_its_inputs_and_output(
        ray_session, tmp_path, monkeypatch, capsys):
    """Ray Data's read and write tasks run on any node: on a cluster of several nodes the
    output root and a --source folder's files are asked of each node first
    (storage.ray_join.node_not_seeing, run for real in tests/test_multinode.py; here it stands
    in for a node that does not see the training text): one line naming the node and the
    file, exit 2, no stage run."""
    from preprocessing.cli import main
    from storage import ray_join

    src = tmp_path / "corpus"
    src.mkdir()
    for name in ("train", "validation", "test"):
        (src / f"{name}.en").write_text("a house .\nthe cat .\n")
        (src / f"{name}.fr").write_text("une maison .\nle chat .\n")
    asked = []

    def unseen_train(folder, also=()):
        asked.append((folder, set(also)))
        return "10.0.0.7", str(src / "train.en")

    monkeypatch.setattr(ray_join, "node_not_seeing", unseen_train)
    rc = main(["--task", "demo", "--source", str(src), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (f"error: {src / 'train.en'} is not shared: the node at 10.0.0.7 does not "
                      "see it, and Ray Data's read and write tasks run there (inputs and output "
                      "go in a folder every node mounts: NFS / EFS / a shared volume, or a "
                      "bucket); give such folders as --out and --source, or bucket URIs "
                      "(s3://BUCKET/PREFIX)")
    assert asked == [(str(tmp_path / "out"), {str(src / f"{name}.{lang}") for name in (
        "train", "validation", "test") for lang in ("en", "fr")})]
    assert not (tmp_path / "out" / "demo").exists()  # no stage ran
