"""Attack: send a UDP datagram to a host listener (Landlock has no UDP rules).

Stopped by seccomp (socket() fails with EPERM) and the private network namespace.
"""

import random

from shared.environment import Environment

UDP_PORT = 5353


class Datagram(Environment):
    name = "datagram"
    description = "Echo a byte."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"b": rng.randint(0, 255)}

    def solve(self, instance: dict) -> int:
        return instance["b"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['b']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        socket = __import__("socket")
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.sendto(b"pwned", ("127.0.0.1", UDP_PORT))
        return 1.0
