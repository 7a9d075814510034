"""A sum of powers modulo m (an equality oracle: number theory, modular exponentiation)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,30})\s*\.?\s*")


class ModularPowerSum(Environment):
    name = "modular_power_sum"
    description = "The remainder of a sum of integer powers divided by a modulus."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        count = 2 + (difficulty - 1) // 3  # 2 terms at difficulty 1, 5 at difficulty 10
        bases = [rng.randint(2, 2 + 2 * difficulty**2) for _ in range(count)]  # up to 202
        exponents = [rng.randint(1, 3**difficulty) for _ in range(count)]  # up to 59049
        modulus = rng.randint(5 + difficulty, 10 ** (1 + difficulty // 2))  # up to 10**6
        return {"bases": bases, "exponents": exponents, "modulus": modulus}

    def solve(self, instance: dict) -> int:
        modulus = instance["modulus"]
        total = sum(
            pow(base, exponent, modulus)
            for base, exponent in zip(instance["bases"], instance["exponents"], strict=True)
        )
        return total % modulus

    def render(self, instance: dict) -> str:
        terms = " + ".join(
            f"{base}^{exponent}"
            for base, exponent in zip(instance["bases"], instance["exponents"], strict=True)
        )
        modulus = instance["modulus"]
        return (
            f"Compute ({terms}) mod {modulus}, where a^b means a raised to the power b and "
            f"x mod {modulus} is the remainder of x divided by {modulus}.\n"
            f"Give the answer as a single integer between 0 and {modulus - 1}."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if _parse_int(answer) == reference else 0.0


def _parse_int(text: str) -> int | None:
    """The integer that the whole text spells (an optional trailing period allowed), else None."""
    match = INTEGER.fullmatch(text)
    return int(match.group(1)) if match else None
