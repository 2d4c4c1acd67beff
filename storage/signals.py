"""How a command stops: Ctrl-C and SIGTERM alike, never lost, never an abort. Shared by the
project's commands (`python -m convs2s`, `python -m preprocessing`, the workflows) and the Ray
stages they run, which is why it sits in the layer under both packages.

    with command_signals():          # a command's main(): Ctrl-C after imports, never dropped
        with sigterm_as_ctrl_c():    # after Ray's start: SIGTERM (`ray job stop`) as Ctrl-C
            run()

Ctrl-C and SIGTERM go through the handler Ray Train or Ray Tune has in place while they run
(`sigterm_as_ctrl_c`), and the caller's handlers come back after Ray's calls that leave theirs
installed (`callers_signal_handlers`). A command's own SIGINT handler
(`ctrl_c_after_imports`) holds a Ctrl-C that lands inside an import until the import ends,
and `ctrl_c_never_lost` raises again a Ctrl-C that Python dropped in a finalizer. A Ray Data
dataset a Ctrl-C cut short is collected quietly (`quiet_interrupted_datasets`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator


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


_HELD: set[threading.Timer] = set()  # Ctrl-Cs to be sent again (`_send_again`)
# Re-entrant: a signal handler may run in the main thread while that thread holds it.
_HELD_LOCK = threading.RLock()


def _send_again(signum: int, delay: float) -> None:
    """Send `signum` to this process again `delay` seconds from now, from another thread,
    unless `_drop_held` drops it first."""
    def send() -> None:
        with _HELD_LOCK:
            if timer not in _HELD:  # dropped: the command has ended
                return
            _HELD.discard(timer)
            os.kill(os.getpid(), signum)

    timer = threading.Timer(delay, send)
    timer.daemon = True
    with _HELD_LOCK:
        _HELD.add(timer)
    timer.start()


def _drop_held() -> None:
    """A Ctrl-C still held when a command's block ends is not sent: the command has ended
    (`--help` is all imports, say), and sent then it came as a KeyboardInterrupt in Python's
    exit ("Exception ignored in atexit callback ... KeyboardInterrupt")."""
    with _HELD_LOCK:
        for timer in list(_HELD):
            timer.cancel()
        _HELD.clear()


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
        _send_again(signum, 0.05)
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
            _send_again(signal.SIGINT, 0.01)
            return
        before(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = before


@contextlib.contextmanager
def command_signals() -> Iterator[None]:
    """A command's whole run (`python -m convs2s`, `python -m preprocessing`, a workflow file):
    Ctrl-C is held while an import runs (`ctrl_c_after_imports`) and never dropped in a
    finalizer (`ctrl_c_never_lost`). The caller's SIGINT handler is back after the block. For a
    command's entry point: in-process callers (tests, notebooks) call the code inside it and
    keep their own handlers. Outside the main thread, or with Ctrl-C ignored (`nohup`), it
    changes nothing."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    if not main or before is signal.SIG_IGN:  # started with Ctrl-C ignored (`nohup`): kept so
        yield
        return
    signal.signal(signal.SIGINT, ctrl_c_after_imports)
    try:
        with ctrl_c_never_lost():
            yield
    finally:
        try:
            _drop_held()
        finally:  # (even where the held Ctrl-C came in there)
            if before is not None:
                signal.signal(signal.SIGINT, before)


def quiet_interrupted_datasets() -> None:
    """Ray Data's `Dataset.__del__` reads `self._current_executor`, which `Dataset.__init__`
    sets only after a few other steps. A Ctrl-C that lands inside `__init__` leaves an
    instance without it, and collecting that instance printed "Exception ignored in ...
    Traceback ... AttributeError" under the run's one "interrupted" line (a suite run,
    2026-12-06). A class-level default makes its `__del__` return, as for a dataset never
    executed. Called by the preprocessing pipeline and the corpus job once they import Ray
    Data."""
    import ray.data

    if not hasattr(ray.data.Dataset, "_current_executor"):
        ray.data.Dataset._current_executor = None
