"""The trained translator as an MLflow pyfunc model (`pyfunc`: `log_translator`,
`TranslatorModel`) and the file MLflow runs to build it (`model_code`, "models from code").

May import: mlflow, `convs2s.config`, `convs2s.io`, `convs2s.inference`, `convs2s.tracking`.

Logged models store `model_code.py` (older ones `served_translator.py`), which imports
`TranslatorModel` from `convs2s.serving`: it stays importable here.
"""

from convs2s.serving.pyfunc import TranslatorModel, log_translator

__all__ = ["TranslatorModel", "log_translator"]
