"""One bad file never takes a batch down, and a crash earns nothing (`validate_source`, the
CLI's judging loop): output of the environment that a check cannot use rejects the file at
the stage that was running; a fault of the project's own is an `error` naming the exception;
either way the next file is judged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import started_sandbox

from evoenv_cli.envs import EXIT_ERROR, exit_code, validate_locally
from evoenv_worker import running_checks
from evoenv_worker.mechanical import validate_source
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.errors import EnvironmentOutputError

CORPUS = Path(__file__).resolve().parent / "corpus"
SOUND = CORPUS / "sound" / "int_score_count_distinct.py"
FLAWED = CORPUS / "flawed" / "l5_spray_accepted.py"


@pytest.fixture(scope="module")
def settings() -> Settings:
    base = Settings()
    return base.model_copy(update={"sandbox": base.sandbox.model_copy(update={"op_seconds": 2.0})})


@pytest.fixture(scope="module")
def sandbox(settings: Settings) -> Iterator[Sandbox]:
    yield from started_sandbox(settings.sandbox)


def _raising(exc: Exception) -> Any:
    def check(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return check


def test_output_a_check_cannot_use_rejects_the_file_at_the_running_stage(
    sandbox: Sandbox, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = EnvironmentOutputError("the reference is a deep list", seed=3, difficulty=4)
    monkeypatch.setattr(running_checks, "check_l4", _raising(fault))
    report = validate_source(SOUND.read_bytes(), "sound.py", sandbox, settings)
    assert (report.verdict, report.failed_stage) == ("rejected", "L4"), report
    assert [s.stage for s in report.stages] == ["L1", "L2", "L3", "L4"]
    failed = report.stages[-1]
    assert not failed.ok and failed.detail == "the reference is a deep list"
    assert failed.trigger is not None and (failed.trigger.seed, failed.trigger.difficulty) == (3, 4)


def test_a_fault_of_the_project_is_an_error_naming_the_exception_and_the_stage(
    sandbox: Sandbox, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(running_checks, "check_scorer", _raising(KeyError("no such probe")))
    report = validate_source(SOUND.read_bytes(), "sound.py", sandbox, settings)
    assert (report.verdict, report.failed_stage) == ("error", None), report
    assert report.error is not None
    assert "L5" in report.error and "KeyError" in report.error and "no such probe" in report.error
    assert [(s.stage, s.ok) for s in report.stages] == [(s, True) for s in ("L1", "L2", "L3", "L4")]


def test_a_file_whose_judging_raises_leaves_every_other_report(
    sandbox: Sandbox,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import evoenv_worker.mechanical as validate_module

    real = validate_module.validate_source

    def validate(data: bytes, file: str, *args: Any, **kwargs: Any) -> Any:
        if file == "second.py":
            raise RuntimeError("the judging loop broke")
        return real(data, file, *args, **kwargs)

    monkeypatch.setattr(validate_module, "validate_source", validate)
    blobs = [
        (Path("first.py"), SOUND.read_bytes()),
        (Path("second.py"), SOUND.read_bytes()),
        (Path("third.py"), FLAWED.read_bytes()),
    ]
    reports = validate_locally(settings, blobs, [], as_json=True)
    assert [(r.file, r.verdict) for r in reports] == [
        ("first.py", "admitted"),
        ("second.py", "error"),
        ("third.py", "rejected"),
    ]
    assert reports[1].error == "RuntimeError: the judging loop broke"
    out = capsys.readouterr().out.splitlines()
    lines = [json.loads(line) for line in out if line.startswith("{")]  # not the log lines
    assert [line["file"] for line in lines] == ["first.py", "second.py", "third.py"]
    assert exit_code(reports) == EXIT_ERROR
