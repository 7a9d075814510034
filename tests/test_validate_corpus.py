"""The validator against a corpus of hand-written environments (docs/CONTRACT.md#admission-stages).

`tests/corpus/flawed/` holds one environment per rule the validator enforces, each otherwise
sound so that it fails only at the intended stage; `tests/corpus/sound/` holds environments
that look odd but keep the contract and must be admitted; `tests/corpus/unsound/` holds files
that pass L1-L5 although their prompt asks something else than their `solve` computes (no
mechanical stage can tell; the second solve is measured on them). Each file says what to expect in
its leading comment lines:

    # expect: L3                      the stage that must reject it (or `admitted`)
    # why: ...                        what is wrong (free text, may continue on more lines)
    # detail: hash seed               a substring of the failing stage's detail (optional)
    # trigger: seed difficulty=10     what the trigger must hold (optional): `seed`,
                                      `difficulty` or `difficulty=N`, or `none`; the default
                                      for L2-L5 is `seed difficulty`

Files that cannot sensibly be committed as sources (empty, binary, not UTF-8, too large) are
built here as bytes. The sandbox follows the EVOENV_* variables (confined unless they opt out);
the per-call limit is lowered for the corpus, so the slow sampler fails fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from support import cannot_open, started_sandbox, without_read_override

from evoenv_worker.mechanical import validate_source
from evoenv_worker.model_stages import trace_instance
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.messages import MECHANICAL_STAGES, ValidateJob, ValidationReport

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus"
FLAWED = sorted((CORPUS / "flawed").glob("*.py"))
SOUND = sorted((CORPUS / "sound").glob("*.py"))
UNSOUND = sorted((CORPUS / "unsound").glob("*.py"))
"""Files that pass L1-L5 but whose prompt does not ask what `solve` computes (the second solve's
corpus: bench/bench_second_solve.py)."""
CORPUS_OP_SECONDS = 2.0
MAX_SOURCE_BYTES = 64 * 1024
SOUND_BASE = CORPUS / "sound" / "int_score_count_distinct.py"
"""A sound source the byte-level cases below are built from."""
CORPUS_SECRET = "the corpus's own validation secret"
"""The validation seeds derive from it (not from the data folder's secret): the same everywhere."""


@dataclass(frozen=True, slots=True)
class Expectation:
    stage: str | None
    """The stage that must reject the file, or None: it must be admitted."""
    detail: str | None = None
    trigger: str | None = None

    @classmethod
    def parse(cls, data: bytes) -> Expectation:
        fields: dict[str, str] = {}
        for line in data.decode("utf-8", "replace").splitlines():
            if not line.startswith("#"):
                break
            key, sep, value = line.lstrip("#").strip().partition(":")
            if sep and key in {"expect", "detail", "trigger"}:
                fields.setdefault(key, value.strip())
        expect = fields.get("expect")
        assert expect is not None, "the file has no '# expect:' line"
        assert expect == "admitted" or expect in MECHANICAL_STAGES, expect
        return cls(
            None if expect == "admitted" else expect, fields.get("detail"), fields.get("trigger")
        )


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    data: bytes
    expect: Expectation


def _sound_source() -> bytes:
    return SOUND_BASE.read_bytes()


def _padded(size: int) -> bytes:
    """The sound source padded with comment lines to exactly `size` bytes."""
    data = _sound_source() + b"\n"
    while len(data) < size:
        line = b"# " + b"padding " * 12 + b"\n"
        data += line[: size - len(data)]
    assert len(data) == size
    return data[:-1] + b"\n"


def built_cases() -> list[Case]:
    """Byte-level candidates: what the file system can hold but a source file should not."""
    sound = _sound_source()
    l1 = Expectation("L1")
    elf = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8
    return [
        Case("built/empty", b"", l1),
        Case("built/whitespace_only", b"\n  \n\t\n", l1),
        Case("built/binary", elf, l1),
        Case("built/nul_byte", sound.replace(b"import random", b"import random  # \x00", 1), l1),
        Case(
            "built/latin1",
            sound.replace(b"\n", "\n# café, naïve: Latin-1\n".encode("latin-1"), 1),
            l1,
        ),
        Case("built/too_large", _padded(MAX_SOURCE_BYTES + 1), Expectation("L1", "bytes")),
        Case("built/at_size_limit", _padded(MAX_SOURCE_BYTES), Expectation(None)),
    ]


def corpus_cases() -> list[Case]:
    cases = []
    for path in [*FLAWED, *SOUND, *UNSOUND]:
        data = path.read_bytes()
        cases.append(Case(f"{path.parent.name}/{path.stem}", data, Expectation.parse(data)))
    return cases


CASES = corpus_cases() + built_cases()
BOM_CASE = Case("built/utf8_bom", b"\xef\xbb\xbf" + _sound_source(), Expectation(None))


@pytest.fixture(scope="module")
def settings() -> Settings:
    base = Settings()
    sandbox = base.sandbox.model_copy(update={"op_seconds": CORPUS_OP_SECONDS})
    validation = base.validation.model_copy(update={"secret": SecretStr(CORPUS_SECRET)})
    return base.model_copy(update={"sandbox": sandbox, "validation": validation})


@pytest.fixture(scope="module")
def sandbox(settings: Settings) -> Iterator[Sandbox]:
    yield from started_sandbox(settings.sandbox)


def _check_trigger(report: ValidationReport, expect: Expectation) -> None:
    failed = report.stages[-1]
    spec = expect.trigger or ("seed difficulty" if failed.stage != "L1" else "none")
    if spec == "none":
        return
    trigger = failed.trigger
    assert trigger is not None, f"{failed.stage} failed without a trigger: {failed.detail}"
    for token in spec.split():
        key, _, value = token.partition("=")
        assert key in {"seed", "difficulty"}, f"bad trigger spec {spec!r}"
        got = getattr(trigger, key)
        assert got is not None, f"the trigger has no {key}: {trigger}"
        if value:
            assert got == int(value), f"trigger {key} is {got}, expected {value}"


def _check(report: ValidationReport, case: Case) -> None:
    expect = case.expect
    summary = [(s.stage, s.ok, s.detail, s.trigger) for s in report.stages]
    assert report.verdict != "error", f"the check could not run: {report.error}"
    if expect.stage is None:
        assert report.verdict == "admitted", summary
        assert report.failed_stage is None
        assert [s.stage for s in report.stages] == list(MECHANICAL_STAGES)
        assert all(s.ok for s in report.stages), summary
        return
    assert (report.verdict, report.failed_stage) == ("rejected", expect.stage), summary
    *passed, failed = report.stages
    assert [s.stage for s in report.stages] == list(
        MECHANICAL_STAGES[: MECHANICAL_STAGES.index(expect.stage) + 1]
    )
    assert all(s.ok for s in passed) and not failed.ok, summary
    assert failed.detail.strip(), "a rejection must say why"
    if expect.detail:
        assert expect.detail.lower() in failed.detail.lower(), failed.detail
    if expect.stage != "L1":
        assert report.name, "past L1 the report names the environment"
    _check_trigger(report, expect)


def test_corpus_is_complete() -> None:
    stages = {c.expect.stage for c in CASES}
    assert stages == {None, *MECHANICAL_STAGES}
    assert len(FLAWED) >= 17 and len(SOUND) >= 5 and len(UNSOUND) >= 5
    assert len(ATTACKS) >= 6


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_validator_judges_corpus_file(case: Case, sandbox: Sandbox, settings: Settings) -> None:
    report = validate_source(case.data, f"{case.id}.py", sandbox, settings)
    _check(report, case)


def test_validator_admits_utf8_with_bom(sandbox: Sandbox, settings: Settings) -> None:
    report = validate_source(BOM_CASE.data, "utf8_bom.py", sandbox, settings)
    _check(report, BOM_CASE)


def test_a_file_with_a_bom_is_sent_on_as_the_text_l1_to_l5_judged(
    sandbox: Sandbox, settings: Settings
) -> None:
    # The job `pool add` and `validate --queue` send: its source is what review, calibration
    # and novelty run and what the archive stores (and export and the web page load).
    job = ValidateJob.for_file("bom", "utf8_bom.py", BOM_CASE.data)
    _check(validate_source(job.data, job.file, sandbox, settings), BOM_CASE)
    assert job.source == _sound_source().decode("utf-8")
    assert trace_instance(sandbox, job.source, job.file) is not None


# ------------------------------------------------------------------------------------- the CLI


def evoenv(
    *args: str | Path, env: dict[str, str] | None = None, prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the `evoenv` console script of this interpreter in a real subprocess (or, where the
    script cannot be executed, its entry point `evoenv_cli:main` through this interpreter),
    after `prefix` (e.g. `without_read_override()`) when given."""
    environment = {**os.environ, **(env or {})}
    arguments = [str(arg) for arg in args]

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*(prefix or []), *command],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=REPO,
            env=environment,
            check=False,
        )

    script = Path(sys.executable).with_name("evoenv")
    if os.access(script, os.X_OK):
        try:
            return run([str(script), *arguments])
        except OSError:  # e.g. its interpreter line cannot be executed by this user
            pass
    return run([sys.executable, "-c", "from evoenv_cli import main; main()", *arguments])


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _assert_report_shape(line: dict[str, Any]) -> None:
    assert {"file", "name", "verdict", "failed_stage", "stages"} <= line.keys()
    assert line["verdict"] in {"admitted", "rejected", "error"}
    stages = line["stages"]
    assert isinstance(stages, list)
    for stage in stages:
        assert {"stage", "ok", "seconds", "detail"} <= stage.keys()
        assert isinstance(stage["ok"], bool) and isinstance(stage["detail"], str)
        assert isinstance(stage["seconds"], int | float) and stage["seconds"] >= 0


def test_cli_json_reports_one_line_per_file_and_exits_1_on_a_rejection(sandbox: Sandbox) -> None:
    flawed = CORPUS / "flawed" / "l5_spray_accepted.py"
    sound = CORPUS / "sound" / "int_score_count_distinct.py"
    result = evoenv("validate", "--json", flawed, sound)
    assert result.returncode == 1, result.stderr
    lines = json_lines(result.stdout)
    assert len(lines) == 2, result.stdout
    for line in lines:
        _assert_report_shape(line)
    first, second = lines
    assert first["file"] == str(flawed) and second["file"] == str(sound)
    assert (first["name"], first["verdict"], first["failed_stage"]) == (
        "small_sum",
        "rejected",
        "L5",
    )
    assert [s["stage"] for s in first["stages"]] == list(MECHANICAL_STAGES)
    assert first["stages"][-1]["ok"] is False and first["stages"][-1]["detail"]
    assert (second["name"], second["verdict"], second["failed_stage"]) == (
        "count_distinct_values",
        "admitted",
        None,
    )
    assert all(s["ok"] for s in second["stages"])


ATTACKS = sorted((CORPUS / "flawed").glob("*_attack_*.py"))
"""Files written to attack the validator itself (its host side), not the sandbox."""


def test_cli_judges_every_attack_file_in_one_call_and_every_file_after_it(
    sandbox: Sandbox,
) -> None:
    files = [path for attack in ATTACKS for path in (attack, SOUND_BASE)]
    result = evoenv("validate", "--json", *files)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = json_lines(result.stdout)
    assert [line["file"] for line in lines] == [str(path) for path in files]
    for path, line in zip(files, lines, strict=True):
        _assert_report_shape(line)
        if path == SOUND_BASE:
            assert line["verdict"] == "admitted", line
            continue
        expect = Expectation.parse(path.read_bytes())
        assert (line["verdict"], line["failed_stage"]) == ("rejected", expect.stage), line
        assert expect.detail and expect.detail.lower() in line["stages"][-1]["detail"].lower()


def test_cli_exits_0_when_every_file_is_admitted(sandbox: Sandbox) -> None:
    files = [CORPUS / "sound" / "word_caesar_decode.py", CORPUS / "sound" / "bool_score_gcd.py"]
    result = evoenv("validate", "--json", *files)
    assert result.returncode == 0, (result.stdout, result.stderr)
    lines = json_lines(result.stdout)
    assert [line["verdict"] for line in lines] == ["admitted", "admitted"]


def test_cli_readable_report_names_stage_and_trigger(sandbox: Sandbox) -> None:
    result = evoenv("validate", CORPUS / "flawed" / "l2_crash_at_max_difficulty.py")
    assert result.returncode == 1, result.stderr
    assert "L2" in result.stdout and "rejected" in result.stdout.lower()
    assert '"difficulty": 10' in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_cli_rejects_unusable_bytes_at_l1(sandbox: Sandbox, tmp_path: Path) -> None:
    files = []
    for case in built_cases():
        if case.expect.stage == "L1":
            path = tmp_path / f"{case.id.split('/')[-1]}.py"
            path.write_bytes(case.data)
            files.append(path)
    result = evoenv("validate", "--json", *files)
    assert result.returncode == 1, result.stderr
    lines = json_lines(result.stdout)
    assert [line["file"] for line in lines] == [str(path) for path in files]
    for line in lines:
        _assert_report_shape(line)
        assert (line["verdict"], line["failed_stage"]) == ("rejected", "L1"), line
        assert [s["stage"] for s in line["stages"]] == ["L1"]


@pytest.mark.parametrize("kind", ["missing", "directory", "no_permission"])
def test_cli_unreadable_path_is_a_usage_error(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "environment.py"
    if kind == "directory":
        path.mkdir()
    prefix: list[str] = []
    if kind == "no_permission":
        path.write_bytes(_sound_source())
        path.chmod(0)
        prefix = without_read_override()  # as root, without root's permission override
        assert cannot_open(path, prefix), "the file is readable: the case would test nothing"
    result = evoenv("validate", "--json", path, prefix=prefix)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0], result.stderr


def test_cli_exits_3_when_the_sandbox_cannot_start(sandbox: Sandbox) -> None:
    # A start-up allowance no interpreter can meet: the check cannot run, never the file's fault.
    result = evoenv(
        "validate", "--json", SOUND_BASE, env={"EVOENV_SANDBOX__START_SECONDS": "0.0001"}
    )
    assert result.returncode == 3, (result.stdout, result.stderr)
    (line,) = json_lines(result.stdout)
    _assert_report_shape(line)
    assert (line["verdict"], line["failed_stage"]) == ("error", None)
    assert "Traceback" not in result.stderr
