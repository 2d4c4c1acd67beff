"""The team tracking server of infra/mlflow with authentication, as a specification: a real
`mlflow server --app-name basic-auth` on loopback, started through
infra/mlflow/auth-entrypoint.sh (conftest's `team_server`). A workflow without a login, with
a wrong one, or with a user who may only read its experiment stops in one line before anything
starts; a user's own experiment takes runs. Credentials come from MLFLOW_TRACKING_USERNAME /
MLFLOW_TRACKING_PASSWORD (or the URI) and are never printed.

    .venv/bin/python -m pytest tests/test_team_server.py -q
"""

from __future__ import annotations

import contextlib
import io
import urllib.request

import pytest

PASSWORD = "bob-pw-7f2a91"


def _workflow(argv: list[str], capsys) -> tuple[int, str]:
    from workflows import wmt14_en_fr

    with contextlib.redirect_stdout(io.StringIO()):
        rc = wmt14_en_fr.main({"smoke": wmt14_en_fr.smoke}, None, argv)
    return rc, capsys.readouterr().err.strip()


@pytest.fixture(scope="module")
def bob(team_server):
    team_server.add_user("bob", PASSWORD)
    return "bob"


def test_the_server_wants_a_login_for_everything_but_its_health(team_server):
    with urllib.request.urlopen(f"{team_server.url}/health", timeout=10) as r:
        assert r.read().strip() == b"OK"  # the compose healthcheck needs no login
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{team_server.url}/api/2.0/mlflow/experiments/search"
                               "?max_results=1", timeout=10)
    assert refused.value.code == 401


def test_the_server_runs_without_a_job_runner(team_server):
    """As infra/mlflow/docker-compose.yaml sets it: no MLflow job runner and none of its huey
    consumers beside the server (each server start cost about 16 CPU seconds more with them)."""
    from benchmarks.local_cluster import processes

    cmdlines = [cmd.replace(b"\0", b" ").decode(errors="replace")
                for _, cmd, _ in processes().values()]
    assert any("mlflow" in c and " server " in f"{c} " for c in cmdlines)  # it is running
    runners = [c for c in cmdlines if "huey_consumer" in c or "mlflow.server.jobs" in c]
    assert not runners, runners


def test_the_credential_cache_is_on_and_a_wrong_password_is_still_refused(team_server, bob):
    """The entrypoint turns MLflow's credential cache on for a minute (a run's 100-200 requests
    each carried a password whose hash check costs tens of milliseconds; its time saved is
    measured in docs/benchmarks.md, not here): a wrong password right after a login that passed
    is still refused, and the right one still works after it."""
    import base64
    import configparser

    conf = configparser.ConfigParser()
    conf.read(team_server.config)
    assert conf["mlflow"]["auth_cache_ttl_seconds"] == "60"

    def status(password: str) -> int:
        token = base64.b64encode(f"{bob}:{password}".encode()).decode()
        req = urllib.request.Request(f"{team_server.url}/api/2.0/mlflow/experiments/search"
                                     "?max_results=1", headers={"Authorization": f"Basic {token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert [status(PASSWORD), status(PASSWORD), status("not-his-password"), status(PASSWORD)] \
        == [200, 200, 401, 200]


@pytest.mark.parametrize("login, says", [
    (None, "the server asks for a login: set MLFLOW_TRACKING_USERNAME and "
           "MLFLOW_TRACKING_PASSWORD"),
    (("bob", "not-his-password"), "the server asks for a login and refused user 'bob'"),
])
def test_no_login_or_a_wrong_one_is_one_line_before_anything_starts(
        team_server, bob, monkeypatch, capsys, tmp_path, login, says):
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    if login:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", login[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", login[1])
    rc, err = _workflow(["--preset", "smoke", "--tracking-uri", team_server.url,
                         "--storage-path", str(tmp_path / "runs")], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and says in err, err
    assert "not-his-password" not in err
    assert not (tmp_path / "runs").exists()  # nothing started


def test_a_user_who_may_only_read_the_experiment_is_refused_and_his_own_takes_runs(
        team_server, bob, monkeypatch, capsys, tmp_path):
    from mlflow.tracking import MlflowClient

    from convs2s.tracking.runs import tracking_problem

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", team_server.admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", team_server.admin[1])
    MlflowClient(team_server.url).create_experiment("admins_experiment")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")  # READ on others' experiments
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    rc, err = _workflow(["--preset", "smoke", "--tracking-uri", team_server.url,
                         "--experiment", "admins_experiment",
                         "--storage-path", str(tmp_path / "runs")], capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "user 'bob' may not write to experiment 'admins_experiment' (read-only)" in err
    assert PASSWORD not in err
    # An experiment of his own (created by him: he manages it) takes his runs.
    assert tracking_problem(team_server.url, "bobs_experiment") is None
    exp = MlflowClient(team_server.url).get_experiment_by_name("bobs_experiment")
    run = MlflowClient(team_server.url).create_run(exp.experiment_id)
    assert run.info.status == "RUNNING"
