"""How the fork server is started: confined (bubblewrap, Landlock, seccomp) or, by explicit
opt-in only, unconfined. The layers: docs/SANDBOX.md#layers.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import structlog

from evoenv_worker.sandbox import confine
from shared.config import SandboxSettings
from shared.errors import SandboxUnavailable

RUNNER = Path(__file__).with_name("runner.py")
CONFINE = Path(__file__).with_name("confine.py")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the `shared` package, which environment code imports."""
SHARED_FILES = ("shared/__init__.py", "shared/environment.py")
"""The only project files bound into the sandbox, besides the runner and `confine.py`."""
SCRATCH_BYTES = 16 << 20
"""Size of the sandbox's tmpfs scratch dir (only the server can write there)."""
MALLOC_ARENA_MAX = "2"
"""Few malloc arenas, so threads fit in the address-space limit."""
PYTHON_FLAGS = ("-s", "-S", "-B", "-P")
"""No user site, no site module, no bytecode writes, no script dir on sys.path. Not `-I`: it
implies `-E`, which ignores PYTHONHASHSEED; the environment is ours entirely anyway."""
_PROBE_SECONDS = 20.0

log = structlog.get_logger(__name__)

_verified_uids: set[int] = set()
"""Uids for which `missing_isolation` found nothing missing in this process."""


def server_command(
    settings: SandboxSettings, *, hash_seed: int
) -> tuple[list[str], dict[str, str], bool]:
    """The fork server's argv, its environment, and whether it is isolated."""
    problems = missing_isolation(settings.uid)
    if not problems:
        return confined_command(settings, hash_seed=hash_seed), {}, True
    if not settings.allow_unconfined:
        raise SandboxUnavailable(
            "cannot isolate environment code: "
            + "; ".join(problems)
            + ". Install what is missing, or set EVOENV_SANDBOX__ALLOW_UNCONFINED=1 to run "
            "WITHOUT isolation (trusted code only)."
        )
    log.warning("sandbox_unconfined", problems=problems, detail="code runs WITHOUT isolation")
    env = {"PYTHONHASHSEED": str(hash_seed), "MALLOC_ARENA_MAX": MALLOC_ARENA_MAX}
    argv = [sys.executable, *PYTHON_FLAGS, str(RUNNER), str(PROJECT_ROOT)]
    return argv, env, False


def confined_command(settings: SandboxSettings, *, hash_seed: int) -> list[str]:
    """bwrap + setpriv + the interpreter running the runner with `--confine`:

        bwrap --unshare-{net,pid,ipc,uts,cgroup} --die-with-parent --new-session <binds> --
            setpriv --reuid UID --regid UID --clear-groups --no-new-privs ... --
            python -s -S -B -P /evoenv/sandbox/runner.py /evoenv --confine

    bwrap itself is started with an empty environment (its `--clearenv` still leaks the host's
    through /proc/1/environ). Inside there is only: /usr (and the /lib* links), the Python
    install at its own path (its site-packages hidden), `runner.py` and `confine.py`, the
    project's `shared/__init__.py` and `shared/environment.py`, a new /proc, a minimal /dev and
    a small tmpfs at /scratch, the only writable place. Then `confine.py` adds Landlock and
    seccomp. When the worker is not root, bwrap uses an unprivileged user namespace instead of
    `setpriv` (`--unshare-user --disable-userns`); the code then runs as the worker's own uid.
    """
    python = interpreter()
    runner = f"{confine.ROOT}/sandbox/runner.py"
    return [
        *_bwrap_prefix(hash_seed),
        *_project_binds(),
        "--",
        *_drop_privileges(settings.uid),
        str(python),
        *PYTHON_FLAGS,
        *(runner, confine.ROOT, "--confine"),
    ]


def missing_isolation(uid: int = 65534) -> list[str]:
    """What this machine lacks for confined mode, each with how to fix it (empty: nothing).

    Checks the tools and the kernel, then starts one real sandbox as `uid` with a trivial
    program. A success is remembered for the life of the process; a failure is not.
    """
    if uid in _verified_uids:
        return []
    problems = _missing_tools() or _probe(uid)
    if not problems:
        _verified_uids.add(uid)
    return problems


def _missing_tools() -> list[str]:
    if sys.platform != "linux":
        return [f"confined mode needs Linux (this is {sys.platform})"]
    problems = []
    if platform.machine() not in ("x86_64", "amd64"):
        problems.append(f"the seccomp filter supports x86_64 only, not {platform.machine()}")
    if shutil.which("bwrap") is None:
        problems.append("bubblewrap is missing: apt-get install bubblewrap")
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        problems.append("setpriv is missing: apt-get install util-linux")
    abi = confine.landlock_abi()
    if abi < confine.MIN_LANDLOCK_ABI:
        problems.append(
            f"Landlock ABI {abi} is below {confine.MIN_LANDLOCK_ABI}: use Linux 6.12 or newer "
            "with Landlock enabled (add landlock to the lsm= kernel parameter)"
        )
    if not confine.seccomp_available():
        problems.append("seccomp filters are unavailable: use a kernel built with CONFIG_SECCOMP")
    return problems


def _probe(uid: int) -> list[str]:
    """Start the real sandbox once: namespaces, binds, uid drop, then both confinement steps."""
    program = (
        f"import sys; sys.path.insert(0, '{confine.ROOT}/sandbox'); import confine; "
        "confine.confine_server(); confine.confine_child()"
    )
    argv = [*_bwrap_prefix(0), *_project_binds(), "--", *_drop_privileges(uid)]
    argv += [str(interpreter()), *PYTHON_FLAGS, "-c", program]
    try:
        result = subprocess.run(argv, env={}, capture_output=True, timeout=_PROBE_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"bubblewrap could not start a sandbox: {exc}"]
    if result.returncode == 0:
        return []
    detail = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    hint = ""
    if os.geteuid() != 0:
        hint = (
            "; run as root, or allow unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1; on Ubuntu also "
            "kernel.apparmor_restrict_unprivileged_userns=0)"
        )
    return [f"a trial sandbox failed to start: {detail[0]}{hint}"]


def interpreter() -> Path:
    """The real (non-venv) interpreter: the sandbox gets the base install, not the venv."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return Path(os.path.realpath(base))


def _bwrap_prefix(hash_seed: int) -> list[str]:
    bwrap = shutil.which("bwrap") or "bwrap"
    argv = [
        bwrap,
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
    ]
    if os.geteuid() != 0:
        argv += ["--unshare-user", "--disable-userns"]
    argv += ["--die-with-parent", "--new-session"]
    argv += _system_binds()
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(SCRATCH_BYTES), "--tmpfs", confine.SCRATCH]
    argv += ["--chdir", confine.SCRATCH]
    for name, value in _sandbox_env(hash_seed).items():
        argv += ["--setenv", name, value]
    return argv


def _system_binds() -> list[str]:
    """/usr, the /lib* and /bin links as on the host, and the Python install at its own path."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for path in confine.SYSTEM_READ_ONLY[1:]:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    prefix = Path(os.path.realpath(sys.base_prefix))
    if not prefix.is_relative_to("/usr"):
        argv += ["--ro-bind", str(prefix), str(prefix)]
        purelib = Path(sysconfig.get_path("purelib", vars={"base": str(prefix)}))
        if purelib.is_dir() and purelib.is_relative_to(prefix):
            argv += ["--tmpfs", str(purelib)]  # the install's own site-packages: not needed
    return argv


def _project_binds() -> list[str]:
    argv = []
    for folder in (confine.ROOT, f"{confine.ROOT}/sandbox", f"{confine.ROOT}/shared"):
        argv += ["--perms", "0755", "--dir", folder]  # made for file binds, they would be 0700
    argv += [
        "--ro-bind",
        str(RUNNER),
        f"{confine.ROOT}/sandbox/runner.py",
        "--ro-bind",
        str(CONFINE),
        f"{confine.ROOT}/sandbox/confine.py",
    ]
    for name in SHARED_FILES:
        argv += ["--ro-bind", str(PROJECT_ROOT / name), f"{confine.ROOT}/{name}"]
    return argv


def _drop_privileges(uid: int) -> list[str]:
    """setpriv to `uid` when the worker is root; nothing otherwise (bwrap already dropped)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv") or "setpriv"
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]


def _sandbox_env(hash_seed: int) -> dict[str, str]:
    return {
        "PYTHONHASHSEED": str(hash_seed),
        "MALLOC_ARENA_MAX": MALLOC_ARENA_MAX,
        "LC_ALL": "C.UTF-8",
        "HOME": confine.SCRATCH,
        "TMPDIR": confine.SCRATCH,
    }
