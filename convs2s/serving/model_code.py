"""The code MLflow runs to build the served translator ("models from code"): a logged model
stores this file, not a pickled Python object, so loading it executes this file and the copy of
the project's packages logged with it (the model's `code_paths`, which MLflow puts on sys.path
first). That code is read from the artifact store: `mlflow models serve` and
`mlflow.pyfunc.load_model` run whatever anyone allowed to write there left in it. The
project's own `python -m convs2s serve --model` runs none of it: it reads MLmodel as YAML and
the weights with the checkpoint allowlist. `convs2s.serving.pyfunc.log_translator` logs it."""

import mlflow

from convs2s.serving.pyfunc import TranslatorModel

mlflow.models.set_model(TranslatorModel())
