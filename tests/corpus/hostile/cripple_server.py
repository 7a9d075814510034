"""Attack: starve the fork server for later requests: lower its rlimits (no file descriptors,
no memory), raise its nice value, pin it to one CPU, stop it through /proc.

Stopped by seccomp (prlimit64 on another pid, setpriority and sched_setaffinity fail with
EPERM) and Landlock (/proc is not readable or writable).
"""

import os
import random
import resource

from shared.environment import Environment


class Starve(Environment):
    name = "starve"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        server = os.getppid()
        attempts = {
            "nofile": lambda: resource.prlimit(server, resource.RLIMIT_NOFILE, (3, 3)),
            "as": lambda: resource.prlimit(server, resource.RLIMIT_AS, (1 << 20, 1 << 20)),
            "nice": lambda: os.setpriority(os.PRIO_PROCESS, server, 19),
            "nice_user": lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19),
            "affinity": lambda: os.sched_setaffinity(server, {0}),
            "proc_mem": lambda: open(f"/proc/{server}/mem", "r+b"),
            "oom_score": lambda: open(f"/proc/{server}/oom_score_adj", "w").write("1000"),
        }
        errors = []
        for what, attempt in attempts.items():
            try:
                attempt()
                errors.append(f"{what}: done")
            except OSError as exc:
                errors.append(f"{what}: {type(exc).__name__}")
        if any("done" in error for error in errors):
            return 1.0
        raise PermissionError("; ".join(errors))
