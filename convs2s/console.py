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

How a command stops on Ctrl-C or SIGTERM: `storage.signals`, shared with the preprocessing.

A Ray worker's own console lines (`worker_line`): written once, not through Ray Train's print.
"""

from __future__ import annotations

import contextlib
import os
import re
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
