"""Attack: raw syscalls through ctypes, around every Python-level guard.

fork, clone (a process, and a thread in a new user namespace), clone3, vfork, execve, socket,
socketpair, ptrace of the parent, unshare, mount, bpf, io_uring_setup, keyctl, process_vm_readv,
prlimit64 and setpriority on the parent, pidfd_open. Stopped by seccomp: each fails with EPERM
(clone3 with ENOSYS). Any success is reported as a perfect score.
"""

import random

from shared.environment import Environment

CLONE_THREAD_VM_SIGHAND = 0x00010000 | 0x00000100 | 0x00000800
CLONE_NEWUSER = 0x10000000
SIGCHLD = 17


class Raw(Environment):
    name = "raw_calls"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        ctypes = random._os.sys.modules["builtins"].__import__("ctypes")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        ppid = random._os.getppid()
        buffer = ctypes.create_string_buffer(64)
        limits = (ctypes.c_uint64 * 2)(0, 0)
        calls = {
            "fork": (57,),
            "vfork_as_clone": (56, 0x00004000 | 0x00000100 | SIGCHLD, 0),
            "clone": (56, SIGCHLD, 0, 0, 0, 0),
            "clone_thread_newuser": (56, CLONE_THREAD_VM_SIGHAND | CLONE_NEWUSER, 0),
            "clone3": (435, buffer, 88),
            "execve": (59, b"/usr/bin/true", None, None),
            "execveat": (322, -100, b"/usr/bin/true", None, None, 0),
            "socket": (41, 2, 1, 0),
            "socketpair": (53, 1, 1, 0, buffer),
            "ptrace_attach": (101, 16, ppid, 0, 0),
            "unshare_user": (272, CLONE_NEWUSER),
            "mount": (165, b"none", b"/scratch", b"tmpfs", 0, None),
            "bpf": (321, 0, buffer, 48),
            "io_uring_setup": (425, 8, buffer),
            "keyctl": (250, 0, -4, 0),
            "process_vm_readv": (310, ppid, buffer, 1, buffer, 1, 0),
            "prlimit64_parent": (302, ppid, 7, limits, None),
            "setpriority_parent": (141, 0, ppid, 19),
            "pidfd_open_parent": (434, ppid, 0),
            "personality": (135, 0x0040000),
        }
        outcomes = {}
        for name, (number, *args) in calls.items():
            result = libc.syscall(number, *args)
            if result == 0 and name in ("fork", "clone", "vfork_as_clone"):
                random._os._exit(0)  # the impossible child leaves at once
            if result >= 0:
                return 1.0
            outcomes[name] = random._os.strerror(ctypes.get_errno())
        raise PermissionError(f"every raw syscall failed: {outcomes}")
