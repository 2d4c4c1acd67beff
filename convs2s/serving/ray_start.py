"""Ray for the serving commands (`translate --actors`, `serve`): the cluster RAY_ADDRESS names,
or a local Ray started quietly, Ray Data's console lines kept to the job's own."""

from __future__ import annotations

import logging
import os

from storage import ray_join
from storage.signals import quiet_interrupted_datasets


def _not_a_skipped_part(record: logging.LogRecord) -> bool:
    """A console filter: Ray Data's record of a part whose actor died PART_TRIES times (a
    traceback) stays in ray-data.log; the job's own line names the part."""
    return "remaining max_errored_blocks" not in record.getMessage()


def start_ray(log_to_driver: bool = True,
              command: str = "python -m convs2s translate ... --actors N") -> None:
    """Join the cluster of RAY_ADDRESS (a submitted job; `ray_join`, whose one-line
    RayAddressError names `command` to submit where RAY_ADDRESS is a dashboard's), else start a
    local Ray quietly. With `log_to_driver=False` the Ray processes' own lines stay in Ray's
    log files (`serve`: its proxy, controller and per-request access lines)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")  # ours is the one bar
    import ray.data  # noqa: F401  (configures Ray Data's loggers on import; adjusted below)

    quiet_interrupted_datasets()  # a Ctrl-C inside a Dataset's constructor: no traceback after

    # Ray Data's per-dataset INFO lines stay in ray-data.log, as in the workflows
    # (preprocessing/ray_data_logging.yaml); its "Progress bars disabled" notice too: the
    # job's own bar is the one on the console
    for handler in logging.getLogger("ray.data").handlers:
        if type(handler).__name__ != "SessionFileHandler":
            handler.setLevel(logging.WARNING)
            if _not_a_skipped_part not in handler.filters:  # (once: Ray may start again)
                handler.addFilter(_not_a_skipped_part)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    with ray_join.sigterm_while_starting_as_ctrl_c():
        if address := os.environ.get("RAY_ADDRESS"):  # a bad one: one line (RayAddressError)
            ray_join.join(address, submit=command, log_to_driver=log_to_driver)
        else:
            ray_join.choose_local_ray_auth()
            ray.init(logging_level=logging.WARNING, include_dashboard=False,
                     log_to_driver=log_to_driver, **ray_join.local_cpus())
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False

