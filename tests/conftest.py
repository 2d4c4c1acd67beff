"""Shared fixtures: one local Ray instance per test session, real data from ../shared/data."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# (CONVS2S_SHARED_DATA: another folder of those corpora, e.g. the part of them a lent GPU
# machine gets, scripts/gpu_checks.sh)
SHARED_DATA = Path(os.environ.get("CONVS2S_SHARED_DATA") or REPO.parent / "shared" / "data")

# Ray Train's controller checks its workers every 2 s (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S), and a
# run's start and its end each wait for a check: 4-5 s of a short run's 12 (a bare two-worker
# TorchTrainer.fit here: 12 s at 2 s, 7-8 s at 0.2 s). The suite makes dozens of short runs, in
# this process, its Ray and the workflows it starts (they inherit the environment).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")

# Ray Train starts a preemption watcher with every worker group: an actor of its own (a new
# process that imports Ray Train) that polls for nodes being drained, as a cloud's spot machines
# are told before they go. Nothing drains a node here (the node tests kill one, which the
# health checks see), and the watchers were 57 of the suite's 2,251 CPU s (29 of them, about
# 2 s each: benchmarks.process_cpu over `make test`, docs/benchmarks.md). The project's own
# runs keep Ray's default (on).
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

# OpenMP's threads spin for a while when they wait for work (libgomp, torch's OpenMP here: 300,000
# spins by default), which on a machine whose cores are all taken burns the time slices the
# other threads need. The suite keeps its two cores busy most of the time (the background runs
# beside the tests), and there a two-thread beam search beside one busy thread ran at 9-18
# sentences/s spinning, 46-53 with 1,000 spins (97-114 and 66-72 alone); sleeping at once
# (OMP_WAIT_POLICY=PASSIVE) gave 59-65 alone (docs/benchmarks.md, "OpenMP threads that spin").
# Set before torch (and so libgomp) is first loaded in this process; children inherit it.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

# A Ray Data execution that moves no block for RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S fails,
# naming its stuck operators (Ray's default: 1800 s). The suite's datasets are small (its
# longest test phase, with all its stages, took 95-134 s in benchmarks/results/suite_phases_*),
# so a stall fails in 5 minutes, not 30 (a CI run stalled once, 1,800 s on a parquet read;
# tests/test_preprocessing_pipeline.py says how). Read when Ray Data is first imported.
os.environ.setdefault("RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S", "300")

# Ray keeps as many idle worker processes as the node has CPUs and ends the others after 1 s
# idle; each training run's actors push the task workers out, so the next evaluation or
# preprocessing tasks start new ones (2.1 s for two tasks that import torch, against 0.01 s on a
# kept one, after each of three TorchTrainer runs). The suite's Rays keep up to 8 idle workers for
# 5 minutes (Ray's num_workers_soft_limit and idle_worker_killing_time_threshold_ms, read by the
# raylet from the environment): tests/test_workflows.py took 0.85x the time (179.8 / 189.8 s
# against 204.3 / 230.2 s, alternated; docs/benchmarks.md "The test suite's time").
os.environ.setdefault("RAY_num_workers_soft_limit", "8")
os.environ.setdefault("RAY_idle_worker_killing_time_threshold_ms", "300000")

# Two of Ray's per-node pollers, in every Ray the suite starts (each node has both). Ray's log
# monitor lists the whole logs folder again on every pass (ten a second when idle) while it
# holds fewer than RAY_LOG_MONITOR_MANY_FILES_THRESHOLD files (1,000), and once every 0.5 s
# from there on; the new lines of the files it knows are still read on every pass, so workers'
# lines reach the drivers as before, a new worker's file noticed within 0.5 s. The dashboard
# agent reads every Ray process's CPU and memory every REPORTER_UPDATE_INTERVAL_MS (5,000) for
# the dashboard's node view, which no test reads. A local Ray that had started 150 worker
# processes (306 log files), over 109-115 s: log monitor 2.69 -> 1.52 CPU s, dashboard agent
# 2.27 -> 1.95 with a 30 s interval (python -m benchmarks.ray_daemons, docs/benchmarks.md).
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "30000")

# A workflow's registration of its best model re-reads the `champion` alias after a pause
# (workflows/lineage.py, REGISTRY_SETTLE_S: 0.5 s, or 3x the read-then-set when that is longer)
# until two reads agree: 1 s of every registering run. The suite's runs register one at a time,
# each in its own store, but for the test of two runs finishing together, which sets the
# default back.
os.environ.setdefault("CONVS2S_REGISTRY_SETTLE_S", "0.1")

# Ctrl-C as a terminal sends it. A suite started in the background by a script (`make test &`,
# a script's `( ... &)`) inherits SIGINT ignored (POSIX: a non-interactive shell's asynchronous
# commands ignore SIGINT and SIGQUIT), and so does every process it starts, since an ignored
# signal stays ignored across exec: a workflow the tests press Ctrl-C in would then be a
# command told to ignore it, and it goes on, as a `nohup`'d one should (two suites started so
# failed the Ctrl-C-in-preprocessing test; docs/benchmarks.md, "Stopping a run"). The suite
# runs as from a terminal, whatever started it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The S3-protocol server on loopback (benchmarks/s3_server.py) gets its port now and starts when
# a test first asks for the `s3` fixture: its endpoint and test credentials must be in the
# environment before the session's Ray starts, so that Ray's workers inherit them, as the
# nodes of a cluster have them from their own environment (or instance role).
_S3_PORT = None
if not os.environ.get("AWS_ENDPOINT_URL"):
    from benchmarks.s3_server import LoopbackS3
    from workflows.cluster import free_port

    _S3_PORT = free_port()
    os.environ.update(LoopbackS3(_S3_PORT, None).env())



# A new sqlite MLflow store costs MLflow its whole schema history (its alembic migrations, 1-1.3 s
# here), and the suite makes about 40 of them. `mlflow_store` gives a test a copy of one empty
# store that MLflow built that way once per session. (Its unused `Default` experiment names the
# template's folder for artifacts; the project logs to experiments it creates.)
_STORE_TEMPLATE: list[Path] = []
_STORE_LOCK = threading.Lock()  # background runs (`background` below) make stores too


def mlflow_store(folder: Path, name: str = "mlflow.db") -> str:
    """The tracking URI of a new, empty sqlite MLflow store `folder`/`name` (an existing one is
    kept as it is)."""
    import atexit
    import shutil
    import tempfile

    if not Path(folder).is_absolute():  # e.g. an s3:// URI that Path() made a relative "s3:/"
        raise ValueError(f"mlflow_store needs a local absolute folder, got {folder}")
    path = Path(folder) / name
    if path.exists():
        return f"sqlite:///{path}"
    with _STORE_LOCK:
        if not _STORE_TEMPLATE:
            from mlflow.tracking import MlflowClient

            home = Path(tempfile.mkdtemp(prefix="convs2s-mlflow-template-"))
            atexit.register(shutil.rmtree, home, ignore_errors=True)
            template = home / "mlflow.db"
            MlflowClient(f"sqlite:///{template}").search_experiments()  # MLflow migrates it
            _STORE_TEMPLATE.append(template)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_STORE_TEMPLATE[0], path)
    return f"sqlite:///{path}"


def at_once(*calls):
    """Call each of `calls` (functions of no argument) at the same time, each in a thread of its
    own, and return their results in order: for calls that wait on processes of their own (a
    command-line tool, a server starting), which then share the cores instead of queueing."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(calls)) as pool:
        running = [pool.submit(call) for call in calls]
        return [r.result() for r in running]


def run_ranks(worker, nprocs: int) -> dict:
    """worker(rank, port, result) in `nprocs` spawned processes, a torch.distributed world that
    rendezvouses on a free loopback port; returns the shared `result` dict the ranks filled."""
    import torch.multiprocessing as mp

    from workflows.cluster import free_port

    port = free_port()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        result = manager.dict()
        mp.start_processes(worker, args=(port, result), nprocs=nprocs, join=True,
                           start_method="spawn")
        return dict(result)


def calls_in_a_fresh_process(imports: str, call: str, cases: list,
                             modules=("torch", "mlflow", "ray")) -> tuple[list, list]:
    """`call` (an expression of `extra`, one of `cases`, giving an exit code) for each case in
    one new Python process that ran `imports` first, each call's stderr captured; returns
    ([[exit code, stderr] per case], the `modules` that process had imported by the end)."""
    import json
    import subprocess
    import sys

    code = (f"import contextlib, io, json, logging, sys\n{imports}\nout = []\n"
            f"for extra in {cases!r}:\n"
            "    err = io.StringIO()\n"
            "    logging.root.handlers.clear()  # (a command's basicConfig binds stderr as it is)\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
            f"        rc = {call}\n"
            "    out.append([rc, err.getvalue()])\n"
            f"print(json.dumps([out, [m for m in {tuple(modules)!r} if m in sys.modules]]))")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # (a server's
    # check would load MLflow; the calls name their own stores where they need one)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@contextlib.contextmanager
def sigterm_once(ready, timeout_s: float = 120):
    """SIGTERM to this process, once, as soon as `ready()` holds and the project's handler
    (`storage.signals.sigterm_handed_to_ctrl_c`) is in place (never to another: the default
    action would end the test session), from a thread polling while the block runs; yields
    the list that gets the moment it was sent."""
    import time

    from storage.signals import sigterm_handed_to_ctrl_c

    sent, done = [], threading.Event()

    def watch():
        deadline = time.monotonic() + timeout_s
        while not done.wait(0.05) and time.monotonic() < deadline:
            if signal.getsignal(signal.SIGTERM) is sigterm_handed_to_ctrl_c and ready():
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        done.set()
        thread.join()


def cpu_holders() -> list[str]:
    """The live actors and placement groups of the running Ray that reserve CPUs."""
    from ray.util.state import list_actors, list_placement_groups

    actors = [f"actor {a.class_name} {a.required_resources}"
              for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True)
              if a.required_resources.get("CPU")]
    groups = [f"placement group {g.name or g.placement_group_id} {g.bundles}"
              for g in list_placement_groups(detail=True) if g.state != "REMOVED"]
    return actors + groups or ["tasks (no actor or placement group holds one)"]


def kill_when(proc, ready, never: str, timeout_s: float = 180) -> None:
    """SIGKILL `proc` (a subprocess.Popen) as soon as `ready()` holds; fail with `never` if it
    does not within `timeout_s`, or if the process ends first."""
    import time

    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert proc.poll() is None, "the process ended before it could be killed"
            assert time.monotonic() < deadline, never
            time.sleep(0.01)
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()

# --- end-to-end runs in the background ------------------------------------------------------------


class Background:
    """End-to-end runs that share nothing with the session's Ray (a cluster of their own, its
    processes and folders), started one after another in one thread as soon as collection
    ends, so that their waits (nodes starting, a node's loss detected, a job's upload) overlap
    the tests that run meanwhile instead of adding to the session's time (docs/benchmarks.md,
    "The test suite's time").

    A test module declares them as `BACKGROUND_RUNS = {name: run}`, in the order they run;
    `run(ctx)` gets this object as `ctx` (`ctx.tmp_path_factory`, `ctx.env`: the environment
    as the session started, before any test changed it; `ctx.result(name)` of an earlier run,
    `ctx.popen` / `ctx.run` for its processes and `ctx.cleanup(fn)` for anything else that
    must end with the session, `ctx.cancelled` set when the session ends early). A run
    starts only when a selected test uses the fixture of its name; its module fixture takes
    the value with `background.result(name)`, which waits for it and raises its error there
    (or runs it at once when it was not started). What measures time (a training time
    budget) runs inside `with background.quiet():`, with no run going."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.env = dict(os.environ)
        self.cancelled = threading.Event()
        self._runs: dict = {}  # name -> run, in order
        self._done: dict = {}  # name -> ("ok", value) | ("error", exception)
        self._cleanups: list = []
        self._lock = threading.Lock()
        self._gate = threading.Lock()  # held by a run, or by a `quiet` section
        self._thread: threading.Thread | None = None
        self._running: set = set()  # the names started (here or in the thread)

    def start(self, declared: dict, used: list) -> None:
        """Know every run the collected modules declare; start those in `used` (names)."""
        self._runs.update(declared)
        if not used:
            return
        self.tmp_path_factory.getbasetemp()  # made here: making it is not thread-safe
        self._thread = threading.Thread(target=self._work, args=(used,),
                                        name="background-runs", daemon=True)
        self._thread.start()

    def _work(self, names: list) -> None:
        for name in names:
            with self._gate:  # not inside a `quiet` section
                if self.cancelled.is_set():
                    break
                self._run(name)

    def _run(self, name: str) -> None:
        """Run `name` here unless it has run or another thread is running it."""
        with self._lock:
            if name in self._done or name in self._running:
                return
            self._running.add(name)
        from benchmarks.suite_phases import span  # (records it only under that plugin)

        try:
            with span(name):
                self._done[name] = ("ok", self._runs[name](self))
        except BaseException as err:  # raised again in the test that takes the result
            self._done[name] = ("error", err)

    def result(self, name: str):
        """The value of run `name` (waiting for it)."""
        import time

        while name not in self._done:
            if name not in self._running:
                self._run(name)  # not started yet: here, now
            else:
                time.sleep(0.1)
        kind, value = self._done[name]
        if kind == "error":
            raise value
        return value

    @contextlib.contextmanager
    def quiet(self):
        """A section with no background run going: it waits for the run in progress to end,
        and the next one starts after the section."""
        with self._gate:
            yield

    def cleanup(self, fn) -> None:
        self._cleanups.append(fn)

    def popen(self, cmd: list, **kw):
        """subprocess.Popen in a process group of its own, which the session's end kills if it
        still runs (a workflow and the local Ray it started)."""
        import subprocess

        proc = subprocess.Popen(cmd, start_new_session=True, **kw)

        def end() -> None:  # the whole group, even when its lead process has ended
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

        self.cleanup(end)
        return proc

    def run(self, cmd: list, timeout: float, **kw):
        """subprocess.run through `popen`: its output captured as text."""
        import subprocess

        proc = self.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:  # the group: a child (its local Ray) holds the pipes
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def close(self) -> None:
        """At the session's end: what the runs started is ended (a run still going fails
        fast once its cluster is gone), the thread is given a while to finish, and what it
        started meanwhile is ended too. (Cleanups are idempotent: a module may have ended
        its part already.)"""
        self.cancelled.set()
        self._clean()
        if self._thread is not None:
            self._thread.join(timeout=120)
            self._clean()  # what a run started while the first cleanup ran

    def _clean(self) -> None:
        for fn in reversed(self._cleanups):
            try:
                fn()
            except Exception as err:  # one failed cleanup must not keep the others from running
                print(f"background cleanup {fn!r} failed: {err!r}")


_BACKGROUND: list[Background] = []


def pytest_collection_finish(session):
    """Start the background runs that the selected tests use (`Background`)."""
    bg = Background(session.config._tmp_path_factory)
    _BACKGROUND.append(bg)
    if session.config.option.collectonly:
        return
    used = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    declared = {}
    for module in dict.fromkeys(getattr(item, "module", None) for item in session.items):
        declared.update(getattr(module, "BACKGROUND_RUNS", {}))
    if "s3" in used and _S3_PORT is not None:  # before the runs, which may use it (`s3_server`)
        s3_server()
    bg.start(declared, [name for name in declared if name in used])


def pytest_sessionfinish(session):
    for bg in _BACKGROUND:
        bg.close()
    _SERVERS_STOP.close()  # the servers the tests and background runs shared


@pytest.fixture(scope="session")
def background() -> Background:
    return _BACKGROUND[-1]


@pytest.fixture(scope="session")
def fr_en_runs(background):
    """The fr-en runs on a bucket and on local disk (tests/test_object_storage.py declares the
    run; tests/test_workflows.py's language-pair test takes its local half)."""
    return background.result("fr_en_runs")


def pytest_collection_modifyitems(config, items):
    """Tests marked `timed` run last, when every background run (`Background`) has ended and
    their `quiet` sections wait for none; `gpu` tests are skipped without a GPU."""
    import torch

    # (sorted() is stable: every other test keeps its place)
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("timed") is not None)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def translate_log_as_it_was():
    """A served replica or a corpus translator made in the test's process (their classes,
    without Ray) filters the translation logger's cut-line warnings for its process, which
    is theirs alone when Ray runs them; here it is the session's: the filter is taken off
    after the test, as pytest's caplog puts the logger's level back."""
    yield
    import sys

    translate = sys.modules.get("convs2s.inference.translate")
    if translate is not None:
        import logging

        logging.getLogger(translate.__name__).removeFilter(translate.without_cut_line_warnings)


@pytest.fixture
def compile_state():
    """`compile_for_training` sets process-wide state: dynamo's float setting, duck sizing
    (`convs2s.model.fused.dynamic_shape_settings`) and the fused loss's compiled chunks
    (`convs2s.model.loss.compile_loss_chunks`). Put them back after the test (pytest's
    monkeypatch would delete the config entry on undo, which hides a torch config entry)."""
    import torch
    import torch.fx.experimental._config as fx_config

    from convs2s.model import loss

    before = torch._dynamo.config.specialize_float, fx_config.use_duck_shape
    yield
    torch._dynamo.config.specialize_float, fx_config.use_duck_shape = before
    loss.compile_loss_chunks(None)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (small real corpora; CONVS2S_SHARED_DATA names another folder of them);
    the test is skipped when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real corpora not found at {SHARED_DATA} (../shared/data beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance (2 CPUs) shared by every test of the session."""
    import ray

    # Keep small parquet reads light (docs/reference.md, Ray) and quiet Ray's progress bars.
    os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    if not ray.is_initialized():
        # With the dashboard, as on a real cluster: Ray Train removes the placement group of
        # a run whose controller died (a killed sweep trial) through the state API it serves.
        # On a free port: runs started by tests in other processes keep Ray's default one.
        from workflows.cluster import free_port

        port = free_port()
        # Its processes ask this instance's state API, not another Ray's on this machine
        # (workflows.cluster.own_dashboard says why).
        os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
        ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1",
                 dashboard_port=port, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


# --- servers the tests share: started once, by a test's fixture or by a background run ----------

_SERVERS: dict = {}
_SERVERS_LOCK = threading.Lock()  # a background run may ask for one while a test does
_SERVERS_STOP = contextlib.ExitStack()  # closed at the session's end, after the background runs


def s3_server():
    """The loopback S3 server (moto's server mode, its own process) with one bucket,
    `convs2s-test` (`.create_bucket`, `.keys(bucket, prefix)`). It is started from the main
    thread, by `pytest_collection_finish` when a selected test uses `s3`: its process ends
    with the thread that started it (benchmarks/s3_server.py, PR_SET_PDEATHSIG), and a
    background run's thread ends before the session does."""
    from benchmarks.s3_server import LoopbackS3

    if _S3_PORT is None:
        pytest.skip("AWS_ENDPOINT_URL is set outside the tests: not starting a loopback server")
    if "s3" in _SERVERS:  # (without the lock: not to wait while the team server starts)
        return _SERVERS["s3"]
    with _SERVERS_LOCK:
        if "s3" not in _SERVERS:
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError("the loopback S3 server is started by the main thread "
                                   "(a selected test uses the `s3` fixture)")
            server = LoopbackS3.start(_S3_PORT)
            _SERVERS_STOP.callback(server.stop)
            server.create_bucket("convs2s-test")
            _SERVERS["s3"] = server
        return _SERVERS["s3"]


def s3_running() -> bool:
    """Whether the loopback S3 server has started (`s3_server`)."""
    return "s3" in _SERVERS


@pytest.fixture(scope="session")
def s3():
    """`s3_server()` for a test."""
    return s3_server()


TEAM_ADMIN = ("admin", "admin-pw-for-tests")


def team_server_of(tmp_path_factory, env: dict):
    """The team tracking server of infra/mlflow on loopback: `mlflow server --app-name
    basic-auth` started through infra/mlflow/auth-entrypoint.sh, its artifacts in the loopback
    bucket (--artifacts-destination s3://convs2s-test/mlflow --serve-artifacts), once per
    session. `env`: the environment it starts in (a background run passes the session's as it
    started, not os.environ, which a test may be changing meanwhile). Returns a namespace:
    url, admin (user, password), add_user(name, password) (for the main thread: it sets the
    admin's login in os.environ for the call), config (the basic-auth configuration the
    entrypoint wrote)."""
    from types import SimpleNamespace

    from benchmarks.mlflow_ui import mlflow_server

    s3_server()
    with _SERVERS_LOCK:
        if "team" in _SERVERS:
            return _SERVERS["team"]
        root = tmp_path_factory.mktemp("team_server")
        server_env = {**env, "MLFLOW_ADMIN_PASSWORD": TEAM_ADMIN[1],
                      "MLFLOW_FLASK_SERVER_SECRET_KEY": "a-key-for-tests-only",
                      "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
                      "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{root / 'auth.db'}"}
        server_env.pop("MLFLOW_TRACKING_URI", None)
        url = _SERVERS_STOP.enter_context(mlflow_server(
            ["server", "--app-name", "basic-auth", "--backend-store-uri",
             f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination",
             "s3://convs2s-test/mlflow", "--serve-artifacts"], root / "server.log",
            wrapper=("sh", str(REPO / "infra" / "mlflow" / "auth-entrypoint.sh")),
            env=server_env))

        def add_user(name: str, password: str) -> None:
            add_team_user(url, name, password)

        _SERVERS["team"] = SimpleNamespace(url=url, admin=TEAM_ADMIN, add_user=add_user,
                                           config=root / "basic_auth.ini")
        return _SERVERS["team"]


def add_team_user(url: str, name: str, password: str) -> None:
    """A user `name` on the team server at `url`, made by its admin (whose login this sets in
    os.environ for the call: a main thread's call, or a process of its own)."""
    from unittest import mock

    from mlflow.server.auth.client import AuthServiceClient

    with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_USERNAME": TEAM_ADMIN[0],
                                      "MLFLOW_TRACKING_PASSWORD": TEAM_ADMIN[1]}):
        AuthServiceClient(url).create_user(name, password)


@pytest.fixture(scope="session")
def team_server(s3, tmp_path_factory):
    """`team_server_of` for a test."""
    return team_server_of(tmp_path_factory, dict(os.environ))


# --- translation assets (tests of translate, averaging, attention plots, evaluation, serving) ---


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict:
    """Two randomly initialised `tiny` ConvS2S checkpoints (seeds 0 and 1) that share a small
    BPE model trained on 2,000 demo pairs: {"a": dir, "b": dir, "spm": path, "pairs": [...]}.
    Fast: no Ray, no training."""
    import pyarrow as pa
    import torch

    from convs2s.io.checkpoint import save_checkpoint
    from convs2s.config import PRESETS
    from convs2s.model.network import ConvS2S
    from preprocessing.demo import translation_pairs
    from preprocessing.vocab import load, train_bpe

    root = tmp_path_factory.mktemp("tiny_checkpoints")
    pairs = translation_pairs(7, 0, 2000)
    train_bpe(pa.table({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}),
              root / "spm", 400, 1.0)
    vocab = load(root / "spm.model").get_piece_size()
    out = {"spm": str(root / "spm.model"), "pairs": pairs}
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        cfg = PRESETS["tiny"]()
        model = ConvS2S(cfg, vocab, vocab)
        state = {"model": model.state_dict(), "model_config": cfg.to_dict(),
                 "src_vocab_size": vocab, "tgt_vocab_size": vocab, "epoch": 1,
                 "update": 10 * (seed + 1), "optimizer": {}, "val_loss": 5.0}
        out[name] = str(save_checkpoint(root / name, state, spm_model=out["spm"]))
    return out


@pytest.fixture(scope="session")
def demo_trained(tmp_path_factory, ray_session):
    """The demo corpus preprocessed (300-sentence valid and test splits) and a `small` ConvS2S
    trained on it in this process (`convs2s.train.local.fit_local`: the Trainer's loop without Ray
    Train, whose start-up this fixture does not test; 450 updates, about 40 s on 2 CPUs; demo
    test BLEU about 35, against 15 at 300 updates and 60 at 600),
    logged to a sqlite MLflow store; plus an untrained checkpoint of the same shape and BPE
    (the BLEU baseline). Returns a namespace: prep, train (TrainResult), tracking_uri,
    untrained, test_src, test_ref."""
    from types import SimpleNamespace

    import torch

    from convs2s.io.checkpoint import save_checkpoint
    from convs2s.config import PRESETS, TrainConfig
    from convs2s.model.network import ConvS2S
    from convs2s.train.job import TrainJob
    from convs2s.train.local import fit_local
    from preprocessing.config import demo
    from preprocessing.pipeline import run_pipeline

    root = tmp_path_factory.mktemp("demo_trained")
    prep = run_pipeline(demo().replace(root=str(root / "prep"),
                                       demo_rows={"train": 20_000, "valid": 300, "test": 300}))
    uri = mlflow_store(root)
    cfg = PRESETS["small"]()
    result = fit_local(TrainJob(
        # float32 on every host: the tests' quality thresholds do not depend on whether the
        # host has native bf16 (auto would pick it where it does)
        model=cfg, train=TrainConfig(max_epochs=0, max_updates=450, checkpoint_interval=150,
                                     keep_last=4, log_interval=50, lr_schedule="fixed",
                                     precision="fp32"),
        train_data=prep.batches["train"], valid_data=prep.batches["valid"],
        spm_model=prep.spm_model, vocab_size=prep.vocab_size, storage_path=str(root / "runs"),
        run_name="demo_small", num_workers=1, cpus_per_worker=1, tracking_uri=uri))
    torch.manual_seed(0)
    V = prep.vocab_size
    untrained = save_checkpoint(
        root / "untrained", {"model": ConvS2S(cfg, V, V).state_dict(),
                             "model_config": cfg.to_dict(), "src_vocab_size": V,
                             "tgt_vocab_size": V, "epoch": 0, "update": 0},
        spm_model=prep.spm_model)
    src, ref = prep.text["test"]
    return SimpleNamespace(prep=prep, train=result, tracking_uri=uri, untrained=str(untrained),
                           test_src=src, test_ref=ref)


# --- workflows: a smoke workflow run, and Ray nodes started with the `ray` CLI --------------------

# Outputs of at most 1.2 x |source| + 10 pieces for the workflow runs of the tests, whose models
# train for a few dozen updates: such a model rarely ends a sentence and would otherwise run each
# one to the presets' 200 pieces (beam 5), most of a short run's evaluation time.
SHORT_OUTPUTS = ("--set", "search.max_len_a=1.2", "--set", "search.max_len_b=10")

# The demo corpus of the En-Fr smoke run of the tests (`smoke_workflow` and the runs that reuse its
# preprocessing): its 20,000 training pairs, 200 validation and 200 test pairs instead of 500
# (the tests read the run's records and families, not its scores' precision; 500 gave the run
# 2.5x the sentences to validate and to score twice).
SMOKE_ROWS = ("--set", "data.demo_rows={train: 20000, valid: 200, test: 200}")
# A quarter of the demo corpus, for the short runs that only need a few dozen updates (the
# node-loss run: 26 updates an epoch on two workers; the other tasks' smoke runs).
QUARTER_DEMO = ("--set", "data.demo_rows={train: 5000, valid: 200, test: 200}")


@pytest.fixture(scope="session")
def smoke_workflow(tmp_path_factory, ray_session):
    """The En-Fr workflow's smoke preset run through its command line (`main`) on the session's
    Ray, cut to 60 updates: demo corpus, `small` model, 2 workers, evaluation of the best
    checkpoint and the average of the last two (with the first test sentence's attention).
    Returns a namespace: storage, tracking_uri,
    experiment, run_name, stdout (the printed summary)."""
    import contextlib
    import io
    from types import SimpleNamespace

    from workflows import wmt14_en_fr

    root = tmp_path_factory.mktemp("smoke_workflow")
    uri = mlflow_store(root)
    argv = ["--preset", "smoke", "--max-updates", "60", *SHORT_OUTPUTS, *SMOKE_ROWS,
            "--storage-path", str(root / "runs"), "--tracking-uri", uri, "--run-name", "smoke-test",
            "--attention", "1"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = wmt14_en_fr.main({"paper": wmt14_en_fr.paper, "smoke": wmt14_en_fr.smoke},
                              wmt14_en_fr.__doc__, argv)
    assert rc == 0, buf.getvalue()[-3000:]
    return SimpleNamespace(storage=root / "runs", tracking_uri=uri, experiment="wmt14_en_fr",
                           run_name="smoke-test", argv=argv, stdout=buf.getvalue())


@pytest.fixture(scope="session")
def demo_batches(ray_session, tmp_path_factory):
    """The embedded demo corpus (En->Fr) through the real preprocessing pipeline, small: 3000
    training pairs, 200 valid / test, a 400-piece joint BPE, batches of <= 800 tokens (about 137
    training batches). Returns the `PipelineOutput` (`.batches[split]`, `.spm_model`,
    `.vocab_size`, `.text`, `.manifests`); written once per test session."""
    from preprocessing.pipeline import run_pipeline

    return run_pipeline(demo_batches_config(tmp_path_factory.mktemp("demo_preprocessed")))


def demo_batches_config(root: Path):
    """The PreprocessConfig `demo_batches` runs, its output under `root` (the same `root`:
    every stage up to date once the fixture made it)."""
    from preprocessing.config import demo

    return demo().replace(root=str(root), vocab_size=400, spm_sample_pairs=2000,
                          max_tokens=800, block_rows=1000,
                          demo_rows={"train": 3000, "valid": 200, "test": 200})


@pytest.fixture(scope="session")
def rows_follow_the_plan():
    """check(record_dir, train_data, seed, shuffle_buffer, world, updates) -> replayed updates:
    which rows (not how many) each update of each rank trained, from the record the workers
    write under CONVS2S_TEST_RECORD_BATCHES. Every update 1..`updates` trained the rows that an
    uninterrupted run's plan (convs2s.train.data) gives it, so each epoch trains every row
    once; an update recorded twice (lost with a dead worker group, trained again) trained the
    same rows both times. Returns the set of those replayed updates."""
    import json

    import pyarrow.parquet as pq

    from convs2s.train.data import TrainFiles, epoch_rows

    def check(record: Path, train_data: str, seed: int, shuffle_buffer: int, world: int,
              updates: int) -> set[int]:
        files = TrainFiles.scan(train_data)
        tables = [pq.read_table(p, columns=["id"]) for p in files.paths]
        per_epoch = files.rows_per_rank(world)
        replayed = set()
        for rank in range(world):
            seen: dict[int, list] = {}
            for line in (Path(record) / f"rank{rank}.jsonl").read_text().splitlines():
                rec = json.loads(line)
                if rec["update"] in seen:
                    assert rec["ids"] == seen[rec["update"]], (rank, rec["update"])
                    replayed.add(rec["update"])
                seen[rec["update"]] = rec["ids"]
            assert sorted(seen) == list(range(1, updates + 1)), rank
            plans = {}
            for update in range(1, updates + 1):
                epoch, i = (update - 1) // per_epoch + 1, (update - 1) % per_epoch
                if epoch not in plans:
                    plans[epoch] = epoch_rows(files, seed, epoch, world, rank, shuffle_buffer)
                f, row = plans[epoch][i]
                assert seen[update] == [tables[f]["id"][int(row)].as_py()], (rank, update)
        return replayed

    return check
