"""The training rows' plan as a specification (convs2s.train.data): every epoch each row is
trained by exactly one rank, in an order that depends only on the files, the seed, the epoch
and the number of ranks, so a resumed run trains exactly the rows its epoch had left, on the
same or on another number of ranks; and the reader returns exactly the planned rows.
No Ray: the plan is plain arithmetic on the files' row counts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from convs2s.train.data import TrainFiles, epoch_rows, read_rows, resume_point, resumed_rows


@pytest.fixture
def files(tmp_path) -> TrainFiles:
    """Seven parquet files of 1 to 40 batch rows; row i of file f has id 1000 * f + i."""
    sizes = [40, 1, 17, 33, 8, 25, 12]
    for f, n in enumerate(sizes):
        pq.write_table(pa.table({"id": [[1000 * f + i] for i in range(n)]}),
                       tmp_path / f"part-{f:03d}.parquet")
    return TrainFiles.scan(tmp_path)


def _ids(files: TrainFiles, refs: np.ndarray) -> list[int]:
    return [1000 * int(Path(files.paths[f]).stem[-3:]) + int(r) for f, r in refs]


def test_the_files_and_their_row_counts_come_from_the_footers(files):
    assert files.rows == (40, 1, 17, 33, 8, 25, 12) and files.total == 136
    assert files.rows_per_rank(3) == 45


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_each_row_is_trained_by_one_rank_and_every_rank_trains_as_many(files, world):
    for epoch in (1, 2):
        plans = [epoch_rows(files, 7, epoch, world, r, shuffle_buffer=10) for r in range(world)]
        assert {len(p) for p in plans} == {files.total // world}
        trained = Counter(i for p in plans for i in _ids(files, p))
        assert max(trained.values()) == 1
        assert files.total - len(trained) == files.total % world  # the remainder waits


def test_the_plan_depends_only_on_files_seed_epoch_and_ranks(files):
    a = epoch_rows(files, 7, 3, 2, 1, 10)
    assert np.array_equal(a, epoch_rows(files, 7, 3, 2, 1, 10))
    assert not np.array_equal(a, epoch_rows(files, 7, 4, 2, 1, 10))  # a new order each epoch
    assert not np.array_equal(a, epoch_rows(files, 8, 3, 2, 1, 10))
    # over epochs a rank meets rows of every file
    seen = {f for e in range(1, 9) for f, _ in epoch_rows(files, 7, e, 2, 0, 10)}
    assert seen == set(range(len(files.paths)))


def test_shuffling_stays_inside_windows_so_reads_stay_sequential(files):
    plain = epoch_rows(files, 7, 1, 1, 0, shuffle_buffer=0)
    shuffled = epoch_rows(files, 7, 1, 1, 0, shuffle_buffer=10)
    assert not np.array_equal(plain, shuffled)
    for start in range(0, len(plain), 10):
        assert sorted(map(tuple, plain[start:start + 10])) == \
            sorted(map(tuple, shuffled[start:start + 10]))


@pytest.mark.parametrize("done", [0, 1, 29, 67])
def test_a_resume_on_as_many_ranks_trains_exactly_the_rows_left(files, done):
    for rank in range(2):
        whole = epoch_rows(files, 7, 2, 2, rank, 10)
        assert np.array_equal(resumed_rows(files, 7, 2, 2, rank, 10, [(done, 2)]), whole[done:])


@pytest.mark.parametrize("before, after", [(2, 3), (3, 2), (2, 1)])
def test_a_resume_on_another_number_of_ranks_trains_each_row_left_once(files, before, after):
    done = 20
    trained = [i for r in range(before) for i in _ids(files, epoch_rows(files, 7, 2, before, r,
                                                                        10)[:done])]
    left = [i for r in range(after) for i in _ids(files, resumed_rows(files, 7, 2, after, r, 10,
                                                                      [(done, before)]))]
    per_rank = {len(resumed_rows(files, 7, 2, after, r, 10, [(done, before)]))
                for r in range(after)}
    assert len(per_rank) == 1  # equal shares: every rank stops at the same update
    assert not set(trained) & set(left) and len(set(left)) == len(left)
    planned = {i for r in range(before) for i in _ids(files, epoch_rows(files, 7, 2, before, r,
                                                                        10))}
    assert set(trained) | set(left) <= planned
    assert len(planned) - len(trained) - len(left) < after  # at most a remainder waits


@pytest.mark.parametrize("worlds", [(2, 4, 4), (2, 3, 2), (3, 2, 5, 1), (2, 2, 3), (4, 4, 4)])
def test_an_epoch_resumed_again_and_again_trains_each_row_at_most_once(files, worlds):
    # A run stopped after some rows on 2 ranks, resumed on 4, stopped again and resumed on 4
    # (or on 2 again, ...), as the Trainer does it: each run resumes from the last checkpoint
    # (resume_point), trains some rows of its plan (resumed_rows), and saves the epoch's cuts
    # and its rows done. Each plan goes on from the rows the one before had left.
    saved, trained = None, []
    for i, world in enumerate(worlds):
        cuts, done, begun = resume_point(*(saved or (None, 0, world)), world)
        plans = [resumed_rows(files, 7, 2, world, r, 10, [*cuts, (done - begun, world)])
                 for r in range(world)]
        assert len({len(p) for p in plans}) == 1  # equal shares: every rank stops together
        now = len(plans[0]) if i == len(worlds) - 1 else 5  # the last run ends the epoch
        trained += [i for p in plans for i in _ids(files, p[:now])]
        done += now
        saved = ([*cuts, (done - begun, world)], done, world)  # the checkpoint
    assert len(trained) == len(set(trained))  # no row twice
    assert files.total - len(trained) < sum(worlds)  # only the cuts' remainders wait
    # a checkpoint from before the cuts were saved resumes on its one plan
    assert resume_point(None, 12, 2, 2) == ([], 12, 0)
    assert resume_point(None, 12, 2, 4) == ([(12, 2)], 6, 6)
    assert resume_point([(0, 2)], 0, 2, 3) == ([], 0, 0)  # an epoch's start: its own plan


def test_the_reader_returns_the_planned_rows_in_order(files):
    refs = epoch_rows(files, 7, 5, 1, 0, 10)
    for window in (1, 3, 10, 1000):
        rows = list(read_rows(files, refs, window))
        assert all(t.num_rows == 1 for t in rows)
        assert [t["id"][0].as_py()[0] for t in rows] == _ids(files, refs)
    assert list(read_rows(files, refs[:0])) == []


def test_a_file_rewritten_under_the_run_is_refused_naming_it(files):
    # The plan was made from the footers' row counts: a file that now holds fewer rows would
    # give empty slices (a confusing collate error), more rows another cut of the data.
    from convs2s.train.data import BatchesChanged

    refs = epoch_rows(files, 7, 1, 1, 0, 10)
    shrunk = files.paths[3]
    pq.write_table(pa.table({"id": [[3000 + i] for i in range(5)]}), shrunk)
    with pytest.raises(BatchesChanged, match=rf"{shrunk} holds 5 batch rows now, 33 when the "
                                             "run planned its epochs: the training batches "
                                             "changed under the run"):
        list(read_rows(files, refs, 10))
    unchanged = [i for i, (f, _) in enumerate(refs) if f != 3]
    assert len(list(read_rows(files, refs[unchanged], 10))) == len(unchanged)


def test_batches_with_a_sentence_over_the_models_positions_are_refused_before_training(
        tmp_path):
    # The manifest preprocessing writes beside the batches says its longest sentences: a run
    # stops before a worker starts, not hours in at the batch that holds one.
    import json

    from convs2s.train.data import check_positions

    for split, longest in (("train", {"src": 300, "tgt": 40}), ("valid", {"src": 9, "tgt": 9})):
        (tmp_path / split).mkdir()
        (tmp_path / split / "manifest.json").write_text(json.dumps({"longest": longest}))
    with pytest.raises(ValueError, match=r"train split\) holds a 300-piece src sentence, over "
                                         r"the model's max_positions=256: cut the batches with "
                                         r"--set data.max_positions=256"):
        check_positions(256, train=tmp_path / "train", valid=tmp_path / "valid")
    check_positions(300, train=tmp_path / "train", valid=tmp_path / "valid")
    check_positions(256, valid=tmp_path / "valid", other=tmp_path / "nothing-there")
