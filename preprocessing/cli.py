"""Run every preprocessing stage of a task and print a summary: `python -m preprocessing`.

    python -m preprocessing --task demo --out data/preprocessed
    python -m preprocessing --task wmt14_en_fr --source hub --out /shared/prep
    python -m preprocessing --task wmt14_en_fr --source ../shared/data/wmt14-en-fr \\
        --split train=newstest2012 --split valid=newstest2013 --split test=newstest2014 \\
        --vocab-size 8000
    python -m preprocessing --task multi30k_en_de --source ../shared/data/multi30k \\
        --split valid=val --split test=test_2016_flickr --shortlist 30   # + lexical table
    python -m preprocessing --task translation --src fr --tgt en \\
        --source ../shared/data/news-commentary-5k --split 'train=nc-5k[:4500]' \\
        --split 'valid=nc-5k[4500:4750]' --split 'test=nc-5k[4750:]'   # any pair, one corpus

`--task` picks a preset (preprocessing.config.PRESETS); any of its settings changes with
`--set FIELD=VALUE`. With RAY_ADDRESS set (e.g. under `ray job submit`) it joins that cluster,
otherwise it starts a local Ray. Exit status 2 with a one-line reason on bad input; Ctrl-C or
SIGTERM stops it with exit status 130, and the same command goes on from the last finished stage.
"""

from __future__ import annotations

import argparse
import logging
import sys

from typing import TYPE_CHECKING

from preprocessing.config import PRESETS
from preprocessing.console import quiet_ray_data
from preprocessing.errors import PreprocessError, message
from storage.settings import Change, apply_changes, read_value
from storage import StorageError, check_storage, location
from storage.paths import shown
from storage.ray_join import RayAddressError

if TYPE_CHECKING:
    from preprocessing.pipeline import PipelineOutput


def summary(out: PipelineOutput) -> str:
    """A short table: rows, drops, tokens, batches and padding efficiency per split."""
    lines = [f"output  {out.root}", f"bpe     {out.spm_model} ({out.vocab_size} types)",
             f"{'split':<8}{'rows in':>11}{'kept':>11}{'src tok':>12}{'tgt tok':>12}"
             f"{'batches':>9}{'pad eff':>9}  dropped"]
    for split in out.batches:
        c, b = out.manifests[f"clean/{split}"], out.manifests[f"batches/{split}"]
        drops = {**c["dropped"], **b["dropped"]}
        lines.append(f"{split:<8}{c['rows_in']:>11,}{b['rows_kept']:>11,}"
                     f"{b['tokens']['src_tokens']:>12,}{b['tokens']['tgt_tokens']:>12,}"
                     f"{b['batches']:>9,}{b['padding_efficiency']:>9.3f}  "
                     + (", ".join(f"{k}={v:,}" for k, v in drops.items()) or "-"))
    for split, (s, t) in out.text.items():
        left_out = out.manifests["text"]["splits"][split].get("dropped")  # no pair to read
        lines.append(f"text    {split}: {s} {t}" + (
            f"  left out: {', '.join(f'{k}={v:,}' for k, v in left_out.items())}"
            if left_out else ""))
    if out.shortlist:
        m = out.manifests["shortlist"]
        lines.append(f"shortlist {out.shortlist} ({m['k']} candidates per source token, "
                     f"{m['sources_with_candidates']:,} source tokens, {m['pairs_counted']:,} "
                     "pairs counted)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m preprocessing",
                                description=__doc__.split("\n")[0])
    p.add_argument("--task", default="demo", choices=sorted(PRESETS), help="preset name")
    p.add_argument("--source", help="hub | demo | a folder or bucket prefix (s3://BUCKET/"
                                    "PREFIX) (default: the preset's)")
    p.add_argument("--src", metavar="LANG", help="source language: its files' suffix or hub "
                                                 "key (default: the preset's)")
    p.add_argument("--tgt", metavar="LANG", help="target language (default: the preset's)")
    p.add_argument("--out", help="output root, a folder or a bucket prefix; stages go to "
                                 "<out>/<task>/<key>/<stage>/")
    p.add_argument("--split", action="append", default=[], metavar="SPLIT=NAME",
                   help="source name of a split: a file stem, e.g. valid=newstest2013 (its "
                        "<stem>.<lang> files), or one file per side, train=SRC_FILE,TGT_FILE "
                        "(repeatable; a new split name adds a test set)")
    p.add_argument("--vocab-size", type=int, help="BPE types (default: the preset's)")
    p.add_argument("--max-tokens", type=int, help="token budget per batch")
    p.add_argument("--dedupe", action="store_true", help="drop exact duplicate training pairs")
    p.add_argument("--shortlist", type=int, metavar="K",
                   help="also learn vocabulary selection's lexical table: K target candidates "
                        "per source token (<out>/<task>/<data key>/shortlist/<key>/"
                        "shortlist.npz; the command prints its path)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change any setting of the preset (preprocessing.config."
                        "PreprocessConfig; repeatable), e.g. --set max_len=100 --set "
                        "character_coverage=1.0 (data.FIELD as the workflows write it works too)")
    p.add_argument("--hub-endpoint", help="Hugging Face endpoint (a mirror) that lists and "
                   "serves the dataset's files; default: HF_ENDPOINT or the hub")
    args = p.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    quiet_ray_data()  # stage lines and results; Ray Data's own INFO lines in its log folder
    cfg = PRESETS[args.task]()
    if args.source not in (None, "hub", "demo"):  # a folder: absolute, as the workflows give
        # it, so both find the same data folder (its key hashes it); a bucket URI as it is
        try:
            args.source = str(location(args.source))
        except StorageError as e:  # "s3:/bkt/x", a query: one line, as argparse's (exit 2)
            print(f"error: --source {e}", file=sys.stderr)
            return 2
    changes = {k: v for k, v in {"source": args.source, "root": args.out,
                                 "vocab_size": args.vocab_size,
                                 "max_tokens": args.max_tokens,
                                 "shortlist_per_source": args.shortlist,
                                 "src_lang": args.src, "tgt_lang": args.tgt}.items()
               if v is not None}
    if args.dedupe:
        changes["dedupe"] = True
    if args.split:
        splits = dict(cfg.splits)
        for item in args.split:
            name, sep, value = item.partition("=")
            if not sep or not name or not value:
                p.error(f"--split {item!r}: expected SPLIT=NAME")
            splits[name] = value
        changes["splits"] = splits
    flags = {"source": "--source", "root": "--out", "vocab_size": "--vocab-size",
             "max_tokens": "--max-tokens", "shortlist_per_source": "--shortlist",
             "src_lang": "--src", "tgt_lang": "--tgt", "dedupe": "--dedupe", "splits": "--split"}
    try:
        sets = [Change("data", key.strip().removeprefix("data."), read_value(raw), item)
                for item in args.set for key, _, raw in [item.partition("=")]]
        if any("=" not in item or not c.field for item, c in zip(args.set, sets)):
            p.error("--set: write FIELD=VALUE (e.g. --set max_len=100)")
        both = next((c for c in sets if c.field in changes), None)
        if both is not None:  # (one would win without a word: which, a reader cannot tell)
            p.error(f"--set {both.text} and {flags[both.field]} both set {both.field}: give "
                    "one of them")
        # the flags and --set in one change, checked once (--src fr --set tgt_lang=en swaps
        # the sides, where the flag alone named one language twice)
        cfg = apply_changes(cfg, sets, "data", {"data.root": "--out", "data.source": "--source"},
                            also=changes)
    except ValueError as e:  # e.g. --src equal to --tgt; a --set naming no field
        p.error(str(e))
    # Imported after quiet_ray_data: Ray Data reads its logging configuration when imported.
    from preprocessing.pipeline import run_pipeline

    try:
        for flag, where, write in (("--out", cfg.root, True), ("--source", cfg.source, False)):
            if where not in ("hub", "demo"):
                check_storage(where, flag, write=write)  # a bucket that cannot work: one line
        out = run_pipeline(cfg, hub_endpoint=args.hub_endpoint)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (`ray job stop`): __main__.py hands it over
        # Each stage writes whole files or none, its manifest last: the same command goes on
        # from the last finished stage.
        print(f"\ninterrupted: finished stages are kept under {shown(cfg.root)}; the same "
              "command goes on from there", file=sys.stderr, flush=True)
        return 130
    except (StorageError, RayAddressError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except PreprocessError as e:
        print(f"error: {message(e)}", file=sys.stderr)
        return 2
    print(summary(out))
    return 0
