"""The workflow console (the filter itself is `convs2s.console`, shared with `python -m convs2s
translate --actors` and `serve`).

    python -m workflows.console LOG     # exit 1 if LOG has alarming lines (CI's smoke check)
"""

from __future__ import annotations

import sys
from pathlib import Path

from convs2s.console import (ALARMING, HARMLESS_RAY_LINES, alarming_lines,
                             harmless_ray_lines_dropped, is_harmless)

__all__ = ["ALARMING", "HARMLESS_RAY_LINES", "alarming_lines", "harmless_ray_lines_dropped",
           "is_harmless"]

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python -m workflows.console LOG  (exit 1 if LOG has alarming lines)",
              file=sys.stderr)
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    try:
        text = Path(sys.argv[1]).read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        print(f"python -m workflows.console: error: {err}", file=sys.stderr)
        sys.exit(2)
    found = alarming_lines(text)
    for line in found:
        print(f"alarming console line: {line}", file=sys.stderr)
    sys.exit(1 if found else 0)
