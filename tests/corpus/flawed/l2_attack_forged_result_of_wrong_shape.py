# expect: L2
# why: an attack on the validator, not the sandbox: the sampler writes a line of its own to its
# result pipe that begins as op 0's result does but whose value is null, not an instance. The
# host must fail that op with a reason (it used to crash on the value), and report the file.
# detail: the instance value is null
"""Parity of a number, whose sampler forges its own result line (an equality oracle)."""

import random
import re
import typing

from shared.environment import Environment

FORGED = b'{"i":0,"ok":true,"value":null}\n'
INTEGER = re.compile(r"\s*([0-9]{1,6})\s*")


def forge() -> None:
    """Write the forged line on every pipe this process has (its result pipe among them)."""
    system = typing.sys.modules["os"]
    for fd in range(3, 64):
        try:
            if system.fstat(fd).st_mode & 0o170000 == 0o010000:  # a FIFO
                system.write(fd, FORGED)
        except OSError:
            pass


class ForgedParity(Environment):
    name = "forged_parity"
    description = "Say whether the sum of some numbers is even or odd."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        forge()
        return {"numbers": [rng.randint(1, 99) for _ in range(3 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return sum(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"What is the sum of {numbers}? Give a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
