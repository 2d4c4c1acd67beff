"""Training: `job` (what a training job is given and returns: light, no torch), `data` (which
rows of the shared batch files each rank reads, in which order, resumably), `collate`
(`Batch`), `update` (one synchronous update: micro-batches, bf16 autocast, gradient all-reduce),
`optim` (the paper's Nesterov SGD, clipping, the lr schedule), `meter` (the log interval's sums
and the progress line), `trainer` (the `Trainer`: the loop's state, validation, checkpoints,
resume, limits) and `launch` (the Ray Train driver: placement, storage, MLflow run, result).

May import: torch, `convs2s.config`, `convs2s.precision`, `convs2s.model`, `convs2s.io`,
`convs2s.tracking`; Ray only in `trainer` and `launch`. Not `convs2s.inference`.
"""
