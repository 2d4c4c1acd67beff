"""Credentials never printed, logged or stored, in what MLflow's own loggers write too (the
functions that hide them in a URI or a message: `storage.redact`, shared with the preprocessing).

    redact_mlflow_logs()                           # MLflow's loggers, from now on

Credentials reach MLflow through the URI itself or $MLFLOW_TRACKING_USERNAME / _PASSWORD /
_TOKEN; they are never shown. Paths in storage/ messages: `storage.paths.shown`.
"""

from __future__ import annotations

import logging
import os

from storage.redact import redact_text, redact_uri  # (also for this package's callers)

__all__ = ["redact_mlflow_logs", "redact_text", "redact_uri"]

# MLflow prints "View run ... at: <tracking URI>/#/..." when a run ends, the URI's user and
# password included; the workflows print their own links, redacted (redact_uri).
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


class _RedactCredentials(logging.Filter):
    """A log record's text and traceback with every URI's credentials redacted (`redact_text`);
    a record with none is left exactly as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format is the handler's to report, as always
            return True
        if "://" in text and (hidden := redact_text(text)) != text:
            record.msg, record.args = hidden, ()
        if record.exc_info and not record.exc_text:  # (the text formatters cache and print)
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and "://" in record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


_REDACT = _RedactCredentials()
_REDACTED_AT: tuple = ()  # the counts of loggers and handlers when last filtered


def redact_mlflow_logs() -> None:
    """Redact credentials in what MLflow's own loggers write: its messages quote the tracking
    URI, password included ("Failed to get mlflow run: API request to http://u:pw@..." from the
    system-metrics monitor when the server goes away). A filter on a logger does not reach its
    children's records, so it goes on every `mlflow` logger made so far and on the handlers of
    `mlflow` and the root (where the records of loggers made later end up); idempotent."""
    global _REDACTED_AT
    now = (len(logging.Logger.manager.loggerDict), len(logging.getLogger("mlflow").handlers),
           len(logging.getLogger().handlers))
    if now == _REDACTED_AT:  # no logger or handler made since the last call (one per client)
        return
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name == "mlflow" or name.startswith("mlflow.")]
    for target in [*loggers, *logging.getLogger("mlflow").handlers, *logging.getLogger().handlers]:
        if _REDACT not in target.filters:
            target.addFilter(_REDACT)
    _REDACTED_AT = now
