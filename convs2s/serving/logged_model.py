"""A translator logged to MLflow, as `serve --model` and its replicas take it: its URI pinned
to the logged model it names now (an alias, `latest` or a stage resolved once, so that every
replica serves the same weights), its folder downloaded once per node where the URI names
weights that cannot change (else by each process), and its artifacts.

    uri = resolve_model_uri("models:/multi30k_en_de-test_2016_flickr@champion", tracking_uri)
    arts = logged_model_artifacts(fetch_logged_model(uri, tracking_uri))  # name -> local path
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def _registry_name(uri: str) -> tuple[str | None, str | None, str | None]:
    """(name, alias, stage) of a registered model's URI that names no fixed version: an alias
    (`models:/NAME@ALIAS`), `latest` in any case (stage None, alias None) or a stage
    (`models:/NAME/Production`, in any case), as MLflow parses them; (None, None, None) for a
    URI that names one version or logged model (`models:/NAME/3`, `models:/m-ID`) or is not a
    registry URI."""
    if not uri.startswith("models:/"):
        return None, None, None
    parts = uri[len("models:/"):].split("/")
    if len(parts) == 2 and parts[1] and not parts[1].isdigit():
        return parts[0], None, None if parts[1].lower() == "latest" else parts[1]
    if len(parts) == 1 and "@" in parts[0]:
        name, alias = parts[0].rsplit("@", 1)
        return name, alias, None
    return None, None, None


def pinned(uri: str) -> bool:
    """Whether `uri` names weights that cannot change: a logged model (`models:/m-ID`), a
    registered version (`models:/NAME/3`) or a run's artifact (`runs:/RUN/PATH`). An alias,
    `latest` or a stage moves; a plain artifact location (a folder, s3://...) may be written
    again."""
    if uri.startswith("runs:/"):
        return True
    if not uri.startswith("models:/"):
        return False
    parts = uri[len("models:/"):].split("/")
    return (len(parts) == 1 and "@" not in parts[0]) or (len(parts) == 2 and parts[1].isdigit())


def resolve_model_uri(uri: str, tracking_uri: str | None) -> str:
    """A registered model's alias, its `latest` version or the latest version in a stage
    (`models:/NAME/Production`; `latest` and stages in any case, as MLflow reads them), pinned
    to the logged model it names now (models:/m-<id>), so that every replica serves the same
    weights even if the alias moves, a version is added or another enters the stage; other
    URIs as given. A URI that does not resolve raises ValueError with the reason."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from convs2s.tracking.redact import redact_text, redact_uri

    tracking_uri = tracking_uri or mlflow.get_tracking_uri()
    name, alias, stage = _registry_name(uri)
    if name is None:
        return uri
    try:
        client = MlflowClient(tracking_uri)
        if alias is not None:
            mv = client.get_model_version_by_alias(name, alias)
        else:  # the highest version number (of those in the stage), as MLflow reads `latest`
            # and a stage when it loads, of those registered whole (not one still PENDING_ or
            # FAILED_REGISTRATION)
            found = [v for v in client.search_model_versions(f"name = '{name}'")
                     if str(getattr(v, "status", "READY")) == "READY"
                     and (stage is None
                          or str(getattr(v, "current_stage", "")).lower() == stage.lower())]
            if not found:
                raise MlflowException(f"Registered Model with name={name} has no version "
                                      + ("ready" if stage is None else f"in stage {stage!r}"))
            mv = max(found, key=lambda v: int(v.version))
    except MlflowException as err:
        raise ValueError(f"model {redact_text(uri)} does not resolve at "
                         f"{redact_uri(tracking_uri)}: "
                         f"{redact_text(err.message.splitlines()[0])}") from None
    except ImportError as err:  # a store whose driver is not installed (postgresql://...)
        raise ValueError(f"model {redact_text(uri)}: the tracking store "
                         f"{redact_uri(tracking_uri)} cannot be opened here: {err}") from None
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

    import mlflow

    from storage.transfer import cache_root
    from storage.scratch import place

    # the store in the key even when it comes from $MLFLOW_TRACKING_URI: models:/NAME/1 or
    # runs:/ID/... of two stores are other models (the key is a hash: no password in a path)
    tracking_uri = tracking_uri or mlflow.get_tracking_uri()
    if not pinned(uri):  # weights that may change (`resolve_model_uri` pins what it can): a
        # download of this process's own, never one an earlier process made of other weights
        # (its folder removed at exit, or by the next fetch here once this process is gone)
        return _fetch_unpinned(uri, tracking_uri)
    dest = cache_root() / "models" / hashlib.sha256(
        f"{tracking_uri}|{uri}".encode()).hexdigest()[:16]
    if (dest / "MLmodel").is_file():
        return dest
    # named by this machine and pid (a cache on a shared home is seen by every node: a pid
    # alone named another node's download, which this one then removed)
    tmp = dest.with_name(f".{dest.name}.{place()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # a download of an earlier process of this pid here
    try:
        got = _download(uri, tracking_uri, tmp)
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


def _download(uri: str, tracking_uri: str, into: Path) -> Path:
    """The logged model `uri` downloaded into `into`: the folder holding its MLmodel file. A URI
    that does not download, or names no model, raises ValueError naming it."""
    import mlflow.artifacts

    from convs2s.tracking.redact import redact_text
    from convs2s.tracking.runs import global_tracking_uri

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a line per file
    try:
        # (models:/ resolves through the process-wide URI; the caller's is put back after.
        # Where MLflow put it: `runs:/RUN/translator` lands in into/translator/)
        with global_tracking_uri(tracking_uri):
            got = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(into)))
    except Exception as err:  # MLflow raises several types for a URI that does not resolve
        # never the server's password, should MLflow name the server (given here, or from
        # $MLFLOW_TRACKING_URI)
        reason = redact_text(str(err).splitlines()[0])
        raise ValueError(f"model {redact_text(uri)} could not be fetched: {reason}") from None
    if not (got / "MLmodel").is_file():
        raise ValueError(f"model {redact_text(uri)} is not a logged model (no MLmodel file "
                         "in what it names): give models:/NAME@ALIAS, models:/m-ID or "
                         "runs:/RUN/NAME of a logged translator")
    return got


def _fetch_unpinned(uri: str, tracking_uri: str) -> Path:
    """`fetch_logged_model` of a URI whose weights may change: downloaded into a scratch folder
    of this process (storage.scratch: removed by the next fetch on this machine once this
    process has ended, and at its exit)."""
    import atexit
    import shutil

    from storage.scratch import scratch_dir
    from storage.transfer import cache_root

    parent = cache_root() / "models"
    parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch_dir("unpinned-", parent=parent)
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    try:
        return _download(uri, tracking_uri, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
