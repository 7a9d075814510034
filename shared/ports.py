"""Local TCP ports: a free one to bind a service to, and whether something listens on one."""

from __future__ import annotations

import ipaddress
import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing was bound to a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        sock.settimeout(timeout)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def is_loopback(host: str) -> bool:
    """Whether a service bound to `host` is reachable from this machine only: `localhost` or
    a loopback address (127.0.0.0/8, ::1). Flower, `evoenv serve` and `evoenv pool serve` ask
    this before they face the network without auth."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
