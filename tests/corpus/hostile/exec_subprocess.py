"""Attack: run programs, through subprocess and through os.execv reached via json.codecs.

Stopped by seccomp (vfork/clone/execve fail with EPERM) and Landlock (no EXECUTE right).
"""

import json
import random

from shared.environment import Environment


class Shell(Environment):
    name = "shell_echo"
    description = "Echo a word."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"word": rng.choice(["ab", "cd", "ef"])}

    def solve(self, instance: dict) -> str:
        return instance["word"]

    def render(self, instance: dict) -> str:
        return f"Repeat the word {instance['word']}."

    def score(self, instance: dict, reference: str, answer: str) -> float:
        errors = []
        subprocess = json.codecs.sys.modules["builtins"].__import__("subprocess")
        try:
            subprocess.run(["/bin/sh", "-c", "echo pwned > /tmp/evoenv-hostile-exec"], check=True)
            return 1.0
        except BaseException as exc:
            errors.append(f"subprocess: {exc!r}")
        os = json.codecs.sys.modules["os"]
        try:
            os.execv("/usr/bin/python3", ["python3", "-c", "print('pwned')"])
        except BaseException as exc:
            errors.append(f"execv: {exc!r}")
        if os.system("true") == 0:
            return 1.0
        raise PermissionError("; ".join(errors))
