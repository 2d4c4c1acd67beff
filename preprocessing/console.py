"""A quiet console for everything that runs the preprocessing on Ray: the project's stage lines,
warnings and results on the console; Ray Data's per-dataset INFO lines (execution plans,
"Starting execution of Dataset ...") only in ray-data.log of Ray's session log folder, and its
progress bars (carriage-return redraws) only on a terminal. Set before Ray starts: a local
Ray's workers inherit the environment; a user's own settings win."""

from __future__ import annotations

import os
import sys
from pathlib import Path

LOGGING_CONFIG = Path(__file__).with_name("ray_data_logging.yaml")


def quiet_ray_data() -> None:
    os.environ.setdefault("RAY_DATA_LOGGING_CONFIG", str(LOGGING_CONFIG))
    if not sys.stdout.isatty():  # a file or a pipe: no redraws, no colour codes
        os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
