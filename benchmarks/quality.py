"""Translation quality on real data under a wall-clock budget: the Multi30k workflow's `cpu`
recipe trained for --max-time on this machine, then scored with sacreBLEU and chrF.

It runs the workflow itself (`workflows/multi30k_en_de.py`: Ray Data preprocessing, Ray Train,
parallel evaluation, MLflow), so the figure is what a user of the workflow gets, and records:
BLEU and chrF of the best checkpoint and of the average of the last checkpoints on every test
set, the validation curve against the training clock, updates, epochs, why training stopped,
the stage times and the machine (throughput, and so BLEU at a fixed budget, varies with the
host CPU: compare figures from the same host).

    python -m benchmarks.quality --max-time 60m                   # the issue's 60-minute budget
    python -m benchmarks.quality --max-time 10m --out /tmp/q.json # a quicker look

Settings are chosen on the validation set (`val`); test_2016_flickr gives the final number.
Writes benchmarks/results/quality_multi30k_en_de_<preset>.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from benchmarks.corpus import DATA_DIR
from benchmarks.machine import load_average, machine_info, wait_for_quiet
from benchmarks.report import RESULTS_DIR, format_table, write_result
from convs2s.config import TRAINING_PRECISIONS, keep_explicit_dropout
from convs2s.metrics.task_kinds import TRANSLATION
from workflows import multi30k_en_de
from workflows.ablations import SweepError, variants_for
from workflows.errors import SpecError
from convs2s.config import duration
from workflows.workflow_config import RunOptions

MAIN_TEST = "test_2016_flickr"
VALID = "val"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu", choices=["cpu", "reference"],
                   help="the workflow preset to train (default: cpu, the recipe)")
    p.add_argument("--max-time", type=duration, default=3600.0, metavar="DURATION",
                   help="training budget: seconds or 90s / 60m / 1h (default: 60m)")
    p.add_argument("--variant", metavar="SWEEP:NAME",
                   help="train a variant of the preset's model from workflows/ablations.py "
                        "instead, e.g. recipe:dropout-0.5 (one trial of that sweep, scored the "
                        "same way)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="change the preset as the workflows' --set does (workflows/overrides.py), "
                        "e.g. --set 'train.dropout_by_passes=[[0, 0.2], [30, 0.4]]'")
    p.add_argument("--max-updates", type=int, default=None,
                   help="also stop after this many updates (equal-update comparisons)")
    p.add_argument("--precision", choices=TRAINING_PRECISIONS, default=None,
                   help="training precision (default: the preset's, auto)")
    p.add_argument("--data", type=Path, default=DATA_DIR / "multi30k",
                   help="folder with train / val / test_2016_flickr .en/.de(.gz)")
    p.add_argument("--storage-path", type=Path,
                   default=Path.home() / ".cache" / "convs2s-benchmarks" / "quality",
                   help="runs, preprocessing output and the MLflow store (outside the repo)")
    p.add_argument("--run-name", help="default: <preset>-<budget>-<date>-<time>; an existing "
                                      "name resumes that run")
    p.add_argument("--out", type=Path, help="result JSON (default: benchmarks/results/"
                                            "quality_multi30k_en_de_<preset>.json)")
    p.add_argument("--replace", action="store_true",
                   help="overwrite the result file if it exists (default: keep it and write "
                        "<name>-<time>.json beside it)")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                   help="first wait up to S seconds for a 1-minute load below --max-load")
    p.add_argument("--max-load", type=float, default=1.0)
    return p.parse_args(argv)


def validation_curve(train_dir: Path) -> list[dict]:
    """Validation loss and perplexity after each epoch (and at the stop), against the
    training clock, from the run's metrics.jsonl."""
    from convs2s.tracking.run_logger import read_local_metrics

    return [{"update": rec["step"], "seconds": round(m["valid/seconds"], 1),
             "valid_loss": round(m["valid/loss"], 4), "valid_ppl": round(m["valid/ppl"], 3)}
            for rec in read_local_metrics(train_dir / "metrics.jsonl")
            if "valid/loss" in (m := rec["metrics"])]


def collect(run_dir: Path) -> dict:
    """The figures of one finished workflow run, from its files (workflow.json with the
    training result and every score, the training run's metrics.jsonl)."""
    state = json.loads((run_dir / "workflow.json").read_text())
    (train,) = state["train"].values()  # the recipe trains one model
    result = train["result"]
    m = result["metrics"]
    scores = {}
    for key, rec in sorted(state["eval"].items()):
        job, test = key.split("/", 1)
        scores.setdefault(test, {})[job] = {k: round(v, 2) for k, v in rec["metrics"].items()
                                            if k in TRANSLATION.metrics}
    curve = validation_curve(Path(result["run_dir"]))
    return {
        "scores": scores,
        "updates": m.get("update"),
        "epochs": m.get("epochs", m.get("epoch")),
        "train_seconds": round(m.get("train_seconds", 0.0), 1),
        "stop_reason": m.get("stop_reason"),
        "precision": m.get("precision"),
        # dropout_by_passes: the dropout the run chose, from which projected passes
        "dropout_choice": m.get("dropout_choice"),
        "best_valid_ppl": min((c["valid_ppl"] for c in curve), default=None),
        "validation_curve": curve,
        "checkpoints": [Path(c).name for c in result["checkpoints"]],
    }


def with_variant(cfg, variant: str):
    """The workflow config with `SWEEP:NAME`'s model changes applied (a SweepError names a bad
    sweep or variant and the choices)."""
    sweep, _, name = variant.partition(":")
    if not name:
        raise SweepError(f"--variant {variant!r}: give SWEEP:NAME, e.g. recipe:dropout-0.5")
    (v,) = variants_for(sweep, cfg.model, [name])
    model = v.apply(cfg.model)
    return cfg.replace(model=model, train=keep_explicit_dropout(cfg.train, cfg.model.dropout,
                                                                model.dropout))


def main(argv: list[str] | None = None) -> int:
    from workflows.engine import run_workflow
    from workflows.run_spec import resolve

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if not args.data.is_dir():
        print(f"error: {args.data} is not a folder; give --data DIR with train / val / "
              f"{MAIN_TEST} .en/.de(.gz) (../shared/data/multi30k)", file=sys.stderr)
        return 2
    quiet = (wait_for_quiet(args.max_load, args.wait_quiet) if args.wait_quiet
             else {"quiet": None})
    load_before = load_average()
    cfg = {"cpu": multi30k_en_de.cpu, "reference": multi30k_en_de.reference}[args.preset]()
    if args.variant:
        try:
            cfg = with_variant(cfg, args.variant)
        except SweepError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    budget = f"{args.max_time / 60:g}m"
    tag = args.preset + (f"_{args.variant.replace(':', '_')}" if args.variant else "")
    run_name = args.run_name or f"{tag}-{budget}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = args.storage_path.expanduser().resolve()
    storage.mkdir(parents=True, exist_ok=True)
    opts = RunOptions(preset=args.preset, data=str(args.data), max_time=args.max_time,
                      max_updates=args.max_updates, precision=args.precision,
                      storage_path=str(storage), run_name=run_name, set=args.set,
                      tracking_uri=f"sqlite:///{storage / 'mlflow.db'}")
    t0 = time.monotonic()
    try:
        spec = resolve(cfg, opts)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = run_workflow(spec)
    wall = time.monotonic() - t0
    figures = collect(Path(result.run_dir))
    figures["workflow_seconds"] = round(wall, 1)
    out = args.out or RESULTS_DIR / f"quality_multi30k_en_de_{tag}.json"
    settings = {"preset": args.preset, "variant": args.variant, "set": args.set,
                "max_time": args.max_time,
                "max_updates": args.max_updates, "precision": spec.train.precision,
                "data": str(args.data),
                "run_name": run_name, "workflow": spec.params()["workflow"]}
    path = write_result(out, "quality", settings, machine_info(), load_before, load_average(),
                        quiet, figures,
                        notes=[f"BLEU: sacreBLEU 13a on detokenized output; main test set "
                               f"{MAIN_TEST}, settings chosen on {VALID}"],
                        replace=args.replace)
    rows = [{"test": test, "job": job, **s} for test, jobs in figures["scores"].items()
            for job, s in jobs.items()]
    print(format_table(rows, [("test", "test set"), ("job", "job"), ("bleu", "BLEU"),
                              ("chrf", "chrF"), ("bleu_tokenized", "BLEU tok")]))
    print(f"{figures['updates']:,} updates, {figures['epochs']} epochs, "
          f"{figures['train_seconds'] / 60:.1f} min of training in {figures['precision']} "
          f"({figures['stop_reason']}); "
          f"best valid ppl {figures['best_valid_ppl']}; workflow {wall / 60:.1f} min")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
