"""Confinement the fork server applies to itself (`confine_server`) and to each child
(`confine_child`), from inside the sandbox. Standard library only (ctypes for the syscalls):
bound into the sandbox beside `runner.py`; the host imports it too, for `landlock_abi`,
`seccomp_available` and the layout constants, which `launch.py` shares with it. What it does
not protect against: docs/SANDBOX.md#what-it-does-not-protect-against.
"""

from __future__ import annotations

import _thread
import ctypes
import os
import struct
import sys
from typing import Any

SCRATCH = "/scratch"
"""The only writable folder inside the sandbox (a tmpfs), and the server's working dir."""
ROOT = "/evoenv"
"""Where the project files are bound: ROOT/shared/... and ROOT/sandbox/{runner,confine}.py."""
SYSTEM_READ_ONLY = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
DEVICES_READ_ONLY = ("/dev/zero", "/dev/urandom", "/dev/random")
DEVICE_NULL = "/dev/null"
MIN_LANDLOCK_ABI = 6
"""Network rules need ABI 4, signal and abstract-socket scoping ABI 6."""
THREAD_STACK_BYTES = 1 << 20

# ------------------------------------------------------------------------------- constants

_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
_SCOPE_SIGNAL = 1 << 1

_PR_SET_DUMPABLE = 4
_PR_GET_SECCOMP = 21
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39
_SECCOMP_MODE_FILTER = 2

_EPERM = 1
_ENOSYS = 38
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000

_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0_LOW, _OFFSET_ARG0_HIGH = 0, 4, 16, 20

_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = (
    0x00000080  # NEWTIME
    | 0x00020000  # NEWNS
    | 0x02000000  # NEWCGROUP
    | 0x04000000  # NEWUTS
    | 0x08000000  # NEWIPC
    | 0x10000000  # NEWUSER
    | 0x20000000  # NEWPID
    | 0x40000000  # NEWNET
)
_X32_SYSCALL_BIT = 0x40000000

_AUDIT_ARCH_X86_64 = 0xC000003E
_X86_64_CLONE, _X86_64_CLONE3, _X86_64_PRLIMIT64 = 56, 435, 302
# fmt: off
_X86_64_DENIED = {
    # process creation and exec
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
    # networking (also unix sockets by path, which Landlock does not cover)
    "socket": 41, "socketpair": 53,
    # other processes
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    "process_madvise": 440, "process_mrelease": 448, "migrate_pages": 256, "move_pages": 279,
    "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144,
    "sched_setaffinity": 203, "sched_setattr": 314, "ioprio_set": 251,
    # namespaces, mounts, root
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
    "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    # state that outlives the child or is shared by every process of the uid
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65,
    "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
    "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
    "mq_notify": 244, "mq_getsetattr": 245,
    # kernel attack surface with no use in an environment
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "fanotify_init": 300,
    "personality": 135, "modify_ldt": 154, "uselib": 134,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "lookup_dcookie": 212,
    # administration (needs capabilities anyway)
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
    "syslog": 103, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
    "quotactl": 179, "quotactl_fd": 443, "vhangup": 153, "settimeofday": 164,
    "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "_sysctl": 156,
    "nfsservctl": 180,
}
_X86_64_OBSOLETE = {
    # removed from the kernel (ENOSYS either way): denied too, so their neighbours form runs
    "create_module": 174, "get_kernel_syms": 177, "query_module": 178,
}
# fmt: on


class ConfinementError(RuntimeError):
    """A confinement step failed; the process must not go on to run untrusted code."""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

_state: dict[str, Any] = {
    "landlock": False,
    "landlock_abi": 0,
    "seccomp": False,
    "child_ruleset": -1,
}
_filter: tuple[ctypes.Array[ctypes.c_char], _SockFprog] | None = None


# ------------------------------------------------------------------------------- public API


def confine_server() -> None:
    """Confine the fork server, once, before it serves anything; raise `ConfinementError` if
    unable. Irreversible, and the first of the two calls (`confine_child` is the second).

    Sets no_new_privs, makes the process undumpable (inherited by each fork), sets a 1 MiB
    default thread stack, and enters a Landlock domain in which the filesystem is read-only on
    the system library dirs, the Python install, the project files on `sys.path` and three
    harmless devices; writable only in `SCRATCH` and on /dev/null; TCP bind and connect are
    refused; signals and abstract unix sockets cannot leave the domain. It also builds, once,
    what every child will load: the ruleset of the children's Landlock domain (an open
    descriptor, inherited by each fork) and the seccomp filter.
    """
    global _filter
    if os.geteuid() == 0 or os.getuid() == 0:
        raise ConfinementError("refusing to confine as root: drop to an unprivileged uid first")
    abi = landlock_abi()
    if abi < MIN_LANDLOCK_ABI:
        raise ConfinementError(f"Landlock ABI {abi} is below the {MIN_LANDLOCK_ABI} needed")
    program = build_filter(os.uname().machine)
    _filter = (program, _SockFprog(len(program) // 8, ctypes.addressof(program)))
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(_prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    _thread.stack_size(THREAD_STACK_BYTES)
    _restrict_self(_server_ruleset(abi))
    children = _child_ruleset(abi)  # close-on-exec, like every Landlock ruleset descriptor
    _state.update(landlock=True, landlock_abi=abi, seccomp=True, child_ruleset=children)


def confine_child() -> None:
    """Confine a forked child further: nested Landlock domain, then the seccomp filter. The
    child's copy of the ruleset descriptor is closed; it keeps its other descriptors.

    Called in each child before it runs anything of the request, after closing every descriptor
    but its own pipes and `child_fds()`; irreversible. The nested domain allows no writes at
    all (save /dev/null) and scopes signals and abstract sockets to the child, so `kill(-1)` or
    `kill(getppid())` cannot reach the server. The seccomp filter makes process creation (fork,
    vfork, clone without CLONE_THREAD; clone3 gives ENOSYS so glibc falls back to clone for
    threads), exec, socket creation, ptrace, namespaces and mounts, keyrings, SysV and POSIX
    message-queue IPC, io_uring, bpf, perf, changing the limits or priority of another process
    and the privileged administration calls fail with EPERM, and kills the process on a foreign
    syscall ABI (i386, x32).
    """
    if not _state["landlock"] or _filter is None:
        raise ConfinementError("confine_child() needs confine_server() first")
    _restrict_self(_state["child_ruleset"])
    _check(
        _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(_filter[1]), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )


def child_fds() -> tuple[int, ...]:
    """The descriptors a forked child keeps open for `confine_child()` (the ruleset of its
    Landlock domain) when it closes the others."""
    return (_state["child_ruleset"],) if _state["landlock"] else ()


def status() -> dict[str, Any]:
    """What is applied: the server's Landlock domain and whether children get the filter. The
    server sends it in its greeting."""
    no_new_privs = _prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1
    isolated = bool(_state["landlock"] and _state["seccomp"] and no_new_privs and os.getuid())
    return {
        "isolated": isolated,
        "landlock_abi": _state["landlock_abi"],
        "landlock": _state["landlock"],
        "network_rules": _state["landlock"],
        "scoped": _state["landlock"],
        "seccomp": _state["seccomp"],
        "no_new_privs": no_new_privs,
        "uid": os.getuid(),
        "gid": os.getgid(),
        "arch": os.uname().machine,
    }


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is missing or disabled."""
    version = _syscall(
        _SYS_LANDLOCK_CREATE_RULESET,
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(version), 0)


def seccomp_available() -> bool:
    """True when the kernel has seccomp filters with the errno and kill-process actions."""
    if _prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        return False
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as file:
            actions = file.read().split()
    except OSError:
        return False
    return {"errno", "kill_process", "allow"} <= set(actions)


# ------------------------------------------------------------------------------- Landlock


def _fs_rights(abi: int) -> int:
    rights = _FS_ABI1
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


def _server_ruleset(abi: int) -> int:
    handled = _fs_rights(abi)
    truncate = _FS_TRUNCATE if abi >= 3 else 0
    ruleset = _create_ruleset(
        abi, handled, _NET_BIND_TCP | _NET_CONNECT_TCP, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    )
    try:
        for path in _readable_paths():
            _add_path_rule(ruleset, path, _FS_READ_FILE | _FS_READ_DIR)
        for path in DEVICES_READ_ONLY:
            _add_path_rule(ruleset, path, _FS_READ_FILE)
        _add_path_rule(ruleset, DEVICE_NULL, _FS_READ_FILE | _FS_WRITE_FILE | truncate)
        if os.path.isdir(SCRATCH):
            _add_path_rule(ruleset, SCRATCH, handled & ~(_FS_EXECUTE | _FS_IOCTL_DEV))
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def _child_ruleset(abi: int) -> int:
    """Handles only the write rights (reads stay as the server's domain allows) and scoping."""
    truncate = _FS_TRUNCATE if abi >= 3 else 0
    writes = _fs_rights(abi) & ~(_FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR | _FS_IOCTL_DEV)
    ruleset = _create_ruleset(abi, writes, 0, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    try:
        _add_path_rule(ruleset, DEVICE_NULL, _FS_WRITE_FILE | truncate)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def _readable_paths() -> list[str]:
    """System library dirs, the Python install and every folder on `sys.path` that exists."""
    candidates = [*SYSTEM_READ_ONLY, sys.base_prefix, sys.base_exec_prefix, *sys.path]
    seen: list[str] = []
    for path in candidates:
        if path and os.path.exists(path) and path not in seen:
            seen.append(path)
    return seen


def _create_ruleset(abi: int, fs: int, net: int, scoped: int) -> int:
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    attr = ctypes.create_string_buffer(struct.pack("=QQQ", fs, net, scoped)[:size], size)
    fd = _syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    return int(_check(fd, "landlock_create_ruleset"))


def _add_path_rule(ruleset: int, path: str, access: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not os.path.isdir(path):  # a rule on a file may carry file rights only
            access &= _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
        attr = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        _check(
            _syscall(
                _SYS_LANDLOCK_ADD_RULE,
                ctypes.c_int(ruleset),
                ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                attr,
                ctypes.c_uint32(0),
            ),
            f"landlock_add_rule({path})",
        )
    finally:
        os.close(fd)


def _restrict_self(ruleset: int) -> None:
    try:
        _check(
            _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)),
            "landlock_restrict_self",
        )
    finally:
        os.close(ruleset)


# ------------------------------------------------------------------------------- seccomp

_Instruction = tuple[int, int | str, int | str, int]


def build_filter(machine: str) -> ctypes.Array[ctypes.c_char]:
    """The children's seccomp BPF program for `machine`, assembled into a ctypes buffer."""
    if machine not in ("x86_64", "amd64"):
        raise ConfinementError(f"the seccomp filter supports x86_64 only, not {machine}")
    code = _assemble(_x86_64_program())
    return ctypes.create_string_buffer(code, len(code))


def _x86_64_program() -> list[_Instruction | str]:
    return [
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_NR),
        (_BPF_JGE_K, "kill", 0, _X32_SYSCALL_BIT),
        (_BPF_JEQ_K, "clone", 0, _X86_64_CLONE),
        (_BPF_JEQ_K, "enosys", 0, _X86_64_CLONE3),
        (_BPF_JEQ_K, "prlimit", 0, _X86_64_PRLIMIT64),
        *_deny_ranges(sorted({**_X86_64_DENIED, **_X86_64_OBSOLETE}.values())),
        "clone",  # threads only: CLONE_THREAD set, no namespace flag
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARG0_LOW),
        (_BPF_JSET_K, 0, "deny", _CLONE_THREAD),
        (_BPF_JSET_K, "deny", "allow", _CLONE_NAMESPACES),
        "prlimit",  # its own limits only: pid 0
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARG0_LOW),
        (_BPF_JEQ_K, 0, "deny", 0),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARG0_HIGH),
        (_BPF_JEQ_K, "allow", "deny", 0),
        "allow",
        (_BPF_RET_K, 0, 0, _RET_ALLOW),
        "deny",
        (_BPF_RET_K, 0, 0, _RET_ERRNO | _EPERM),
        "enosys",
        (_BPF_RET_K, 0, 0, _RET_ERRNO | _ENOSYS),
        "kill",
        (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),
    ]


def _deny_ranges(numbers: list[int]) -> list[_Instruction | str]:
    """Deny `numbers` (sorted), then allow: a run of consecutive numbers takes two tests.

    Loading a filter costs the child a few microseconds per instruction (the kernel checks
    and compiles it), so runs are tested as ranges, lowest first: below a run's start, nothing
    later can match, so the call is allowed."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    program: list[_Instruction | str] = []
    for low, high in runs:
        if low == high:
            program.append((_BPF_JEQ_K, "deny", 0, low))
        else:
            program.append((_BPF_JGE_K, 0, "allow", low))
            program.append((_BPF_JGE_K, 0, "deny", high + 1))
    program.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    return program


def _assemble(program: list[_Instruction | str]) -> bytes:
    """Encode `struct sock_filter`s; a string is a label, a string jump target one ahead."""
    labels: dict[str, int] = {}
    instructions: list[_Instruction] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(instructions)
        else:
            instructions.append(item)
    out = bytearray()
    for index, (op, true, false, k) in enumerate(instructions):
        jt, jf = _jump(true, index, labels), _jump(false, index, labels)
        out += struct.pack("=HBBI", op, jt, jf, k)
    return bytes(out)


def _jump(target: int | str, index: int, labels: dict[str, int]) -> int:
    offset = target if isinstance(target, int) else labels[target] - index - 1
    if not 0 <= offset <= 255:
        raise ConfinementError(f"seccomp jump out of range at instruction {index}")
    return offset


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise ConfinementError(f"{what} failed: {os.strerror(errno)} (errno {errno})")
    return result
