"""The help pages a newcomer reads: plain text wrapped to the terminal, one example a command,
and each parameter named by what it takes (`--seed SEED`), never by its Python type."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from typer.core import TyperArgument, TyperOption

EXAMPLES: dict[tuple[str, ...], str] = {
    ("seeds",): "evoenv seeds --json",
    ("sample",): "evoenv sample sort_words --seed 3 --difficulty 5",
    ("validate",): "evoenv validate --all my_env.py",
    ("worker",): "evoenv worker -Q grading -c 2",
    ("flower",): "EVOENV_FLOWER__PORT=5556 evoenv flower",
    ("status",): "evoenv status --json",
    ("job",): "evoenv job 3f2c9a1e-5b7d-4c1a-9e0f-2b6d8a4c7e10 --json",
    ("serve",): "evoenv serve --port 8001",
    ("learner",): "evoenv learner --resume --steps 100",
    ("export",): "evoenv export ./policy",
    ("eval",): "evoenv eval -e sort_words -d 3 -n 64 --json",
    ("report",): "evoenv report -o ./report",
    ("up",): "evoenv up --steps 20",
    ("model", "prepare"): "evoenv model prepare --force",
    ("model", "list"): "evoenv model list",
    ("pool", "list"): "evoenv pool list --all",
    ("pool", "show"): "evoenv pool show count_vowels",
    ("pool", "add"): "evoenv pool add my_env.py",
    ("pool", "export"): "evoenv pool export --format jsonl -n 200 ./data",
    ("pool", "serve"): "evoenv pool serve --port 8100",
    ("pool", "retire"): "evoenv pool retire count_vowels",
}
"""One example a command, shown at the end of its help page."""


class _NamedArgument(TyperArgument):
    """An argument whose help shows its name (FILES...), not its Python type (<list[Path]>)."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def command(app: typer.Typer) -> Any:
    """`app`'s command with the help pages above: typer prints `<int>`, `<bool>` and
    `<list[Path]>` beside every parameter and has no setting against it; an option's metavar
    (its name in capitals) replaces the type, and an argument shows its name alone."""
    for typer_app in (app, *(group.typer_instance for group in app.registered_groups)):
        if typer_app is not None:
            typer_app.rich_markup_mode = None  # plain text: paragraphs rewrapped to the width
    root = typer.main.get_command(app)
    for path, found in _commands(root):
        if path in EXAMPLES:
            found.epilog = f"Example: {EXAMPLES[path]}"
        for param in found.params:
            if isinstance(param, TyperArgument):
                param.__class__ = _NamedArgument
                param.metavar = param.metavar or param.name.upper()
            elif isinstance(param, TyperOption) and not param.is_flag and param.metavar is None:
                param.metavar = param.name.upper()
        if getattr(found, "commands", None) is None and found.help:  # its line in the list
            found.short_help = found.help.split("\n\n", 1)[0].replace("\n", " ")
    return root


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))
