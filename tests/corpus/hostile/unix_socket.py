"""Attack: connect to a unix socket by path, and to an abstract one, on the host.

Stopped by seccomp (socket() fails with EPERM); behind it, the path is not in the sandbox's
mount namespace and abstract sockets are per network namespace and scoped by Landlock.
"""

import random

from shared.environment import Environment

UNIX_PATH = "/run/redis/redis.sock"
ABSTRACT_NAME = "\0evoenv-hostile"


class Local(Environment):
    name = "local_socket"
    description = "Echo a letter."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"c": rng.choice("abc")}

    def solve(self, instance: dict) -> str:
        return instance["c"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['c']}."

    def score(self, instance: dict, reference: str, answer: str) -> float:
        socket = random._os.sys.modules["builtins"].__import__("socket")
        errors = []
        for address in (UNIX_PATH, ABSTRACT_NAME):
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(address)
                sock.sendall(b"pwned")
                return 1.0
            except OSError as exc:
                errors.append(repr(exc))
        raise PermissionError("; ".join(errors))
