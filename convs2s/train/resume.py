"""What a run may start from: the checkpoint it resumes (the same model, seed, shuffle buffer
and training batches, or a refusal naming what differs and the fix) and the trained model it
fine-tunes (`init_from`: the same architecture and vocabulary sizes), and whether the command
that started the run still holds its folder (`check_lease`)."""

from __future__ import annotations

from convs2s.io.checkpoint import CheckpointError, load_checkpoint, micro_batches_per_update
from convs2s.train.data import (RESUME_FIX, model_differences, model_refusal,
                                resume_differences)
from convs2s.train.job import RunRefused, TrainJob


class ResumeRefused(CheckpointError, RunRefused):
    """The checkpoint a rank was handed is not one this run may resume (another model, seed,
    optimizer or batches): the same on every rank, and the same on a retry, so it ends the run
    as one line under every launcher (returned, not raised, by a Ray Train worker:
    convs2s.train.trainer.STOPPING_ERRORS) instead of Ray Train restarting the group to fail
    the same way. `preflight` refuses the same from the newest checkpoint's meta.json."""


def initial_weights(job: TrainJob) -> dict:
    """The weights of `job.init_from` for the model `job` builds; a checkpoint of another
    architecture or vocabulary is a CheckpointError naming what differs."""
    state = load_checkpoint(job.init_from)
    differ = [f"{k} {theirs!r} (the run: {ours!r})" for k, theirs, ours
              in model_differences(state, job) if not k.endswith("vocab_size")]
    ours = (job.vocab_size, job.tgt_vocab_size or job.vocab_size)
    if (state["src_vocab_size"], state["tgt_vocab_size"]) != ours:
        differ.append(f"vocabulary sizes {state['src_vocab_size']} / {state['tgt_vocab_size']} "
                      f"(the run's data: {ours[0]} / {ours[1]})")
    if differ:
        raise CheckpointError(f"init_from={job.init_from}: its model differs from the one to "
                              f"train: {'; '.join(differ)}; fine-tuning keeps the checkpoint's "
                              "architecture and encodes the data with its vocabulary")
    return state["model"]


def check_same_model(state: dict, job: TrainJob, where) -> None:
    """Refuse to resume a run's checkpoint with another model (another --model, other
    layers, another vocabulary): `load_state_dict` would stop with a page of tensor shapes."""
    if differ := model_differences(state, job):
        raise ResumeRefused(f"{where}: the run's checkpoint {model_refusal(differ)}")


def check_same_training(state: dict, job: TrainJob, data: dict, where,
                        world: int | None = None) -> None:
    """Refuse to resume a run's checkpoint with another seed, another shuffle buffer or other
    training batches: the interrupted epoch goes on with the rows its plan had left
    (convs2s.train.data), a plan made from them (`resume_differences`; `preflight` refuses the
    same from the latest checkpoint's meta.json before any worker starts). A checkpoint from
    before the data was recorded: the settings are compared only."""
    saved = {**(state.get("train_config") or {}),
             "micro_batches_per_update": micro_batches_per_update(state)}
    if differ := resume_differences(saved, state.get("train_data"), job, data, world):
        raise ResumeRefused(f"{where}: the run's checkpoint was trained with "
                            + "; ".join(differ) + f": {RESUME_FIX}")


def check_lease(job: TrainJob, comm, before: str) -> None:
    """Every rank at once: stop (LeaseLost, on every rank, so that none waits for the others at
    a collective) when the run folder's lease `job.lease` is no longer the starting command's
    (storage.lease.LeaseRef.check, read by rank 0). A no-op without a lease, but collective
    still: a torchrun world passes the lease to rank 0 alone."""
    import logging

    from storage.lease import LeaseLost

    problem = None
    if comm.rank == 0 and job.lease is not None:
        try:
            job.lease.check(before)
        except LeaseLost as err:
            problem = str(err)
        except Exception as err:  # noqa: BLE001 - the storage did not answer: the run goes on
            # (the command's own heartbeat says when its lease is lost; a days-long run does
            # not stop at one unanswered read)
            logging.getLogger("convs2s.train").warning(
                "the run folder's lease could not be read before %s (%s); going on", before,
                type(err).__name__)
    if comm.world_size > 1:
        problem = comm.broadcast_object(problem)
    if problem is not None:
        raise LeaseLost(problem)


# How the updates are made, besides the optimizer's (refused, convs2s.train.data) and the lr
# (said by the trainer on resuming): a resume may change them, and says so
RECIPE_KEYS = ("label_smoothing", "clip_norm", "lr_shrink", "anneal_from_epoch",
               "warmup_updates", "warmup_init_lr", "min_lr")


def recipe_changes(saved: dict, cfg, state: dict | None = None, model=None) -> str:
    """'key there -> asked' for each RECIPE_KEYS setting the checkpoint's run had otherwise
    (a key an older checkpoint lacks is not compared); with the checkpoint's `state` and the
    asked `model`, its dropout too, unless the run's probe chose it (kept). (Not a model
    difference refused: a fine-tuned model's differs from the checkpoint it came from; changed
    on a resume it trained on at the new rate without a word.)"""
    changes = [f"{k} {saved[k]} -> {getattr(cfg, k)}" for k in RECIPE_KEYS
               if k in saved and saved[k] != getattr(cfg, k)]
    was = ((state or {}).get("model_config") or {}).get("dropout")
    if model is not None and was is not None and was != model.dropout \
            and not state.get("dropout_choice"):
        changes.append(f"model.dropout {was} -> {model.dropout}")
    return "; ".join(changes)


def budget_changes(saved: dict, cfg) -> str:
    """'key there -> asked' for each budget (max_epochs / max_updates / max_time) the
    checkpoint's run had otherwise."""
    return "; ".join(f"{k} {saved[k]} -> {getattr(cfg, k)}"
                     for k in ("max_epochs", "max_updates", "max_time")
                     if k in saved and saved[k] != getattr(cfg, k))
