"""Serving the trained translator:
- `pyfunc`: the MLflow pyfunc model (`log_translator`, `TranslatorModel`) and `model_code`, the
  file MLflow runs to build it ("models from code");
- `corpus`: a large corpus translated by a Ray Data job (an actor pool, parts with a manifest,
  resumable); `inputs`: the text both translate modes read (text, .gz, a parquet column);
- `online`: a Ray Serve deployment with dynamic request batching; `logged_model`: a translator
  logged to MLflow as it serves (its URI pinned, fetched once per node). Joining RAY_ADDRESS,
  as every Ray command does: `storage.ray_join`.

May import: mlflow, ray, `convs2s.config`, `convs2s.precision`, `convs2s.console` (Ray's
harmless console lines; none imports it now), `convs2s.io`, `convs2s.inference`,
`convs2s.tracking`.

Logged models store `model_code.py` (older ones `served_translator.py`), which imports
`TranslatorModel` from `convs2s.serving`: it stays importable here (loaded on first use, so a
corpus actor does not import MLflow).
"""

__all__ = ["TranslatorModel", "log_translator"]


def __getattr__(name: str):
    if name in __all__:
        from convs2s.serving import pyfunc

        return getattr(pyfunc, name)
    raise AttributeError(f"module 'convs2s.serving' has no attribute {name!r}")
