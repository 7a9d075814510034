"""Helpers the tests share (importable as `support`: pytest puts tests/ on the path)."""

from __future__ import annotations

import os
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def missing(what: str) -> None:
    """A service the test needs is missing: fail under CI, skip on a developer's machine."""
    if IN_CI:
        pytest.fail(f"{what} (required under CI=true)")
    pytest.skip(what)
