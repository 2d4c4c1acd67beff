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


def quiet_interrupted_datasets() -> None:
    """Ray Data's `Dataset.__del__` reads `self._current_executor`, which `Dataset.__init__`
    sets only after a few other steps. A Ctrl-C that lands inside `__init__` leaves an
    instance without it, and collecting that instance printed "Exception ignored in ...
    Traceback ... AttributeError" under the run's one "interrupted" line (a suite run,
    2026-12-06). A class-level default makes its `__del__` return, as for a dataset never
    executed. Call once ray.data is imported."""
    import ray.data

    if not hasattr(ray.data.Dataset, "_current_executor"):
        ray.data.Dataset._current_executor = None

