"""A translator logged to MLflow, as `serve --model` and its replicas take it: its URI pinned
to the logged model it names now (an alias or `latest` resolved once, so that every replica
serves the same weights), its folder downloaded once per node, and its artifacts.

    uri = resolve_model_uri("models:/multi30k_en_de-test_2016_flickr@champion", tracking_uri)
    arts = logged_model_artifacts(fetch_logged_model(uri, tracking_uri))  # name -> local path
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def resolve_model_uri(uri: str, tracking_uri: str | None) -> str:
    """A registered model's alias, or its `latest` version, pinned to the logged model it names
    now (models:/m-<id>), so that every replica serves the same weights even if the alias
    moves or a version is added; other URIs as given. A URI that does not resolve raises
    ValueError with the reason."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from convs2s.tracking.redact import redact_text, redact_uri

    tracking_uri = tracking_uri or mlflow.get_tracking_uri()
    name, alias = None, None
    if uri.startswith("models:/") and "@" in uri:
        name, alias = uri[len("models:/"):].split("@", 1)
    elif uri.startswith("models:/") and uri.endswith("/latest"):
        name = uri[len("models:/"):-len("/latest")]
    if name is None:
        return uri
    client = MlflowClient(tracking_uri)
    try:
        if alias is not None:
            mv = client.get_model_version_by_alias(name, alias)
        else:  # the highest version number, as MLflow reads `latest` when it loads, of
            # those registered whole (not one still PENDING_ or FAILED_REGISTRATION)
            found = [v for v in client.search_model_versions(f"name = '{name}'")
                     if str(getattr(v, "status", "READY")) == "READY"]
            if not found:
                raise MlflowException(f"Registered Model with name={name} has no version "
                                      "ready")
            mv = max(found, key=lambda v: int(v.version))
    except MlflowException as err:
        raise ValueError(f"model {redact_text(uri)} does not resolve at "
                         f"{redact_uri(tracking_uri)}: "
                         f"{redact_text(err.message.splitlines()[0])}") from None
    if getattr(mv, "model_id", None):
        return f"models:/{mv.model_id}"
    if str(mv.source).startswith("models:/m-"):  # the logged model it was registered from
        return mv.source
    return f"models:/{name}/{mv.version}"


def fetch_logged_model(uri: str, tracking_uri: str | None) -> Path:
    """The logged model's folder on this node (downloaded once per node, store and URI). A
    URI that does not download, or names no model (no MLmodel file), raises ValueError naming
    it; nothing half-downloaded is left or reused."""
    import shutil

    import mlflow.artifacts

    from convs2s.tracking.runs import global_tracking_uri
    from convs2s.tracking.redact import redact_text
    from storage.transfer import cache_root
    from storage.scratch import place

    # the store in the key even when it comes from $MLFLOW_TRACKING_URI: models:/NAME/1 or
    # runs:/ID/... of two stores are other models (the key is a hash: no password in a path)
    tracking_uri = tracking_uri or mlflow.get_tracking_uri()
    dest = cache_root() / "models" / hashlib.sha256(
        f"{tracking_uri}|{uri}".encode()).hexdigest()[:16]
    if (dest / "MLmodel").is_file():
        return dest
    # named by this machine and pid (a cache on a shared home is seen by every node: a pid
    # alone named another node's download, which this one then removed)
    tmp = dest.with_name(f".{dest.name}.{place()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # a download of an earlier process of this pid here
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a line per file
    try:
        try:
            # (models:/ resolves through the process-wide URI; the caller's is put back after.
            # Where MLflow put it: `runs:/RUN/translator` lands in tmp/translator/)
            with global_tracking_uri(tracking_uri):
                got = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri,
                                                               dst_path=str(tmp)))
        except Exception as err:  # MLflow raises several types for a URI that does not resolve
            # never the server's password, should MLflow name the server (given here, or from
            # $MLFLOW_TRACKING_URI)
            reason = redact_text(str(err).splitlines()[0])
            raise ValueError(f"model {redact_text(uri)} could not be fetched: {reason}") \
                from None
        if not (got / "MLmodel").is_file():
            raise ValueError(f"model {redact_text(uri)} is not a logged model (no MLmodel file "
                             "in what it names): give models:/NAME@ALIAS, models:/m-ID or "
                             "runs:/RUN/NAME of a logged translator")
        if dest.is_dir() and not (dest / "MLmodel").is_file():
            # a folder left by an older version of this code (a download's parent): never
            # complete, since only a folder holding MLmodel is renamed into place
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(got, dest)
        except OSError:  # another replica on this node finished first (its folder is whole)
            if not (dest / "MLmodel").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def logged_model_artifacts(folder: Path) -> dict[str, str]:
    """name -> local path of a downloaded pyfunc model's artifacts (its MLmodel file says)."""
    import yaml

    meta = yaml.safe_load((folder / "MLmodel").read_text())
    arts = meta.get("flavors", {}).get("python_function", {}).get("artifacts") or {}
    if "checkpoints" not in arts or "search" not in arts:
        raise ValueError(f"{folder}: not a translator logged by this project (no checkpoints "
                         "and search artifacts)")
    out = {}
    for name, a in arts.items():  # (MLmodel is the artifact store's: anyone who can write
        # there wrote it) paths inside the model's folder only, as MLflow writes them
        path = a.get("path") if isinstance(a, dict) else None
        if not isinstance(path, str) or not path or Path(path).is_absolute() \
                or ".." in Path(path).parts:
            raise ValueError(f"{folder / 'MLmodel'}: artifact {name!r} has path {path!r}, not "
                             "a path inside the model's folder: not a model this project "
                             "logged; log the model again")
        out[name] = str(folder / path)
    return out
