"""Which package may import which (every import counts: module level, in functions, under
TYPE_CHECKING). The worker and the learner import nothing from each other: the learner sends
jobs by task name (`evoenv_learner/jobs.py`); the command (`evoenv_cli/`) is the one package
that imports both. shared/ imports none of them, nor Celery or torch; `evoenv_model/` imports
only shared/. Celery is imported by the workers' app and tasks and by the learner's client.
And no function of these packages is over `MAX_FUNCTION_LINES` lines."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "evoenv_model", "evoenv_worker", "evoenv_learner", "evoenv_cli")
FORBIDDEN = {
    "shared": {
        "evoenv_model",
        "evoenv_worker",
        "evoenv_learner",
        "evoenv_cli",
        "celery",
        "kombu",
        "torch",
    },
    "evoenv_model": {"evoenv_worker", "evoenv_learner", "evoenv_cli", "celery", "kombu"},
    "evoenv_worker": {"evoenv_learner", "evoenv_cli"},
    "evoenv_learner": {"evoenv_worker", "evoenv_cli"},
    "evoenv_cli": set(),
}
MAX_FUNCTION_LINES = 100
"""The most lines a function or method of a product package may span, from its `def` line to
its last, docstring included (`end_lineno - lineno + 1`)."""
CELERY_USERS = {
    "evoenv_worker/app.py",
    "evoenv_worker/tasks.py",
    "evoenv_worker/broker.py",
    "evoenv_learner/jobs.py",
}


def imports(file: Path) -> set[str]:
    """The top-level names of every module `file` imports, wherever the import is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text("utf-8"), str(file))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def test_each_package_imports_only_what_its_layer_allows() -> None:
    wrong = [
        f"{file.relative_to(REPO)} imports {name}"
        for package in PACKAGES
        for file in files(package)
        for name in sorted(imports(file) & FORBIDDEN[package])
    ]
    assert not wrong


def test_celery_is_imported_only_by_the_workers_app_and_the_learners_client() -> None:
    users = {
        str(file.relative_to(REPO))
        for package in PACKAGES
        for file in files(package)
        if imports(file) & {"celery", "kombu"}
    }
    assert users == CELERY_USERS


def test_no_function_is_over_the_length_limit() -> None:
    long = [
        f"{file.relative_to(REPO)}:{node.lineno} {node.name}: {length} lines"
        for package in PACKAGES
        for file in files(package)
        for node in ast.walk(ast.parse(file.read_text("utf-8"), str(file)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert not long
