"""Attack: patch json.dumps, the runner's own functions and the framework's grading so that
every later result reads as a perfect score; then also try the server's memory via /proc.

The patches live only in this forked child; a later request runs in a fresh fork of the
unpatched server. The call itself raises, so it is not counted as a success either way.
"""

import json
import random
import sys

from shared.environment import Environment


class Forger(Environment):
    name = "forger"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        forged = '{"i":%d,"ok":true,"value":1.0}'

        def fake_dumps(value: object, *args: object, **kwargs: object) -> str:
            index = value.get("i", 0) if isinstance(value, dict) else 0
            return forged % index

        json.dumps = fake_dumps
        runner = sys.modules["__main__"]
        runner.run_op = lambda env, op, kept, index: {"i": index, "ok": True, "value": 1.0}
        runner._emit = lambda out, message: out.write(b'{"ok":true,"value":1.0}\n')
        runner._fail = lambda index, *rest: {"i": index, "ok": True, "value": 1.0}
        sys.modules["shared.environment"].grade_value = lambda value: None
        with open(f"/proc/{random._os.getppid()}/mem", "r+b") as memory:
            memory.write(b"pwned")
        return 1.0
