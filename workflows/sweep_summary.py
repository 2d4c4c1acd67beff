"""A sweep's summary (workflows/sweep.py): per variant the mean and sample spread over its
seeds of the validation perplexity and of each test set's headline metric, as the paper's
tables give them; written as summary.md / summary.json in the sweep folder and logged to the
sweep's MLflow run (artifacts, and `<variant>/<figure>_mean` / `_sd` metrics). `sweep` is a
`workflows.sweep.SweepSpec`, `result` a `SweepResult` (which import this module).
"""

from __future__ import annotations

import json
import math

from convs2s.metrics.task_kinds import task_kind
from storage import write_whole
from workflows.ablations import BASELINE
from workflows.run_spec import RunSpec


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (nan for one value)."""
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def variant_stats(sweep, results: dict[str, dict]) -> dict[str, dict]:
    """Per variant: n, and mean / sd of the validation perplexity and of each test set's
    headline metric over its finished seeds."""
    b = sweep.base
    headline = task_kind(b.task_kind).headline
    out = {}
    for v in sweep.variants:
        rows = [results[t.name] for t in sweep.trials
                if t.variant.name == v.name and t.name in results]
        stats = {"n": len(rows)}
        keys = ["valid_ppl"] + [f"{name}/{headline}" for name in b.test_sets.values()]
        for key in keys:
            vals = [float(r[key]) for r in rows if r.get(key) is not None]
            stats[key] = mean_sd(vals)
        out[v.name] = stats
    return out


def _paper(x: float | None) -> str:
    """A paper figure as the paper prints it (21.7, 21.63); none for a table without it."""
    return "" if x is None else f"{x:g}"


def summary_table(sweep, results: dict[str, dict], failed: dict[str, str]) -> str:
    """The paper-shaped table: variant, valid PPL and each test set's headline metric as mean
    +- sd over seeds, with the paper's (valid PPL, BLEU) where it has the row."""
    b = sweep.base
    headline = task_kind(b.task_kind).headline
    stats = variant_stats(sweep, results)
    tests = list(b.test_sets.values())
    cols = ["variant", "n", "valid PPL"] + [f"{headline} {t}" for t in tests] \
        + ["paper PPL", f"paper {headline}"]
    rows = []
    for v in sweep.variants:
        s = stats[v.name]
        rows.append([v.name, f"{s['n']}/{len(sweep.seeds)}", _pm(s["valid_ppl"])]
                    + [_pm(s[f"{t}/{headline}"]) for t in tests]
                    + ([_paper(x) for x in v.paper] if v.paper else ["", ""]))
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    base = next((v for v in sweep.variants if v.name == BASELINE), None)
    out.append("")
    out.append(f"{len(sweep.seeds)} seed(s) ({', '.join(map(str, sweep.seeds))}) per variant; "
               f"mean +- sample sd; budget {budget_text(b)}; scores of each trial's best "
               f"checkpoint, beam {b.search.beam}."
               + (" Paper: WMT'14 En-De, newstest2014, mean of three runs (its Tables 4, 5, 7 "
                  "and 8); its BLEU is Moses-tokenized, comparable to each trial's "
                  "bleu_tokenized rather than to sacreBLEU's bleu; its PPL is per word of a "
                  "160K-word target vocabulary, not per BPE piece as here: compare the order "
                  "of the rows, not the values."
                  if any(v.paper for v in sweep.variants) else ""))
    if base is None:
        out.append("(no baseline among the variants run: compare the rows with each other)")
    for name, err in failed.items():
        out.append(f"FAILED {name}: {err}")
    return "\n".join(out)


def _pm(ms: tuple[float, float]) -> str:
    mean, sd = ms
    if math.isnan(mean):
        return "-"
    return f"{mean:.2f}" + ("" if math.isnan(sd) else f" +- {sd:.2f}")


def budget_text(spec: RunSpec) -> str:
    t = spec.train
    parts = ([f"{t.max_time / 60:g} min of training"] if t.max_time else []) \
        + ([f"{t.max_updates} updates"] if t.max_updates else []) \
        + ([f"{t.max_epochs} epochs"] if t.max_epochs else [])
    return " / ".join(parts) + " per trial (whichever comes first)" if parts else "unbounded"


def sweep_params(sweep) -> dict:
    """The sweep run's params: the sweep, its variants and seeds, and the base run spec."""
    return {"sweep": {"name": sweep.sweep, "variants": ",".join(v.name for v in sweep.variants),
                      "seeds": ",".join(map(str, sweep.seeds)), "trials": len(sweep.trials),
                      "budget": budget_text(sweep.base)},
            **sweep.base.params()}


def summary_metrics(sweep, results: dict[str, dict],
                    failed: dict[str, str]) -> dict[str, float]:
    """The sweep run's metrics: per variant `<variant>/n` (its finished seeds) and the mean and
    sample sd of each `variant_stats` figure (`<variant>/valid_ppl_mean`, `.../<test>_bleu_sd`;
    a figure with no value, or an sd of one seed, is left out), and the trials finished and
    failed."""
    metrics = {}
    for name, s in variant_stats(sweep, results).items():
        metrics[f"{name}/n"] = s["n"]
        for key, value in s.items():
            if key == "n":
                continue
            mean, sd = value
            label = key.replace("/", "_")
            if not math.isnan(mean):
                metrics[f"{name}/{label}_mean"] = mean
            if not math.isnan(sd):
                metrics[f"{name}/{label}_sd"] = sd
    metrics["trials_finished"] = len(results)
    metrics["trials_failed"] = len(failed)
    return metrics


def json_safe(value):
    """`value` with every float that JSON has no number for (NaN: the sd of one seed; inf) as
    null: json.dumps writes them as NaN, which JSON parsers refuse."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def log_summary(sweep, result, uri: str, run_id: str | None,
                log_final_metrics, log_artifacts) -> None:
    """summary.md / summary.json in the sweep folder and as the sweep run's artifacts; the
    per-variant means and spreads as its metrics (those of this invocation's trials only)."""
    from convs2s.tracking.runs import metric_keys

    headline = task_kind(sweep.base.task_kind).headline
    stats = variant_stats(sweep, result.results)
    md = sweep.folder / "summary.md"  # (write_whole makes the folder)
    write_whole(md, (f"# Sweep {sweep.run_name} ({sweep.sweep}, {sweep.base.workflow} "
                     f"{sweep.base.preset})\n\n{result.table}\n").encode())
    js = sweep.folder / "summary.json"
    summary = {"sweep": sweep.sweep, "run_name": sweep.run_name,
               "workflow": sweep.base.workflow, "preset": sweep.base.preset,
               "seeds": sweep.seeds, "budget": budget_text(sweep.base),
               "variants": {v.name: {"label": v.label, "paper": v.paper,
                                     # (the trials' own: a custom variant's --set, and
                                     # what a named one's model change implies)
                                     "changes": next((t.changes for t in sweep.trials
                                                      if t.variant is v), {}),
                                     "stats": stats[v.name]}
                            for v in sweep.variants},
               "trials": result.results, "failed": result.failed, "headline": headline}
    write_whole(js, json.dumps(json_safe(summary), indent=1, default=str,
                               allow_nan=False).encode())
    metrics = summary_metrics(sweep, result.results, result.failed)
    # The run's metrics are the latest summary's: a figure an earlier invocation logged that
    # this one has none for (a variant or a seed not rerun, an sd over one seed now) is logged
    # as NaN, not left beside the new figures as if it were one of them.
    metrics.update({k: math.nan for k in metric_keys(uri, run_id) - set(metrics)
                    if k.endswith(("/n", "_mean", "_sd"))})
    log_final_metrics(uri, run_id, metrics)
    log_artifacts(uri, run_id, str(md), "summary")
    log_artifacts(uri, run_id, str(js), "summary")
