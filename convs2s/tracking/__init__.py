"""MLflow: `runs` (runs, tags, params, final metrics, datasets and the logged-model helpers a
workflow uses), `run_logger` (a training run's metrics, buffered, with a local metrics.jsonl),
`system_metrics` (each training node's CPU / memory / GPU sampling) and `redact` (credentials
never printed, logged or stored: in URIs, messages and MLflow's own logs).

May import: mlflow (inside functions where a caller must stay light), psutil, the standard
library. Nothing of the model or the search.
"""
