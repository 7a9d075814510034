"""Attack: write files outside the scratch dir: /tmp, the repository, the bound project files.

Stopped by bubblewrap (read-only binds; the host's /tmp and repository are not there), Landlock
(children may write nowhere but /dev/null) and RLIMIT_FSIZE 0.
"""

import random

from shared.environment import Environment

MARKERS = ["/tmp/evoenv-hostile-marker", "/work/main/evoenv-hostile-marker"]
PROTECTED = ["/evoenv/shared/environment.py", "/evoenv/sandbox/runner.py"]


class Scribble(Environment):
    name = "scribble"
    description = "Return a digit."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"d": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["d"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['d']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        os = [c for c in ().__class__.__base__.__subclasses__()
              if c.__name__ == "_wrap_close"][0].__init__.__globals__
        errors = []
        for path in MARKERS + ["/scratch/marker", "/dev/shm/marker"]:
            try:
                os["makedirs"](os["path"].dirname(path), exist_ok=True)
                with open(path, "w") as file:
                    file.write("pwned")
                errors.append(f"{path}: written")
            except OSError as exc:
                errors.append(f"{path}: {type(exc).__name__}")
        for path in PROTECTED:
            try:
                with open(path, "a") as file:
                    file.write("\nraise SystemExit('pwned')\n")
                errors.append(f"{path}: written")
            except OSError as exc:
                errors.append(f"{path}: {type(exc).__name__}")
        if any("written" in error for error in errors):
            return 1.0
        raise PermissionError("; ".join(errors))
