"""Attack: a syscall through the x32 ABI (number | 0x40000000), which a filter that checks only
the architecture field would let through. Stopped by seccomp: the process is killed (SIGSYS).
"""

import ctypes
import random

from shared.environment import Environment

X32 = 0x40000000
SYS_SOCKET = 41


class Abi(Environment):
    name = "abi_switch"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        if libc.syscall(X32 | SYS_SOCKET, 2, 1, 0) >= 0:
            return 1.0
        raise PermissionError(f"x32 socket failed: errno {ctypes.get_errno()}")
