"""The workflow console filter (workflows/console.py) as a specification: each Ray line it keeps
off the console is named here, as Ray printed it on a clean run, with the reason it is
harmless; every other line, Python's and C++'s alike, passes through unchanged and in order.

    .venv/bin/python -m pytest tests/test_console.py -q
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from workflows.console import HARMLESS_RAY_LINES, is_harmless

REPO = Path(__file__).resolve().parents[1]

# Lines as Ray 2.60 printed them during `make smoke` (the driver's own C++ log, and worker and
# GCS lines forwarded by Ray's log monitor).
RAY_SAID = {
    "restartable actor, arguments in the object store (driver)":
        "[2026-11-24 06:10:18,334 E 2779 2779] core_worker.cc:2465: Actor with class name: "
        "'MapWorker(MapBatches(PartEncoder))' and ID: '923ea68990991e123865cb3d01000000' has "
        "constructor arguments in the object store and max_restarts > 0. If the arguments in "
        "the object store go out of scope or are lost, the actor restart will fail. See "
        "https://github.com/ray-project/ray/issues/53727 for more details.",
    "restartable actor, arguments in the object store (Ray Train's controller)":
        "(TrainController pid=4046) [2026-11-24 06:11:04,707 E 4046 4076] core_worker.cc:2465: "
        "Actor with class name: 'PreemptionWatcher' and ID: '7d3a5793d11e4de8b26e090a01000000' "
        "has constructor arguments in the object store and max_restarts > 0. If the arguments "
        "in the object store go out of scope or are lost, the actor restart will fail.",
    "a kill RPC to an actor that had exited":
        "(pid=gcs_server) [2026-11-24 06:10:37,775 E 2782 2782] (gcs_server) "
        "gcs_actor_scheduler.cc:538: Failed to kill actor 668c6250ece636d0125b5cbf01000000, "
        "return status: Invalid: KillActor RPC failed for actor "
        "668c6250ece636d0125b5cbf01000000: RpcError: RPC error: Socket closed rpc_code: 14",
    "Ray Train's and Ray Data's actors starting together on a 2-CPU node":
        "(raylet) WARNING: 8 PYTHON worker processes have been started on node: "
        "7fc01a80262e569f79cda224a5d515442d7f2afea399cfe299988784 with address: 192.0.2.2, "
        "which is 4x the maximum expected startup concurrency (2). This could be a result of "
        "using a large number of actors, tasks blocked in ray.get() calls, or tasks with "
        "fractional CPU requests (e.g., num_cpus=0.1) allowing high concurrency. See "
        "https://github.com/ray-project/ray/issues/3644 for some discussion of workarounds.",
}

# Lines that must reach the user, including Ray errors that look alike.
MUST_PASS = [
    "(RayTrainWorker pid=4148) [convs2s.train] epoch 1 done | update 104 | valid loss 4.589",
    "[2026-11-24 06:10:18,334 E 2779 2779] core_worker.cc:812: Failed to register worker to "
    "Raylet: IOError: Connection refused",
    "(pid=gcs_server) [2026-11-24 06:10:37,775 E 2782 2782] (gcs_server) "
    "gcs_actor_scheduler.cc:538: Actor 668c6250 creation failed: insufficient resources",
    "Traceback (most recent call last):",
    "(raylet) WARNING: the node is running low on memory",
    "error: no input for split 'valid' (source name 'val') in /data",
]


@pytest.mark.parametrize("what", sorted(RAY_SAID))
def test_each_filtered_ray_line_is_named_with_why_it_is_harmless(what):
    why = is_harmless(RAY_SAID[what])
    assert why and len(why) > 60, what  # a reason a reader can check, not a label


def test_every_pattern_is_exercised_and_other_lines_pass():
    for pattern, _ in HARMLESS_RAY_LINES:
        assert any(pattern.search(line) for line in RAY_SAID.values()), pattern.pattern
    for line in MUST_PASS:
        assert is_harmless(line) is None, line


CHILD = r"""
import os, subprocess, sys
sys.path.insert(0, {repo!r})
from workflows.console import harmless_ray_lines_dropped
with harmless_ray_lines_dropped():
    print("python line 1", file=sys.stderr, flush=True)
    os.write(2, ({harmless!r} + "\n").encode())           # C++ writes straight to fd 2
    subprocess.run([sys.executable, "-c",                 # so does a child process
                    "import os; os.write(2, b'child line\\n' + os.environ['LINE'].encode())"],
                   env={{**os.environ, "LINE": {harmless!r} + "\n"}})
    os.write(2, b"partial line without newline")
    os.write(2, b" ends here\n")
    print("python line 2", file=sys.stderr, flush=True)
print("after the block", file=sys.stderr, flush=True)
"""


STDOUT_CHILD = r"""
import os, sys
sys.path.insert(0, {repo!r})
from workflows.console import harmless_ray_lines_dropped
with harmless_ray_lines_dropped(2), harmless_ray_lines_dropped(1):  # as a workflow command
    print("stage line")
    print({harmless!r})                                   # Ray prints raylet errors on stdout
    print("an error the user must see", file=sys.stderr)
    print("summary line")                                 # buffered: flushed through the filter
print("after the block", flush=True)
"""


def _run_child(script: str, harmless_key: str) -> subprocess.CompletedProcess:
    """`script` in a fresh Python with RAY_SAID[harmless_key] as the line it must drop."""
    code = script.format(repo=str(REPO), harmless=RAY_SAID[harmless_key])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_workflow_filters_stdout_too_where_ray_prints_the_raylets_warnings():
    proc = _run_child(STDOUT_CHILD, "Ray Train's and Ray Data's actors starting together on a "
                                    "2-CPU node")
    assert proc.stdout.splitlines() == ["stage line", "summary line", "after the block"]
    assert proc.stderr.splitlines() == ["an error the user must see"]


def test_the_filter_drops_only_those_lines_from_every_writer_of_stderr():
    proc = _run_child(CHILD, "restartable actor, arguments in the object store (driver)")
    assert proc.stderr.splitlines() == ["python line 1", "child line",
                                        "partial line without newline ends here",
                                        "python line 2", "after the block"]


def test_the_clean_console_check_flags_what_reads_as_trouble_and_only_that():
    from workflows.console import alarming_lines

    trouble = [*RAY_SAID.values(),
               "2026-11-24 06:09:51,598\tWARNING authentication_token_setup.py:85 -- Token "
               "authentication is enabled for this Ray cluster.",
               "/x/actor_pool_map_operator.py:551: UserWarning: The minimum number of concurrent "
               "actors for 'MapBatches(PartEncoder)' is set to 2",
               "(DatasetManager pid=4215) /x/execution_options.py:436: RayDeprecationWarning: "
               "`ExecutionOptions.exclude_resources` is deprecated",
               "Traceback (most recent call last):"]
    fine = ["06:10:16 [clean/train] done in 8.1 s: 20,000 in, 19,944 kept, dropped: ratio=56",
            "(RayTrainWorker pid=4148) [convs2s.train] epoch 1 done | update 104 | valid loss "
            "4.589 | valid ppl 98.35 | next lr 0.25",
            "06:16:15 avg_last2/demo_test: bleu 71.15, 173.0 sentences/s"]
    assert alarming_lines("\n".join(trouble + fine)) == trouble


def test_rays_no_free_cpu_alarm_after_a_write_stays_in_its_log_file():
    """Ray Data's `materialize()` (under `write_datasink`) checks for a free CPU again right
    after the write ran, before the write tasks' CPUs show as released: the stages demote that
    false alarm to INFO (ray-data.log keeps it) and do the check themselves."""
    import logging

    from preprocessing.stages import _RayCpuCheckToLogFile

    logger = logging.getLogger("test.ray.data.dataset")
    logger.propagate, logger.level = False, logging.DEBUG
    console, file = [], []

    class Collect(logging.Handler):
        def __init__(self, out, level):
            super().__init__(level)
            self.out = out

        def emit(self, record):
            self.out.append((record.levelname, record.getMessage()))

    logger.addHandler(Collect(console, logging.WARNING))
    logger.addHandler(Collect(file, logging.DEBUG))
    logger.addFilter(_RayCpuCheckToLogFile())
    logger.warning("Warning: The Ray cluster currently does not have any available CPUs. The "
                   "Dataset job will hang unless more CPUs are freed up.")
    logger.warning("Some other warning")
    assert console == [("WARNING", "Some other warning")]
    assert [level for level, _ in file] == ["INFO", "WARNING"]


_CTRL_C_IN_AN_IMPORT = """
import signal, sys, time
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "ours":
    from storage.signals import command_signals as guard
else:
    from contextlib import nullcontext as guard
try:
    with guard():
        import pressed_while_imported  # Ctrl-C in its body, where C++ may be calling Python
        time.sleep(5)
        print("no interrupt")
except KeyboardInterrupt:
    print("interrupted; the import finished:", "pressed_while_imported" in sys.modules)
"""


@pytest.mark.parametrize("handler,finished", [("ours", True), ("python's", False)])
def test_ctrl_c_inside_an_import_is_raised_after_it(tmp_path, handler, finished):
    """A command's SIGINT handler (`python -m convs2s`, `python -m preprocessing`, a workflow):
    a Ctrl-C that lands inside an import (torch's pybind11 modules call back into Python as
    they load, and a KeyboardInterrupt raised there aborted the process in C++) comes after
    the import, as a KeyboardInterrupt; Python's own handler raises it inside the import."""
    (tmp_path / "pressed_while_imported.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.3)\n")
    out = subprocess.run([sys.executable, "-c", _CTRL_C_IN_AN_IMPORT, str(tmp_path), handler],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.strip() == f"interrupted; the import finished: {finished}", out


_COMMAND_ENDS_IN_AN_IMPORT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from storage.signals import command_signals
with command_signals():
    import pressed_while_imported  # the command's last step: Ctrl-C held until it ends
print("finished")
time.sleep(0.5)
print("and nothing came after")
"""


def test_a_ctrl_c_still_held_when_the_command_ends_is_not_sent_after_it(tmp_path):
    """A command that ends inside the import a Ctrl-C came in (`--help` is all imports) has
    ended: the Ctrl-C it held is not sent after it, where it came as a KeyboardInterrupt in
    the caller's code or in Python's exit ("Exception ignored in atexit callback")."""
    (tmp_path / "pressed_while_imported.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.01)\n")
    out = subprocess.run([sys.executable, "-c", _COMMAND_ENDS_IN_AN_IMPORT, str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert (out.returncode, out.stdout.split(), out.stderr) == (
        0, ["finished", "and", "nothing", "came", "after"], ""), out


_CTRL_C_IN_A_FINALIZER = """
import gc, os, signal, sys, time
from storage.signals import ctrl_c_never_lost

class PressedWhileCollected:
    def __del__(self):  # as a finalizer (SQLAlchemy's weakref callback) the GC runs
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)

def work():
    PressedWhileCollected()
    gc.collect()
    time.sleep(2)
    return "no interrupt"

try:
    if sys.argv[1] == "ours":
        with ctrl_c_never_lost():
            print(work())
    else:
        print(work())
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.parametrize("hook,says", [("ours", "interrupted"), ("python's", "no interrupt")])
def test_a_ctrl_c_that_lands_in_a_finalizer_is_not_lost(hook, says):
    """A KeyboardInterrupt raised inside a finalizer is dropped by Python ("Exception ignored
    in ...") and the work goes on; within `ctrl_c_never_lost` it is raised again where the
    work runs, and nothing is printed for it."""
    out = subprocess.run([sys.executable, "-c", _CTRL_C_IN_A_FINALIZER, hook],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.strip() == says, out
    assert ("Exception ignored" in out.stderr) == (hook != "ours"), out.stderr


def test_a_commands_signal_handling_leaves_the_callers_as_it_found_them():
    """`command_signals` (a command's whole run) puts the caller's Ctrl-C handler and
    unraisable hook back when it ends, and a command started with Ctrl-C ignored (`nohup`, a
    script's `cmd &`) keeps ignoring it, as Python itself would."""
    from storage.signals import command_signals, ctrl_c_after_imports

    before, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    with command_signals():
        assert signal.getsignal(signal.SIGINT) is ctrl_c_after_imports
        assert sys.unraisablehook is not hook
    assert signal.getsignal(signal.SIGINT) is before and sys.unraisablehook is hook
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with command_signals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert sys.unraisablehook is hook


def test_a_commands_first_import_is_the_standard_library_only():
    """`python -m convs2s` and `python -m preprocessing` import `storage.signals` before their
    Ctrl-C handling is in place: a Ctrl-C during that import is Python's own traceback, so it
    loads nothing heavy (the `storage` package loads its filesystem layer, pyarrow, only when
    one of its names is first used)."""
    check = ("import sys; import storage.signals; print(sorted(m for m in ('pyarrow', 'yaml', "
             "'ray', 'torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.stdout.strip() == "[]", out


def test_the_console_check_names_its_usage_and_a_log_it_cannot_read(tmp_path):
    """`python -m workflows.console --help` read a file named --help (a traceback), as did a
    log that is not there."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "workflows.console", *args],
                              capture_output=True, text=True, timeout=60)

    helped = run("--help")
    assert helped.returncode == 0 and helped.stderr.startswith("usage: python -m workflows.")
    gone = run(str(tmp_path / "nope.log"))
    assert gone.returncode == 2 and gone.stderr.startswith("python -m workflows.console: error:")
    assert "Traceback" not in helped.stderr + gone.stderr
    (tmp_path / "ok.log").write_text("training finished\n")
    assert run(str(tmp_path / "ok.log")).returncode == 0
