"""The run lease as a specification (storage/lease.py), on a local folder and on a bucket of
the loopback S3 server alike: one holder per run folder; a second command is refused with the
holder named; a holder that is gone (a dead pid on this host, or a heartbeat older than the
bound) is taken over with a line saying so; of two takers one wins; a holder whose lease was
taken learns it at its next heartbeat, or as it ends; a renewal or a release never overwrites
or deletes the lease of a command that took it over meanwhile.

    .venv/bin/python -m pytest tests/test_lease.py -q
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from storage import location
from storage.lease import LEASE_FILE, LeaseHeld, LeaseLost, RunLease
from storage.processes import machine_id, pid_namespace
from storage.paths import ObjectPath

DEAD_PID = 2**22  # above the kernel's largest pid_max: no process has it


@pytest.fixture(params=["local", "bucket"])
def run_dir(request, tmp_path):
    if request.param == "local":
        return tmp_path / "runs" / "demo"
    request.getfixturevalue("s3")
    return location(f"s3://convs2s-test/leases/{tmp_path.name}/demo")


def _plant(run_dir, **held) -> None:
    """A lease another command wrote: `held` overrides a live holder on another host."""
    now = time.time()
    record = {"host": "other-host", "pid": 4242, "id": "someone", "command": "wmt14_en_fr paper",
              "renewed": now, "expires": now + 120, **held}
    location(run_dir).mkdir(parents=True, exist_ok=True)
    path = location(run_dir) / LEASE_FILE
    path.write_text(json.dumps(record))
    if not isinstance(path, ObjectPath):  # a local lease's mtime is its last renewal: as written
        os.utime(path, (record["renewed"], record["renewed"]))


def _plant_gone(run_dir, **held) -> str:
    """A lease whose holder's heartbeat stopped (another host's: its pid is not looked up);
    returns what the takeover says of it. In a folder, renewed 600 s ago by its mtime; in a
    bucket the store's clock times it (the object's last PUT), so it is planted with a ttl of
    0 and is stale once the store's clock has moved on a second."""
    now = time.time()
    if not isinstance(location(run_dir), ObjectPath):
        _plant(run_dir, renewed=now - 600, expires=now - 480, **held)
        return r"heartbeat stopped 6\d\d s ago \(its lease lasted 120 s\)"
    _plant(run_dir, renewed=now - 600, expires=now - 600, **held)
    time.sleep(1.1)  # (Date and Last-Modified count whole seconds)
    return r"heartbeat stopped [1-3] s ago \(its lease lasted 0 s\)"


def _past_a_short_ttl(run_dir) -> float:
    """Seconds after which a lease of ttl 0.3 s that was not renewed is stale: 0.5 in a folder;
    1.1 in a bucket, whose store's clock counts whole seconds (`Date`, `Last-Modified`)."""
    return 1.1 if isinstance(location(run_dir), ObjectPath) else 0.5


def test_one_holder_a_second_command_is_refused_with_the_holder_named(run_dir):
    with RunLease(run_dir, command="wmt14_en_fr smoke") as first:
        assert first.taken_over is None and (location(run_dir) / LEASE_FILE).exists()
        with pytest.raises(LeaseHeld, match=r"is in use by another command \(wmt14_en_fr "
                                            r"smoke\): pid \d+ on .*give another --run-name"):
            RunLease(run_dir).acquire()
    assert not (location(run_dir) / LEASE_FILE).exists()  # released
    with RunLease(run_dir):  # free again
        pass


def test_a_run_folder_the_lease_made_is_removed_with_it_when_nothing_was_written(tmp_path):
    """A command refused after it took its lease (no room on a local Ray, say) left an empty
    run folder under its name. The lease removes a folder it made when it is still empty; one
    that was there before, or that holds anything, stays."""
    made = tmp_path / "runs" / "refused"
    with RunLease(made):
        assert made.is_dir()
    assert not made.exists() and (tmp_path / "runs").is_dir()
    with RunLease(made):
        (made / "metrics.jsonl").write_text("{}\n")  # the run wrote something: kept
    assert sorted(p.name for p in made.iterdir()) == ["metrics.jsonl"]
    there = tmp_path / "runs" / "there"
    there.mkdir()
    with RunLease(there):
        pass
    assert there.is_dir()  # not made by the lease: never removed


def test_a_live_holder_on_another_host_is_never_taken_over(run_dir):
    _plant(run_dir)
    with pytest.raises(LeaseHeld, match="pid 4242 on other-host"):
        RunLease(run_dir).acquire()
    # nor one of another container on this host (host networking: the same host name, pids
    # numbered apart): its pid is not looked up here
    _plant(run_dir, host=socket.gethostname(), pid=DEAD_PID, pidns="pid:[1]")
    with pytest.raises(LeaseHeld, match=r"pid 4194304 on "):
        RunLease(run_dir).acquire()
    # nor one of another machine with this host name (EC2's default ip-10-0-1-23 in two VPCs):
    # every bare host has the same initial pid namespace; the boot ids differ
    _plant(run_dir, host=socket.gethostname(), pid=DEAD_PID, pidns=pid_namespace(),
           boot="0c5e1a52-another-machine")
    with pytest.raises(LeaseHeld, match=r"pid 4194304 on "):
        RunLease(run_dir).acquire()
    # a record that names no machine (an older version's) is judged by its expiry alone
    _plant(run_dir, host=socket.gethostname(), pid=DEAD_PID, pidns=pid_namespace())
    with pytest.raises(LeaseHeld, match=r"pid 4194304 on "):
        RunLease(run_dir).acquire()


@pytest.mark.parametrize("gone", ["pid", "heartbeat"])
def test_a_gone_holder_is_taken_over_with_a_line_saying_so(run_dir, gone, caplog):
    if gone == "pid":
        _plant(run_dir, host=socket.gethostname(), pid=DEAD_PID, boot=machine_id(),
               pidns=pid_namespace())
        why = "holder .pid 4194304 on this host. is gone"
    else:
        why = _plant_gone(run_dir)
    with RunLease(run_dir) as lease:
        assert lease.taken_over is not None
        assert json.loads((location(run_dir) / LEASE_FILE).read_text())["id"] == \
            lease.owner["id"]
    import re

    assert re.search(why, lease.taken_over), lease.taken_over
    assert "took over the lease" in caplog.text


@pytest.mark.parametrize("skew", [-600, 3600])
def test_a_bucket_lease_is_timed_by_the_stores_clock_not_the_hosts(s3, tmp_path, skew):
    """Hosts of a cluster whose clocks disagree: a live holder whose clock runs 10 minutes
    behind writes an expiry already past by the taker's clock, and must not be taken over; a
    holder whose clock runs an hour ahead writes an expiry far off, and once its heartbeat
    stops it must be taken over all the same. The store's clock (the object's last PUT, the
    answer's Date) times both."""
    run_dir = location(f"s3://convs2s-test/leases/{tmp_path.name}/skew")
    now = time.time() + skew  # the holder's clock
    if skew < 0:  # live: renewed just now by its clock, a ttl of 120 s
        _plant(run_dir, renewed=now, expires=now + 120)
        with pytest.raises(LeaseHeld, match="pid 4242 on other-host"):
            RunLease(run_dir).acquire()
        return
    _plant(run_dir, renewed=now, expires=now + 1)  # its last renewal; a ttl of 1 s
    time.sleep(2.2)  # the heartbeat stopped over a second ago by the store's clock
    with RunLease(run_dir) as lease:
        assert lease.taken_over is not None
        assert "heartbeat stopped" in lease.taken_over and "lasted 1 s" in lease.taken_over


def test_of_two_takers_of_a_stale_lease_one_wins(run_dir):
    _plant_gone(run_dir)
    outcomes, barrier, held = [], threading.Barrier(2), []

    def take():
        lease = RunLease(run_dir, heartbeat_s=60)
        barrier.wait()
        try:
            held.append(lease.acquire())
            outcomes.append("held")
        except LeaseHeld:
            outcomes.append("refused")

    threads = [threading.Thread(target=take) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for lease in held:  # (its heartbeat would outlive the bucket's server otherwise)
        lease.release()
    assert sorted(outcomes) == ["held", "refused"]


def test_a_holder_whose_lease_was_taken_learns_it_at_its_next_heartbeat(run_dir):
    lease = RunLease(run_dir, heartbeat_s=0.2).acquire()
    _plant(run_dir)  # another command took it (as after this holder's heartbeat had stopped)
    deadline = time.monotonic() + 10
    while not lease.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lease.lost
    lease.release()  # leaves the other command's lease alone
    assert json.loads((location(run_dir) / LEASE_FILE).read_text())["id"] == "someone"


def test_a_folder_without_hard_links_still_gets_one_holder(tmp_path, monkeypatch):
    # (some FUSE mounts refuse link(): the lease is created with O_EXCL there)
    import os

    def no_links(*args):
        raise PermissionError("link not supported")

    monkeypatch.setattr(os, "link", no_links)
    with RunLease(tmp_path / "runs" / "fuse") as first:
        assert first.taken_over is None
        with pytest.raises(LeaseHeld, match="is in use by another command"):
            RunLease(tmp_path / "runs" / "fuse").acquire()
    assert not (tmp_path / "runs" / "fuse").exists()  # no lease (nor the folder it made) left


def test_an_unreadable_lease_is_named_with_the_fix(run_dir):
    # (the lease is written whole and then linked into place, so a crash cannot leave one;
    # one written by an older version, or by hand, is named with what to do)
    location(run_dir).mkdir(parents=True, exist_ok=True)
    (location(run_dir) / LEASE_FILE).write_text("")
    with pytest.raises(LeaseHeld, match=r"cannot be read as a lease .* delete it once no "
                                        r"command uses"):
        RunLease(run_dir).acquire()


def test_a_command_whose_lease_was_taken_fails_as_its_block_ends(run_dir):
    with pytest.raises(LeaseLost, match=r"lost its lease while it ran .* may be mixed"):
        with RunLease(run_dir, heartbeat_s=0.2) as lease:
            _plant(run_dir)  # taken over meanwhile
            deadline = time.monotonic() + 10
            while not lease.lost and time.monotonic() < deadline:
                time.sleep(0.05)
    assert json.loads((location(run_dir) / LEASE_FILE).read_text())["id"] == "someone"


def _bucket_lease(tmp_path, name: str, **kwargs):
    """A lease on the loopback server's bucket, its boto3 client and the client's own
    put_object (a test wraps the client's, as a store or botocore would change what it does)."""
    lease = RunLease(location(f"s3://convs2s-test/leases/{tmp_path.name}/{name}"), **kwargs)
    client = lease._s3()
    return lease, client, client.put_object


def test_a_renewal_sent_twice_keeps_the_lease(s3, tmp_path):
    # botocore resends a PUT whose answer was lost: the second copy finds the first's ETag
    # (412). The lease is still this command's: it goes on holding it.
    lease, client, put = _bucket_lease(tmp_path, "twice", ttl_s=3.0, heartbeat_s=0.2)

    def twice(**kwargs):
        first = put(**kwargs)
        try:
            return put(**kwargs)
        except Exception:  # noqa: BLE001 - the 412 of the resend, as botocore would see it
            if "IfMatch" not in kwargs:
                return first
            raise

    client.put_object = twice
    with lease:
        time.sleep(1.5)  # several renewals, each sent twice
        assert not lease.lost
        with pytest.raises(LeaseHeld, match="is in use by another command"):
            RunLease(lease.folder).acquire()


def test_a_create_sent_twice_is_taken_as_this_commands_own(s3, tmp_path):
    # The first PUT of a new lease landed but its answer was lost; botocore's resend finds the
    # lease there (412). It is this command's own: held, with its heartbeat, not a refusal
    # naming itself (which left a lease no one renewed, blocking the run for its ttl).
    lease, client, put = _bucket_lease(tmp_path, "created", ttl_s=3.0, heartbeat_s=0.2)

    def answer_lost(**kwargs):
        put(**kwargs)
        return put(**kwargs)  # the resend: 412 while the lease is there

    client.put_object = answer_lost
    lease.acquire()
    client.put_object = put
    try:
        time.sleep(0.6)  # renewals go on
        assert not lease.lost and lease.taken_over is None
        with pytest.raises(LeaseHeld, match="is in use by another command"):
            RunLease(lease.folder).acquire()
    finally:
        lease.release()
    assert not lease.lost and not (lease.folder / LEASE_FILE).exists()


def test_a_store_that_ignores_conditional_writes_is_refused_naming_them(s3, tmp_path,
                                                                        monkeypatch):
    # A store that carries out a conditional PUT it should refuse would let two commands
    # create one lease: refused before the lease, naming what it ignores (the real loopback
    # server, reached through a client that drops the condition headers, as such a store
    # would ignore them).
    import storage.lease as lease_module
    from storage.paths import StorageError

    monkeypatch.setattr(lease_module, "_CONDITIONS_HONOURED", set())
    lease, client, put = _bucket_lease(tmp_path, "ignored")

    def unconditional(**kwargs):
        kwargs.pop("IfNoneMatch", None)
        kwargs.pop("IfMatch", None)
        return put(**kwargs)

    client.put_object = unconditional
    with pytest.raises(StorageError, match=r"ignored: this S3 store ignores If-None-Match on "
                                           r"PUT, If-Match on PUT \(a conditional write was "
                                           r"carried out, not refused\)"):
        lease.acquire()
    assert not lease.folder.exists() or not list(lease.folder.iterdir())  # probe removed too
    client.put_object = put
    with lease:  # the store as it is (it honours them): the lease is taken
        assert "convs2s-test" in lease_module._CONDITIONS_HONOURED


def test_a_botocore_too_old_for_the_conditions_is_one_line_and_the_floor_is_required(
        s3, tmp_path, monkeypatch):
    """boto3 1.34 (the floor the project had) has no IfNoneMatch / IfMatch on PutObject: the
    first bucket lease was botocore's ParamValidationError, a traceback. The floor now is the
    first release whose S3 model has them, and an older one is named with the fix."""
    import tomllib

    import botocore

    import storage.lease as lease_module
    from storage.paths import StorageError

    monkeypatch.setattr(lease_module, "_CONDITIONS_HONOURED", set())
    monkeypatch.setattr(botocore, "__version__", "1.34.162")
    lease, _, _ = _bucket_lease(tmp_path, "old-botocore")
    with pytest.raises(StorageError, match=r"this botocore \(1.34.162\) cannot send the "
                                           r"conditional writes .*pip install 'boto3>=1.35.69'"):
        lease.acquire()
    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    floor = next(d for d in deps["project"]["dependencies"] if d.startswith("boto3"))
    assert tuple(map(int, floor.split(">=")[1].split("."))) == lease_module.BOTOCORE_CONDITIONS


def test_what_a_holder_started_checks_the_lease_is_still_the_holders(run_dir):
    # Training workers carry the lease (LeaseRef) and check it before each checkpoint: the
    # holder itself learns of a takeover only at its next renewal (never, while suspended).
    from storage.lease import LeaseRef

    lease = RunLease(run_dir, command="A", ttl_s=0.3, heartbeat_s=1000).acquire()
    ref = lease.ref()
    ref.check()  # still A's
    with pytest.raises(LeaseLost, match="no longer holds the run folder's lease"):
        LeaseRef(ref.path, "someone-else").check()
    time.sleep(_past_a_short_ttl(run_dir))
    other = RunLease(run_dir, command="B", heartbeat_s=1000).acquire()  # A's is stale
    with pytest.raises(LeaseLost, match=rf"\(pid {os.getpid()} on {socket.gethostname()} "
                                        r"holds it now \(B\)\), so this stops before "
                                        "writing its checkpoint at update 7"):
        ref.check("writing its checkpoint at update 7")
    other.release()
    with pytest.raises(LeaseLost, match="no command holds it now"):
        ref.check()
    lease.release()
    assert lease.lost


def test_renewals_unanswered_past_the_ttl_go_on_and_the_lease_is_lost_only_to_a_taker(
        run_dir, monkeypatch, tmp_path):
    """Storage that stops answering for longer than the ttl (an outage, a stalled driver): the
    heartbeat gave up for good, the lease counted lost though no one took it, and the
    command wrote on to its end. It renews again once the store answers; a workflow checks the
    lease before each record it writes, so one taken meanwhile stops it there."""
    from storage import lease as leases
    from workflows.run_state import StageContext
    from workflows.run_tree import RunTree

    lease = RunLease(run_dir, command="A", ttl_s=0.5, heartbeat_s=0.05).acquire()

    def unanswered(*args, **kw):
        raise OSError(5, "Input/output error")

    # every renewal fails past the ttl: a POSIX folder's touch, a bucket's PUT
    if isinstance(run_dir, ObjectPath):
        events = lease._s3().meta.events
        events.register_first("before-send.s3.PutObject", unanswered)
        time.sleep(1.2)
        events.unregister("before-send.s3.PutObject", unanswered)
    else:
        utime = os.utime
        monkeypatch.setattr(leases.os, "utime", unanswered)
        time.sleep(1.2)
        monkeypatch.setattr(leases.os, "utime", utime)
    time.sleep(0.5)
    assert not lease.lost and lease._thread.is_alive()
    held, _ = leases.read_lease(location(run_dir) / LEASE_FILE)
    assert held["id"] == lease.owner["id"] and held["expires"] > time.time()
    # taken over while the holder stalls: its next record stops, naming the taker
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = StageContext(RunTree.open(uri, "exp", location(run_dir), "r"), lease=lease.ref())
    ctx.save_state({"train": {}})
    stalled = RunLease(run_dir, command="A", ttl_s=0.3, heartbeat_s=1000)
    lease.release()
    stalled.acquire()
    ctx = StageContext(ctx.tree, lease=stalled.ref())
    time.sleep(_past_a_short_ttl(run_dir))
    taker = RunLease(run_dir, command="B", heartbeat_s=1000).acquire()
    with pytest.raises(LeaseLost, match=r"holds it now \(B\)\), so this stops before "
                                        "recording the run's state in workflow.json"):
        ctx.save_state({"train": {"train": "done"}})
    assert json.loads((location(run_dir) / "workflow.json").read_text()) == {"train": {}}
    taker.release()
    stalled.release()


def test_a_run_inside_a_folder_another_command_holds_is_refused(run_dir):
    # `python -m convs2s train --storage-path <a workflow's run> --run-name train` while the
    # workflow trains there: refused, naming the workflow (the two leases are on two folders).
    _plant(run_dir, host=socket.gethostname(), pid=os.getppid(), boot=machine_id(),
           pidns=pid_namespace())
    inner = location(run_dir) / "train"
    with pytest.raises(LeaseHeld, match=rf"{inner} is inside {location(run_dir)}, which is in "
                                        r"use by another command \(wmt14_en_fr paper\)"):
        RunLease(inner, outer=run_dir).acquire()
    assert not (inner / LEASE_FILE).exists()
    _plant_gone(run_dir)  # its holder gone: the inner run may start
    with RunLease(inner, outer=run_dir):
        pass
    (location(run_dir) / LEASE_FILE).unlink()
    with RunLease(run_dir) as outer:  # this very process's own run: its training goes on
        with RunLease(inner, outer=run_dir):
            assert not outer.lost


def test_a_run_holding_a_folder_another_command_holds_is_refused(run_dir):
    """The other way round: a workflow rerun on its run name while `convs2s train` trains in
    that run's train/ (by hand): refused, naming the folder in use (it took the run and
    trained into train/ beside the other command). Two such commands starting at once each
    look again once they hold their own lease, so they never both go on."""
    inner = location(run_dir) / "train"
    _plant(inner, command="convs2s train (train)")
    with pytest.raises(LeaseHeld, match=rf"{location(run_dir)} holds {inner}, which is in use "
                                        r"by another command \(convs2s train \(train\)\)"):
        RunLease(run_dir, inner=True).acquire()
    assert not (location(run_dir) / LEASE_FILE).exists()
    # the inner command took its lease while this one was taking the outer: seen after
    outer = RunLease(run_dir, inner=True)
    take = outer._take

    def inner_meanwhile():
        take()
        _plant(inner, command="convs2s train (train)")

    (inner / LEASE_FILE).unlink()
    outer._take = inner_meanwhile
    with pytest.raises(LeaseHeld, match=rf"holds {inner}"):
        outer.acquire()
    assert not (location(run_dir) / LEASE_FILE).exists()  # released: not held beside it
    _plant_gone(inner)  # its holder gone: the run may go on
    with RunLease(run_dir, inner=True):
        pass


def test_a_sweeps_lease_covers_its_trials_training_folders_both_ways(run_dir):
    """A sweep holds <sweep>/ for its trials, each training in <sweep>/<trial>/train: a
    `convs2s train --storage-path <sweep>/<trial> --run-name train` by hand (outer: its
    storage path, whose own lease is none) is refused while the sweep's is live, and a sweep
    started while such a training runs (inner=2) too. Each went on, two writers in one
    checkpoint folder, each one's keep_last deleting the other's checkpoints."""
    sweep = location(run_dir)
    trial = sweep / "base-seed1"
    _plant(run_dir, command="multi30k cpu --sweep paper-5.2")
    with pytest.raises(LeaseHeld, match=rf"{trial / 'train'} is inside {sweep}, which is in "
                                        r"use by another command \(multi30k cpu --sweep"):
        RunLease(trial / "train", outer=trial).acquire()
    (sweep / LEASE_FILE).unlink()
    (trial / "train").mkdir(parents=True)
    _plant(trial / "train", command="convs2s train (train)")
    with pytest.raises(LeaseHeld, match=rf"{sweep} holds {trial / 'train'}, which is in use"):
        RunLease(sweep, inner=2).acquire()
    with RunLease(sweep, inner=True):  # (one level: what the sweep's was)
        pass


def test_a_renewal_that_finds_the_lease_aside_for_a_moment_keeps_it(tmp_path, monkeypatch):
    # A taker that judged a late holder stale renames the lease aside to look at it and puts
    # it back when it is not the record it judged: the holder's renewal in that moment finds
    # no lease, and took it for lost (it stopped renewing; the lease expired under it). Here
    # the lease is put back while the renewal waits to look again.
    import storage.lease as lease_module

    lease = RunLease(tmp_path / "runs" / "late", heartbeat_s=1000).acquire()
    aside = lease.path.with_name("looked-at")
    os.rename(lease.path, aside)
    waits = []

    def put_back_while_waiting(seconds: float) -> None:
        waits.append(seconds)
        if aside.exists():
            os.rename(aside, lease.path)

    monkeypatch.setattr(lease_module.time, "sleep", put_back_while_waiting)
    assert lease._renew()
    assert waits  # it waited, and looked again
    monkeypatch.undo()
    lease.release()
    assert not lease.lost


def test_the_heartbeat_keeps_a_live_lease_fresh(run_dir):
    # A ttl of 3 s, renewed every 0.2 s: a renewal may take over 2 s on a loaded host (CI
    # once missed a 1 s ttl) and the lease still lives.
    with RunLease(run_dir, ttl_s=3.0, heartbeat_s=0.2) as lease:
        first = lease._read()
        time.sleep(3.5)  # longer than the ttl: only the renewals keep it live
        with pytest.raises(LeaseHeld, match="is in use by another command"):
            RunLease(run_dir).acquire()
        # renewed, not merely unexpired (a local lease by its mtime: its heartbeat touches it;
        # a bucket's by the store's clock, in whole seconds: 3.5 +- 1 s later, against 0 +- 1.5
        # without renewals)
        assert lease._read()["expires"] > first["expires"] + 2.0


def test_a_folder_that_ignores_a_touch_still_gets_its_lease_renewed(tmp_path, monkeypatch,
                                                                   caplog):
    # A local lease is renewed by touching it; a mount that accepts the touch and keeps no
    # modification time (some FUSE filesystems) gets its record written again, saying so.
    import storage.lease

    monkeypatch.setattr(storage.lease.os, "utime", lambda *args, **kwargs: None)
    run_dir = tmp_path / "runs" / "demo"
    # (an ignored touch shows once the record is 3 s old: a ttl of 6 s leaves a renewal held
    # up by a loaded host 3 s, as the heartbeat test's does)
    with RunLease(run_dir, command="A", ttl_s=6.0, heartbeat_s=0.2) as lease:
        first = json.loads((run_dir / LEASE_FILE).read_text())
        time.sleep(6.5)  # past the ttl: only renewals that reach the record keep it live
        with pytest.raises(LeaseHeld, match=r"in use by another command \(A\)"):
            RunLease(run_dir).acquire()
        assert json.loads((run_dir / LEASE_FILE).read_text())["expires"] > first["expires"] + 1
        assert not lease.lost
    assert "keeps no modification time" in caplog.text and not (run_dir / LEASE_FILE).exists()


def test_a_taker_that_lost_its_race_puts_the_holders_own_file_back(tmp_path, monkeypatch,
                                                                  caplog):
    """On a folder a team shares, a taker that lost the race for a stale lease put the winner's
    lease back as a file of its own making: the winner, another user, could no longer set its
    time (only a file's owner may), failed to renew every beat and lost a live run. The same
    file goes back (linked: owner and renewal time kept); a lease that is still another
    user's file is renewed by writing it again."""
    import storage.lease

    run_dir = tmp_path / "runs" / "demo"
    with RunLease(run_dir, command="A", ttl_s=60, heartbeat_s=60) as holder:
        lease = run_dir / LEASE_FILE
        before = os.stat(lease)
        late = RunLease(run_dir, command="B", heartbeat_s=60)
        assert not late._take_over({"id": "the stale record it looked at"})  # (lost the race)
        after = os.stat(lease)
        assert (after.st_ino, after.st_mtime) == (before.st_ino, before.st_mtime)
        assert holder._renew() and not holder.lost
        real_utime = os.utime

        def owned_by_another_user(path, *args, **kwargs):
            if Path(path) == lease:
                raise PermissionError(1, "Operation not permitted", str(path))
            return real_utime(path, *args, **kwargs)

        monkeypatch.setattr(storage.lease.os, "utime", owned_by_another_user)
        assert holder._renew() and not holder.lost
        assert "is another user's file" in caplog.text
        assert json.loads(lease.read_text())["id"] == holder.owner["id"]


def test_a_newcomer_never_finds_a_renewing_lease_missing(run_dir):
    # A renewal that took the lease away for a moment (renamed aside and written back) let a
    # newcomer that looked then take it from a live holder: every look is refused.
    # (25 looks, however long a loaded host takes for them: a bucket's look, a boto3 client
    # and two requests, made 19 in 3 s during a suite run)
    with RunLease(run_dir, command="A", ttl_s=60, heartbeat_s=0.005) as lease:
        deadline = time.monotonic() + 60
        looks = 0
        while looks < 25 and time.monotonic() < deadline:
            with pytest.raises(LeaseHeld, match=r"in use by another command \(A\)"):
                RunLease(run_dir, command="B").acquire()
            looks += 1
        assert looks == 25 and not lease.lost


@pytest.mark.parametrize("then", ["holds it", "has released it"])
def test_a_command_whose_lease_was_taken_while_it_stalled_fails_as_it_ends(run_dir, then):
    # Its heartbeat stalled past the ttl (a stopped process, a paused VM, a hung mount: here a
    # heartbeat slower than the ttl), another command took the lease over, and the stalled one
    # resumes and ends before its next renewal: it learns it as it ends.
    with pytest.raises(LeaseLost, match=r"lost its lease while it ran"):
        with RunLease(run_dir, command="A", ttl_s=0.3, heartbeat_s=1000):
            time.sleep(_past_a_short_ttl(run_dir))
            other = RunLease(run_dir, command="B", heartbeat_s=1000).acquire()
            assert other.taken_over is not None
            if then == "has released it":
                other.release()
    lease = location(run_dir) / LEASE_FILE
    if then == "holds it":  # left alone
        assert json.loads(lease.read_text())["id"] == other.owner["id"]
        other.release()
        assert not other.lost
    assert not lease.exists()


def test_an_error_under_way_is_not_replaced_by_the_lost_lease(run_dir):
    with pytest.raises(KeyError, match="the command's own error"):
        with RunLease(run_dir, ttl_s=0.3, heartbeat_s=1000) as lease:
            time.sleep(_past_a_short_ttl(run_dir))
            other = RunLease(run_dir, heartbeat_s=1000).acquire()
            raise KeyError("the command's own error")
    assert lease.lost
    other.release()


def _after_next_look(lease: RunLease, act) -> threading.Event:
    """Run `act` (another command taking the lease over) once, as `lease` next goes to the
    store: after its next read of the lease, or before its next write or delete when it does
    not read first. The store stays real; this only picks the moment. Returns an event set
    once `act` has run."""
    done = threading.Event()

    def once():
        if not done.is_set():
            done.set()
            act()

    if not isinstance(lease.path, ObjectPath):  # a local folder: the lease's reads
        read = lease._read

        def read_then_act():
            held = read()
            once()
            return held

        lease._read = read_then_act
        return done
    client = lease._s3()  # a bucket: this command's own client (the other has its own)
    for name in ("get_object", "put_object", "delete_object"):
        call = getattr(client, name)

        def hooked(*args, _call=call, _name=name, **kwargs):
            if _name != "get_object":
                once()
            answer = _call(*args, **kwargs)
            if _name == "get_object":
                once()
            return answer

        setattr(client, name, hooked)
    return done


def test_a_takeover_during_a_renewal_is_kept_and_the_renewer_learns_it(run_dir):
    # The holder stalled past its ttl; as its heartbeat looks at the lease, another command
    # takes it over: the renewal must not write over that command's lease.
    lease = RunLease(run_dir, command="A", ttl_s=0.3,
                     heartbeat_s=_past_a_short_ttl(run_dir) + 0.1).acquire()
    taken = []
    done = _after_next_look(lease, lambda: taken.append(
        RunLease(run_dir, command="B", heartbeat_s=1000).acquire()))
    assert done.wait(10)
    deadline = time.monotonic() + 5
    while not lease.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lease.lost
    other = taken[0]
    assert json.loads((location(run_dir) / LEASE_FILE).read_text())["id"] == other.owner["id"]
    lease.release()  # leaves it alone
    other.release()
    assert not other.lost and not (location(run_dir) / LEASE_FILE).exists()


def test_a_takeover_during_a_release_is_not_deleted(run_dir):
    taken = []
    with pytest.raises(LeaseLost):
        with RunLease(run_dir, command="A", ttl_s=0.3, heartbeat_s=1000) as lease:
            time.sleep(_past_a_short_ttl(run_dir))
            _after_next_look(lease, lambda: taken.append(
                RunLease(run_dir, command="B", heartbeat_s=1000).acquire()))
    other = taken[0]
    assert json.loads((location(run_dir) / LEASE_FILE).read_text())["id"] == other.owner["id"]
    with pytest.raises(LeaseHeld, match=r"in use by another command \(B\)"):
        RunLease(run_dir).acquire()  # still held: a third command is refused
    other.release()
    assert not other.lost


def test_a_holder_whose_lease_was_deleted_learns_it_at_its_next_heartbeat(run_dir):
    # (as when another command took it over and has ended since): on a bucket the renewal's
    # If-Match PUT finds no object (404), which is no network error to retry
    with pytest.raises(LeaseLost):
        with RunLease(run_dir, ttl_s=60, heartbeat_s=0.2) as lease:
            (location(run_dir) / LEASE_FILE).unlink()
            deadline = time.monotonic() + 10
            while not lease.lost and time.monotonic() < deadline:
                time.sleep(0.05)
            assert lease.lost
    assert not (location(run_dir) / LEASE_FILE).exists()
