"""How the stage processes of several nodes find each other: the network interface gloo uses.

gloo binds each process to the address its host name resolves to, and where that is a loopback
address (a host name listed as 127.0.0.1 in /etc/hosts, containers, network namespaces) every
node offers the others 127.0.0.1 and the process group never forms ("connectFullMesh failed ...
Connection refused"). ``GLOO_SOCKET_IFNAME`` names the interface instead; when it is unset and
``MASTER_ADDR`` is another machine's, the strategy sets it to the interface the kernel routes
``MASTER_ADDR`` through (found without sending anything), and says so in one line. A process
group that still does not form is one line naming the address, the port and the interface.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Mapping, MutableMapping

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


class RendezvousError(RuntimeError):
    """The stage processes cannot form their process group (the message says why, in one line)."""


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def interface_towards(host: str) -> tuple[str, str] | None:
    """(interface name, its IPv4 address) through which this machine reaches ``host``, or None
    when that cannot be told (no route, not IPv4, not Linux). A UDP socket's ``connect`` asks the
    kernel for the route and sends nothing."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
            local = probe.getsockname()[0]
        except OSError:
            return None
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == local:
                return name, local
    return None


def choose_gloo_interface(env: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` in ``env`` when the run spans machines and it is unset: the
    interface that routes to ``MASTER_ADDR``. Returns a line saying what was chosen (None when
    nothing was: a single machine, or the variable already set). Raises RendezvousError when the
    host name resolves to loopback and no interface can be found."""
    env = os.environ if env is None else env
    master = env.get("MASTER_ADDR")
    if env.get(GLOO_IFNAME) or not master or _is_loopback(master):
        return None
    found = interface_towards(master)
    if found is None:
        if _is_loopback(socket.gethostname()):
            raise RendezvousError(
                f"MASTER_ADDR={master}: no network interface of this machine routes there, and its host name "
                f"{socket.gethostname()!r} resolves to a loopback address, so gloo would offer the other nodes "
                f"127.0.0.1; set {GLOO_IFNAME} to the interface that reaches the other nodes (e.g. eth0)"
            )
        return None
    env[GLOO_IFNAME] = found[0]
    return (
        f"gloo on {found[0]} ({found[1]}), the interface that routes to MASTER_ADDR={master} "
        f"({GLOO_IFNAME} overrides)"
    )


def rendezvous_failed(exc: BaseException, rank: int, env: Mapping[str, str] | None = None) -> RendezvousError:
    """One line for a process group that did not form (the backend's message is many lines)."""
    env = os.environ if env is None else env
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    where = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
    interface = env.get(GLOO_IFNAME) or "the host name's address"
    return RendezvousError(
        f"rank {rank}: the stage processes did not form their process group at MASTER_ADDR:MASTER_PORT={where} "
        f"(gloo on {interface}): {first[:300]}; check that every node reaches that address and port, and "
        f"{GLOO_IFNAME} on each node"
    )
