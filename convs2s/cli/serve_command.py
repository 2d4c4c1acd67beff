"""`python -m convs2s serve`: a translator on Ray Serve (convs2s.serving.online), its model,
settings, port and resources checked here before Ray starts."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

from convs2s.config import INFERENCE_PRECISIONS, SearchConfig
from storage import StorageError, location


def serve(argv: list[str] | None = None) -> int:
    """python -m convs2s serve: the Ray Serve deployment (convs2s.serving.online)."""
    d = SearchConfig()
    p = argparse.ArgumentParser(
        prog="python -m convs2s serve",
        description="Serve a translator over HTTP on Ray Serve, batching concurrent requests "
                    "(POST /translate {\"inputs\": [...], \"params\": {...}}; GET /health).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", nargs="+", help="checkpoint directories (several: an "
                      "ensemble)")
    what.add_argument("--model", help="an MLflow model URI: models:/NAME@ALIAS or "
                      "models:/NAME/latest (pinned to the version it names at start), "
                      "models:/NAME/VERSION, models:/m-ID, runs:/RUN/NAME")
    p.add_argument("--tracking-uri", help="where --model resolves (default: "
                   "MLFLOW_TRACKING_URI)")
    p.add_argument("--spm-model")
    p.add_argument("--beam", type=int, help=f"default beam of requests (checkpoints: {d.beam})")
    p.add_argument("--lenpen", type=float)
    p.add_argument("--max-len-a", type=float)
    p.add_argument("--max-len-b", type=int)
    p.add_argument("--precision", choices=INFERENCE_PRECISIONS)
    p.add_argument("--precision-fallback", choices=["fp32"],
                   help="serve float32 weights where --precision cannot run (one warning)")
    p.add_argument("--shortlist", metavar="NPZ")
    p.add_argument("--shortlist-frequent", type=int)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--min-replicas", type=int, help="autoscaling: fewest replicas")
    p.add_argument("--max-replicas", type=int, help="autoscaling: most replicas")
    p.add_argument("--target-ongoing-requests", type=float, default=8.0,
                   help="autoscaling: requests in flight per replica it aims at")
    p.add_argument("--threads-per-replica", type=int, default=1,
                   help="CPUs (torch threads) each replica holds")
    p.add_argument("--gpus-per-replica", type=float, default=0.0)
    p.add_argument("--max-batch-size", type=int, default=32,
                   help="most sentences searched together")
    p.add_argument("--batch-wait-ms", type=float, default=2.0,
                   help="at rest, how long a sentence waits for others to share its search")
    p.add_argument("--max-queued-requests", type=int, default=256,
                   help="requests each HTTP proxy holds waiting for a replica; past them, 503 "
                        "at once (-1: no limit)")
    p.add_argument("--request-timeout", type=float, metavar="SECONDS",
                   help="a request that takes longer is answered 408 (default: no limit; on "
                        "a Serve already running, its own setting stays)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (0.0.0.0: every interface)")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--name", default="convs2s", help="the Serve application's name (default: "
                   "convs2s); one of that name running already is refused, left as it is "
                   "(each serves /: one application a cluster)")
    p.add_argument("--replace", action="store_true", help="redeploy a running application of "
                   "--name with this model (its Ctrl-C then deletes it)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(levelname)s %(message)s",
                        stream=sys.stderr)
    from convs2s.io.checkpoint import CheckpointError
    from convs2s.inference.quantize import PrecisionError
    from storage import ray_join
    from convs2s.serving.ray_start import start_ray
    from convs2s.serving.logged_model import resolve_model_uri
    from convs2s.serving.online import DeployError, ServeSettings, run

    search = {k: v for k, v in (("beam", args.beam), ("lenpen", args.lenpen),
                                ("max_len_a", args.max_len_a), ("max_len_b", args.max_len_b),
                                ("precision", args.precision),
                                ("precision_fallback", args.precision_fallback),
                                ("shortlist", args.shortlist),
                                ("shortlist_frequent", args.shortlist_frequent))
              if v is not None}
    try:
        settings = ServeSettings(
            checkpoints=args.checkpoint or [], model=args.model, tracking_uri=args.tracking_uri,
            search=search, spm_model=args.spm_model, replicas=args.replicas,
            min_replicas=args.min_replicas, max_replicas=args.max_replicas,
            target_ongoing_requests=args.target_ongoing_requests,
            threads_per_replica=args.threads_per_replica,
            gpus_per_replica=args.gpus_per_replica, max_batch_size=args.max_batch_size,
            batch_wait_ms=args.batch_wait_ms, max_queued_requests=args.max_queued_requests,
            request_timeout_s=args.request_timeout)
        if settings.model and args.spm_model:
            raise ValueError(f"--spm-model {args.spm_model}: a logged model (--model) carries "
                             "its own text pipeline; leave it out")
        if settings.model:  # resolved (and an alias pinned) before Ray starts
            import mlflow

            # read here, once, and given to the replicas (whose environment may not hold
            # $MLFLOW_TRACKING_URI); shown only through redact_uri
            settings.tracking_uri = settings.tracking_uri or mlflow.get_tracking_uri()
            settings.model = resolve_model_uri(settings.model, settings.tracking_uri)
        else:
            for c in settings.checkpoints:
                if not location(c).is_dir():
                    raise ValueError(f"checkpoint {c} does not exist: give a checkpoint "
                                     "directory of a training run (e.g. RUN/train/best)")
            SearchConfig.from_dict(search)  # (a --beam 0: before torch loads)
        _load_as_replicas_will(settings)
        # (a new local Ray, not one `ray.init()` would join on this machine, `ray start
        # --head`: its Serve proxy may hold --port already, serving this very application
        # from an earlier `serve`, replaced, not refused)
        if not os.environ.get("RAY_ADDRESS") and not ray_join.running_here():
            _check_port_free(args.host, args.port)  # a new local Ray: its HTTP proxy binds here
            _check_replicas_fit_here(settings)
    except (CheckpointError, PrecisionError, StorageError, OSError, ValueError) as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    from ray.exceptions import RayError  # (Ray once the checks have passed)

    try:
        # Serve's per-request lines stay in Ray's log files
        start_ray(log_to_driver=False, command="python -m convs2s serve ...")
    except (RayError, ValueError, OSError) as err:  # a RAY_ADDRESS it cannot join (said
        # with its password hidden; Ray's own errors too)
        from convs2s.tracking.redact import redact_text

        print(f"{p.prog}: error: {redact_text(str(err))}", file=sys.stderr)
        return 2
    try:
        _check_shared(settings)
    except ValueError as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    try:
        run(settings, host=args.host, port=args.port, name=args.name, blocking=True,
            replace=args.replace)
    except (DeployError, RayError, OSError) as err:  # (an unreachable RAY_ADDRESS: a
        # ConnectionError; Serve's deployment failing: DeployError, with the replica's error)
        from convs2s.tracking.redact import redact_text

        print(f"{p.prog}: error: {redact_text(str(err).splitlines()[0])}", file=sys.stderr)
        return 2
    return 0


def _port(text: str) -> int:
    """--port: a TCP port (binding 70000 raised OverflowError, a traceback after the model
    loaded; with Ray already up, the port went to Serve as it was)."""
    import argparse

    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535)")
    return port


def _check_shared(settings) -> None:
    """On a cluster of several nodes, the replicas load the model's local files (checkpoints,
    sentencepiece model, shortlist, dictionary) on whichever node Serve places them: one that
    does not see them failed its replicas with a FileNotFoundError, and the deploy with them
    (`ray_join.node_not_seeing`; nothing is written into those folders). A logged model
    (--model) and bucket URIs are fetched by each replica."""
    from storage import ray_join

    s = settings.for_replicas()
    files = [*s.checkpoints, s.spm_model, s.search.get("shortlist"), s.search.get("dictionary")]
    if (unseen := ray_join.node_not_seeing(None, also=tuple(filter(None, files)))) is not None:
        raise ValueError(f"{unseen[1]} is not shared: the node at {unseen[0]} does not see it, "
                         "and Serve may place replicas there; put the model's files in a folder "
                         "every node mounts (NFS / EFS / a shared volume) or a bucket, or serve "
                         "a logged model (--model)")


def _check_port_free(host: str, port: int) -> None:
    """--host / --port free to bind (Serve's proxy, started later, only logs that it could not,
    and retries)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as uvicorn binds)
        try:
            sock.bind((host, port))
        except OSError as err:
            why = err.strerror or err
            raise OSError(f"--port {port} on --host {host} cannot be bound ({why}): give "
                          "another --port, or stop what holds it") from None


def _check_replicas_fit_here(settings) -> None:
    """A new local Ray has this machine's CPUs and GPUs: replicas that need more at start (at
    least one: autoscaling from 0 starts one at the first request) would wait for them without
    end (Serve waits for an autoscaler to add nodes). A GPU fraction is placed on one GPU."""
    import math

    import torch

    try:
        from ray._private.utils import get_num_cpus  # (what a new local Ray counts: cgroups)
    except ImportError:  # (moved in another Ray)
        get_num_cpus = os.cpu_count
    n = max(1, settings.replicas if settings.min_replicas is None else settings.min_replicas)
    t, g = settings.threads_per_replica, settings.gpus_per_replica
    need_cpus, cpus = n * t, get_num_cpus()
    if need_cpus > cpus:
        raise ValueError(f"{n} replica(s) x --threads-per-replica {t} need {need_cpus} CPUs, "
                         f"and this machine has {cpus}: Serve would wait for them without "
                         "end; give fewer replicas or threads, or join a cluster (RAY_ADDRESS)")
    if not g:
        return
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    fit = gpus // g if g >= 1 else gpus * math.floor(1 / g + 1e-9)  # (whole GPUs, or shares
    # of one GPU each)
    if n > fit:
        raise ValueError(f"{n} replica(s) x --gpus-per-replica {g:g} need more GPUs than this "
                         f"machine has ({gpus}: {fit:g} such replica(s) fit): Serve would wait "
                         "for them without end; give fewer replicas, or join a cluster with "
                         "GPUs (RAY_ADDRESS)")


def _load_as_replicas_will(settings) -> None:
    """The model loaded once here, on the CPU, with the settings every replica will load it
    with: a folder without checkpoint.pt, a corrupt checkpoint, a missing --shortlist or a
    precision that cannot run is one line now, not an error in every replica while Serve
    retries them (as `translate --actors` checks its model before the actors start)."""
    import torch

    from convs2s.inference.quantize import resolve_precision
    from convs2s.precision import runs_on_gpus
    from convs2s.inference.translate import load_for_inference

    torch.set_num_threads(1)  # (a check: the replicas' threads are theirs)
    if settings.model:
        from convs2s.serving.logged_model import fetch_logged_model, logged_model_artifacts
        from convs2s.serving.pyfunc import translator_from_artifacts

        arts = logged_model_artifacts(fetch_logged_model(settings.model, settings.tracking_uri))
        translator = translator_from_artifacts(arts, "cpu", settings.search)
    else:
        translator = load_for_inference(settings.checkpoints,
                                        SearchConfig.from_dict(settings.search), "cpu",
                                        spm_model=settings.spm_model)
    cfg = translator.search
    here = not os.environ.get("RAY_ADDRESS")  # (a cluster's replicas run on its GPU nodes)
    if settings.gpus_per_replica and (not runs_on_gpus(cfg.precision)
                                      or (here and torch.cuda.is_available())):
        # a replica with a GPU searches on it: int8 runs on CPUs, bf16 on GPUs with native
        # bf16, checked on this machine's GPU where the replicas run here (resolve_precision:
        # the fallback, else an error; elsewhere, the replicas find it)
        resolve_precision(cfg.precision, "cuda", cfg.precision_fallback)
    del translator
    gc.collect()
