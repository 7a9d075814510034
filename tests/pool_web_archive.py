"""An archive for the tests of `evoenv pool serve` (importable as `pool_web_archive`): a seed, an
admitted, a retired and a rejected environment, a candidate judged at L1 with no environment
row, and a hostile (rejected) environment whose every model-written field holds markup and script."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.db import Archive
from shared.env_stats import CalibrationFigures, DifficultySearch, EnvStats, Retirement
from shared.messages import StageReport, Trigger, ValidationReport

SEED_FILE = Path(__file__).resolve().parents[1] / "seeds" / "sort_words.py"

ADMITTED = '''"""Count the vowels in a made-up word."""

import random

from shared.environment import Environment


class CountVowels(Environment):
    name = "count_vowels"
    description = "Count the vowels in a made-up word."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 5

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        letters = "abcdefghijklmnopqrstuvwxyz"
        return {"word": "".join(rng.choice(letters) for _ in range(4 * difficulty))}

    def solve(self, instance: dict) -> int:
        return sum(ch in "aeiou" for ch in instance["word"])

    def render(self, instance: dict) -> str:
        return f"How many vowels are in {instance['word']}? Answer with a number."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if answer.strip() == str(reference) else 0.0
'''
RETIRED = ADMITTED.replace("count_vowels", "count_vowels_v0").replace("CountVowels", "Old")
REJECTED = ADMITTED.replace("count_vowels", "broken_grid").replace("CountVowels", "Grid")

SCRIPT = "<script>alert(1)</script>"
BREAKOUT = '"><img src=x onerror="document.title=\'pwned\';window.pwned=1">'
PWN = "<script>window.pwned=1;document.title='pwned'</script>"
HOSTILE_NAME = SCRIPT
RUN = "run-a"
"""The run whose samples the archive keeps: steps 1 and 2."""
HOSTILE_STRINGS = (SCRIPT, BREAKOUT, PWN, "<script", "<img", "<iframe")
"""What must never reach a page unescaped (each also appears escaped, as text)."""

HOSTILE = f'''"""{PWN}"""

import random

from shared.environment import Environment

BREAKOUT = {BREAKOUT!r}
PWN = {PWN!r}


class Hostile(Environment):
    name = {SCRIPT!r}
    description = BREAKOUT + " <iframe src=javascript:alert(1)></iframe>"
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 3

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {{"n": rng.randint(1, 9) * difficulty}}

    def solve(self, instance: dict) -> str:
        return "</pre>" + PWN + str(instance["n"])

    def render(self, instance: dict) -> str:
        return PWN + BREAKOUT + " what is " + str(instance["n"]) + "?"

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if answer == reference else 0.0
'''


@dataclass(frozen=True)
class Built:
    archive: Archive
    seed: str
    admitted: str
    retired: str
    rejected: str
    hostile: str
    l1_job: str
    """The job id of the candidate stopped at L1 (it has a report, no environment row)."""


def stage(name: str, ok: bool, detail: str, trigger: Trigger | None = None) -> StageReport:
    return StageReport(stage=name, ok=ok, seconds=0.25, detail=detail, trigger=trigger)  # type: ignore[arg-type]


def build_archive(url: str) -> Built:
    archive = Archive(url)
    seed = archive.add_environment(
        "sort_words", SEED_FILE.read_text(), status="seed", origin="seed"
    )
    admitted = archive.add_environment("count_vowels", ADMITTED, status="admitted", origin="user")
    archive.update_environment(
        admitted,
        stats=EnvStats(
            calibration=CalibrationFigures(pass_rate=0.375, difficulty=3, passes=3, instances=8),
            calibration_difficulty=3,
            serving_difficulty=2,
            uses=40,
            gradings=320,
            env_errors=8,
            pass_rate_history=[
                DifficultySearch(at="2025-01-01T00:00:00Z", level=3, curve={"3": 0.2, "2": 0.5}),
                DifficultySearch(at="2025-01-02T00:00:00Z", level=2, curve={"2": 0.45}),
                DifficultySearch(at="2025-01-03T00:00:00Z", level=2, curve={"2": 0.3}),
            ],
        ),
    )
    retired = archive.add_environment(
        "count_vowels_v0", RETIRED, status="retired", origin="generated", parents=[seed]
    )
    archive.update_environment(
        retired,
        stats=EnvStats(
            admitted_at=1.0,
            funnel="admitted",
            retired=Retirement(reason="rotation", at="2025-01-04T00:00:00Z", epochs=50),
        ),
    )
    rejected = archive.add_environment(
        "broken_grid", REJECTED, status="rejected", origin="generated", parents=[admitted]
    )
    archive.update_environment(rejected, stats=EnvStats(funnel="L3"))
    archive.record_validation(
        "job-rejected",
        rejected,
        ValidationReport(
            file="candidate_g1_0.py",
            name="broken_grid",
            verdict="rejected",
            failed_stage="L3",
            stages=[
                stage("L1", True, "static checks passed"),
                stage("L2", True, "24 instances sampled"),
                stage(
                    "L3",
                    False,
                    "the reference does not score 1.0 on its own instance",
                    Trigger(seed=3, difficulty=2, answer="7"),
                ),
            ],
        ),
        adhoc=False,
    )
    archive.record_validation(
        "job-l1",
        "f" * 64,
        ValidationReport(
            file="candidate_g1_1.py",
            name=None,
            verdict="rejected",
            failed_stage="L1",
            stages=[stage("L1", False, "no Environment subclass")],
        ),
        adhoc=False,
    )
    hostile = archive.add_environment(
        HOSTILE_NAME, HOSTILE, status="rejected", origin="generated", parents=[admitted]
    )
    archive.update_environment(hostile, stats=EnvStats(funnel="L5"))
    archive.record_validation(
        "job-hostile",
        hostile,
        ValidationReport(
            file=f"{BREAKOUT}.py",
            name=HOSTILE_NAME,
            verdict="rejected",
            failed_stage="L5",
            stages=[
                stage("L1", True, PWN),
                stage("L5", False, BREAKOUT, Trigger(seed=1, difficulty=1, answer=PWN + BREAKOUT)),
            ],
        ),
        adhoc=False,
    )
    solver = {
        "role": "solver",
        "group_id": "s-1",
        "env": "count_vowels",
        "env_sha": admitted,
        "seed": 4,
        "difficulty": 2,
        "policy_version": 1,
        "reward": 1.0,
        "outcome": "scored",
        "detail": "",
        "text": f"I count them. <answer>3</answer> {PWN}",
        "prompt": "How many vowels are in 'banana'?",
        "answer": "3",
        "reference": "3",
    }
    candidate = {
        "role": "generator",
        "group_id": "g1",
        "env": "proposal",
        "env_sha": "",
        "seed": 0,
        "difficulty": 0,
        "policy_version": 1,
        "reward": -0.8,
        "outcome": "scored",
        "detail": "",
        "text": f"class BrokenGrid(Environment):  # {BREAKOUT}",
        "verdict": "L3",
        "job_id": "job-rejected",
    }
    archive.record_metrics(RUN, 1, "samples", 1, {"samples": [solver, candidate]})
    later = {**candidate, "job_id": "g9-0", "verdict": "L1", "text": "not a file"}
    archive.record_metrics(RUN, 2, "samples", 2, {"samples": [later]})
    return Built(archive, seed, admitted, retired, rejected, hostile, "job-l1")


@contextlib.contextmanager
def pool_served(folder: Path, url: str, user: str, password: str) -> Iterator[tuple[str, Path]]:
    """`evoenv pool serve --port 0` with basic auth on the archive at `url`, as a subprocess:
    its base URL and the file its log goes to. Stopped with SIGTERM on leaving."""
    password_file = folder / "password"
    password_file.write_text(password + "\n")
    env = {
        **os.environ,
        "EVOENV_DATA_DIR": str(folder),
        "EVOENV_DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
    }
    command = "from evoenv_cli import main; main()"
    args = ["pool", "serve", "--port", "0", "--user", user, "--password-file", str(password_file)]
    log = folder / "serve.log"
    with log.open("w") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-c", command, *args],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=env,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "pool on http://127.0.0.1:PORT/", once it listens
        if not line.startswith("pool on "):
            pytest.fail(f"evoenv pool serve did not start: {line!r} {log.read_text()[-2000:]}")
        yield line.split()[-1].rstrip("/"), log
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    # uvicorn stops cleanly on SIGTERM, then raises it again: the exit status says so
    assert proc.returncode in (0, -15), log.read_text()
