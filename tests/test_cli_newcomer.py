"""The CLI as a newcomer meets it (docs/commands.md), through the real command line: a local
admission whose later stages lack a service runs L1-L5, reports a rejection as one, and names
the missing service in one line before it loads the embedding model."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from support import free_port, started_sandbox
from test_validate_corpus import evoenv

from evoenv_cli import app
from evoenv_cli.help_pages import command
from evoenv_worker.sandbox.host import Sandbox
from shared.config import SandboxSettings

REPO = Path(__file__).resolve().parents[1]
SOUND = REPO / "tests" / "corpus" / "sound" / "sum_or_long_product.py"
EMBEDDING_LOAD = "Loading weights"
"""What loading the embedding model prints (the novelty stage's first step)."""


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    yield from started_sandbox(SandboxSettings())


def _evoenv(tmp_path: Path, *args: str | Path, **settings: str) -> subprocess.CompletedProcess[str]:
    """`evoenv ARGS` in a subprocess with a data folder of its own and `settings`."""
    return evoenv(*args, env={"EVOENV_DATA_DIR": str(tmp_path / "data"), **settings})


def _syntax_error(tmp_path: Path) -> Path:
    path = tmp_path / "broken.py"
    path.write_text(SOUND.read_text().replace("class SumOrLongProduct", "class SumOr LongProduct"))
    return path


def _one_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith("error:")]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.usefixtures("sandbox")
def test_pool_add_without_redis_runs_l1_l5_and_names_redis_before_loading_anything(
    tmp_path: Path,
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    done = _evoenv(tmp_path, "pool", "add", SOUND, EVOENV_REDIS_URL=dead)
    assert done.returncode == 3, done.stdout + done.stderr
    line = _one_error_line(done.stdout)
    assert "pool add needs Redis at" in line and "EVOENV_REDIS_URL" in line and dead in line
    assert "evoenv up" in line
    for stage in ("L1", "L2", "L3", "L4", "L5"):  # the report L1-L5 gave is kept
        assert f"  {stage} " in done.stdout and "ok" in done.stdout
    assert "unconfined" not in done.stdout
    assert EMBEDDING_LOAD not in done.stdout + done.stderr
    assert "ConnectionError" not in done.stdout + done.stderr

    rejected = _evoenv(tmp_path, "pool", "add", _syntax_error(tmp_path), EVOENV_REDIS_URL=dead)
    assert rejected.returncode == 1, rejected.stdout + rejected.stderr
    assert rejected.stdout.startswith("REJECTED at L1"), rejected.stdout
    assert "Redis" not in rejected.stdout + rejected.stderr


@pytest.mark.usefixtures("sandbox")
@pytest.mark.parametrize("stage", ["--review", "--calibrate"])
def test_validate_names_the_model_server_it_cannot_reach(
    tmp_path: Path, redis_url: str, stage: str
) -> None:
    server = f"http://127.0.0.1:{free_port()}"
    done = _evoenv(
        tmp_path, "validate", stage, SOUND, EVOENV_REDIS_URL=redis_url, EVOENV_VLLM_URLS=server
    )
    assert done.returncode == 3, done.stdout + done.stderr
    line = _one_error_line(done.stdout)
    named = "review needs" if stage == "--review" else "calibration needs"
    assert f"{named} the model server at {server}" in line and "EVOENV_VLLM_URLS" in line, line
    assert "  L5 " in done.stdout and "unconfined" not in done.stdout


def test_sample_refuses_a_negative_seed_as_the_web_page_does(tmp_path: Path) -> None:
    done = _evoenv(tmp_path, "sample", "sort_words", "--seed", "-1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and "--seed" in done.stderr and "0" in done.stderr
    assert done.stdout == ""


@pytest.mark.usefixtures("sandbox")
def test_l4_says_where_it_did_not_check_the_prompt_for_the_answer(tmp_path: Path) -> None:
    short = REPO / "tests" / "corpus" / "sound" / "int_score_count_distinct.py"  # small integers
    long = REPO / "tests" / "corpus" / "sound" / "partial_credit_sort.py"  # sorted lists
    done = _evoenv(tmp_path, "validate", "--json", short, long)
    assert done.returncode == 0, done.stdout + done.stderr
    short_l4, long_l4 = (
        next(s for s in json.loads(line)["stages"] if s["stage"] == "L4")
        for line in done.stdout.splitlines()
    )
    assert (
        "the answer text in the prompt: not checked (answers shorter than 8 characters)"
        in (short_l4["detail"])
    )
    assert "0 of" not in short_l4["detail"] and short_l4["data"]["leak_checked"] == 0
    assert "0 of 24 prompts contain the answer text;" in long_l4["detail"]


@pytest.mark.usefixtures("sandbox")
def test_validate_says_how_long_a_looping_sampler_kept_it_waiting(tmp_path: Path) -> None:
    looping = tmp_path / "loops.py"
    looping.write_text(
        SOUND.read_text().replace(
            "    def sample(self, rng: random.Random, difficulty: int) -> dict:\n",
            "    def sample(self, rng: random.Random, difficulty: int) -> dict:\n"
            "        while True:\n            pass\n",
        )
    )
    done = _evoenv(tmp_path, "validate", "--json", looping, EVOENV_SANDBOX__OP_SECONDS="1")
    assert done.returncode == 1, done.stdout + done.stderr
    (l2,) = (s for s in json.loads(done.stdout)["stages"] if s["stage"] == "L2")
    assert not l2["ok"] and "no result within 1 s" in l2["detail"], l2
    found = re.search(r"\((\d+) calls ran past the limit: (\d+) s waited in all", l2["detail"])
    assert found is not None, l2["detail"]
    over, waited = int(found[1]), int(found[2])
    assert over >= 2 and waited >= over and abs(waited - l2["seconds"]) < 1.5, l2


def test_a_short_sha_as_shown_names_its_environment_in_pool_show_and_on_the_web(
    tmp_path: Path,
) -> None:
    from fastapi.testclient import TestClient
    from pool_web_archive import build_archive

    from evoenv_cli.pool_web import create_app
    from shared.config import Settings

    url = f"sqlite:///{tmp_path / 'archive.db'}"
    built = build_archive(url)
    listed = _evoenv(tmp_path, "pool", "list", "--all", EVOENV_DATABASE_URL=url)
    short = built.admitted[:10]
    assert short in listed.stdout, listed.stdout  # as `pool list` shows it
    shown = _evoenv(tmp_path, "pool", "show", short, EVOENV_DATABASE_URL=url)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout[: shown.stdout.index("\n}") + 2])["sha"] == built.admitted
    unknown = _evoenv(tmp_path, "pool", "show", "0123456789", EVOENV_DATABASE_URL=url)
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: no environment"), unknown

    settings = Settings(data_dir=tmp_path, database_url=url)
    with TestClient(create_app(settings)) as client:
        page = client.get(f"/env/{short}")
        assert page.status_code == 200 and "count_vowels" in page.text
        assert client.get("/env/0123456789").status_code == 404


@pytest.mark.usefixtures("sandbox")
def test_tables_never_cut_a_name_at_80_columns(tmp_path: Path) -> None:
    from pool_web_archive import ADMITTED, build_archive

    url = f"sqlite:///{tmp_path / 'archive.db'}"
    long_name = "planted_environment_with_a_long_descriptive_name"
    build_archive(url).archive.add_environment(
        long_name, ADMITTED.replace("count_vowels", long_name), status="admitted", origin="user"
    )
    listed = _evoenv(tmp_path, "pool", "list", EVOENV_DATABASE_URL=url, COLUMNS="80")
    assert listed.returncode == 0, listed.stderr
    assert long_name in listed.stdout and "…" not in listed.stdout, listed.stdout
    seeds = _evoenv(tmp_path, "seeds", COLUMNS="80")
    assert "count_connected_components" in seeds.stdout and "count_connected_compon…" not in (
        seeds.stdout
    ), seeds.stdout


@pytest.mark.usefixtures("sandbox")
def test_validate_novelty_prints_no_progress_bar_of_the_embedding_model(tmp_path: Path) -> None:
    done = _evoenv(tmp_path, "validate", "--novelty", SOUND)
    assert "  novelty " in done.stdout, done.stdout + done.stderr
    assert EMBEDDING_LOAD not in done.stdout + done.stderr and "it/s" not in done.stderr


def _commands(command: Any, path: tuple[str, ...] = ("evoenv",)) -> Iterator[tuple[str, ...]]:
    """The path of `command` and of every command under it."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _command_at(path: tuple[str, ...]) -> Any:
    command = typer.main.get_command(app)
    for name in path[1:]:
        command = command.commands[name]
    return command


def _docs_of(path: tuple[str, ...], docs: str) -> str:
    """What docs/commands.md says of the command at `path`: the table rows whose first cell
    names it, and the sections whose heading does (the whole page for `evoenv` itself)."""
    if len(path) == 1:
        return docs
    named = " ".join(path)
    rows = [
        line
        for line in docs.splitlines()
        if line.startswith("| `evoenv")
        and f"evoenv {path[1]}" in line.split(" | ")[0]
        and all(word in line.split(" | ")[0] for word in path[2:])
    ]
    sections = [s for s in re.split(r"\n(?=## )", docs) if named in s.splitlines()[0]]
    return "\n".join(rows + sections)


def test_every_command_and_option_is_in_docs_commands() -> None:
    docs = (REPO / "docs" / "commands.md").read_text()
    missing = []
    for path in _commands(typer.main.get_command(app)):
        said = _docs_of(path, docs)
        options = [o for p in _command_at(path).params for o in (*p.opts, *p.secondary_opts)]
        for option in [o for o in options if o.startswith("-") and o != "--help"]:
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", said):
                missing.append(f"{' '.join(path)} {option}")
        if not said:
            missing.append(" ".join(path))
    assert not missing, f"not in docs/commands.md: {missing}"


def _help_pages() -> Iterator[tuple[tuple[str, ...], Any, str]]:
    """Each command's path, command and help page as `evoenv` prints it (80 columns)."""
    root = command(app)
    for path in _commands(root):
        found = root
        for name in path[1:]:
            found = found.commands[name]
        with contextlib.redirect_stdout(io.StringIO()) as page:
            assert root.main([*path[1:], "--help"], "evoenv", standalone_mode=False) == 0
        yield path, found, page.getvalue()


def test_every_help_page_ends_with_an_example_that_parses() -> None:
    for path, found, page in _help_pages():
        if getattr(found, "commands", None) is not None:
            continue  # a group lists its commands
        examples = [line.strip() for line in page.splitlines() if "Example: " in line]
        assert len(examples) == 1, f"{' '.join(path)}: {examples}"
        words = [w for w in shlex.split(examples[0].removeprefix("Example: ")) if "=" not in w]
        assert tuple(words[: len(path)]) == path, examples[0]
        found.make_context(path[-1], words[len(path) :])  # raises on a bad example


def test_no_help_page_names_a_python_type_or_breaks_a_sentence() -> None:
    for path, found, page in _help_pages():
        assert not re.search(r"<(int|str|bool|float|Path|list\[|int range)", page), page
        summary = " ".join((found.help or "").split("\n\n", 1)[0].split())
        assert len(summary) <= 100 and summary.count(". ") == 0, f"{path}: {summary}"
        lines = page.splitlines()
        for line, after in itertools.pairwise(lines):
            if not after.strip() or not line.startswith("  ") or line.strip().startswith("-"):
                continue
            first = after.split()[0]
            cut = not re.search(r"[.:;,)\]]$", line) and first[0].islower()
            assert not (cut and len(line) + 1 + len(first) <= 78), f"{path}: {line!r} / {after!r}"
