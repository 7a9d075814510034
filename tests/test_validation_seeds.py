"""L2-L5's seeds derive from the installation's secret and the file's hash: the same for one
file and secret, others for another file or secret, never a fixed list; the secret is written
to the data folder on first use unless a setting gives it. An environment honest only on the
once-public seeds 0-39 passes L2-L5 there, and is rejected at L5 on its own seeds."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from support import started_sandbox

from evoenv_worker import running_checks
from evoenv_worker.mechanical import SourceRunner, validate_source
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.environment import TRAIN_SEEDS
from shared.errors import UsageError
from shared.validation_seeds import KEY_FILE, validation_secret, validation_seeds

RECOGNISER = (
    Path(__file__).resolve().parent / "corpus" / "dishonest" / "validation_seed_recogniser.py"
)
SECRET = b"a secret of this installation"


def test_the_seeds_are_the_files_and_the_secrets_own() -> None:
    data = RECOGNISER.read_bytes()
    seeds = validation_seeds(SECRET, data, 8)
    assert seeds == validation_seeds(SECRET, data, 8)
    assert len(set(seeds)) == 8 and all(seed in TRAIN_SEEDS for seed in seeds)
    assert seeds != list(range(8))
    assert not set(seeds) & set(validation_seeds(SECRET, data + b"\n", 8))
    assert not set(seeds) & set(validation_seeds(b"another secret, another host", data, 8))


def test_the_secret_is_written_on_first_use_and_kept(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    secret = validation_secret(settings)
    path = tmp_path / "data" / KEY_FILE
    assert len(secret) == 64 and path.read_text().strip().encode() == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert validation_secret(settings) == secret


def test_a_secret_set_in_the_settings_wins_and_writes_nothing(tmp_path: Path) -> None:
    given = Settings(data_dir=tmp_path, validation={"secret": "sixteen or more characters"})
    assert validation_secret(given) == b"sixteen or more characters"
    assert not (tmp_path / KEY_FILE).exists()
    short = Settings(data_dir=tmp_path, validation={"secret": "too short"})
    with pytest.raises(UsageError, match="fewer than 16 characters"):
        validation_secret(short)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    yield from started_sandbox(Settings().sandbox)


def test_an_environment_honest_only_on_public_seeds_fails_l5_on_its_own(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    data = RECOGNISER.read_bytes()
    base = Settings(data_dir=tmp_path)
    settings = base.model_copy(
        update={"validation": base.validation.model_copy(update={"secret": SecretStr("s" * 16)})}
    )
    runner = SourceRunner(sandbox, data.decode(), RECOGNISER.name)
    check, meta = running_checks.describe(runner)
    assert check.ok and meta is not None
    public, items = running_checks.check_executes(runner, meta, range(8), settings.validation)
    assert public.ok
    scorer = running_checks.check_scorer(runner, items, meta, settings.validation)
    assert scorer.ok, "on seeds 0-7 the scorer is honest: L5 cannot tell"

    report = validate_source(data, RECOGNISER.name, sandbox, settings)
    assert (report.verdict, report.failed_stage) == ("rejected", "L5"), report.stages[-1]
    assert "accepts the" in report.stages[-1].detail
    trigger = report.stages[-1].trigger
    assert trigger is not None
    assert trigger.seed in validation_seeds(b"s" * 16, data, settings.validation.seeds)
