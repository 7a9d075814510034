"""Text that environments and paths put on a terminal, shown as data (`plain`, `cell`): control
characters, bidirectional overrides and lone surrogates escaped, never read as Rich markup."""

from __future__ import annotations

import re

from rich.text import Text

_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    "\ud800-\udfff]"
)
"""C0 and C1 controls and DEL (tab and newline apart), the bidirectional marks and overrides,
the line and paragraph separators, and surrogates (a lone one cannot be written as UTF-8)."""
_BREAKS = re.compile("[\t\n]")


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
