"""The code MLflow runs to build the served translator ("models from code"): a logged model
stores this file, not a pickled Python object, so loading it executes only the project's code.
`convs2s.serving.pyfunc.log_translator` logs it; MLflow puts the `convs2s` package (the model's
`code_paths`) on sys.path before running it."""

import mlflow

from convs2s.serving.pyfunc import TranslatorModel

mlflow.models.set_model(TranslatorModel())
