"""The paper's §5.4-§5.5 analysis at laptop scale: a sweep of the Multi30k `cpu` recipe (Table 4's
position embeddings and Table 5's attention placements by default) at an equal training budget
per trial and several seeds, run by the workflow's own sweep runner (Ray Tune, MLflow), then
each variant's mean and spread and whether the paper's direction holds beyond the seed spread.

    python -m benchmarks.analysis --max-time 4m --seeds 2                 # Tables 4 + 5
    python -m benchmarks.analysis --sweep table4 --max-time 8m --seeds 3
    python -m benchmarks.analysis ... --screenshot docs/analysis_compare.png

The same command again resumes the sweep (finished trials are skipped) and rewrites the result.
`--screenshot` renders MLflow's compare view of the trials in headless Chromium (`mlflow
server` on loopback). Settings are compared on the validation set (`val`); the test set's BLEU
is reported beside it. Writes benchmarks/results/analysis_<sweep>.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.corpus import DATA_DIR
from benchmarks.machine import load_average, machine_info
from benchmarks.mlflow_ui import mlflow_server
from benchmarks.report import RESULTS_DIR, write_result
from workflows import multi30k_en_de
from workflows.ablations import BASELINE, SWEEPS
from convs2s.config import duration
from workflows.workflow_config import RunOptions

MAIN_TEST = "test_2016_flickr"
VALID = "val"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.analysis",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", default="paper-5.2", choices=sorted(SWEEPS))
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--max-time", type=duration, default=240.0, metavar="DURATION",
                   help="training budget per trial (default: 4m)")
    p.add_argument("--data", type=Path, default=DATA_DIR / "multi30k")
    p.add_argument("--storage-path", type=Path,
                   default=Path.home() / ".cache" / "convs2s-benchmarks" / "analysis")
    p.add_argument("--tracking-uri", help="default: sqlite:///<storage-path>/mlflow.db")
    p.add_argument("--run-name", help="default: <sweep>-<budget>-<seeds>seeds; the same name "
                                      "resumes the sweep")
    p.add_argument("--out", type=Path)
    p.add_argument("--replace", action="store_true")
    p.add_argument("--screenshot", type=Path, help="PNG of MLflow's compare view of the trials")
    return p.parse_args(argv)


def direction(stats: dict, variant: str, key: str, lower_is_better: bool) -> dict | None:
    """The baseline against `variant` on `key` (mean, sd over seeds): which is better, by how
    much, and whether the difference exceeds the larger of the two seed spreads."""
    if variant not in stats or BASELINE not in stats:
        return None
    (bm, bsd), (vm, vsd) = stats[BASELINE][key], stats[variant][key]
    if bm != bm or vm != vm:  # nan: no finished seed
        return None
    diff = (vm - bm) if lower_is_better else (bm - vm)  # > 0: the baseline is better
    spread = max(s for s in (bsd, vsd) if s == s) if (bsd == bsd or vsd == vsd) else None
    return {"baseline_better_by": round(diff, 3), "seed_spread": spread and round(spread, 3),
            "beyond_spread": spread is not None and abs(diff) > spread}


def trial_times(uri: str, results: dict) -> dict[str, float]:
    """Each trial's wall minutes (its MLflow workflow run's start to end)."""
    from mlflow.tracking import MlflowClient

    client, out = MlflowClient(uri), {}
    for name, m in results.items():
        run = client.get_run(m["run_id"]).info
        if run.end_time:
            out[name] = round((run.end_time - run.start_time) / 60_000, 2)
    return out


def screenshot(uri: str, page: str, out: Path, budget_s: int = 60) -> Path:
    """Render `page` (a path after the UI's address, e.g. `/#/compare-runs?...`) of `mlflow
    server` on the store `uri` in headless Chromium to `out`."""
    chromium = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                     if shutil.which(n)), None)
    if chromium is None:
        raise RuntimeError("no Chromium for --screenshot: apt-get install -y chromium")
    log = Path(tempfile.mkstemp(suffix=".log", prefix="mlflow-server-")[1])
    with mlflow_server(["server", "--backend-store-uri", uri], log) as url:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                            "--no-first-run", "--disable-background-networking",
                            "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                            "--window-size=1600,1400", f"--virtual-time-budget={budget_s * 1000}",
                            f"--user-data-dir={profile}", f"--screenshot={out}",
                            f"{url}{page}"],
                           check=True, capture_output=True, timeout=300)
    return out


def main(argv: list[str] | None = None) -> int:
    from workflows.orchestrate import sweep_summary
    from workflows.sweep import resolve_sweep, run_sweep
    from workflows.sweep_summary import variant_stats

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if not args.data.is_dir():
        print(f"error: {args.data} is not a folder; give --data DIR (../shared/data/multi30k)",
              file=sys.stderr)
        return 2
    if args.screenshot and args.screenshot.exists() and not args.replace:
        print(f"error: --screenshot {args.screenshot} exists: give another file name, or "
              "--replace to overwrite it", file=sys.stderr)
        return 2
    storage = args.storage_path.expanduser().resolve()
    storage.mkdir(parents=True, exist_ok=True)
    uri = args.tracking_uri or f"sqlite:///{storage / 'mlflow.db'}"
    budget = f"{args.max_time / 60:g}m"
    run_name = args.run_name or f"{args.sweep}-{budget}-{args.seeds}seeds"
    opts = RunOptions(preset="cpu", data=str(args.data), max_time=args.max_time,
                      storage_path=str(storage), run_name=run_name, tracking_uri=uri,
                      sweep=args.sweep, seeds=args.seeds)
    load_before = load_average()
    t0 = time.monotonic()
    sweep = resolve_sweep(multi30k_en_de.cpu(), opts)
    result = run_sweep(sweep)
    wall = time.monotonic() - t0
    printed = sweep_summary(result, wall)
    print(printed, flush=True)
    stats = variant_stats(sweep, result.results)
    minutes = trial_times(uri, result.results)
    figures = {
        "table": result.table,
        "variants": {v.name: {"label": v.label, "changes": v.changed(sweep.base.model),
                              "paper": v.paper,
                              **{k: (s if k == "n" else [round(x, 3) for x in s])
                                 for k, s in stats[v.name].items()}}
                     for v in sweep.variants},
        "directions": {v.name: {"valid_ppl": direction(stats, v.name, "valid_ppl", True),
                                "bleu": direction(stats, v.name, f"{MAIN_TEST}/bleu", False)}
                       for v in sweep.variants if v.name != BASELINE},
        "trials": {name: {**{k: (round(x, 3) if isinstance(x, float) else x)
                             for k, x in m.items()}, "wall_minutes": minutes.get(name)}
                   for name, m in result.results.items()},
        "failed": result.failed,
        "grid_wall_minutes": round(sum(minutes.values()), 1),
        "this_invocation_minutes": round(wall / 60, 1),
    }
    if args.screenshot:
        (line,) = [x for x in printed.splitlines() if x.startswith("  compare: ")]
        url = line.split(": ", 1)[1].strip()
        figures["screenshot"] = str(screenshot(uri, url[url.index("/#/"):], args.screenshot))
    out = args.out or RESULTS_DIR / f"analysis_{args.sweep}.json"
    path = write_result(out, "analysis", {"sweep": args.sweep, "seeds": sweep.seeds,
                                          "max_time": args.max_time, "preset": "cpu",
                                          "data": str(args.data), "run_name": run_name,
                                          "workflow": sweep.base.params()["workflow"]},
                        machine_info(), load_before, load_average(), {"quiet": None}, figures,
                        notes=[f"each trial: the cpu recipe's model with the variant's change, "
                               f"{budget} of training, its best checkpoint scored with beam 5 "
                               f"(sacreBLEU 13a); valid PPL: the last validation; paper numbers: "
                               "WMT'14 En-De newstest2014, mean of 3 runs"],
                        replace=args.replace)
    print(json.dumps(figures["directions"], indent=1))
    print(f"grid: {figures['grid_wall_minutes']} min of trials; wrote {path}")
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
