"""L1 refuses what reaches beyond a routine's arguments: frame, code and traceback attributes,
and private attributes other than the object's own, however written; an object's own private
attributes and methods pass (docs/CONTRACT.md#allowed-imports-and-forbidden-constructs)."""

from __future__ import annotations

import pytest

from shared.static import check_static

SOURCE = """
import random

from shared.environment import Environment


class Reach(Environment):
    name = "reach"
    _TABLE = (1, 2, 3)

    def __init__(self):
        self._memo = {}

    @classmethod
    def _first(cls):
        return cls._TABLE[0]

    def sample(self, rng, difficulty):
        return {"n": rng.randint(1, 9) + self._first()}

    def solve(self, instance):
        return self.__doubled(instance["n"])

    def __doubled(self, n):
        return sorted([n, 2 * n], key=lambda value: self._memo.get(value, value))[-1]

    def render(self, instance):
        return f"Double {instance['n']}."

    def score(self, instance, reference, answer):
        LINE
        return 1.0 if answer.strip() == str(reference) else 0.0
"""


def judged(line: str) -> tuple[bool, str]:
    indented = line.replace("\n", "\n        ")
    result = check_static(SOURCE.replace("LINE", indented).encode(), 64 * 1024)
    return result.ok, result.detail


def test_the_objects_own_private_attributes_pass() -> None:
    assert judged("self._memo[reference] = reference") == (True, "class Reach (reach, equality)")


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        ("frame = random._os.sys._getframe(1)", "private attribute '_getframe'"),
        ("state = random._inst.getstate()", "private attribute '_inst'"),
        ("random.Random()._randbelow(3)", "private attribute '_randbelow'"),
        ("self._undefined", "private attribute '_undefined'"),
        ("other = self\nother._memo", "private attribute '_memo'"),
        ("self = random\nself._memo", "private attribute '_memo'"),
        ("(lambda self: self._memo)(random)", "private attribute '_memo'"),
        ("[self._memo for self in (random,)]", "private attribute '_memo'"),
        ("from random import _inst", "private attribute '_inst'"),
        ("match answer:\n    case object(_os=module):\n        pass", "private attribute '_os'"),
        ("generator = (n for n in ())\ngenerator.gi_frame", "attribute 'gi_frame'"),
        ("caller = frame.f_back", "attribute 'f_back'"),
        ("names = frame.f_locals", "attribute 'f_locals'"),
        ("match answer:\n    case object(f_globals=found):\n        pass", "attribute 'f_globals'"),
        ("self.score.co_consts", "attribute 'co_consts'"),
        ("error.tb_next", "attribute 'tb_next'"),
        ("coroutine.cr_frame", "attribute 'cr_frame'"),
        ("random.settrace", "attribute 'settrace'"),
        ("random.exc_info()", "attribute 'exc_info'"),
    ],
)
def test_what_reaches_beyond_the_arguments_is_refused(line: str, refused: str) -> None:
    ok, detail = judged(line)
    assert not ok
    assert refused in detail, detail
