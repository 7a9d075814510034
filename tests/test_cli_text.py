"""What environments and paths put on the terminal is data (docs/commands.md#what-the-cli-prints):
through the real command line, control sequences, markup in a path, bidirectional overrides
and lone surrogates can neither repaint a report, lose one, nor stop the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import sandbox_or_missing
from typer.testing import CliRunner

from evoenv_cli import app
from evoenv_cli.envs import out
from evoenv_learner.pool import seed_pool
from shared.db import Archive, EnvironmentRow, source_sha

REPO = Path(__file__).resolve().parents[1]
SOUND = REPO / "tests" / "corpus" / "sound" / "int_score_count_distinct.py"
FORGED = "\x1b[2K\r\x1b[1A\x1b[2K\x1b[32mADMITTED\x1b[0m  forged.py\n  L5 ok"
"""An exception message that, printed raw, would erase the line above and claim admission."""


@pytest.fixture(scope="module")
def sandbox() -> None:
    sandbox_or_missing()


def _evoenv(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`evoenv ARGS` in a subprocess, its output a pipe (UTF-8, as a terminal's would be)."""
    return subprocess.run(
        [sys.executable, "-c", "from evoenv_cli import main; main()", *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="strict",
        timeout=180,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _variant(folder: Path, name: str, old: str, new: str) -> Path:
    """The sound file with one piece of its text replaced, written to `folder/name`."""
    source = SOUND.read_text("utf-8")
    assert old in source
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(source.replace(old, new, 1), "utf-8")
    return path


SAMPLE_LINE = "        length = 4 + 4 * difficulty"
PROMPT_END = '"Give the answer as a single integer."'


def test_the_text_report_shows_every_file_and_what_it_printed_as_data(
    sandbox: None, tmp_path: Path
) -> None:
    forged = _variant(
        tmp_path / "a[/x]",
        "forged[red].py",
        SAMPLE_LINE,
        f"        raise ValueError({FORGED!r})",
    )
    raising = _variant(
        tmp_path, "surrogate.py", SAMPLE_LINE, '        raise ValueError("bad \\ud800")'
    )
    prompt = _variant(tmp_path, "prompt.py", PROMPT_END, PROMPT_END[:-1] + ' \\ud800"')
    sound = tmp_path / "b[/bold]" / "sound.py"
    sound.parent.mkdir(parents=True)
    sound.write_bytes(SOUND.read_bytes())
    files = [forged, sound, raising, prompt, sound]
    result = _evoenv("validate", *files)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    assert "\x1b" not in result.stdout and "\r" not in result.stdout
    heads = [line for line in result.stdout.splitlines() if not line.startswith(" ")]
    verdicts = [(head.split("  ")[0], head.split("  ")[1]) for head in heads]
    assert verdicts == [
        ("REJECTED at L2", str(forged)),
        ("ADMITTED", str(sound)),
        ("REJECTED at L2", str(raising)),
        ("REJECTED at L2", str(prompt)),
        ("ADMITTED", str(sound)),
    ], result.stdout
    assert "\\x1b[2K\\r\\x1b[1A" in result.stdout and "\\n  L5 ok" in result.stdout
    assert "bad \\ud800" in result.stdout
    assert "lone surrogate (U+D800)" in result.stdout


def test_a_reason_holding_a_lone_surrogate_is_stored_and_sent_as_text(
    sandbox: None, redis_url: str, tmp_path: Path
) -> None:
    # `pool add` stores each report (archive, Redis): a rejection stays a rejection.
    raising = _variant(
        tmp_path, "surrogate.py", SAMPLE_LINE, '        raise ValueError("bad \\ud800")'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    env |= {"EVOENV_REDIS_URL": redis_url, "EVOENV_DATA_DIR": str(tmp_path / "data")}
    result = _evoenv("pool", "add", "--json", raising, env=env)
    assert result.returncode == 1, (result.stdout, result.stderr)
    (line,) = [json.loads(text) for text in result.stdout.splitlines()]
    assert (line["verdict"], line["failed_stage"]) == ("rejected", "L2"), line
    assert "bad \\ud800" in line["stages"][-1]["detail"]


def test_sample_shows_a_prompt_as_data(sandbox: None, tmp_path: Path) -> None:
    hostile = '"Give the answer \\x1b[2J\\u202e[bold]as a single integer[/] \\ud800\\x9b."'
    path = _variant(tmp_path, "hostile.py", PROMPT_END, hostile)
    result = _evoenv("sample", path)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    assert not {"\x1b", "\u202e", "\x9b"} & set(result.stdout)
    assert "\\x1b[2J\\u202e[bold]as a single integer[/] \\ud800\\x9b." in result.stdout
    assert "How many different values occur in the list?" in result.stdout  # lines kept


def test_pool_list_shows_an_impostor_name_as_what_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An archive written before names were matched whole: "sort_words\n" beside the seed.
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    archive = Archive(url)
    seed_pool(archive, REPO / "seeds")
    seed = archive.by_name("sort_words")
    assert seed is not None
    source = seed.source.replace('"sort_words"', '"sort_words\\n"')
    row = EnvironmentRow(sha=source_sha(source), name="sort_words\n", source=source)
    row.status = "admitted"
    with archive.session() as session:
        session.add(row)
        session.commit()
    archive.engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    # wide enough that no name is cut short (the console was sized when it was first used)
    monkeypatch.setattr(out, "width", 200)
    result = CliRunner().invoke(app, ["pool", "list"], env={**env, "EVOENV_DATABASE_URL": url})
    assert result.exit_code == 0, (result.output, result.exception)
    names = [line.split("│")[1].strip() for line in result.output.splitlines() if "│" in line]
    assert names.count("sort_words") == 1, result.output
    assert names.count("sort_words\\n") == 1, result.output
