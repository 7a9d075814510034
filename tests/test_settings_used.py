"""No setting that does nothing: every field of `Settings`, nested groups too, is read by name
somewhere in the product outside `shared/config.py` (an attribute access, found with `ast`),
or its `EVOENV_*` variable is named in `deploy/` or `scripts/`. Dumping all the settings (a
start-up log line) reads no field by name, so it does not count."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from shared.config import Settings

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("shared", "evoenv_model", "evoenv_worker", "evoenv_learner", "evoenv_cli")
CONFIG = REPO / "shared" / "config.py"
ALLOWED: dict[str, str] = {}
"""Fields read in a way this test cannot see (dotted path: one line saying how)."""


def fields(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, info in model.model_fields.items():
        yield (*path, name)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from fields(info.annotation, (*path, name))


def attributes_read() -> set[str]:
    """Every attribute name accessed in the product's code, outside the settings module."""
    names: set[str] = set()
    for package in PRODUCT:
        for file in (REPO / package).rglob("*.py"):
            if file == CONFIG:
                continue
            tree = ast.parse(file.read_text(), str(file))
            names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    return names


def variables_named() -> str:
    return "\n".join(
        file.read_text()
        for folder in ("deploy", "scripts")
        for file in sorted((REPO / folder).rglob("*"))
        if file.is_file()
    )


def unused(settings: type[BaseModel], names: set[str], text: str) -> list[str]:
    return [
        ".".join(path)
        for path in fields(settings)
        if path[-1] not in names
        and "EVOENV_" + "__".join(part.upper() for part in path) not in text
        and ".".join(path) not in ALLOWED
    ]


def test_every_setting_is_read_somewhere() -> None:
    assert unused(Settings, attributes_read(), variables_named()) == []


def test_a_field_nobody_reads_is_found() -> None:
    class Group(BaseModel):
        max_staleness: int = 0
        nobody_reads_this: int = 0

    class Extended(Settings):
        group: Group = Group()

    named = variables_named() + "\nEVOENV_GROUP=x"
    assert unused(Extended, attributes_read(), named) == ["group.nobody_reads_this"]
