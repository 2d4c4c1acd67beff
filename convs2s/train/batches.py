"""The loop's batches (convs2s.train.trainer): this rank's planned training rows collated into
padded tensors (checked against the model's positions), optionally padded further to a few
static shapes (`TrainConfig.static_shapes`, for CUDA graphs), and this rank's share of the
validation rows.

    batches = train_batches(read_rows(files, rows, shuffle_buffer), model.max_positions)
    batches = static_batches(batches, budget, static_shapes, model.max_positions)
    valid = list(valid_batches(valid_files, comm))
"""

from __future__ import annotations

import numpy as np

from convs2s.train.collate import collate_arrow, pad_to, static_shape
from convs2s.train.comm import Comm
from convs2s.train.data import TrainFiles, read_file


def train_batches(rows, max_positions: int):
    """Collated batches of this rank's rows (`convs2s.train.data.read_rows`)."""
    for table in rows:
        batch = collate_arrow(table)
        longest = max(batch.src_tokens.shape[1], batch.target.shape[1])
        if longest > max_positions:
            raise ValueError(
                f"batch with sentence ids {batch.ids[:5].tolist()} has a {longest}-token "
                f"sentence, over the model's max_positions={max_positions}: filter longer "
                "sentences in preprocessing or raise ModelConfig.max_positions")
        yield batch


def static_batches(batches, max_tokens: int, multiple: int, max_positions: int):
    """`batches` padded to static shapes (`TrainConfig.static_shapes`): the same loss and
    gradients, a few shapes. Without the batches' budget (no manifest) the ladder alone sets
    the sentence counts."""
    budget = max_tokens or 1 << 62
    for batch in batches:
        yield pad_to(batch, *static_shape(batch, budget, multiple, max_positions))


def valid_batches(files: TrainFiles, comm: Comm):
    """Every rank reads all validation rows, file by file in name order, and keeps (collates)
    those whose first sentence id falls to it: each row is validated once, on one rank, and no
    row is dropped to equalize the ranks' shares."""
    import pyarrow.compute as pc

    for path in files.paths:
        table = read_file(path)
        if "id" not in table.column_names:
            raise ValueError(f"{path}: validation batches without sentence ids (the `id` "
                             "column of docs/design.md's batches format); re-run preprocessing")
        first = pc.list_element(table.column("id"), 0).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(first % comm.world_size == comm.rank):
            yield collate_arrow(table.slice(int(i), 1))  # zero-copy row
