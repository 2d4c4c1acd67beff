"""Training: `job` (what a training job is given and returns: light, no torch), `data` (which rows
of the shared batch files each rank reads, in which order, resumably), `collate` (`Batch`),
`update` (one synchronous update: micro-batches, bf16 autocast, gradient all-reduce), `graphs`
(the forward and backward replayed from CUDA graphs, one per static batch shape), `optim` (the
paper's Nesterov SGD, clipping, the lr schedule), `meter` (the log interval's sums and the
progress line), `trainer` (`run_loop` and the `Trainer`: the loop's state, validation,
checkpoints, resume, limits), `batches` (the loop's training and validation batches), `resume`
(what a run may resume or fine-tune from), `faults` (fault injection for tests), `memory_fit`
(on a GPU, the data's largest step once before training: a budget the card cannot hold fails at
once with the largest that fits), `runtime` (what a launcher gives the loop: rank, device, the
checkpoint to resume from, where checkpoints go), `launch` (the Ray Train driver: placement,
storage, MLflow run, result) and `local` (the same loop in one process or a torchrun rank,
without Ray: `python -m convs2s train`).

May import: torch, `convs2s.config`, `convs2s.console` (Ctrl-C and SIGTERM during a run; a
worker's console lines), `convs2s.precision`, `convs2s.model`, `convs2s.io`, `convs2s.tracking`
(MLflow only when a run is tracked); Ray only in `launch` and inside `runtime.RayRuntime` /
`trainer.train_loop_per_worker`. Not `convs2s.inference`.
"""
