"""Real, bandwidth-limited links between "nodes" on one machine: N network namespaces, each joined
to a bridge in a hub namespace by a veth pair whose node end is shaped with ``tc tbf`` (the rate a
node sends at; a message between nodes crosses one shaped link). Processes run in a node with
``ip netns exec``; traffic between two processes of one node stays inside it (unshaped), traffic
between nodes crosses the shaped link, so gloo between namespaces is a real slow network.

Addresses come from 169.254.0.0/16 and exist only inside the namespaces made here; everything is
removed when the ``with`` block ends, whatever happens. Needs root (CAP_NET_ADMIN): without it the
block fails at once, in one line. ``netem`` (delays) is not available in every kernel; ``tbf`` is.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys

_COUNTER = itertools.count()


class LinkError(RuntimeError):
    """The links cannot be built here (the message says why, in one line)."""


def _run(*cmd: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        raise LinkError(
            f"`{' '.join(cmd)}` failed: {result.stderr.strip().splitlines()[-1] if result.stderr else ''}"
        )


def check_links_possible() -> None:
    """Raise LinkError (one line) where this process cannot build links (not root, no ip or tc)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        raise LinkError("links: network namespaces need root (CAP_NET_ADMIN) and the ip and tc commands")


def wire_tx_bytes(interface: str = "eth0") -> int | None:
    """Bytes ``interface`` of this process's network namespace has sent (its kernel counter, Ethernet,
    IP and TCP headers included), or None where it has no such interface (outside a node of ``Links``)."""
    try:
        return int(open(f"/sys/class/net/{interface}/statistics/tx_bytes").read())
    except (OSError, ValueError):
        return None


class Links:
    """``nodes`` namespaces joined by links shaped to ``rate_mbit`` (None: unshaped)."""

    def __init__(self, nodes: int, rate_mbit: float | None = None) -> None:
        if nodes < 2:
            raise ValueError(f"links: nodes={nodes}: at least 2")
        self.nodes, self.rate_mbit = nodes, rate_mbit
        tag = f"{os.getpid() % 100000}x{next(_COUNTER)}"
        self.hub = f"rh{tag}"
        self.names = [f"rn{tag}n{i}" for i in range(nodes)]
        self.subnet = 20 + (os.getpid() * 7 + next(_COUNTER)) % 200  # 169.254.<subnet>.0/24
        self._made: list[str] = []

    def address(self, node: int) -> str:
        return f"169.254.{self.subnet}.{node + 1}"

    def exec_args(self, node: int, gloo_interface: bool = True) -> list[str]:
        """The prefix that runs a command inside ``node``; with ``gloo_interface`` its gloo is told to go
        out on eth0 (``GLOO_SOCKET_IFNAME``; the strategy finds that interface itself, plain torch does not)."""
        prefix = ["ip", "netns", "exec", self.names[node]]
        return [*prefix, "env", "GLOO_SOCKET_IFNAME=eth0"] if gloo_interface else prefix

    def __enter__(self) -> Links:
        check_links_possible()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        _run("ip", "netns", "add", self.hub)
        self._made.append(self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        _run("ip", "-n", self.hub, "link", "set", "lo", "up")
        for i, name in enumerate(self.names):
            _run("ip", "netns", "add", name)
            self._made.append(name)
            outer, inner = f"v{i}b", f"v{i}a"
            _run(
                "ip",
                "link",
                "add",
                inner,
                "netns",
                name,
                "type",
                "veth",
                "peer",
                "name",
                outer,
                "netns",
                self.hub,
            )
            _run("ip", "-n", name, "link", "set", inner, "name", "eth0")
            _run("ip", "-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _run("ip", "-n", name, "link", "set", "eth0", "up")
            _run("ip", "-n", name, "link", "set", "lo", "up")
            _run("ip", "-n", self.hub, "link", "set", outer, "master", "br0")
            _run("ip", "-n", self.hub, "link", "set", outer, "up")
            if self.rate_mbit:
                burst = max(32_000, int(self.rate_mbit * 1e6 / 8 / 100))  # 10 ms at the rate, at least 32 kB
                _run(
                    "ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                    "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "latency", "100ms",
                )  # fmt: skip

    def close(self) -> None:
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made = []

    def __exit__(self, *exc) -> None:
        self.close()


RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); got, start = 0, None
while True:
    data = c.recv(1 << 20)
    if not data: break
    start = start or time.perf_counter(); got += len(data)
print(got * 8 / (time.perf_counter() - start) / 1e6)
"""
SENDER = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"x" * int(sys.argv[3])); s.close()
"""


def measured_rate_mbit(links: Links, src: int, dst: int, megabytes: float, port: int = 29555) -> float:
    """Megabits per second a TCP stream carries from node ``src`` to node ``dst``."""
    receiver = subprocess.Popen(
        [*links.exec_args(dst), sys.executable, "-c", RECEIVER, links.address(dst), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        subprocess.run(
            [
                *links.exec_args(src),
                sys.executable,
                "-c",
                SENDER,
                links.address(dst),
                str(port),
                str(int(megabytes * 1e6)),
            ],
            check=True,
            timeout=120,
        )
        out, _ = receiver.communicate(timeout=120)
        return float(out.strip())
    finally:
        if receiver.poll() is None:
            receiver.kill()
