"""Text that environments and paths put on a terminal, shown as data (`plain`, `cell`): control
characters, bidirectional overrides and lone surrogates escaped, never read as Rich markup."""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    "\ud800-\udfff]"
)
"""C0 and C1 controls and DEL (tab and newline apart), the bidirectional marks and overrides,
the line and paragraph separators, and surrogates (a lone one cannot be written as UTF-8)."""
_BREAKS = re.compile("[\t\n]")
UNBOUNDED = 10_000
"""A width no table reaches: where `print_table` measures what a table needs."""
SHOWN_SHA = 10
"""How many hex digits of a sha `pool list` shows (as the pool's web page does): enough for
`Archive.find`."""


def plain(text: object, *, lines: bool = False) -> str:
    """`text` safe to print: each unsafe character as its Python escape (`\\x1b`, `\\u202e`,
    `\\ud800`); tabs and newlines too, unless `lines` (a prompt keeps its lines)."""
    shown = _UNSAFE.sub(_escaped, str(text))
    return shown if lines else _BREAKS.sub(_escaped, shown)


def cell(text: object) -> Text:
    """`text` as a table cell: `plain`, and never read as markup."""
    return Text(plain(text))


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def whole_column(table: Table, header: str, values: Iterable[object]) -> None:
    """Add to `table` a column that never cuts nor wraps its values (names, shas), as `plain`
    shows them: as wide as the widest, so that the other columns give way."""
    width = max([cell_len(plain(value)) for value in values] + [cell_len(header)])
    table.add_column(header, no_wrap=True, min_width=width)


def print_table(console: Console, table: Table) -> None:
    """Print `table` without cutting a word: in the console's width where its columns fit,
    else in the width they need at the least (a terminal then wraps its lines; a pipe keeps
    them). Columns that must not wrap at all are `whole_column`s."""
    needed = Measurement.get(console, console.options.update_width(UNBOUNDED), table).minimum
    if needed <= console.width:
        console.print(table)
        return
    console.print(Segments(console.render(table, console.options.update_width(needed))), crop=False)
