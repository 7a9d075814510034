"""Attack: a 32-bit syscall through `int 0x80` from hand-written machine code, where the i386
syscall numbers differ (2 is fork). Stopped by seccomp's architecture check: the process is
killed (SIGSYS).
"""

import ctypes
import mmap
import random

from shared.environment import Environment

# mov eax, 2 (i386 fork); int 0x80; ret
CODE = bytes([0xB8, 0x02, 0x00, 0x00, 0x00, 0xCD, 0x80, 0xC3])


class Legacy(Environment):
    name = "legacy_call"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        result = ctypes.CFUNCTYPE(ctypes.c_int)(address)()
        if result == 0:
            random._os._exit(0)
        if result > 0:
            return 1.0
        raise PermissionError(f"int 0x80 fork returned {result}")
