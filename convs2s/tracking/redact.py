"""Credentials never printed, logged or stored, in what MLflow's own loggers write too (the
functions that hide them in a URI or a message: `storage.redact`, shared with the preprocessing).

    redact_mlflow_logs()                           # MLflow's loggers, from now on

Credentials reach MLflow through the URI itself or $MLFLOW_TRACKING_USERNAME / _PASSWORD /
_TOKEN; they are never shown. Paths in storage/ messages: `storage.paths.shown`.
"""

from __future__ import annotations

import os

from storage.redact import redact_logs, redact_text, redact_uri  # (also for its callers)

__all__ = ["Hidden", "redact_mlflow_logs", "redact_text", "redact_uri"]

# MLflow prints "View run ... at: <tracking URI>/#/..." when a run ends, the URI's user and
# password included; the workflows print their own links, redacted (redact_uri).
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


class Hidden:
    """A URI handed to code that may record or show what it is given (Ray Train's run state
    stringifies `train_loop_config` for its dashboard and export events): `str` and `repr`
    redact it, `.value` is the URI itself for the code that uses it."""

    __slots__ = ("value",)

    def __init__(self, value: str | None):
        self.value = value

    def __repr__(self) -> str:
        return repr(redact_uri(self.value))

    __str__ = __repr__

    def __reduce__(self):  # (pickled to the workers as its value; None too)
        return (Hidden, (self.value,))


def redact_mlflow_logs() -> None:
    """Redact credentials in what MLflow's own loggers write: its messages quote the tracking
    URI, password included ("Failed to get mlflow run: API request to http://u:pw@..." from the
    system-metrics monitor when the server goes away). A filter on a logger does not reach its
    children's records, so it goes on every `mlflow` logger made so far and on the handlers of
    `mlflow` and the root (where the records of loggers made later end up); idempotent
    (`storage.redact.redact_logs`)."""
    redact_logs("mlflow")
