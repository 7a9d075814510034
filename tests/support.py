"""Helpers the tests share (importable as `support`: pytest puts tests/ on the path)."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from evoenv_worker.sandbox.host import Sandbox
from shared.config import SandboxSettings
from shared.errors import SandboxUnavailable
from shared.messages import GeneratorGroupData, GradedCompletion, GradedGroup
from shared.ports import free_port as free_port  # re-exported for the tests

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(what: str) -> None:
    """A service the test needs is missing: fail under CI, skip on a developer's machine."""
    if IN_CI:
        pytest.fail(f"{what} (required under CI=true)")
    pytest.skip(what)


def sandbox_or_missing() -> None:
    """`missing` unless EvoEnv's sandbox starts here (the one started is closed at once)."""
    for _box in started_sandbox(SandboxSettings()):
        pass


def pip_install_target(package: Path, target: Path) -> Path:
    """An exported package, installed by pip into `target` (its own folder, put on a path by
    whoever uses it), offline and without its dependencies; `target` returned."""
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "--no-index", "--no-deps", "--no-build-isolation", "--target", str(target), package],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def run_isolated(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`code` run by this Python with no site-packages, no PYTHONPATH and no current folder on
    its path (`-I -S`): what an exported package finds where the project is not installed."""
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def started_sandbox(settings: SandboxSettings) -> Iterator[Sandbox]:
    """A module's sandbox fixture: started (or `missing`), closed when the module is done."""
    box = Sandbox(settings)
    try:
        box.start()
    except SandboxUnavailable as exc:
        missing(f"the sandbox cannot start: {exc}")
    yield box
    box.close()


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@contextlib.contextmanager
def chromium(folder: Path, user: str = "", password: str = "") -> Iterator[Any]:
    """Headless Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium; never
    Selenium Manager: nothing is downloaded), its profile under `folder`; with `user`, every
    request carries that basic-auth user and `password`."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        missing(
            f"{CHROMIUM} or {CHROMEDRIVER} is missing (apt-get install chromium chromium-driver; "
            "scripts/setup.sh installs them)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium is not installed (pip install -e '.[dev]')")

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={folder / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        if user:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd(
                "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
            )
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(folder / "chromium-profile", ignore_errors=True)


def without_read_override() -> list[str]:
    """A command prefix under which a file of mode 000 cannot be read: [] for a user that is
    not root; for root, `setpriv` dropping the two capabilities that override file permissions.

    The command keeps uid 0 rather than switching to an unprivileged uid, so that it reaches
    the checkout and its interpreter wherever root installed them (a virtual environment whose
    base interpreter lives in root's home folder, mode 700, is not runnable as nobody)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        missing("setpriv (util-linux) is not installed: root would read any file")
    prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"]
    tried = subprocess.run([*prefix, "true"], capture_output=True, text=True, check=False)
    if tried.returncode != 0:
        missing(f"setpriv cannot drop capabilities here: {tried.stderr.strip()}")
    return prefix


def cannot_open(path: Path, prefix: list[str]) -> bool:
    """Whether a command run after `prefix` is refused opening `path` for reading."""
    code = f"try: open({str(path)!r}, 'rb')\nexcept PermissionError: raise SystemExit(13)"
    return subprocess.run([*prefix, sys.executable, "-c", code], check=False).returncode == 13


_SERVERS: list[Callable[[], None]] = []


def register_server(stop: Callable[[], None]) -> None:
    """A session-scoped model server's `stop`, for `stop_servers` (it must be safe to call
    twice: its fixture stops it again at the session's end)."""
    _SERVERS.append(stop)


def stop_servers() -> None:
    """Stop the registered servers: the end-to-end cluster calls it before it starts, so that
    no two model servers and a trainer of the large model share the machine's memory (in one
    CI run the learner was killed for memory with the small model's server still up)."""
    while _SERVERS:
        _SERVERS.pop()()


def graded_group(
    role: str, rewards: Sequence[float | None], *, run: str = "r", group_id: str = "g1"
) -> GradedGroup:
    """A graded group of `role` whose completions earned `rewards` (None: an environment error),
    as a worker appends it to the rollout stream."""
    completions = [
        GradedCompletion(
            text="t",
            token_ids=[1],
            logprobs=[-0.1],
            reward=reward,
            outcome="env_error" if reward is None else "scored",
        )
        for reward in rewards
    ]
    data = GeneratorGroupData(funnel=["L1"] * len(rewards), gamma=2.0)
    return GradedGroup(
        run=run,
        group_id=group_id,
        role=role,  # type: ignore[arg-type]
        env_name="e",
        env_sha="s",
        seed=0,
        difficulty=1,
        prompt="p",
        policy_version=0,
        completions=completions,
        **({"data": data} if role == "generator" else {}),  # type: ignore[arg-type]
    )
