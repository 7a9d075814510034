"""Every module of the product packages opens with a docstring of one to five lines that says
what the module is for; how things work goes to the classes and functions, history and
figures to commit messages and docs/results.md."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "evoenv_model", "evoenv_worker", "evoenv_learner", "evoenv_cli")
MAX_LINES = 5
ALLOWED_LONGER: dict[str, str] = {}
"""Modules whose docstring may be longer for now, each with the reason."""


def docstring_lines(file: Path) -> int:
    """Lines of the module docstring as written (blank lines inside count); 0 when missing."""
    doc = ast.get_docstring(ast.parse(file.read_text("utf-8"), str(file)), clean=False)
    return len(doc.strip().splitlines()) if doc and doc.strip() else 0


def product_modules() -> list[Path]:
    return sorted(file for package in PACKAGES for file in (REPO / package).rglob("*.py"))


def test_every_product_module_says_what_it_is_for_in_one_to_five_lines() -> None:
    wrong = []
    for file in product_modules():
        name = file.relative_to(REPO).as_posix()
        lines = docstring_lines(file)
        if lines == 0:
            wrong.append(f"{name}: no module docstring")
        elif lines > MAX_LINES and name not in ALLOWED_LONGER:
            wrong.append(f"{name}: module docstring of {lines} lines (at most {MAX_LINES})")
    assert not wrong, "\n".join(wrong)


def test_the_allow_list_names_modules_that_exist() -> None:
    missing = [name for name in ALLOWED_LONGER if not (REPO / name).is_file()]
    assert not missing, f"remove from ALLOWED_LONGER (no such module any more): {missing}"
