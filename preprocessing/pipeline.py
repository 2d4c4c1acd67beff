"""The preprocessing pipeline: clean -> spm -> encoded -> batches (+ text), each a Ray Data stage.
(With a fixed vocabulary, e.g. a checkpoint's for fine-tuning, there is no spm stage.)

    from preprocessing.config import demo
    from preprocessing.pipeline import run_pipeline
    out = run_pipeline(demo().replace(root="/tmp/prep"))
    out.batches["train"]   # <root>/<task>/<data key>/batches/<cut key>/train (parquet)

Output layout `<root>/<task>/<data key>/<stage>/` (see docs/design.md; `data_dir`):
clean/<split>, spm, encoded/<split>, batches/<cut key>/<split> (one folder per batch cut:
`BATCH_CUT`; an evaluation split's folders are `<split>.<input key>`: `split_folder`),
text/<text key>/<split>.<lang>, and with
`shortlist_per_source` the lexical table of vocabulary selection, shortlist/<shortlist key>/
(lexical.py; one folder per k and sample: `SHORTLIST`).
Each stage is skipped when its manifest matches (same stage config and the same input
fingerprint) and otherwise rebuilt atomically (stages.py).
Each stage is a Ray Data pipeline: a datasource in (reading.py, parts.py), map_batches, a
grouping exchange where rows must meet across the split (exchange.py), and `PartSink` (parts.py)
out, which writes the parts and counts every row kept or dropped. The encoder tasks read and
write their parts themselves, each worker process loading the vocabulary once (encoding.py
says why). The driver only sees counts and the bounded BPE sample.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import ray
import ray.data  # noqa: F401 - imported with the pipeline, not inside the first stage

from preprocessing.batching import (BATCH_SCHEMA, add_window, batch_stats, batch_window,
                                    n_windows_for)
from preprocessing.cleaning import (CLEAN_SCHEMA, clean_block, clean_rows, clean_stats, unspaced,
                                    dedupe_group, normalize_block)
from preprocessing.config import PreprocessConfig
from preprocessing.encoding import SentencePieceVocabulary, encode_parts
from preprocessing.errors import PreprocessError, user_errors
from preprocessing.lexical import TABLE_FILE, build_table
from preprocessing.exchange import group_by
from preprocessing.parts import PartSink, read_stage, write_stage
from preprocessing.reading import read_split
from preprocessing.sources import (SplitSource, bad_rows_hint, resolve_split,
                                   shared_training_lines)
from preprocessing.stages import (PIPELINE_VERSION, config_hash, dropped_counts, execution_settings,
                                  finished, no_space, stage_output, write_manifest)
from preprocessing.vocab import BOS, EOS, PAD, UNK, learn_bpe, load, sample_pairs
from storage import local_copy, location, remove_tree, written_locally
from storage import ray_join
from storage.signals import quiet_interrupted_datasets, sigterm_as_ctrl_c

log = logging.getLogger("preprocessing")
quiet_interrupted_datasets()  # a Ctrl-C inside a Dataset's constructor: no traceback after


@dataclass
class PipelineOutput:
    """Where a finished run's outputs are (design.md): paths are absolute."""

    root: str  # <root>/<task>/<data key> (data_dir)
    spm_model: str  # the joint sentencepiece model ("" for a fixed vocabulary without one)
    vocab_size: int  # source vocabulary (joint: both sides)
    batches: dict[str, str]  # split -> batches folder (one parquet row per batch)
    text: dict[str, tuple[str, str]]  # eval split -> (source text, target text)
    manifests: dict[str, dict]  # "clean/train", "spm", "encoded/valid", ..., "text"
    shortlist: str | None = None  # the lexical table of vocabulary selection, if made
    tgt_vocab_size: int = 0  # the target vocabulary when it is not the joint one (else 0)
    # A fixed vocabulary's files (run_pipeline(vocabulary=)): they travel with the weights.
    text_files: tuple[str, ...] = ()
    # The stages this call ran ("clean/train", "spm", ...); the others were up to date and
    # skipped. Empty: nothing was made again (a resumed run's output, as it was).
    ran: tuple[str, ...] = ()


def _fp(*manifests: dict) -> str:
    """Input fingerprint of a stage fed by these stages' outputs."""
    return config_hash([[m["config_hash"], m["input_fingerprint"]] for m in manifests])


def _stage(task_dir: Path, stage: str, stage_cfg: dict, input_fp: str, body,
           folder: str | None = None, ran: list[str] | None = None) -> dict:
    """Run `body(tmp_dir) -> manifest fields` unless a matching manifest exists; the output
    is <task_dir>/<folder> (default: the stage's name). A stage run is added to `ran`."""
    cfg_hash = config_hash({"pipeline_version": PIPELINE_VERSION, **stage_cfg})
    where = task_dir / (folder or stage)
    done = finished(where, cfg_hash, input_fp)
    if done is not None:
        log.info("[%s] up to date, skipped", stage)
        return done
    log.info("[%s] running", stage)
    t0 = time.monotonic()
    try:
        with stage_output(where) as tmp:
            info = body(tmp)
            manifest = {"stage": stage, "config": stage_cfg, "config_hash": cfg_hash,
                        "input_fingerprint": input_fp, **info,
                        "seconds": round(time.monotonic() - t0, 2)}
            write_manifest(tmp, manifest)
    except OSError as e:  # on the driver: the BPE model, the text export, a manifest
        raise (no_space(getattr(e, "filename", None) or where, e) or e) from None
    log.info("[%s] done in %.1f s%s", stage, manifest["seconds"], _brief(manifest))
    if ran is not None:
        ran.append(stage)
    return manifest


def _here(manifest: dict, **paths) -> dict:
    """A stage's manifest with the paths it holds into the data folder (`paths`) where that
    folder is now. A stage's key holds no path, so a data folder moved, or copied to another
    bucket, keeps its stages; the paths its manifests were written with may name the old place
    (gone, or another copy that may change or go later): the output reads the folder it is in."""
    return {**manifest, **paths}


def _brief(m: dict) -> str:
    if "rows_in" not in m:
        return ""
    drops = ", ".join(f"{k}={v:,}" for k, v in m.get("dropped", {}).items()) or "none"
    return f": {m['rows_in']:,} in, {m['rows_kept']:,} kept, dropped: {drops}"


def _checked(label: str, rows: int | None, expected: int, what: str) -> None:
    if rows is not None and rows != expected:
        raise RuntimeError(f"{label}: {rows} rows {what} but {expected} expected")


def _clean(cfg: PreprocessConfig, split: str, src: SplitSource, tmp: Path) -> dict:
    ds = read_split(src, cfg)
    opts = {"src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang, "row_shape": cfg.row_shape,
            "max_len": cfg.max_len, "max_len_ratio": cfg.max_len_ratio,
            "max_line_bytes": cfg.max_line_bytes, "token_map": dict(cfg.token_map) or None}
    label = f"clean/{split}"
    # batch_size=None: each block the reader yields (<= block_rows rows) is one part.
    if cfg.dedupe and split == "train":
        n_buckets = min(4096, max(1, src.estimated_rows() // 250_000))
        rows = ds.map_batches(clean_rows, batch_size=None, batch_format="pyarrow",
                              fn_kwargs={**opts, "n_buckets": n_buckets, "seed": cfg.seed})
        out, scattered = group_by(rows, key="bucket", n_keys=n_buckets, fn=dedupe_group,
                                  fn_kwargs={}, how=cfg.exchange, spill_dir=tmp / ".buckets",
                                  label=label)
        sink = PartSink(tmp, part_key="bucket", schema=CLEAN_SCHEMA, stats_fn=clean_stats,
                        key_digits=6, label=label)
    else:
        out, scattered = ds.map_batches(clean_block, batch_size=None, batch_format="pyarrow",
                                        fn_kwargs=opts), None
        sink = PartSink(tmp, part_key="part", schema=CLEAN_SCHEMA, stats_fn=clean_stats,
                        label=label)
    totals = write_stage(out, sink)
    remove_tree(tmp / ".buckets")
    _checked(label, scattered, totals.get("rows_in", 0), "spilled")
    where = f"split {split!r} ({cfg.source}: {cfg.splits[split]})"
    dropped = dropped_counts(totals)
    if not totals.get("rows_in"):
        raise PreprocessError(f"{where} is empty: no rows to read; check the input files")
    if not totals["rows_kept"]:
        counts = ", ".join(f"{k}={v:,}" for k, v in dropped.items())
        why = bad_rows_hint(src, cfg) if max(dropped, key=dropped.get, default="") == \
            "bad_row" else ""
        raise PreprocessError(f"{where}: all {totals['rows_in']:,} rows were dropped "
                              f"({counts}); " + (why or "check the languages / row shape and "
                                                 "the filters"))
    return {"rows_in": totals["rows_in"], "rows_kept": totals["rows_kept"], "dropped": dropped,
            "tokens": {"src_words": totals["src_words"], "tgt_words": totals["tgt_words"]},
            "source": src.fingerprint}


# (sentencepiece learns on 1 thread; a task lost with its node runs again, twice at most;
# scheduled on the cluster, never inside the caller's placement group: a sweep's trial, a Ray
# Tune actor, captures its child tasks into its own, which has no CPU for them)
_LEARN_BPE = ray.remote(num_cpus=1, max_retries=2, scheduling_strategy="DEFAULT")(learn_bpe)


def _spm(cfg: PreprocessConfig, task_dir: Path, clean_train: dict, tmp: Path) -> dict:
    ds = execution_settings(read_stage(task_dir / "clean" / "train", ["id", "src", "tgt"]))
    with user_errors():
        blocks = sample_pairs(ds, clean_train["rows_kept"], cfg.spm_sample_pairs, cfg.spm_seed)
        # in a task: a cluster runs this driver on its head node, which need not have the
        # memory nor the CPU the sample and the trainer take (preprocessing.vocab)
        rows = ray.get(_LEARN_BPE.remote(blocks, cfg.spm_sample_pairs, str(tmp / "spm"),
                                         cfg.vocab_size, cfg.character_coverage))
    sp = load(local_copy(tmp / "spm.model"))
    return {"vocab_path": str(task_dir / "spm" / "spm.model"), "vocab_size": sp.get_piece_size(),
            "sample_pairs": rows, "special_ids": {"bos": BOS, "pad": PAD, "eos": EOS,
                                                             "unk": UNK}}


def _fixed(vocabulary) -> dict:
    """The manifest of a vocabulary given to run_pipeline (not learned: no stage folder)."""
    return {"stage": "vocabulary", "config_hash": vocabulary.fingerprint,
            "input_fingerprint": "", "from": getattr(vocabulary, "folder", None),
            "kind": getattr(vocabulary, "kind", None), "files": list(vocabulary.files),
            "vocab_path": vocabulary.spm_model, "vocab_size": vocabulary.src_size,
            "tgt_vocab_size": vocabulary.tgt_size}


def _encode(cfg: PreprocessConfig, task_dir: Path, split: str, spm_m: dict, vocabulary,
            clean_m: dict, tmp: Path, folder: str) -> dict:
    label = f"encoded/{split}"
    actors = cfg.encode_tasks or max(1, int(ray.cluster_resources().get("CPU", 1)))
    totals = encode_parts(str(task_dir / "clean" / folder), str(tmp), vocabulary, actors, label)
    _checked(label, totals.get("rows_in", 0), clean_m["rows_kept"], "encoded")
    return {"rows_in": totals["rows_in"], "rows_kept": totals["rows_kept"], "dropped": {},
            "tokens": {k: totals[k] for k in ("src_tokens", "tgt_tokens", "src_unk", "tgt_unk")},
            "vocab_path": spm_m["vocab_path"], "vocab_size": spm_m["vocab_size"]}


def _batches(cfg: PreprocessConfig, task_dir: Path, split: str, enc_m: dict, tmp: Path,
             folder: str) -> dict:
    label = f"batches/{split}"
    n_windows = n_windows_for(enc_m["rows_kept"], cfg.shuffle_window)
    rows = read_stage(task_dir / "encoded" / folder).map_batches(
        add_window, batch_size=None, batch_format="pyarrow",
        fn_kwargs={"n_windows": n_windows, "seed": cfg.seed})
    out, scattered = group_by(rows, key="window", n_keys=n_windows, fn=batch_window, fn_kwargs={
        "max_tokens": cfg.max_tokens, "max_sentences": cfg.max_sentences, "seed": cfg.seed,
        "max_positions": cfg.max_positions},
        how=cfg.exchange, spill_dir=tmp / ".windows", label=label)
    _checked(label, scattered, enc_m["rows_kept"], "spilled")
    t = write_stage(out, PartSink(tmp, part_key="window", schema=BATCH_SCHEMA,
                                  stats_fn=batch_stats, key_digits=6, label=label))
    remove_tree(tmp / ".windows")
    _checked(label, t.get("rows_in", 0), enc_m["rows_kept"], "batched")
    if not t["rows_kept"]:  # (raised inside the stage: its parts are removed, not published)
        raise _no_batches(cfg, split, t["rows_in"], dropped_counts(t))
    real = t["src_tokens"] + t["tgt_tokens"]
    return {"rows_in": t["rows_in"], "rows_kept": t["rows_kept"], "dropped": dropped_counts(t),
            "batches": t["batches"],
            "tokens": {"src_tokens": t["src_tokens"], "tgt_tokens": t["tgt_tokens"],
                       "padded_tokens": t["padded_tokens"], "padded_slots": t["padded_slots"]},
            # real tokens / slots of the padded B x S and B x T tensors
            "padding_efficiency": round(real / max(1, t["padded_slots"]), 4),
            # how full the token budget is: sum of n * max(S, T) / (batches * max_tokens)
            "budget_fill": round(t["padded_tokens"] / max(1, t["batches"] * cfg.max_tokens), 4),
            "max_tokens": cfg.max_tokens, "max_sentences": cfg.max_sentences,
            "max_positions": cfg.max_positions,
            # pieces, EOS included: the largest step of the data is the budget filled with them
            "longest": {"src": t.get("longest_src", 0), "tgt": t.get("longest_tgt", 0)},
            "vocab_path": enc_m["vocab_path"], "vocab_size": enc_m["vocab_size"]}


def _no_batches(cfg: PreprocessConfig, split: str, rows: int,
                dropped: dict[str, int]) -> PreprocessError:
    """The error for a split none of whose sentences fits a batch: training would only find
    an empty folder later ("no parquet batch shards")."""
    drops = ", ".join(f"{k}={v:,}" for k, v in dropped.items())
    limits = f"max_tokens={cfg.max_tokens}" + (f", max_positions={cfg.max_positions}"
                                               if cfg.max_positions is not None else "")
    return PreprocessError(
        f"batches/{split} ({cfg.source}: {cfg.splits[split]}): all {rows:,} sentences were "
        f"dropped ({drops}): not one fits a batch ({limits}, in pieces with EOS); raise "
        "max_tokens (--set data.max_tokens=N) or max_positions (the model's) above the "
        "sentences' length in pieces, or check the split's input")


def _text(cfg: PreprocessConfig, sources: dict[str, SplitSource], tmp: Path, final) -> dict:
    """Evaluation splits as plain text, one line per input row, in input order; `final` is
    where the stage's files end up (its keyed folder). A row the reader could not take as a
    pair (cleaning.UNREADABLE) has no source and reference to score: it is left out, counted
    by reason, and its row number (a text file's line number) logged and kept in the manifest.
    Rows that are not UTF-8 stay, U+FFFD for their undecodable bytes, counted."""
    out = {}
    for split in cfg.eval_splits:
        ds = read_split(sources[split], cfg).map_batches(
            normalize_block, batch_size=None, batch_format="pyarrow",
            fn_kwargs={"src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang,
                       "row_shape": cfg.row_shape, "token_map": dict(cfg.token_map) or None,
                       "max_line_bytes": cfg.max_line_bytes})
        ds = execution_settings(ds)
        ds.context.execution_options.preserve_order = True  # input order = line order
        paths = [tmp / f"{split}.{cfg.src_lang}", tmp / f"{split}.{cfg.tgt_lang}"]
        n, kept, not_utf8, dropped, left_out = 0, 0, 0, {}, []
        first = (sources[split].lines or (0, None))[0]  # a line range's ids start there
        with written_locally(paths[0]) as src_file, written_locally(paths[1]) as tgt_file, \
                open(src_file, "w", encoding="utf-8") as fs, \
                open(tgt_file, "w", encoding="utf-8") as ft:
            with user_errors():
                for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                    ids = b["id"].to_pylist()
                    if ids != list(range(first + n, first + n + len(ids))):  # alignment is
                        # the whole point
                        raise RuntimeError(f"text/{split}: rows out of order at line {n}")
                    for i, s, t, reason, err in zip(ids, b["src"].to_pylist(),
                                                    b["tgt"].to_pylist(),
                                                    b["reason"].to_pylist(),
                                                    b["error"].to_pylist()):
                        if reason is None:
                            fs.write(s + "\n")
                            ft.write(t + "\n")
                            kept += 1
                            not_utf8 += err == "invalid_utf8"
                        else:
                            dropped[reason] = dropped.get(reason, 0) + 1
                            if len(left_out) < 20:
                                left_out.append(i + 1)
                    n += len(ids)
        if dropped:
            log.warning("text/%s (%s): %d of %d rows left out of the evaluation text, no "
                        "pair to read in them (%s), at row%s %s%s (a text file's line numbers)",
                        split, cfg.splits[split], n - kept, n,
                        ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())),
                        "s" if n - kept > 1 else "", ", ".join(map(str, left_out)),
                        ", ..." if n - kept > len(left_out) else "")
        if not_utf8:
            log.warning("text/%s (%s): %d rows are not UTF-8; scored with U+FFFD for their "
                        "undecodable bytes", split, cfg.splits[split], not_utf8)
        out[split] = {"rows_in": n, "rows_kept": kept, "dropped": dict(sorted(dropped.items())),
                      "left_out_rows": left_out, "kept_not_utf8": not_utf8,
                      "files": [str(final / p.name) for p in paths]}
    return {"rows_in": sum(o["rows_in"] for o in out.values()),
            "rows_kept": sum(o["rows_kept"] for o in out.values()),
            "dropped": {r: sum(o["dropped"].get(r, 0) for o in out.values())
                        for r in sorted({r for o in out.values() for r in o["dropped"]})},
            "splits": out}


# Bump when the text export of the same input changes (its folder key changes with it): 2, rows
# without a readable pair are left out (they were a blank line, or the raw line as the source).
TEXT_VERSION = 2

# What does not change the output: where it goes, how many encoder tasks, how rows meet; and
# the settings of the lexical table, a stage of its own beside the training data (its manifest
# holds them), like the evaluation-only text.
_NOT_OUTPUT = ("root", "encode_tasks", "exchange", "splits", "shortlist_per_source",
               "shortlist_sample_pairs")
# The batch cut: settings that only the batches stages read. They are not in the data key, so
# runs that differ only in them (another `--set data.max_tokens`, to keep the paper's update on
# fewer GPUs) share the cleaned, BPE and encoded stages, and each cuts its own batches into a
# folder of its own, batches/<cut key>/<split>, never replacing batches another run trains from.
BATCH_CUT = ("max_tokens", "max_sentences", "shuffle_window", "max_positions")


def cut_key(cfg: PreprocessConfig) -> str:
    """The batch cut's folder name: a hash of its settings (BATCH_CUT; max_positions only when
    set, so that cuts made before it existed keep their folders)."""
    return config_hash({k: getattr(cfg, k) for k in BATCH_CUT
                        if k != "max_positions" or cfg.max_positions is not None})[:12]


# The lexical table's settings (lexical.py), the name of its folder as BATCH_CUT's are the
# batches': runs asking for another k or another sample each build a table of their own,
# shortlist/<key>/shortlist.npz, and a table a run or a logged model was given is never rebuilt
# under its path.
SHORTLIST = ("shortlist_per_source", "shortlist_sample_pairs")


def shortlist_key(cfg: PreprocessConfig) -> str:
    """The lexical table's folder name: a hash of its settings (SHORTLIST)."""
    return config_hash({k: getattr(cfg, k) for k in SHORTLIST})[:12]


def split_folder(cfg: PreprocessConfig, split: str, source: SplitSource) -> str:
    """A split's folder in the clean, encoded and batches stages (clean/<folder>, ...). The
    training and validation inputs are in the data key, so their folders are their names. An
    evaluation split's input is not (runs scoring other test files share the data folder), so
    its folders carry a key of their input, `<split>.<key>`, as the evaluation text's folder
    does: two runs with other files under one split name each have their own, and neither
    replaces, or encodes, the other's rows. (A key has no '.', and a split name with one and
    12 hex digits after it would have to hash to them.)"""
    if split in ("train", "valid"):
        return split
    return f"{split}.{config_hash([cfg.splits[split], source.fingerprint])[:12]}"


def data_dir(cfg: PreprocessConfig, sources: dict[str, SplitSource] | None = None,
             vocabulary=None, by_revision: bool = False) -> Path:
    """`<root>/<task>/<data key>/`: the folder of this data. The key is the hash of the
    settings that decide the output, of the training and validation inputs (their source
    names and fingerprints) and of a fixed vocabulary's files, so runs on other data or
    settings write beside each other and never replace a folder another run trains from;
    evaluation-only splits are stages inside it. `sources` (resolved splits) is computed when
    not given.

    A hub dataset's data is the commit each input resolved to (in its fingerprint), not the
    revision's name: a branch and the commit it stood at are one folder, so a run whose branch
    moved goes on pinned to its commit (`--set data.hub_revision=<commit>`) with the stages and
    batches it trained on. `by_revision`: the key of folders made before 2026-12-07, which
    named the revision as given (`run_pipeline` still finds them)."""
    if sources is None:
        sources = {s: resolve_split(cfg, s) for s in ("train", "valid") if s in cfg.splits}
    settings = {k: v for k, v in cfg.to_dict().items()
                if k not in _NOT_OUTPUT and k not in BATCH_CUT
                and not (k == "token_map" and not v)}  # (unset: the keys folders had before)
    if _by_commit(cfg) and not by_revision:
        del settings["hub_revision"]
    inputs = {s: [cfg.splits[s], sources[s].fingerprint] for s in ("train", "valid")
              if s in sources}
    keyed = {"pipeline_version": PIPELINE_VERSION, "settings": settings, "inputs": inputs}
    if vocabulary is not None:
        keyed["vocabulary"] = vocabulary.fingerprint
    return location(cfg.root) / cfg.task / config_hash(keyed)[:12]


def run_pipeline(cfg: PreprocessConfig, hub_endpoint: str | None = None,
                 vocabulary=None, revision_names: tuple[str, ...] = ()) -> PipelineOutput:
    """Run (or resume) every stage of `cfg`'s task; Ray is started if it is not running, or
    joined where RAY_ADDRESS names a cluster (`storage.ray_join.RayAddressError`: one it cannot).

    `vocabulary` (encoding.py says what it is) fixes the token ids instead of learning a joint
    BPE: fine-tuning encodes new data with the model's own text pipeline. The BPE settings of
    `cfg` then do not apply.

    `revision_names`: hub revisions a folder of this data may have been keyed by before
    2026-12-07 (`data_dir`), besides `cfg.hub_revision`: a run that recorded `main` and is
    pinned to its commit now finds the folder it trained from."""
    cfg = cfg.replace(root=str(location(cfg.root)))
    sources = {s: resolve_split(cfg, s, hub_endpoint) for s in cfg.splits}  # fail fast, no Ray
    if shared := shared_training_lines(sources):
        split, first, end = shared
        upto = f"{end - 1:,}" if end is not None else "the end"
        raise PreprocessError(
            f"split {split!r} ({cfg.splits[split]}) reads lines {first:,} to {upto} of the "
            f"training split's files ({cfg.splits['train']}): its loss and scores would be on "
            "text the model and its BPE learned; " + (
                "give it other lines (NAME[first:end] ranges that do not meet) or other files"
                if sources["train"].kind in ("text", "tsv", "jsonl") else
                "map it to another split or other files"))
    if vocabulary is not None and cfg.shortlist_per_source and not vocabulary.spm_model:
        raise PreprocessError(f"shortlist_per_source={cfg.shortlist_per_source}: vocabulary "
                              "selection needs one joint vocabulary, and the fixed "
                              f"vocabulary {vocabulary!r} has one per language; set it to 0")
    task_dir, keyed_by = data_dir(cfg, sources, vocabulary), None
    if _by_commit(cfg):  # a hub folder made before, keyed by a revision's name: its own keys
        # (first: a run that trained from it refuses batches of another folder)
        for name in dict.fromkeys([cfg.hub_revision, *filter(None, revision_names)]):
            older = data_dir(cfg.replace(hub_revision=name), sources, vocabulary,
                             by_revision=True)
            if older.exists():
                task_dir, keyed_by = older, name
                break
    if not ray.is_initialized():  # RAY_ADDRESS joined (one line where it cannot), else local
        log.info("%s (Ray Data's in ray-data/)",
                 ray_join.start_or_join(submit="python -m preprocessing ..."))
    check_shared(cfg, sources)
    with sigterm_as_ctrl_c():  # (after Ray's start, which installs Ray's own handler)
        return _run_stages(cfg, sources, task_dir, vocabulary, keyed_by)


def check_shared(cfg: PreprocessConfig, sources: dict[str, SplitSource]) -> None:
    """On a cluster of several nodes, Ray Data's tasks read a local folder's files and write
    the stages' parts under the output root wherever they run: a node that does not see them
    failed its read tasks with a FileNotFoundError from inside Ray Data, or wrote parts to its
    own disk that the next stage looked for in vain (`ray_join.node_not_seeing`)."""
    files = tuple(f for src in sources.values() for f in src.files)
    if (unseen := ray_join.node_not_seeing(cfg.root, also=files)) is not None:
        address, what = unseen
        raise PreprocessError(
            f"{what} is not shared: the node at {address} does not see it, and Ray Data's "
            "read and write tasks run there (inputs and output go in a folder every node "
            "mounts: NFS / EFS / a shared volume, or a bucket)",
            "give such folders as --out and --source, or bucket URIs (s3://BUCKET/PREFIX)")


def _by_commit(cfg: PreprocessConfig) -> bool:
    """Whether `cfg`'s data is keyed by the commits its inputs resolved to (a hub dataset),
    not by its revision's name (`data_dir`)."""
    return cfg.source == "hub"


def _run_stages(cfg: PreprocessConfig, sources: dict[str, SplitSource], task_dir: Path,
                vocabulary, keyed_by: str | None = None) -> PipelineOutput:
    """Every stage of `run_pipeline`, in order; each is skipped when its output is up to date.
    `keyed_by`: `task_dir` is a hub folder made before 2026-12-07, whose cleaning stages were
    keyed by this revision's name (`data_dir`)."""
    m: dict[str, dict] = {}
    ran: list[str] = []
    stage = functools.partial(_stage, ran=ran)  # (each stage that runs is listed)
    clean_cfg = {k: v for k, v in cfg.to_dict().items() if k in (
        "source", "src_lang", "tgt_lang", "row_shape", "max_len", "max_len_ratio",
        "max_line_bytes", "hub_repo", "hub_config", "hub_revision", "seed")}
    if cfg.token_map:  # (only where set: the stages of other data keep their keys)
        clean_cfg["token_map"] = dict(cfg.token_map)
    if _by_commit(cfg):  # (the commit is in the input's fingerprint)
        if keyed_by is None:
            del clean_cfg["hub_revision"]
        else:
            clean_cfg["hub_revision"] = keyed_by
    if unspaced(cfg.src_lang) or unspaced(cfg.tgt_lang):  # (lengths in characters since
        clean_cfg["unspaced_lengths"] = 1  # 2026-12-06: folders made before are not reused)
    folders = {split: split_folder(cfg, split, src) for split, src in sources.items()}
    for split, src in sources.items():
        scfg = {**clean_cfg, "split": cfg.splits[split], "dedupe": cfg.dedupe and split == "train"}
        m[f"clean/{split}"] = stage(task_dir, f"clean/{split}", scfg, config_hash(src.fingerprint),
                                    lambda tmp, s=split, src=src: _clean(cfg, s, src, tmp),
                                    folder=f"clean/{folders[split]}")
    spm_cfg = {"vocab_size": cfg.vocab_size, "spm_sample_pairs": cfg.spm_sample_pairs,
               "spm_seed": cfg.spm_seed, "character_coverage": cfg.character_coverage}
    if vocabulary is None:  # learn the joint BPE
        m["spm"] = _here(stage(task_dir, "spm", spm_cfg, _fp(m["clean/train"]),
                               lambda tmp: _spm(cfg, task_dir, m["clean/train"], tmp)),
                         vocab_path=str(task_dir / "spm" / "spm.model"))
        vocabulary = SentencePieceVocabulary(m["spm"]["vocab_path"], m["spm"]["vocab_size"])
        vocab_m = m["spm"]
    else:
        vocab_m = m["vocabulary"] = _fixed(vocabulary)
    batch_cfg = {**{k: getattr(cfg, k) for k in BATCH_CUT  # (as cut_key: unset, not there)
                    if k != "max_positions" or cfg.max_positions is not None}, "seed": cfg.seed}
    cut = cut_key(cfg)
    for split in cfg.splits:
        name = folders[split]
        m[f"encoded/{split}"] = _here(stage(
            task_dir, f"encoded/{split}", {}, _fp(vocab_m, m[f"clean/{split}"]),
            lambda tmp, s=split, f=name: _encode(cfg, task_dir, s, vocab_m, vocabulary,
                                                 m[f"clean/{s}"], tmp, f),
            folder=f"encoded/{name}"), vocab_path=vocab_m["vocab_path"])
        m[f"batches/{split}"] = _here(stage(
            task_dir, f"batches/{split}", batch_cfg, _fp(m[f"encoded/{split}"]),
            lambda tmp, s=split, f=name: _batches(cfg, task_dir, s, m[f"encoded/{s}"], tmp, f),
            folder=f"batches/{cut}/{name}"), vocab_path=vocab_m["vocab_path"])
    if cfg.shortlist_per_source:  # vocabulary selection's lexical table (lexical.py)
        short_cfg = {"k": cfg.shortlist_per_source,
                     "sample_pairs": cfg.shortlist_sample_pairs}
        short_dir = f"shortlist/{shortlist_key(cfg)}"
        table = str(task_dir / short_dir / TABLE_FILE)
        m["shortlist"] = _here(stage(
            task_dir, "shortlist", short_cfg, _fp(m["encoded/train"]),
            lambda tmp: {"table": table, **build_table(
                task_dir / "encoded" / "train", vocab_m["vocab_path"], vocab_m["vocab_size"],
                cfg.shortlist_per_source, cfg.shortlist_sample_pairs,
                m["encoded/train"]["rows_kept"], tmp, cfg.exchange)}, folder=short_dir),
            table=table)
    if cfg.eval_splits:
        text_cfg = {k: v for k, v in clean_cfg.items()
                    if k not in ("max_len", "max_len_ratio", "unspaced_lengths")}
        text_cfg["text_version"] = TEXT_VERSION
        text_cfg["splits"] = {s: cfg.splits[s] for s in cfg.eval_splits}
        text_fp = config_hash([sources[s].fingerprint for s in cfg.eval_splits])
        # Keyed by its splits and their inputs: runs scoring other test sets (other --test-set
        # values) on the same data each have their own folder, never rewrite another's.
        text_dir = f"text/{config_hash([text_cfg, text_fp])[:12]}"
        text = stage(task_dir, text_dir, text_cfg, text_fp,
                     lambda tmp: _text(cfg, sources, tmp, task_dir / text_dir))
        m["text"] = _here(text, splits={s: _here(o, files=[
            str(task_dir / text_dir / location(f).name) for f in o["files"]])
            for s, o in text["splits"].items()})
    return PipelineOutput(
        root=str(task_dir), spm_model=vocab_m["vocab_path"], vocab_size=vocab_m["vocab_size"],
        batches={s: str(task_dir / "batches" / cut / folders[s]) for s in cfg.splits},
        text={s: tuple(m["text"]["splits"][s]["files"]) for s in cfg.eval_splits},
        manifests=m, shortlist=m["shortlist"]["table"] if "shortlist" in m else None,
        tgt_vocab_size=vocab_m.get("tgt_vocab_size", 0) if "vocabulary" in m else 0,
        text_files=tuple(vocab_m["files"]) if "vocabulary" in m else (), ran=tuple(ran))
