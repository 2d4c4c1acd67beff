"""Benchmark results: one JSON file per run, and a short table on stdout.

Every result file has the same top-level keys, so results from different machines and commits
can be compared by a script:

    {"benchmark": "training", "created": "2026-...Z", "command": "python -m benchmarks...",
     "settings": {...the parsed flags...}, "machine": {...machine_info()...},
     "load_average": {"before": [1m, 5m, 15m], "after": [...]}, "quiet": {...},
     "results": {...benchmark-specific...}, "notes": [...]}

Results go to `benchmarks/results/<name>.json` by default (small; committed), `--out` elsewhere.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def fresh_workdir(folder: Path, benchmark: str) -> Path:
    """`folder` made empty for `benchmark`: made here, or emptied only when an earlier run of
    the same benchmark made it (its mark file says so); a folder it did not make is refused
    (SystemExit), never deleted."""
    mark = folder / f".convs2s-bench-{benchmark}"
    if folder.exists() and any(folder.iterdir()):
        if not mark.is_file():
            raise SystemExit(f"error: --workdir {folder} holds files this benchmark did not "
                             "write; give a new or empty folder")
        for p in folder.iterdir():  # (its contents: the folder may be a link, a mount)
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    mark.write_text(f"made by python -m benchmarks.{benchmark}\n")
    return folder


def write_result(path: str | Path, benchmark: str, settings: dict, machine: dict,
                 load_before: list, load_after: list, quiet: dict, results: dict,
                 notes: list[str] | None = None, replace: bool = False) -> Path:
    """Write one result file (atomically: a killed run leaves the old file) and return its
    path. An existing file (a recorded result) is kept unless `replace`: the new result goes
    beside it as `<name>-<UTC time>.json`, and the returned path says where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not replace:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        new = path.with_name(f"{path.stem}-{stamp}{path.suffix}")
        n = 1
        while new.exists():  # two results in one second
            n += 1
            new = path.with_name(f"{path.stem}-{stamp}-{n}{path.suffix}")
        print(f"{path} exists (a recorded result; --replace overwrites it): writing {new}",
              file=sys.stderr)
        path = new
    doc = {
        "benchmark": benchmark,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python -m " + shlex.join([f"benchmarks.{benchmark}"] + sys.argv[1:]),
        "settings": settings,
        "machine": machine,
        "load_average": {"before": load_before, "after": load_after},
        "quiet": quiet,
        "results": results,
        "notes": notes or [],
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=_plain) + "\n")
    tmp.replace(path)
    return path


def _plain(x):
    """JSON fallback for numpy scalars, paths and torch dtypes."""
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def format_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """Rows of dicts -> aligned text; columns are (key, header); floats get 3 significant digits
    above 100 as integers with thousands separators."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return "" if v is None else str(v)

    table = [[h for _, h in columns]] + [[cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def add_search_args(p, beam: int = 5) -> None:
    """The search flags the translation benchmarks share (the Multi30k settings by default)."""
    from pathlib import Path as _Path

    p.add_argument("--beam", type=int, default=beam)
    p.add_argument("--max-len-a", type=float, default=1.2)
    p.add_argument("--max-len-b", type=int, default=10)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--shortlist", type=_Path)
    p.add_argument("--shortlist-frequent", type=int, default=1000)


def add_result_args(p) -> None:
    """--wait-quiet / --max-load (machine_info's quiet check), --out and --replace."""
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--max-load", type=float, default=1.0)
    p.add_argument("--out", type=Path)
    p.add_argument("--replace", action="store_true")


def read_sentences(path: Path, limit: int | None = None) -> list[str]:
    """The lines of a text or .gz file (the first `limit`)."""
    import gzip
    import itertools

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, limit)]
