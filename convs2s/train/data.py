"""Which batch rows each rank trains on in each epoch, as a plan that depends only on the data's
files, the seed, the epoch and the number of ranks: a run resumed in a new driver (after a
worker, node or driver death) trains exactly the rows its interrupted epoch had not trained,
on every rank, whatever reads the files.

Ray Data's `streaming_split` hands blocks to whichever rank asks first and its file shuffle
reseeds per execution; a new driver reproduces neither, so skipping "the first k rows" after a
resume repeated some rows and skipped others. Here, for epoch e:

1. the files (one parquet row per batch, preprocessing's `batches/train`) are permuted with a
   generator seeded by (seed, e);
2. their rows, in that order, are cut into `world` equal contiguous ranges: rank r trains
   range r (the remainder, fewer than `world` rows, waits for another epoch's order, as Ray
   Data's equal split drops it);
3. each rank shuffles its range in windows of `shuffle_buffer` rows, seeded by (seed, e, r):
   a window spans one or two files, so reading stays sequential;
4. a run resumed after `done` rows of the epoch on each rank (every rank takes the same number
   of rows per update) skips them; resumed on another number of ranks, the rows the old ranks
   had not trained are cut again into equal ranges of the new number. A checkpoint keeps the
   epoch's cuts, (rows done, ranks) for each plan the epoch went through, so a run resumed
   twice in one epoch, the first time on another number of ranks, replays them in turn.

`read_rows` reads a plan's rows with pyarrow from the shared parquet files (`TrainJob` paths
are local or shared-filesystem paths), the next window's files in a background thread.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from convs2s.train.job import RunRefused
from storage import filesystem_of, is_uri, location


@dataclass(frozen=True)
class TrainFiles:
    """The training split's parquet files (sorted by name) and their row counts."""

    paths: tuple[str, ...]
    rows: tuple[int, ...]

    @classmethod
    def scan(cls, folder: str | Path) -> TrainFiles:
        """Row counts from the parquet footers (reading every file would take minutes at
        scale: 45 s for the 102k batches of 10M pairs on 2 CPUs)."""
        files = sorted(location(folder).glob("*.parquet"))  # local, or objects in a bucket
        return cls(tuple(str(f) for f in files), tuple(_rows(f) for f in files))

    @property
    def total(self) -> int:
        return sum(self.rows)

    def rows_per_rank(self, world: int) -> int:
        return self.total // world


def _rows(path) -> int:
    """A batch file's row count from its footer; a file that is not whole parquet is one line
    naming it."""
    fs, key = filesystem_of(path)
    try:
        return pq.read_metadata(key, filesystem=fs).num_rows
    except pa.ArrowInvalid as err:  # (not a storage error: those say what they are)
        raise RunRefused(f"{path}: not a readable parquet batch file ({err}); the batches "
                         "folder is damaged: copy it again, or rerun preprocessing") from None


def epoch_rows(files: TrainFiles, seed: int, epoch: int, world: int, rank: int,
               shuffle_buffer: int) -> np.ndarray:
    """Rank `rank`'s rows of epoch `epoch` in training order: an (n, 2) array of (file index,
    row in file), n = total rows // world."""
    order = np.random.default_rng([seed, epoch]).permutation(len(files.paths))
    refs = np.concatenate([np.stack([np.full(files.rows[f], f), np.arange(files.rows[f])], 1)
                           for f in order] or [np.zeros((0, 2), dtype=np.int64)])
    per = len(refs) // world
    mine = refs[rank * per:(rank + 1) * per]
    if shuffle_buffer > 1:
        rng = np.random.default_rng([seed, epoch, rank])
        for start in range(0, len(mine), shuffle_buffer):
            window = mine[start:start + shuffle_buffer]
            mine[start:start + shuffle_buffer] = window[rng.permutation(len(window))]
    return mine


def resumed_rows(files: TrainFiles, seed: int, epoch: int, world: int, rank: int,
                 shuffle_buffer: int, cuts: list[tuple[int, int]] = ()) -> np.ndarray:
    """Rank `rank`'s rows still to train in epoch `epoch`. `cuts`: the epoch's plans so far, in
    order, each as (rows done on each rank, ranks): the first plan is `epoch_rows` on its ranks;
    each next one cuts the rows the previous one had left into equal ranges of its ranks (a
    remainder, fewer than its ranks, waits for another epoch), and so does this one for `world`
    ranks. No cuts: the whole epoch."""
    cuts = [(int(d), int(w)) for d, w in cuts] or [(0, world)]
    if all(w == world for _, w in cuts):  # one plan all along: skip what was done
        return epoch_rows(files, seed, epoch, world, rank, shuffle_buffer)[sum(d for d, _ in cuts):]
    plans = [epoch_rows(files, seed, epoch, cuts[0][1], r, shuffle_buffer)
             for r in range(cuts[0][1])]
    for i, (done, _) in enumerate(cuts):
        rest = np.concatenate([p[done:] for p in plans])
        ranks = cuts[i + 1][1] if i + 1 < len(cuts) else world
        per = len(rest) // ranks
        plans = [rest[r * per:(r + 1) * per] for r in range(ranks)]
    return plans[rank]


def resume_point(saved_cuts: list | None, rows_done: int, saved_world: int,
                 world: int) -> tuple[list[tuple[int, int]], int, int]:
    """Where a run on `world` ranks resumes an epoch from a checkpoint that saved `rows_done`
    rows a rank on `saved_world` ranks and the epoch's cuts (`saved_cuts`, its last the plan it
    was on; None in checkpoints from before cuts were saved: one plan). Returns (the cuts
    before this run's plan, the rows each rank counts as done in the epoch, the count at which
    this run's plan began): the plan's rows are `resumed_rows(..., cuts + [(done - begun,
    world)])`. On as many ranks as the last plan had, that plan goes on; on another number its
    rows left are cut again, one cut more."""
    cuts = [(int(d), int(w)) for d, w in saved_cuts or [(rows_done, saved_world)]]
    done = rows_done * saved_world // world  # the same share of the epoch
    if cuts[-1][1] == world:  # the same plan goes on
        return cuts[:-1], done, done - cuts[-1][0]
    if len(cuts) == 1 and cuts[0][0] == 0:  # at the epoch's start: its own plan
        cuts = []
    return cuts, done, done


def read_file(path: str) -> pa.Table:
    """One training file, whole (a local path or an object's URI)."""
    fs, key = filesystem_of(path)
    return pq.read_table(key, filesystem=fs)


class BatchesChanged(ValueError):
    """A training file no longer holds the rows the run's plan was made from."""


def read_counted(files: TrainFiles, f: int) -> pa.Table:
    """File `f` of `files`, whole, refused (BatchesChanged) when its row count is not the one
    its footer had when the run planned its epochs: a file rewritten under a running run would
    otherwise give slices past its end (an empty batch) or rows of another cut. (Preprocessing
    never rewrites a finished folder; a file of the same row count rewritten by another tool
    is not told apart.)"""
    table = read_file(files.paths[f])
    if table.num_rows != files.rows[f]:
        raise BatchesChanged(
            f"{files.paths[f]} holds {table.num_rows:,} batch rows now, {files.rows[f]:,} when "
            "the run planned its epochs: the training batches changed under the run. Train on "
            "a folder nothing rewrites (preprocessing writes new data to a new one), under "
            "another --run-name")
    return table


def read_rows(files: TrainFiles, refs: np.ndarray, window: int = 256) -> Iterator[pa.Table]:
    """The rows `refs` names, in order, as one-row tables (zero-copy slices of the files they
    come from). Files are read whole (`read_counted`), the next window's in a background thread
    while this one trains; at most the files of two windows are held."""
    window = max(1, window)
    starts = range(0, len(refs), window)

    def needed(start: int) -> list[int]:
        return list(dict.fromkeys(int(f) for f in refs[start:start + window, 0]))

    tables: dict[int, concurrent.futures.Future] = {}
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="convs2s-read") as pool:
        def fetch(start: int) -> None:
            for f in needed(start):
                if f not in tables:
                    tables[f] = pool.submit(read_counted, files, f)

        if len(refs):
            fetch(0)
        for start in starts:
            if start + window < len(refs):
                fetch(start + window)  # read ahead while this window trains
            for f, row in refs[start:start + window]:
                yield tables[int(f)].result().slice(int(row), 1)
            keep = set(needed(start + window)) if start + window < len(refs) else set()
            for f in [f for f in tables if f not in keep]:
                del tables[f]


def split_files(train_data: str, valid_data: str) -> tuple[TrainFiles, TrainFiles]:
    """The training and validation splits' parquet files and row counts. Each rank plans and
    reads its own training rows of every epoch from them (convs2s.train.data), so a resumed
    run trains exactly the rows it had left; each reads the validation files whole and keeps
    its share by sentence id. Neither goes through Ray Data: the workers read the files with
    pyarrow, with or without Ray."""
    found = []
    for split, path in (("train", train_data), ("valid", valid_data)):
        d = location(path)
        if is_uri(d) and not (d / STAGE_MANIFEST).is_file():
            # In a bucket a stage is complete only once its manifest is there (written last):
            # parts without it are a killed or running writer's, never read.
            raise FileNotFoundError(
                f"{d} ({split} split) has no {STAGE_MANIFEST}: the preprocessing stage that "
                "writes it did not finish (killed, or still running); rerun preprocessing (the "
                "workflow redoes an unfinished stage) and train from its output")
        files = TrainFiles.scan(d) if d.is_dir() else TrainFiles((), ())
        if not files.paths:
            raise FileNotFoundError(
                f"no parquet batch shards in {d} ({split} split): run "
                "preprocessing.pipeline.run_pipeline first and pass PipelineOutput.batches"
            )
        # A folder copied in part (or parts removed) reads as a smaller split: trained on
        # without a word. Its manifest counts the batches written; batches made by other
        # tools, without one, are taken as they are.
        counted = read_manifest(d).get("batches")
        if counted is not None and int(counted) != files.total:
            raise RunRefused(
                f"{d} ({split} split) holds {files.total:,} batches in {len(files.paths)} "
                f"file(s), but its {STAGE_MANIFEST} counts {int(counted):,}: the folder is not "
                "the one preprocessing wrote (copied in part, or files removed or added); copy "
                "it whole again, or rerun preprocessing")
        found.append(files)
    return found[0], found[1]


def preflight(job, world: int) -> tuple[TrainFiles, TrainFiles]:
    """What both launchers (Ray Train's `fit`, `fit_local`) refuse before a run starts, each
    one line (RunRefused, or the checks' ValueError): a --run-name that is not one folder
    (storage.checks), data that is not what preprocessing wrote or that the run cannot use
    (its files against their manifest, positions, vocabulary, an update the split cannot fill
    on `world` ranks), a run folder holding a model it did not train (foreign_best), and a
    checkpoint to resume trained with another seed or on other batches (resume_problem).
    Returns the training and validation files."""
    from convs2s.io.checkpoint import foreign_best  # (here: the checks need no torch)
    from storage.checks import run_name_problem

    if problem := run_name_problem(job.run_name):
        raise RunRefused(problem)
    files, valid_files = split_files(job.train_data, job.valid_data)
    check_positions(job.model.max_positions, train=job.train_data, valid=job.valid_data)
    check_vocabulary(job)
    check_updates_fill(files.total, world, job.train.update_freq)
    if problem := foreign_best(location(job.storage_path) / job.run_name):
        raise RunRefused(problem)
    if problem := resume_problem(job, files, world):  # (the worker checks what it loads)
        raise RunRefused(problem)
    return files, valid_files


def resume_differences(saved: dict, data: dict | None, job, ours: dict,
                       world: int | None = None) -> list[str]:
    """How a checkpoint trained with the settings `saved` (its `seed` and `shuffle_buffer`; a
    key a checkpoint from before it was recorded lacks is not compared) on batches `data`
    (`data_identity`; None for a checkpoint from before it was recorded) differs from the run
    `job` asks on batches `ours`: the interrupted epoch goes on with the rows its plan had left,
    a plan made from the seed, the shuffle windows and the batch files, so another seed, another
    shuffle buffer or another cut of the data (another --train-data, --max-tokens, corpus)
    would train some rows twice and others never."""
    out = _optimizer_differences(saved, job.train)
    micro = saved.get("micro_batches_per_update")
    if world is not None and micro is not None and int(micro) != world * job.train.update_freq:
        out.append(f"{int(micro)} micro-batches an update there (ranks x update_freq), "
                   f"{world * job.train.update_freq} asked ({world} x {job.train.update_freq}): "
                   "another update size (the same product on another number of ranks resumes)")
    if (kind := saved.get("lr_schedule")) is not None and kind != job.train.lr_schedule:
        out.append(f"lr_schedule {kind} there, {job.train.lr_schedule} asked (the checkpoint "
                   "holds its schedule's state: another would take it for its own, and the lr "
                   "jump)")
    if (seed := saved.get("seed")) is not None and int(seed) != job.train.seed:
        out.append(f"seed {int(seed)} there, {job.train.seed} asked")
    if (buffer := saved.get("shuffle_buffer")) is not None \
            and max(int(buffer), 1) != max(job.train.shuffle_buffer, 1):  # (0 and 1: in order)
        out.append(f"shuffle_buffer {int(buffer)} there, {job.train.shuffle_buffer} asked")
    differ = [k for k, v in (data or {}).items()
              if v is not None and ours.get(k) is not None and ours[k] != v]
    if differ:
        out.append(f"other training batches than {job.train_data} ("
                   + ", ".join(f"{k} {data[k]} there, {ours[k]} here" for k in differ) + ")")
    return out


def _optimizer_differences(saved: dict, train) -> list[str]:
    """How the optimizer settings `saved` (OPTIMIZER_KEYS; a key an older checkpoint lacks is
    not compared) differ from TrainConfig `train`'s: those the saved optimizer uses (NAG's
    momentum, Adam's betas and eps, both's weight decay), or the optimizer itself."""
    from convs2s.config import OPTIMIZER_KEYS

    kind = saved.get("optimizer")
    if kind is not None and kind != train.optimizer:
        return [f"optimizer {kind} there, {train.optimizer} asked"]
    used = {"nag": ("momentum", "weight_decay"), "adam": ("adam_betas", "adam_eps",
                                                          "weight_decay")}.get(kind or "nag")
    out = []
    for key in OPTIMIZER_KEYS:
        there, ours = saved.get(key), getattr(train, key)
        if key in used and there is not None:
            same = (tuple(float(x) for x in there) == tuple(float(x) for x in ours)
                    if key == "adam_betas" else float(there) == float(ours))
            if not same:
                out.append(f"{key} {there} there, {ours} asked")
    return out


RESUME_FIX = ("resume with the run's own seed, shuffle_buffer, optimizer settings, lr schedule, "
              "update size and training batches, or give another --run-name for a new run")


def resume_problem(job, files: TrainFiles, world: int | None = None) -> str | None:
    """Why the run folder's latest checkpoint cannot be resumed by `job` (another seed, other
    batches: `resume_differences`, read from its meta.json), or None; checked before a
    worker starts, so that the refusal is one line under every launcher."""
    import json

    from convs2s.io.checkpoint import META_FILE, list_checkpoints

    run_dir = location(job.storage_path) / job.run_name
    kept = list_checkpoints(run_dir) if run_dir.is_dir() else []
    if not kept:
        return None
    meta = json.loads((location(kept[-1].path) / META_FILE).read_text())
    if "model_config" in meta and (differ := model_differences(meta, job)):
        return (f"{run_dir}: its checkpoint at update {kept[-1].update} " + model_refusal(differ))
    differ = resume_differences(meta, meta.get("train_data"), job,
                                data_identity(job.train_data, files), world)
    if not differ:
        return None
    return (f"{run_dir}: its checkpoint at update {kept[-1].update} was trained with "
            + "; ".join(differ) + f": {RESUME_FIX}")


def model_differences(state: dict, job) -> list[tuple[str, object, object]]:
    """(setting, the checkpoint's, `job`'s) for each way checkpoint `state`'s model (its
    model_config and vocabulary sizes: the checkpoint, or its meta.json) differs from the one
    `job` builds: its ModelConfig (defaults filled: a checkpoint from before a field existed
    has the default's) and vocabulary sizes. The dropout aside: the run's probe chooses it, and
    a fine-tuned model's differs from the checkpoint it came from."""
    from convs2s.config import ModelConfig

    theirs = ModelConfig.from_dict(state["model_config"]).replace(dropout=job.model.dropout)
    ours = job.model.to_dict()
    differ = [(k, v, ours[k]) for k, v in theirs.to_dict().items() if v != ours[k]]
    sizes = {"src_vocab_size": job.vocab_size,
             "tgt_vocab_size": job.tgt_vocab_size or job.vocab_size}
    return differ + [(k, state[k], v) for k, v in sizes.items() if k in state and state[k] != v]


def model_refusal(differ: list[tuple[str, object, object]]) -> str:
    """The words refusing to resume another model (`model_differences`)."""
    return ("is another model than the one asked ("
            + "; ".join(f"{k}: {theirs!r} in the checkpoint, {ours!r} asked"
                        for k, theirs, ours in differ[:3]) + (", ..." if len(differ) > 3 else "")
            + "): resume with the run's own model settings (its --model), or give another "
            "--run-name for a new run")


def data_identity(folder, files: TrainFiles) -> dict:
    """What makes a training split the same data, wherever it was copied: its batch stage's
    settings and input digests (the manifest's `config_hash`, `input_fingerprint`; None for
    batches made by other tools) and its batch count. A checkpoint records it; a resume on
    other batches is refused (`resume_problem`, and the worker's own check in
    convs2s.train.trainer)."""
    m = read_manifest(folder)
    return {"config_hash": m.get("config_hash"), "input_fingerprint": m.get("input_fingerprint"),
            "batches": files.total}


def check_vocabulary(job) -> None:
    """Refuse a vocabulary the batches were not encoded with (`job.spm_model`, `job.vocab_size`
    against the manifest's `vocab_size` and `vocab_path`): a smaller one stopped at the first
    update with an IndexError, a larger one, or another of the same size, trained a model whose
    checkpoints carry the wrong sentencepiece model, without a word."""
    m = read_manifest(job.train_data)
    if "vocab_size" not in m:
        return  # batches made by other tools: nothing to compare
    given = f"--spm-model {job.spm_model}" if job.spm_model else "the job's vocabulary"
    if job.vocab_size != int(m["vocab_size"]):  # (the source side's, or the joint one's)
        raise RunRefused(
            f"{given} has {job.vocab_size:,} pieces but {job.train_data} was encoded with a "
            f"vocabulary of {int(m['vocab_size']):,} ({m.get('vocab_path') or 'its manifest'}):"
            " give the spm model of that preprocessing output (its spm/spm.model)")
    used = m.get("vocab_path")
    if job.spm_model and used and str(location(used)) != str(location(job.spm_model)):
        try:
            same = location(used).read_bytes() == location(job.spm_model).read_bytes()
        except OSError:
            return  # the data's own model is not where it was (a copied folder): sizes only
        if not same:
            raise RunRefused(
                f"{given} is not the sentencepiece model {job.train_data} was encoded with "
                f"({used}, the same size, other pieces): give that one")


def check_updates_fill(batches: int, world: int, update_freq: int) -> None:
    """Refuse, before a worker starts, an update the training split cannot fill: each of the
    `world` ranks trains `batches // world` batch rows an epoch, `update_freq` to an update, so
    with fewer rows than that every update would be a smaller one than asked (none at all
    without a row)."""
    per_rank = batches // world
    if per_rank < update_freq:
        trained = "no update at all" if per_rank == 0 else \
            f"one update of {per_rank} micro-batch(es) an epoch, smaller than asked"
        raise ValueError(
            f"the training split has {batches:,} batch(es), {per_rank:,} for each of "
            f"{world} worker(s), and an update takes {update_freq} a worker: the run would "
            f"train {trained}. Use fewer workers, a smaller --update-freq, or smaller batches "
            "(a smaller max_tokens cuts more of them)")


def check_positions(max_positions: int, **folders) -> None:
    """Refuse, before a worker starts, batches with a sentence longer than the model's
    positions (the manifest's `longest`, pieces with EOS): training would stop at the first
    batch holding it, maybe hours in. `folders`: split name -> batches folder."""
    for split, folder in folders.items():
        longest = read_manifest(folder).get("longest") or {}
        side, n = max(((k, int(v or 0)) for k, v in longest.items()), key=lambda kv: kv[1],
                      default=("src", 0))
        if n > max_positions:
            raise ValueError(
                f"{folder} ({split} split) holds a {n}-piece {side} sentence, over the model's "
                f"max_positions={max_positions}: cut the batches with --set "
                f"data.max_positions={max_positions} (drops and counts such sentences; the "
                "workflows set it from the model), or train a model with more positions")


STAGE_MANIFEST = "manifest.json"  # written last by every preprocessing stage (docs/design.md)


def read_manifest(batches_folder) -> dict:
    """The manifest preprocessing wrote beside a split's batches (`max_tokens`, `longest`, the
    counts); {} where there is none or it does not parse (batches made by other tools)."""
    import json

    try:
        return json.loads((location(batches_folder) / STAGE_MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
