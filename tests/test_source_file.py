"""`validate`, `sample` and `pool add` facing paths that are no environment file, through the
real command line (docs/CONTRACT.md#verdicts-and-exit-codes).

A path that cannot be read as a file (a directory, a FIFO, a device, no permission) is one
line on stderr and exit 2, before any file is judged; a FIFO never blocks. A regular file is
read up to the source size limit plus one byte: a multi-GB file or one that is not UTF-8 is a
candidate that fails L1 (for `sample`, which judges nothing, one line and exit 2). Every run's
peak memory (its own and its children's) stays far below the multi-GB file's size. Each
command runs under an address-space cap, so that a reader that is not bounded fails here at
once instead of exhausting the machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import cannot_open, missing, without_read_override
from typer.testing import CliRunner

from evoenv_cli import app
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.errors import SandboxUnavailable, UsageError

REPO = Path(__file__).resolve().parents[1]
SOUND = REPO / "tests" / "corpus" / "sound" / "int_score_count_distinct.py"
LIMIT = Settings().validation.max_source_bytes
BIG_BYTES = 2 * 1024**3 + 1
"""The multi-GB file: sparse, so it costs no disk."""
ADDRESS_SPACE = 4 * 1024**3
"""The cap on each command's address space: above the big file, so an unbounded read of it
shows in the peak memory; /dev/zero read without bound hits it instead of the machine."""
PEAK_BYTES = 400 * 1024**2
"""Peak resident memory allowed to a command and its children (about 80 MB here)."""
SECONDS = 120.0
"""A command still running after this is killed: a FIFO that blocked, a read without end."""
EXIT_REJECTED, EXIT_USAGE = 1, 2


@dataclass(frozen=True, slots=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    peak_bytes: int


MEASURED = """\
import resource, subprocess, sys
code = subprocess.run(sys.argv[2:], check=False).returncode
with open(sys.argv[1], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""
"""Runs a command, then writes its peak resident memory (KiB, its children's included). It is
measured from this small process because a child's peak counts the memory of the process it
was forked from, and the test process may have grown large."""


def evoenv(*args: str | Path, env: dict[str, str], prefix: list[str] | None = None) -> Run:
    """`evoenv ARGS` in a subprocess under the address-space cap, with its peak memory."""
    with tempfile.TemporaryDirectory() as folder:
        folder_path = Path(folder)
        peak = folder_path / "peak"
        command = [
            *(prefix or []),
            sys.executable,
            "-c",
            MEASURED,
            str(peak),
            "prlimit",
            f"--as={ADDRESS_SPACE}",
            "--",
            sys.executable,
            "-c",
            "from evoenv_cli import main; main()",
            *map(str, args),
        ]
        with (folder_path / "out").open("w+b") as out, (folder_path / "err").open("w+b") as err:
            proc = subprocess.Popen(
                command, stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True
            )
            try:
                returncode = proc.wait(SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                pytest.fail(f"evoenv {' '.join(map(str, args))} still ran after {SECONDS:.0f} s")
            out.seek(0)
            err.seek(0)
            return Run(
                returncode,
                out.read().decode("utf-8", "replace"),
                err.read().decode("utf-8", "replace"),
                int(peak.read_text()) * 1024,
            )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The command's environment: a private data folder, and a Redis URL nobody answers (a
    case that reaches Redis uses `redis_env`)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    return {
        **base,
        "EVOENV_DATA_DIR": str(tmp_path / "data"),
        "EVOENV_REDIS_URL": f"redis://127.0.0.1:{_closed_port()}/0",
    }


@pytest.fixture
def redis_env(env: dict[str, str], redis_server: Any) -> dict[str, str]:
    return {**env, "EVOENV_REDIS_URL": redis_server.url.rsplit("/", 1)[0] + "/5"}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[None]:
    """The L1 cases start the sandbox (`validate` opens it before judging)."""
    box = Sandbox(Settings().sandbox)
    try:
        box.start()
    except SandboxUnavailable as exc:
        missing(f"the sandbox cannot start: {exc}")
    box.close()
    yield


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    """One path of each kind, in a folder every user can enter."""
    folder = tmp_path / "paths"
    folder.mkdir()
    folder.chmod(0o755)
    big = folder / "big.py"
    with big.open("wb") as f:
        f.truncate(BIG_BYTES)
    latin1 = folder / "latin1.py"
    latin1.write_bytes(SOUND.read_bytes().replace(b"\n", "\n# café\n".encode("latin-1"), 1))
    fifo = folder / "fifo.py"
    os.mkfifo(fifo)
    directory = folder / "directory.py"
    directory.mkdir()
    locked = folder / "locked.py"
    locked.write_bytes(SOUND.read_bytes())
    locked.chmod(0)
    return {
        "big": big,
        "latin1": latin1,
        "fifo": fifo,
        "directory": directory,
        "zero": Path("/dev/zero"),
        "locked": locked,
    }


COMMANDS = {"validate": ["validate", "--json"], "sample": ["sample"], "pool add": ["pool", "add"]}


def _one_line(run: Run) -> str:
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    return lines[0]


def _bounded(run: Run) -> None:
    assert run.peak_bytes < PEAK_BYTES, f"peak memory {run.peak_bytes / 1024**2:.0f} MiB"


def _usage_error_here(args: list[str | Path], env: dict[str, str]) -> str:
    """The usage error of `evoenv ARGS` run in this process (the console script prints it as
    one line and exits 2, as the subprocess cases show)."""
    result = CliRunner().invoke(app, [str(arg) for arg in args], env=env)
    assert isinstance(result.exception, UsageError), (result.exit_code, result.output)
    assert result.output == ""
    return str(result.exception)


# ---------------------------------------------- in a subprocess: one line, memory, no privilege


@pytest.mark.parametrize("command", list(COMMANDS))
def test_dev_zero_is_one_line_and_exit_2_in_bounded_memory(
    command: str, env: dict[str, str]
) -> None:
    run = evoenv(*COMMANDS[command], "/dev/zero", env=env)
    _bounded(run)
    assert run.returncode == EXIT_USAGE, (run.stdout, run.stderr)
    assert run.stdout == ""
    assert _one_line(run) == "error: /dev/zero is a character device, not an environment file"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_file_without_read_permission_is_one_line_and_exit_2(
    command: str, paths: dict[str, Path], env: dict[str, str]
) -> None:
    locked, prefix = paths["locked"], without_read_override()
    assert cannot_open(locked, prefix), "the file is readable: the case would test nothing"
    run = evoenv(*COMMANDS[command], locked, env=env, prefix=prefix)
    assert run.returncode == EXIT_USAGE, (run.stdout, run.stderr)
    assert run.stdout == ""
    assert _one_line(run) == f"error: {locked}: permission denied"


def test_validate_judges_a_huge_and_a_non_utf8_file_at_l1_in_bounded_memory(
    paths: dict[str, Path], env: dict[str, str], sandbox: None
) -> None:
    run = evoenv("validate", "--json", paths["big"], paths["latin1"], env=env)
    _check_l1(run, paths)


@pytest.mark.integration
def test_pool_add_judges_a_huge_and_a_non_utf8_file_at_l1_in_bounded_memory(
    paths: dict[str, Path], redis_env: dict[str, str], sandbox: None
) -> None:
    run = evoenv("pool", "add", "--json", paths["big"], paths["latin1"], env=redis_env)
    _check_l1(run, paths)


def _check_l1(run: Run, paths: dict[str, Path]) -> None:
    _bounded(run)
    assert run.returncode == EXIT_REJECTED, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = [json.loads(text) for text in run.stdout.splitlines() if text.strip()]
    assert [line["file"] for line in lines] == [str(paths["big"]), str(paths["latin1"])]
    for line, says in zip(lines, [f"more than {LIMIT} bytes", "not UTF-8"], strict=True):
        assert (line["verdict"], line["failed_stage"]) == ("rejected", "L1"), line
        (stage,) = line["stages"]
        assert says in stage["detail"], stage


def test_sample_of_a_huge_file_is_one_line_and_exit_2_in_bounded_memory(
    paths: dict[str, Path], env: dict[str, str]
) -> None:
    run = evoenv("sample", paths["big"], env=env)
    _bounded(run)
    assert run.returncode == EXIT_USAGE, (run.stdout, run.stderr)
    line = _one_line(run)
    assert line.startswith(f"error: {paths['big']} is larger than {LIMIT} bytes"), line


# ------------------------------------------------------------------------------ in this process


@pytest.mark.timeout(30)  # a FIFO opened for reading waits for a writer that never comes
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("kind", "says"), [("fifo", "a FIFO"), ("directory", "a directory")])
def test_a_fifo_or_a_directory_is_a_usage_error_at_once(
    command: str, kind: str, says: str, paths: dict[str, Path], env: dict[str, str]
) -> None:
    message = _usage_error_here([*COMMANDS[command], paths[kind]], env)
    assert message == f"{paths[kind]} is {says}, not an environment file"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("command", ["validate", "pool add"])
def test_an_unreadable_path_is_a_usage_error_before_any_file_is_judged(
    command: str, paths: dict[str, Path], env: dict[str, str]
) -> None:
    message = _usage_error_here([*COMMANDS[command], SOUND, paths["fifo"]], env)
    assert "FIFO" in message
    assert not (Path(env["EVOENV_DATA_DIR"]) / "archive.db").exists()


def test_sample_of_a_non_utf8_file_is_a_usage_error(
    paths: dict[str, Path], env: dict[str, str]
) -> None:
    message = _usage_error_here(["sample", paths["latin1"]], env)
    assert message == f"{paths['latin1']} is not UTF-8 text (byte {_first_latin1_byte()})"


def _first_latin1_byte() -> int:
    data = SOUND.read_bytes().replace(b"\n", "\n# café\n".encode("latin-1"), 1)
    return data.index("é".encode("latin-1"))


def test_sample_still_reads_a_sound_file(env: dict[str, str], sandbox: None) -> None:
    result = CliRunner().invoke(app, ["sample", "--json", str(SOUND), "--seed", "3"], env=env)
    assert result.exit_code == 0, result.output
    record: dict[str, Any] = json.loads(result.output)
    assert record["env"] == "count_distinct_values" and record["seed"] == 3
