"""A multi-node Ray cluster on one host, as on a real cluster: `ray start --head` plus more
nodes joining it with `ray start --address`, each its own raylet with its own CPUs.

Used by tests/test_multinode.py (its node loss and `ray job submit`), benchmarks/streaming.py and
benchmarks/cluster_stop.py:

    cluster = RayCliCluster(cli_env())
    cluster.start_head(num_cpus=1); cluster.add_node(num_cpus=1)
    ray.init(address=cluster.gcs_address)   # with cluster.env's RAY_AUTH_MODE
    ...
    cluster.stop()
    orphaned_agents()                       # [] once every stopped cluster took its agents
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from workflows.cluster import free_port


def processes() -> dict[int, tuple[int, bytes, set[bytes]]]:
    """The machine's live processes but this one: {pid: (parent pid, command line, environment
    entries)}; zombies (ended, not yet reaped) are left out."""
    out = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] == "Z":
                    continue
                out[int(proc.name)] = (int(stat[1]), (proc / "cmdline").read_bytes(),
                                       set((proc / "environ").read_bytes().split(b"\0")))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _open_paths(pid: int) -> set[str]:
    """The files process `pid` holds open (empty when it ended meanwhile)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    out = set()
    for fd in fds:
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def agents(temp_dir: str | None = None, procs: dict | None = None
           ) -> dict[int, tuple[str, int | None]]:
    """Ray agent processes (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`): {pid: (title, pid
    of its raylet, or None when its parent is no raylet)}. `temp_dir`: only the agents of the
    `RayCliCluster` under that folder, by the log files they hold open in its session folder;
    by default, every agent. (Not by their environment: an agent retitles itself over its
    command line and environment, so /proc/<pid>/environ keeps only some of its variables,
    and which ones changes with the environment's length.) `procs`: a `processes()` table
    already read."""
    mine = None if temp_dir is None else f"{temp_dir.rstrip('/')}/"
    live = processes() if procs is None else procs
    out = {}
    for pid, (parent, cmd, _) in live.items():
        title = cmd.split(b"\0")[0].decode(errors="replace").strip()
        if not title.startswith("ray::") or "Agent" not in title:
            continue
        if mine is not None and not any(p.startswith(mine) for p in _open_paths(pid)):
            continue
        # the raylet starts its agents: an agent whose raylet ended is reparented
        raylet = parent if parent in live and b"raylet" in live[parent][1] else None
        out[pid] = (title, raylet)
    return out


def orphaned_agents(temp_dir: str | None = None) -> list[str]:
    """The `agents` (of the cluster under `temp_dir`, or all) whose raylet is gone, "pid title"
    each: such an agent spins a whole core for minutes, so a stopped cluster must take its
    agents along. (Restricted to one cluster, another Ray on the machine ending meanwhile does
    not count.)"""
    return [f"{pid} {title} (its raylet gone)"
            for pid, (title, raylet) in agents(temp_dir).items() if raylet is None]


def cli_env(base: dict | None = None) -> dict:
    """Environment for `ray start` and drivers: `base` (this process's environment by default)
    with token authentication, this Python's bin first on PATH (so the Ray processes run the
    project's Python), no inherited cluster or MLflow."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_AUTH_MODE"] = "token"  # ray start --head enables tokens (docs/reference.md, Ray)
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    return env


class RayCliCluster:
    """Ray nodes started with `ray start` on this host (a real head with the dashboard / job
    API, and more nodes joining it), all under one short temp dir. Every process they start
    inherits `MARKER_ENV`=<that temp dir> from `env`; `stop()` ends exactly the processes that
    carry it or name the temp dir (never `ray stop`, which would end every Ray on the machine).
    The command line alone does not find them all: Ray's dashboard agent and runtime-env agent
    retitle themselves (`ray::DashboardAgent`), and the Ray Client server names only the GCS
    address; left behind, an agent whose raylet is gone spins a whole core for minutes."""

    MARKER_ENV = "CONVS2S_RAY_CLI_CLUSTER"

    def __init__(self, env: dict, temp_dir: str | None = None):
        """`temp_dir`: a running cluster's folder, to find its processes (`pids`); by default
        a new one."""
        import tempfile

        # Short: Ray's unix sockets live under it (path limit ~107 bytes).
        self.temp_dir = temp_dir or tempfile.mkdtemp(prefix="rt", dir="/tmp")
        self.env = {**env, self.MARKER_ENV: self.temp_dir}
        # A new cluster's own token, in its temp dir: `ray start` reads a token and never makes
        # one, so with the user's ~/.ray/auth_token it failed on a machine where no Ray had run
        # yet, and a shared file ties every test cluster to whatever last wrote it. (A running
        # cluster's folder, `temp_dir`, is only read: its token is used if it has one.)
        token = Path(self.temp_dir) / "auth_token"
        if temp_dir is None:
            import secrets

            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        if token.exists():
            self.env["RAY_AUTH_TOKEN_PATH"] = str(token)
        self.gcs_address: str | None = None
        self.dashboard_url: str | None = None
        self.agent_wait_s: float | None = None  # the head's agent's wait after `ray start`
        self._alive = 0  # nodes started and not killed (the head among them)
        self._nodes = 0  # nodes added (each has a temp dir n<k> in the cluster's)

    def _start(self, args: list[str], temp_dir: str | None = None) -> int:
        """`ray start` with this cluster's ports and temp dir (or `temp_dir`, one inside it);
        returns the port of the node's dashboard agent (its HTTP server)."""
        import subprocess

        agent_port = free_port()
        # Every port a node binds is chosen here, none left to Ray's own pick; free_port never
        # gives one twice (a node's raylet and its metrics exporter were once given one port
        # by the kernel, and it refused).
        ports = ["--dashboard-agent-listen-port", str(agent_port),
                 "--dashboard-agent-grpc-port", str(free_port()),
                 "--metrics-export-port", str(free_port()),
                 "--runtime-env-agent-port", str(free_port()),
                 "--object-manager-port", str(free_port())]
        proc = subprocess.run(["ray", "start", *args, *ports, "--temp-dir",
                               temp_dir or self.temp_dir, "--disable-usage-stats"],
                              env=self.env, capture_output=True, text=True, timeout=240)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start {args} failed:\n{proc.stdout}\n{proc.stderr}")
        return agent_port

    def wait_for_agent(self, agent_port: int, timeout: float = 180.0) -> float:
        """Wait until the node's dashboard agent answers its health check; returns the seconds
        waited. A job is submitted through the head's agent, which the dashboard waits for
        only 10 s (Ray's WAIT_AVAILABLE_AGENT_TIMEOUT) before it refuses the job ("No available
        agent to submit job"); the agent records its address in the GCS right after its HTTP
        server starts. On this project's 2-core hosts `ray start` returned with the agent
        already healthy (0.0 s waited, idle and with 3 busy processes): the wait is a guard
        that turns a slow or dead agent into an error with the agent's log."""
        import http.client
        import time
        import urllib.error
        import urllib.request

        url = f"http://127.0.0.1:{agent_port}/api/healthz"
        start = time.monotonic()
        last = "no answer"
        while time.monotonic() - start < timeout:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200:
                        return time.monotonic() - start
            except urllib.error.HTTPError as exc:  # up, raylet / GCS not yet healthy
                last = f"HTTP {exc.code}"
            except http.client.RemoteDisconnected as exc:  # closed unanswered: not up yet
                last = str(exc)
            except http.client.HTTPException as exc:  # not HTTP: another server has the port
                raise RuntimeError(f"port {agent_port}, given to the dashboard agent, answers "
                                   f"as another kind of server ({type(exc).__name__}): another "
                                   f"process bound it first") from None
            except OSError as exc:
                last = str(exc)
            time.sleep(0.25)
        logs = sorted(Path(self.temp_dir).glob("session_latest/logs/dashboard_agent*.log"))
        tail = logs[-1].read_text(errors="replace")[-3000:] if logs else "(no agent log)"
        raise RuntimeError(f"the dashboard agent on port {agent_port} was not healthy after "
                           f"{timeout:.0f} s ({last}); its log ends:\n{tail}")

    def start_head(self, num_cpus: int) -> None:
        """Start the head; it is ready for `ray job submit` (and the state API) on return.
        A head that did not come up (`ray start` failed, or its dashboard agent is not healthy)
        is ended and started once more on new ports; a second failure raises with both
        attempts' errors and the tail of the cluster's logs."""
        import subprocess

        errors = []
        for attempt in range(2):
            try:
                self._start_head(num_cpus)
                return
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                errors.append(f"attempt {attempt + 1}: {exc}\n{self.log_tails()}")
                self._end_processes()
                self.gcs_address = self.dashboard_url = None
                self._alive = 0
        raise RuntimeError("\n\n".join(errors))

    def _start_head(self, num_cpus: int) -> None:
        port, dash = free_port(), free_port()
        # This cluster's processes (and drivers started with `env`) ask its own state API,
        # never another Ray's on this machine (workflows.cluster.own_dashboard).
        self.env["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dash}"
        agent = self._start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                             "--node-manager-port", str(free_port()),
                             "--num-cpus", str(num_cpus), "--include-dashboard", "true",
                             "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
                             "--ray-client-server-port", str(free_port())])
        self.gcs_address = f"127.0.0.1:{port}"
        self._alive = 1
        self.dashboard_url = f"http://127.0.0.1:{dash}"
        self.agent_wait_s = self.wait_for_agent(agent)

    def add_node(self, num_cpus: int, node_manager_port: int | None = None) -> int:
        """Start a node joining the head; returns its raylet's port (`kill_node` takes it).

        `ray start` waits a fixed 30 s for its raylet to show in the GCS (Ray 2.60,
        `ray/_private/node.py`) and then gives up, leaving the raylet running. On CI's 2-core
        host that wait once ran out ("RPC error: Deadline Exceeded" from the GCS) in one test
        of 600. A node that did not come up is ended (and, if the GCS had registered it after
        all, waited on until the GCS counts it dead), then started once more on a new port, as
        an autoscaler replaces a node that failed to launch; a second failure raises with both
        attempts' output and the tail of the cluster's logs."""
        import subprocess

        errors = []
        for attempt in range(2):
            port = node_manager_port if node_manager_port and not attempt else free_port()
            # Its own temp dir, as a machine has its own disk: nodes that shared the head's
            # unpacked a job's working directory into one folder, each replacing it under the
            # processes running from it (the job's driver lost its working directory).
            self._nodes += 1
            node_dir = Path(self.temp_dir) / f"n{self._nodes}"
            try:
                self._start(["--address", self.gcs_address, "--node-ip-address", "127.0.0.1",
                             "--num-cpus", str(num_cpus), "--node-manager-port", str(port)],
                            temp_dir=str(node_dir))
            except RuntimeError as exc:
                errors.append(f"attempt {attempt + 1}: {exc}\n{self.log_tails()}")
                try:
                    self._kill_raylet(port, missing_ok=True)
                    self._wait_alive_nodes(self._alive, timeout=90.0)
                except (RuntimeError, subprocess.TimeoutExpired) as gone:
                    errors.append(f"ending the node that did not come up: {gone}")
                    break
                continue
            self._alive += 1
            return port
        raise RuntimeError("\n\n".join(errors))

    def log_tails(self, chars: int = 1500) -> str:
        """The last `chars` of the GCS's log and of the newest raylet log (what says why a node
        did not register)."""
        logs = Path(self.temp_dir).glob("**/session_2*/logs/*.out")  # not session_latest
        raylets = sorted((p for p in logs if p.name.startswith("raylet")),
                         key=lambda p: p.stat().st_mtime)
        picked = [*Path(self.temp_dir).glob("session_2*/logs/gcs_server.out"), *raylets[-1:]]
        return "\n".join(f"--- {p.name} ends:\n{p.read_text(errors='replace')[-chars:]}"
                         for p in picked) or "(no GCS or raylet log)"

    def alive_nodes(self) -> int:
        """How many nodes the GCS counts alive (`ray list nodes`)."""
        import json
        import subprocess

        proc = subprocess.run(["ray", "list", "nodes", "--address", self.gcs_address,
                               "--format", "json", "--limit", "1000"], env=self.env,
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"ray list nodes failed:\n{proc.stderr[-2000:]}")
        return sum(n["state"] == "ALIVE" for n in json.loads(proc.stdout))

    def _wait_alive_nodes(self, count: int, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while (seen := self.alive_nodes()) != count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the GCS counts {seen} live nodes, not {count}, after "
                                   f"{timeout:.0f} s\n{self.log_tails()}")
            time.sleep(1.0)

    def kill_node(self, node_manager_port: int) -> int:
        """Lose a node as a machine is lost: SIGKILL its raylet (the one serving
        `node_manager_port`) and every process under it at once; returns how many died."""
        died = self._kill_raylet(node_manager_port)
        self._alive -= 1
        return died

    def _kill_raylet(self, node_manager_port: int, missing_ok: bool = False) -> int:
        import signal

        parents = {}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    stat = (proc / "stat").read_text()
                    cmd = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                parents[int(proc.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd)
        flag = f"--node_manager_port={node_manager_port}".encode()
        doomed = {pid for pid, (_, cmd) in parents.items()
                  if b"raylet" in cmd.split(b"\0")[0] and flag in cmd}
        if not doomed:
            if missing_ok:
                return 0
            raise RuntimeError(f"no raylet serves port {node_manager_port}")
        grew = True
        while grew:  # the raylet's descendants: its workers, agents
            more = {pid for pid, (ppid, _) in parents.items() if ppid in doomed} - doomed
            doomed |= more
            grew = bool(more)
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(doomed)

    def pids(self) -> list[int]:
        """This cluster's live processes: those whose environment carries its marker or whose
        command line names its temp dir, its Ray agents (`agents`: by the files they hold in its
        temp dir, an agent whose raylet was killed among them), and every descendant of these."""
        procs = processes()
        marker = f"{self.MARKER_ENV}={self.temp_dir}".encode()
        found = {pid for pid, (_, cmd, env) in procs.items()
                 if self.temp_dir.encode() in cmd or marker in env}
        found |= set(agents(self.temp_dir, procs))  # an orphan too (its raylet gone: a lost node)
        grew = True
        while grew:
            more = {pid for pid, (ppid, _, _) in procs.items() if ppid in found} - found
            found |= more
            grew = bool(more)
        return sorted(found)

    def stop(self) -> None:
        """End every process of this cluster and remove its temp dir."""
        import shutil

        self._end_processes()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _end_processes(self) -> None:
        import contextlib
        import signal
        import time

        # A test cluster's state is thrown away: a short grace, then SIGKILL (Ray's workers
        # may take 10 s and more to wind down on SIGTERM).
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
