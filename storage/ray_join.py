"""Starting or joining Ray for every Ray command of the project (the workflows, `python -m
preprocessing`, `python -m workflows.evaluation`, `translate --actors`, `serve`): the cluster
RAY_ADDRESS names, or a local Ray started quietly (`start_or_join`). An address no command can
join stops the command with one line (`RayAddressError`) that names it, hides its password and
says what to do, instead of Ray's traceback (which quotes the address whole) or minutes of Ray's
own connection retries:

- the dashboard's http:// address, the one `ray job submit` reads (the infra guide exports it);
- a host:port where nothing takes a connection within CONVS2S_RAY_JOIN_WAIT_S seconds (30 by
  default: a head still starting gets that long);
- a host:port that answers HTTP/1, a web server's (the dashboard's port without `http://`),
  or says nothing for CONVS2S_RAY_SILENT_S seconds (10 by default): Ray's GCS and its client
  server speak gRPC and answer at once, and Ray would retry such a port for minutes;
- an address Ray itself refuses.

    join(os.environ["RAY_ADDRESS"], submit="python -m convs2s translate ...", log_to_driver=False)

Joining passes no resource arguments to `ray.init` (docs/reference.md, Ray).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from storage.redact import redact_text
from storage.signals import callers_signal_handlers

_log = logging.getLogger("storage.ray_join")

# What RAY_ADDRESS may hold, and what to do instead: the end of every refusal of it.
FIX = ("unset RAY_ADDRESS to run on this machine; to join a cluster, set it to its head's GCS "
       "address HOST:6379 (a driver on a cluster node), or submit the command with `ray job "
       "submit` (Ray's docs advise its Jobs API over Ray Client, ray://HOST:10001, for Ray "
       "Train and Tune)")


class RayAddressError(ValueError):
    """RAY_ADDRESS names nothing this command can join; the message is the one line to print."""


def shown(address: str) -> str:
    """RAY_ADDRESS as it may be printed: a password in it as `***` (`redact_text`), also in a
    GCS address, which has no scheme."""
    if "://" in address:
        return redact_text(address)
    return redact_text("gcs://" + address).removeprefix("gcs://")


def join_wait_s() -> float:
    """How long a command waits for RAY_ADDRESS to take a connection (read when it joins)."""
    from storage.settings import env_seconds

    return env_seconds("CONVS2S_RAY_JOIN_WAIT_S", 30)


def join(address: str, *, submit: str, **init_kwargs) -> None:
    """`ray.init` for `address` (RAY_ADDRESS), with `init_kwargs` (logging, log_to_driver: no
    resources). `submit` is the command to run through `ray job submit` where only the
    dashboard's address is known. Raises RayAddressError."""
    import ray

    name = f"RAY_ADDRESS={shown(address)}"
    if address.startswith(("http://", "https://")):
        raise RayAddressError(
            f"{name} is a Ray dashboard (jobs API) address, the one `ray job submit` reads, "
            f"not a cluster this command can join: to run there, submit it (`ray job submit "
            f"--working-dir . -- {submit}`); " + FIX)
    from storage.settings import SettingError

    try:
        wait_s, _ = join_wait_s(), silent_s()  # (both read now: a bad value, before any wait)
    except SettingError as err:
        raise RayAddressError(str(err)) from None
    if problem := _unreachable(address, wait_s):
        raise RayAddressError(f"{name}: {problem}; " + FIX)
    try:
        ray.init(logging_level=logging.WARNING, **init_kwargs)
    except (ValueError, ConnectionError) as err:
        said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        said = redact_text(said).replace(address, shown(address))
        raise RayAddressError(f"{name}: Ray cannot join it ({said}); " + FIX) from None


@contextlib.contextmanager
def sigterm_while_starting_as_ctrl_c() -> Iterator[None]:
    """Around `ray.init`: a SIGTERM while Ray starts (seconds on a small machine) stops the
    command as Ctrl-C does. Ray installs its own SIGTERM handler in the middle of `ray.init`,
    and it exits (SystemExit 15, sometimes with a traceback from inside Ray's start): taken
    here as a KeyboardInterrupt, which the commands answer with their `interrupted` line.
    A SIGTERM whose handler ran inside a fork callback (Ray's start forks its processes) had
    its exit swallowed ("Exception ignored in ... _releaseLock": the command ran on): the
    signal module's wakeup fd, written by the C handler whatever the Python one does, tells
    that a SIGTERM (or a Ctrl-C) came, and it is raised here once Ray's start returns. That
    swallowed exit is not printed either (its traceback was the command's last words but one,
    a suite run, 2026-12-07)."""
    wake = _wakeup_pipe()
    before = sys.unraisablehook

    def hook(unraisable) -> None:
        if wake is not None and unraisable.exc_type is SystemExit \
                and getattr(unraisable.exc_value, "code", None) == signal.SIGTERM:
            return  # (the wakeup fd has it: raised as Ctrl-C once the start returns)
        before(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    except SystemExit as stop:
        if stop.code != signal.SIGTERM:
            raise
        raise KeyboardInterrupt("SIGTERM") from None
    finally:
        if sys.unraisablehook is hook:  # (one set meanwhile stays)
            sys.unraisablehook = before
        came = _close_wakeup_pipe(wake)
    if came:
        raise KeyboardInterrupt("SIGTERM")


def _wakeup_pipe():
    """(read end, write end, the wakeup fd before) with this pipe as the signal module's wakeup
    fd, or None where there is none to set (not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    try:
        before = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return None
    return r, w, before


def _close_wakeup_pipe(wake) -> bool:
    """Put the wakeup fd back (unless Ray's start set its own meanwhile: kept) and say whether
    a SIGTERM came while the pipe was the wakeup fd."""
    if wake is None:
        return False
    r, w, before = wake
    now = signal.set_wakeup_fd(before)
    if now != w:  # (someone else's since: theirs stays)
        signal.set_wakeup_fd(now)
    try:
        got = os.read(r, 4096)
    except BlockingIOError:
        got = b""
    finally:
        os.close(r)
        os.close(w)
    return signal.SIGTERM in got or signal.SIGINT in got


def start_or_join(submit: str, **init_kwargs) -> str:
    """Ray for a command that finds none started in its process: the cluster RAY_ADDRESS names
    (`join`; RayAddressError where it cannot), else a local Ray started quietly (token
    authentication chosen for the process, `choose_local_ray_auth`; Ray's banner left out), or
    one already running on this machine (`ray start --head`), which `ray.init` joins. The
    caller's Ctrl-C and SIGTERM handlers stay in place (Ray's start installs its own).
    `submit`: the command to name for `ray job submit`; `init_kwargs`: what both a join and a
    start take (`log_to_driver`, not resources). Returns the line its console shows instead of
    the banner: where Ray is, its CPUs and its log folder."""
    import ray

    with callers_signal_handlers(), sigterm_while_starting_as_ctrl_c():
        if address := os.environ.get("RAY_ADDRESS"):
            join(address, submit=submit, **init_kwargs)
        else:
            choose_local_ray_auth()
            ray.init(logging_level=logging.WARNING, **init_kwargs, **local_cpus())
    where = (f"cluster {shown(address)}" if address else "local instance" if started_here()
             else "the Ray already running on this machine")
    return (f"Ray: {where}, {ray.cluster_resources().get('CPU', 0):g} CPUs; Ray's own logs: "
            f"{log_dir()}")


def choose_local_ray_auth() -> None:
    """Before a local Ray starts: token authentication (Ray's default for a new local
    instance), chosen explicitly, since left unset Ray picks the same and prints a notice on
    every run. A user's own RAY_AUTH_MODE is kept."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    import ray._raylet

    ray._raylet.Config.initialize("")  # as Ray does after setting it: re-read the setting


def log_dir() -> str:
    """Where the Ray this process is connected to keeps its logs (Ray Data's in ray-data/), as
    a command's console names it."""
    import ray

    try:
        return str(Path(ray._private.worker._global_node.get_session_dir_path()) / "logs")
    except AttributeError:  # not a node of this process (a client connection)
        return "the Ray dashboard (Logs), or `ray job logs`"


def started_here() -> bool:
    """Whether this process started the Ray it is connected to (`ray.init()` found no cluster
    to join): a local Ray, which never grows. A cluster it joined (RAY_ADDRESS, Ray Client, or
    one `ray.init()` found running on this machine: a `ray up` head, `ray start`) may have an
    autoscaler that adds nodes."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)  # (None: Ray Client)
    return bool(node is not None and getattr(node, "head", False))


def never_grows() -> bool:
    """Whether the Ray this process is connected to is a local one it started, which never
    grows (no RAY_ADDRESS, `started_here`): work it cannot hold would wait without end. A
    cluster's autoscaler may add nodes: there work waits for room."""
    return not os.environ.get("RAY_ADDRESS") and started_here()


def no_room_for(cpus: float, gpus: float, nodes: list[dict]) -> tuple[float, float] | None:
    """On a Ray this process started (`started_here`, no RAY_ADDRESS), which never grows: None
    if one of its alive nodes (`ray.nodes()`) holds `cpus` CPUs and `gpus` GPUs together, else
    its largest CPU and GPU counts, for the message. None on a cluster (its autoscaler may add
    the node: there the work waits)."""
    if not never_grows():
        return None
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    if any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in alive):
        return None
    return (max((r.get("CPU", 0) for r in alive), default=0),
            max((r.get("GPU", 0) for r in alive), default=0))


def node_not_seeing(folder, also: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """On a cluster of several nodes: (the address of the first other alive node that does not
    see the local `folder`, or one of the local files `also`, and what it does not see), or
    None (every node sees them, this node is the only one, or each is a bucket URI: shared by
    nature). The driver writes a probe file in `folder` (made if missing; None: a command that
    writes nothing there, only `also` is looked for) and a task on each other node looks for it
    and for `also`. Nodes an autoscaler adds later are not asked (none is there to ask)."""
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from storage.paths import is_uri, location

    here = ray.get_runtime_context().get_node_id()
    others = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    wanted = [str(location(p)) for p in also if not is_uri(str(p))]
    probe = None
    if folder is not None and not is_uri(str(folder)):
        folder = location(folder)
        probe = folder / f".convs2s-shared-probe-{uuid.uuid4().hex[:12]}"
        wanted.insert(0, str(probe))
    if not others or not wanted:
        return None
    if probe is not None:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("")

    def unseen(paths: list[str]) -> str | None:
        return next((p for p in paths if not os.path.exists(p)), None)

    task = ray.remote(num_cpus=0)(unseen)
    try:
        refs = {task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(wanted): n["NodeManagerAddress"] for n in others}
        # (all at once, 60 s in all: a node that does not answer, or dies meanwhile, is said
        # and passed over, not a traceback; what it would not see fails there later)
        done, late = ray.wait(list(refs), num_returns=len(refs), timeout=60)
        asked = str(folder) if probe is not None else wanted[0]
        for ref in late:
            with contextlib.suppress(Exception):  # (its node may be gone)
                ray.cancel(ref, force=True)
            _log.warning("the node at %s did not answer within 60 s whether it sees %s: not "
                         "checked", refs[ref], asked)
        for ref in done:
            try:
                missing = ray.get(ref)
            except ray.exceptions.RayError as err:
                _log.warning("the node at %s could not be asked whether it sees %s (%s): not "
                             "checked", refs[ref], asked, type(err).__name__)
                continue
            if missing is not None:
                return refs[ref], str(folder) if missing == str(probe) else missing
        return None
    finally:
        if probe is not None:
            probe.unlink(missing_ok=True)


def local_cpus() -> dict:
    """What a local Ray this process starts is told of its CPUs: those this process may run
    on (its affinity: a Slurm or `taskset` cpuset, which Ray's own count of the machine's
    ignores, 2 CPUs under `taskset -c 0` on a 2-CPU machine, and its actors oversubscribed the
    one allowed). Nothing where one already runs on this machine (`ray.init` joins it, and
    refuses resources then)."""
    if not hasattr(os, "sched_getaffinity") or running_here():
        return {}
    return {"num_cpus": len(os.sched_getaffinity(0))}


def running_here() -> bool:
    """Whether `ray.init()` without RAY_ADDRESS would join a Ray already running on this
    machine (`ray start --head`, a `ray up` head) instead of starting one of its own."""
    try:
        from ray._private.services import find_bootstrap_address

        return find_bootstrap_address(None) is not None
    except Exception:  # noqa: BLE001 - Ray's internals moved: as if none runs
        return False


def _unreachable(address: str, wait_s: float) -> str | None:
    """Why Ray cannot join `address`'s host and port, and what to do: nothing takes a
    connection there, tried until `wait_s` has passed, or what does answers a plain HTTP
    request as an HTTP/1 server (Ray's GCS and client server are gRPC servers: they answer it
    with HTTP/2 frames). None otherwise, or for a value that names no host:port ("auto",
    another scheme: left to Ray). The host as Ray resolves it (its node IP for localhost)."""
    rest = address.removeprefix("ray://")
    if "://" in rest:
        return None
    host, _, port = rest.rpartition("@")[2].split("/")[0].rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None
    if rest == address:  # a GCS address: Ray turns localhost into this node's IP
        from ray._private.services import resolve_ip_for_localhost

        host = resolve_ip_for_localhost(host)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=5) as conn:
                said = _first_answer(conn)
                if said == b"HTTP/":
                    return (f"{host}:{port} answers HTTP/1, as a web server does, not as Ray: "
                            "correct the address (a dashboard's, with http://, is for `ray "
                            "job submit`)")
                if said is None:
                    return (f"{host}:{port} takes connections but says nothing (for "
                            f"{silent_s():g} s; Ray's GCS and client server answer at once): "
                            "correct the address")
                return None
        except OSError as err:
            if time.monotonic() >= deadline:
                why = err.strerror or str(err) or type(err).__name__
                return (f"nothing answers at {host}:{port} ({why}; tried for {wait_s:g} s): "
                        "start that cluster (`ray start --head`, `ray up`) or correct the "
                        "address")
        time.sleep(1)


# How long the server at RAY_ADDRESS may say nothing to a request: Ray's GCS and its client
# server are gRPC servers, which send their HTTP/2 settings as soon as a connection opens
# (measured: well under 1 ms on a local head). A port that stays silent is something else, and
# Ray would retry it for minutes (over 3 here, 2026-12-05, until stopped).
SILENT_S = 10.0


def silent_s() -> float:
    """How long the server at RAY_ADDRESS may say nothing (CONVS2S_RAY_SILENT_S, default
    SILENT_S; read when a command joins)."""
    from storage.settings import env_seconds

    return env_seconds("CONVS2S_RAY_SILENT_S", SILENT_S)


def _first_answer(conn: socket.socket) -> bytes | None:
    """The first 5 bytes the server on `conn` sends after an HTTP/1.0 request (`b"HTTP/"`: a
    web server, the Ray dashboard's port given without `http://`; a gRPC server answers with
    HTTP/2 frames); b"" when it closes the connection or resets it, None when it says nothing
    for `silent_s()` seconds."""
    try:
        conn.settimeout(silent_s())
        conn.sendall(b"GET / HTTP/1.0\r\nHost: ray-address-check\r\n\r\n")
        said = b""
        while len(said) < 5 and (more := conn.recv(5 - len(said))):
            said += more
        return said
    except socket.timeout:
        return None
    except OSError:
        return b""
