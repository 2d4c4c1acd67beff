"""Ports for servers that tests and benchmarks start on this host (Ray nodes, MLflow, the S3
server, Ray Serve).

A port is free when it is picked, but the server binds it only seconds later. A port from
`bind(("", 0))` comes from the kernel's ephemeral range, the same range every other
`bind(0)` and outgoing connection draws from; Ray alone binds dozens such ports while the suite
runs. In one CI run another process's gRPC server took the port picked for a test head's
dashboard agent in that window, and the agent's health check read HTTP/2 bytes
("BadStatusLine"). Ports are therefore drawn at random below the ephemeral range and above
Ray's worker ports (10002-19999 by default, `ray start --min-worker-port/--max-worker-port`),
where nothing binds without being told to.
"""

from __future__ import annotations

import random
import socket

RAY_WORKER_PORTS = range(10002, 20000)  # Ray's default --min-worker-port .. --max-worker-port


def ephemeral_range() -> range:
    """The kernel's ephemeral ports (Linux: /proc/sys/net/ipv4/ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # every address: a server may bind 0.0.0.0 or 127.0.0.1
        except OSError:
            return False
    return True


def free_port(taken: set[int] | None = None, rng: random.Random | None = None) -> int:
    """A port no process holds now, outside the ephemeral range and Ray's worker ports, and not
    in `taken` (to which it is added): a port is only held once its server binds it, so two
    picks in a row must not return one port twice. Falls back to a kernel-picked port where no
    such range exists."""
    rng = rng or random.SystemRandom()
    taken = taken if taken is not None else set()
    low = RAY_WORKER_PORTS.stop
    high = ephemeral_range().start  # exclusive
    if high - low >= 1000:
        for _ in range(200):
            port = rng.randrange(low, high)
            if port not in taken and _bindable(port):
                taken.add(port)
                return port
    while True:  # no room below the ephemeral range, or all 200 picks held
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port
