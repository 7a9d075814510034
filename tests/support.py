"""Helpers the tests share (importable as `support`: pytest puts tests/ on the path)."""

from __future__ import annotations

import os

import pytest

from shared.ports import free_port as free_port  # re-exported for the tests

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(what: str) -> None:
    """A service the test needs is missing: fail under CI, skip on a developer's machine."""
    if IN_CI:
        pytest.fail(f"{what} (required under CI=true)")
    pytest.skip(what)
