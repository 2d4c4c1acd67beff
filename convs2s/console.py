"""The console of the project's Ray commands (workflows, `translate --actors`, `serve`): what Ray
prints that is harmless and that the project can neither cause nor prevent stays in Ray's log
files, not on the console. No dependencies: the lowest part of convs2s/, used by workflows/
(`workflows.console` re-exports it and checks a log with `python -m workflows.console LOG`).

Ray's C++ core logs ERROR lines to its log files *and* to stderr: the driver's own stderr, and
(through Ray's log forwarding) each worker's, prefixed `(<actor> pid=...)`. A few of them
are notices about Ray's own design, not about this run, and read as failures to a user. Each
is named below with the reason it is harmless; every other line passes untouched, and a
filtered line is still in Ray's log folder (`Ray's own logs: ...` on the console).

    with harmless_ray_lines_dropped(2), harmless_ray_lines_dropped(1):  # a workflow command
        run()

The filter sits on file descriptor 2 (a pipe read by a thread), since the C++ lines bypass
Python's `sys.stderr`. It is installed only by a command (a workflow's or `python -m convs2s`'s
`main()` without argv): in-process callers (tests, notebooks) keep their own stderr.

How a run stops (`sigterm_as_ctrl_c`, `callers_signal_handlers`): Ctrl-C and SIGTERM (`ray job
stop`) alike, through the handler Ray Train or Ray Tune has in place, and the caller's handlers
back after Ray's calls that leave theirs installed.

A Ray worker's own console lines (`worker_line`): written once, not through Ray Train's print.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator


def worker_line(line: str) -> None:
    """One line on a Ray worker's stdout, which Ray forwards to the driver's console once.
    Not print(): Ray Train patches it in workers to log *and* echo, so each line came twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# (pattern, why it is harmless). The patterns match one line each, as Ray prints them.
HARMLESS_RAY_LINES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"core_worker\.cc:\d+: Actor with class name: '[^']+' and ID: '[0-9a-f]+' "
                r"has constructor arguments in the object store and max_restarts > 0"),
     "Ray warns for every restartable actor whose constructor arguments it keeps in its object "
     "store (ray-project/ray#53727). Ray Data's actor pools (their "
     "DataContext and transformer) and Ray Train's PreemptionWatcher are made that way "
     "by Ray itself; the driver that owns those objects lives as long as the actors, so a "
     "restart finds them. Turning restarts off to silence it would lose the restarts."),
    (re.compile(r"gcs_actor_scheduler\.cc:\d+: Failed to kill actor [0-9a-f]+, return status: "
                r".*KillActor RPC failed"),
     "Ray's GCS logs that its kill RPC to an actor failed when the actor's process had already "
     "exited (Ray Data shutting down a finished pool): the actor is gone either way."),
    (re.compile(r"\(raylet\) WARNING: \d+ PYTHON worker processes have been started on node: "
                r"\S+ with address: \S+, which is \d+x the maximum expected startup "
                r"concurrency"),
     "The raylet counts Python processes starting at the same moment against one per CPU: "
     "when training starts, Ray Train's controller, its two workers and Ray Data's dataset, "
     "split and stats actors all start together, which is more than a 2-CPU node's count. "
     "They are Ray's own actors, each started once; the run is not slowed or short of CPUs."),
)



def choose_local_ray_auth() -> None:
    """Before a local Ray starts: token authentication (Ray's default for a new local
    instance), chosen explicitly, since left unset Ray picks the same and prints a notice on
    every run. A user's own RAY_AUTH_MODE is kept."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    import ray._raylet

    ray._raylet.Config.initialize("")  # as Ray does after setting it: re-read the setting

# A clean run's console has none of these: a Ray C++ ERROR line ("[<time> E <pid> <tid>]"), a
# Ray Python WARNING / ERROR line ("<time>\tWARNING file.py:12 -- ..."), a raylet warning or
# error forwarded to the driver ("(raylet) WARNING: ..."), a Python warning ("...Warning: ...")
# or a traceback.
ALARMING = re.compile(r"\d E \d+ \d+\]|\b(WARNING|ERROR) \S+\.py:\d+ --|\(raylet\) (WARNING|ERROR)"
                      r"|Warning|Traceback")


def alarming_lines(console: str) -> list[str]:
    """The lines of a console log that read as trouble (`ALARMING`)."""
    return [line for line in console.splitlines() if ALARMING.search(line)]


def is_harmless(line: str) -> str | None:
    """The reason `line` is a known harmless Ray line, or None."""
    for pattern, why in HARMLESS_RAY_LINES:
        if pattern.search(line):
            return why
    return None


@contextlib.contextmanager
def harmless_ray_lines_dropped(stream_fd: int = 2) -> Iterator[None]:
    """Lines written to `stream_fd` (by Python, C++ or Ray's log forwarding) pass through,
    except the harmless Ray lines above. Restores the descriptor on exit. A workflow filters
    both streams: Ray forwards its processes' logs to stderr but prints the errors the raylet
    pushes to the driver (`(raylet) WARNING: ...`) on stdout."""
    try:
        _flush()
        saved = os.dup(stream_fd)
        read_end, write_end = os.pipe()
    except OSError:  # no usable descriptor (closed stderr): nothing to filter
        yield
        return
    os.dup2(write_end, stream_fd)
    os.close(write_end)
    thread = threading.Thread(target=_pump, args=(read_end, saved), name="console-filter",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        _flush()  # Python's buffered text goes through the filter before it is removed
        os.dup2(saved, stream_fd)  # the pipe's last writer in this process is gone ...
        thread.join(timeout=5.0)   # ... so the pump drains it and stops
        os.close(saved)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _pump(read_end: int, out_fd: int) -> None:
    """Copy whole lines from `read_end` to `out_fd`, dropping the harmless ones."""
    pending = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(read_end, 65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            keep = [line for line in lines
                    if is_harmless(line.decode("utf-8", "replace")) is None]
            if keep:
                _write_all(out_fd, b"".join(line + b"\n" for line in keep))
        if pending and is_harmless(pending.decode("utf-8", "replace")) is None:
            _write_all(out_fd, pending)
    os.close(read_end)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


# --- stopping a command: Ctrl-C and SIGTERM ------------------------------------------------------


@contextlib.contextmanager
def callers_signal_handlers() -> Iterator[None]:
    """The caller's Ctrl-C (SIGINT), SIGTERM and SIGUSR1 handlers put back when the block ends.
    Ray Train's `fit` and Ray Tune's `Tuner.fit`, called in the main thread, install handlers of
    their own (Ray Train's aborts its run; Ray Tune's stops its experiment, and it takes SIGUSR1
    too) and leave them installed after the run. The caller's next Ctrl-C (a workflow's
    evaluation, the stage after training) then went to a finished run: Ray Train's swallowed
    it (the third press exits with status 0) and kept the run's controller actor alive, held by
    the handler; Ray Tune's swallowed the first."""
    signals = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None))
               if s is not None]
    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in signals} if main else {}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # (None: a handler not set from Python, left as it is)
                signal.signal(sig, handler)


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM (what `ray job stop` sends a job's driver, and a machine's
    shutdown every process) stops the work as Ctrl-C does: through the SIGINT handler in place
    (Ray Train's during `fit`, which aborts the worker group; Ray Tune's during a sweep, which
    stops the trials; else Python's KeyboardInterrupt). The caller's handlers are put back after
    (`callers_signal_handlers`). Without it, SIGTERM went to Ray's handlers, which `ray.init`
    installs: its C++ handler printed a stack and its Python one exited (SystemExit) wherever
    the driver was, in `fit` leaving the run's controller and workers to the process's exit;
    the process then ended in an abort (status 134), in every stage."""
    with callers_signal_handlers():
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm_handed_to_ctrl_c)
        yield


def sigterm_handed_to_ctrl_c(signum, frame) -> None:
    """`sigterm_as_ctrl_c`'s SIGTERM handler: the SIGINT handler in place, called as for
    Ctrl-C."""
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        raise KeyboardInterrupt("SIGTERM")
    handler(signal.SIGINT, frame)


def _inside_an_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def ctrl_c_after_imports(signum, frame) -> None:
    """A SIGINT handler for a command's main thread (`python -m convs2s`): Ctrl-C is a
    KeyboardInterrupt, as with Python's own handler, except inside an import, where it is sent
    again 50 ms later until it lands outside one. Imports run C++ code that calls back into
    Python (torch's pybind11 modules as they load), and a KeyboardInterrupt raised there
    escaped as a C++ exception: "terminate called after throwing an instance of
    'pybind11::error_already_set'", and the process aborted (status -6, a page of C++ text
    instead of the `interrupted` line; a suite run, 2026-12-06, Ctrl-C 0.5 s into
    `python -m convs2s train`)."""
    if _inside_an_import(frame):
        again = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_never_lost() -> Iterator[None]:
    """Within the block, a Ctrl-C is never dropped. Python raises its KeyboardInterrupt in the
    code running when the signal comes, and when that is a finalizer or a weakref callback
    (the garbage collector running SQLAlchemy's, say), it prints "Exception ignored in ...
    KeyboardInterrupt" and goes on: the workflow ran to its end, Ctrl-C lost (a suite run,
    2026-12-06). Such a Ctrl-C is sent again, to the code that runs next, and nothing is
    printed for it; other errors Python cannot raise go to the hook in place."""
    before = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is KeyboardInterrupt:  # (signal handlers run in the main thread)
            # from another thread, a moment later: sent from here it would be raised in here
            again = threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT))
            again.daemon = True
            again.start()
            return
        before(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = before
