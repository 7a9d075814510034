"""No server listens beyond loopback without credentials: `evoenv serve`, deploy/redis.sh,
`evoenv flower` and `evoenv up` refuse such a bind in one line naming the setting, before
anything binds; the Redis that deploy/redis.sh or `up` starts with a password answers NOAUTH
without it. The servers started here listen on loopback only."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from pydantic import SecretStr
from support import free_port, missing

from evoenv_cli.up import redis_child, redis_password
from shared.config import Settings
from shared.ports import listening

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from evoenv_cli import main; main()"]
PASSWORD = 'pa ss"wo\\rd&$x'
"""Spaces, quotes, a backslash, `&` and `$`: whatever the quoting on its way must survive."""
ELSEWHERE = "192.0.2.1"
"""An address beyond loopback that is no interface's here (TEST-NET-1): were a refusal missing,
the server would fail to bind it rather than face a network."""


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """This process's environment without EVOENV_* variables, an empty settings file for the
    deploy scripts, a data folder of the test's own, plus `settings`."""
    env_file = tmp_path / "evoenv.env"
    env_file.touch()
    base = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    data = str(tmp_path / "data")
    return {**base, "EVOENV_ENV_FILE": str(env_file), "EVOENV_DATA_DIR": data, **settings}


def _run(command: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """Run `command` in a session of its own (all of it killed if it outlives `timeout`); its
    exit status and standard error."""
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        pytest.fail(f"{command} did not stop within {timeout} s: it did not refuse")
    return proc.returncode, err


def _one_line_naming(err: str, setting: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and setting in lines[0], err


def _raw_ping(port: int) -> bytes:
    """Redis's answer to PING from a client that gave no password."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(200)


@pytest.fixture
def redis_installed() -> None:
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed (scripts/setup.sh installs it)")


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; each is stopped after it."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while not listening(port):
        assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
        assert time.monotonic() < deadline, "redis-server did not listen within 20 s"
        time.sleep(0.05)


@pytest.mark.integration
@pytest.mark.usefixtures("redis_installed")
def test_deploy_redis_with_a_password_answers_noauth_without_it(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    env = _env(tmp_path, EVOENV_REDIS_PORT=str(port), EVOENV_REDIS_PASSWORD=PASSWORD)
    proc = subprocess.Popen(
        ["bash", "deploy/redis.sh"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    started.append(proc)
    _wait_listening(port, proc)
    assert _raw_ping(port).startswith(b"-NOAUTH")
    assert PASSWORD.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    client = redis.Redis.from_url(f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{port}/0")
    assert client.ping()
    client.close()


@pytest.mark.parametrize("bind", [ELSEWHERE, f"127.0.0.1 {ELSEWHERE}"])
def test_deploy_redis_refuses_a_bind_beyond_loopback_without_a_password(
    tmp_path: Path, bind: str
) -> None:
    port = free_port()
    env = _env(tmp_path, EVOENV_REDIS_PORT=str(port), EVOENV_REDIS_BIND=bind)
    code, err = _run(["bash", "deploy/redis.sh"], env, timeout=30)
    assert code == 2
    _one_line_naming(err, "EVOENV_REDIS_PASSWORD")
    assert not (tmp_path / "data").exists() and not listening(port)


def test_evoenv_serve_refuses_a_bind_beyond_loopback_before_preparing_the_model(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = _env(tmp_path, EVOENV_MODEL=str(tmp_path / "no-model"))
    code, err = _run([*CLI, "serve", "--host", ELSEWHERE, "--port", str(port)], env)
    assert code == 2
    _one_line_naming(err, "EVOENV_SERVE__API_KEY")
    assert not (tmp_path / "data").exists() and not listening(port)


def test_evoenv_flower_refuses_a_bind_beyond_loopback_without_basic_auth(tmp_path: Path) -> None:
    port = free_port()
    env = _env(tmp_path, EVOENV_FLOWER__ADDRESS=ELSEWHERE, EVOENV_FLOWER__PORT=str(port))
    env["EVOENV_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"  # none: refused before it
    code, err = _run([*CLI, "flower"], env)
    assert code == 2
    _one_line_naming(err, "EVOENV_FLOWER__BASIC_AUTH")
    assert not listening(port)


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("EVOENV_SERVE__HOST", ELSEWHERE, "EVOENV_SERVE__API_KEY"),
        ("EVOENV_FLOWER__ADDRESS", ELSEWHERE, "EVOENV_FLOWER__BASIC_AUTH"),
    ],
)
def test_evoenv_up_refuses_a_server_beyond_loopback_before_starting_anything(
    tmp_path: Path, setting: str, value: str, named: str
) -> None:
    port = free_port()
    env = _env(
        tmp_path,
        **{setting: value},
        EVOENV_SERVE__PORT=str(port),
        EVOENV_MODEL=str(tmp_path / "no-model"),  # should it start anyway: nothing to load
    )
    if setting != "EVOENV_SERVE__HOST":  # the model server is elsewhere (and not there)
        env["EVOENV_VLLM_URLS"] = f"http://127.0.0.1:{free_port()}"
    code, err = _run([*CLI, "up", "--steps", "1"], env)
    assert code == 2
    _one_line_naming(err, named)
    assert not (tmp_path / "data").exists() and not listening(port)


def test_up_generates_its_redis_password_into_the_data_folder_for_an_open_bind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_bind = Settings(data_dir=tmp_path / "data", redis_bind="0.0.0.0", redis_password="")  # type: ignore[arg-type]
    password, path = redis_password(open_bind)
    assert path == tmp_path / "data" / "redis-password" and len(password) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert redis_password(open_bind) == (password, path), "kept for the next runs"
    child, url = redis_child(open_bind, {}, tmp_path / "logs")
    assert str(path) in capsys.readouterr().out, "up says where the password is"
    assert child.argv[child.argv.index("--bind") + 1] == "0.0.0.0"
    assert url.startswith(f"redis://:{password}@127.0.0.1:")
    given = open_bind.model_copy(update={"redis_password": SecretStr(PASSWORD)})
    assert redis_password(given) == (PASSWORD, None)
    loopback = Settings(data_dir=tmp_path / "other", redis_password="")  # type: ignore[arg-type]
    assert redis_password(loopback) == ("", None)
    assert not (tmp_path / "other").exists()


@pytest.mark.integration
@pytest.mark.usefixtures("redis_installed")
def test_up_redis_with_a_password_answers_noauth_without_it(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    settings = Settings(  # type: ignore[arg-type]
        data_dir=tmp_path / "data", redis_bind="127.0.0.1", redis_password=PASSWORD
    )
    child, url = redis_child(settings, {}, tmp_path / "logs")
    assert not any(PASSWORD in arg for arg in child.argv), "off the command line"
    proc = subprocess.Popen(child.argv, cwd=tmp_path, stdout=subprocess.DEVNULL)
    started.append(proc)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    _wait_listening(port, proc)
    assert _raw_ping(port).startswith(b"-NOAUTH")
    client = redis.Redis.from_url(url)
    assert client.ping()
    client.close()
