"""The generator's side in the worker: getting the code back out of a proposal's response (the
prompt itself is built by `shared/proposal_prompt.py`). The candidate is the file as the model
wrote it (`written_code`); what extraction would complete (`repairs`: helpers and imports it
uses but never defines) only names, in a failing stage's detail, what the file lacked.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from shared.static import ALLOWED_MODULES, BASE_CLASS, BASE_MODULE


def prompt_text(messages: Sequence[Mapping[str, str]]) -> str:
    """A chat prompt as one text (what a generation group records, and where `repairs` finds
    the example files)."""
    return "\n\n".join(m["content"] for m in messages)


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_START = re.compile(r"^(?:from|import|class|\"\"\"|#)\b", re.MULTILINE)


def written_code(text: str) -> str:
    """The environment file in a response, as the model wrote it (the candidate admission
    judges and the generator is rewarded for): the fenced block that defines a class (the
    last such, else the longest fence), or an unterminated fence, or the text from the first
    line that starts code. Empty when there is nothing that looks like code (L1 rejects it)."""
    blocks = _FENCE.findall(text)
    with_class = [b for b in blocks if re.search(r"^class\s", b, re.MULTILINE)]
    if with_class:
        return with_class[-1].strip() + "\n"
    if blocks:
        return max(blocks, key=len).strip() + "\n"
    opened = re.search(r"```[ \t]*(?:python|py|python3)?[ \t]*\n", text, re.IGNORECASE)
    if opened:
        return text[opened.end() :].strip() + "\n"
    start = _START.search(text)
    return text[start.start() :].strip() + "\n" if start else ""


def repaired_code(text: str, prompt: str = "") -> str:
    """`written_code` completed with `with_missing_helpers` (from the examples in `prompt`)
    and `with_missing_imports`: what the file would have been with the boilerplate it dropped.
    Never judged or rewarded (the reward is for what the model wrote)."""
    return with_missing_imports(with_missing_helpers(written_code(text), prompt))


def repairs(text: str, prompt: str = "") -> list[str]:
    """What `repaired_code` adds to the written file, each as one short text: the import
    lines, then the example's helpers by name (`_parse_int (the example's helper)`); empty
    when nothing is missing."""
    code = written_code(text)
    completed = with_missing_helpers(code, prompt)
    helpers = missing_helpers(code, prompt) if completed != code else {}
    imports = missing_imports(completed)
    return [line.strip() for line in imports] + [f"{n} (the example's helper)" for n in helpers]


def with_missing_helpers(code: str, prompt: str) -> str:
    """`code` with the module-level functions and constants of the example files shown in
    `prompt` that it calls but never defines, copied in above its first class (with those they
    use in turn). A proposal writes its own class and calls the example's `_parse_int` without
    defining it (L2: "name '_parse_int' is not defined", 5 of 44 candidates in a half-hour
    `evoenv up` run): the helper it meant is the one it was shown (named in the failing
    stage's detail, never judged: `repairs`). Code or examples that do not parse are left as
    they are."""
    added = missing_helpers(code, prompt)
    if not added:
        return code
    tree = ast.parse(code)
    first = next((node for node in tree.body if isinstance(node, ast.ClassDef)), None)
    if first is None:
        return code  # no class: L1 rejects it whatever is added
    helpers = "".join(source + "\n\n\n" for source in added.values())
    lines = code.splitlines(keepends=True)
    at = min([first.lineno, *(d.lineno for d in first.decorator_list)]) - 1
    return "".join(lines[:at]) + helpers + "".join(lines[at:])


def missing_helpers(code: str, prompt: str) -> dict[str, str]:
    """The example helpers (`shown_helpers`) that `code` calls but never defines, with those
    they use in turn, by name in the order shown; empty when the code or no example parses."""
    shown = shown_helpers(prompt)
    if not shown:
        return {}
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return {}
    bound, loaded = _names(tree)
    wanted = [name for name in shown if name in loaded - bound]
    added: set[str] = set()
    while wanted:
        name = wanted.pop(0)
        if name in added:
            continue
        added.add(name)
        _, uses = _names(ast.parse(shown[name]))
        wanted += [n for n in shown if n in uses - bound and n not in added]
    return {name: source for name, source in shown.items() if name in added}


@functools.lru_cache(maxsize=16)
def shown_helpers(prompt: str) -> Mapping[str, str]:
    """The module-level functions and single-name constants of the Python files fenced in a
    proposal prompt, by name, in the order shown (the first definition of a name wins).
    Cached: every candidate of a group is completed from the same prompt."""
    helpers: dict[str, str] = {}
    for block in _FENCE.findall(prompt):
        try:
            body = ast.parse(block).body
        except SyntaxError:
            continue
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                name = node.targets[0].id
            else:
                continue
            segment = ast.get_source_segment(block, node, padded=False)
            if segment is not None and name not in helpers:
                helpers[name] = segment
    return MappingProxyType(helpers)


def with_missing_imports(code: str) -> str:
    """`code` with `import m` added for each allowlisted standard-library module `m` that it
    uses as `m.name` but never binds (imports, assigns or takes as an argument); with
    `from m import name` for a bare name it uses but never binds that an allowlisted module
    exports (`deque`, `lru_cache`, `gcd`; `MODULE_ORDER` decides a name several export); and
    with `from shared.environment import Environment` when a class derives from an unbound
    `Environment`. Imitating an example, the 0.5B generator drops `import random` /
    `import re` (L2: "name 're' is not defined"), `from collections import deque`, and now and
    then the base class's import (L1: "the file does not import Environment", 3 of 16
    candidates in a half-hour `evoenv up` run). Such a file fails as written; what this adds
    is only named in the failing stage's detail (`repairs`). Nothing else is changed; code
    that does not parse is returned as it is."""
    missing = missing_imports(code)
    if not missing:
        return code
    tree = ast.parse(code)
    body = tree.body
    first = 0 if ast.get_docstring(tree, clean=False) is None else 1
    while first < len(body) and _is_future_import(body[first]):
        first += 1
    lines = code.splitlines(keepends=True)
    at = body[first].lineno - 1 if first < len(body) else len(lines)
    return "".join(lines[:at]) + "".join(missing) + "".join(lines[at:])


def missing_imports(code: str) -> list[str]:
    """The import lines `with_missing_imports` adds to `code` (each ending in a newline);
    empty when nothing is missing or the code does not parse."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    bound, loaded = _names(tree)
    attribute_of = {
        node.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    unbound = loaded - bound
    missing = [f"import {m}\n" for m in sorted(unbound & attribute_of & _IMPORTABLE)]
    exported = _exported_names()
    missing += [
        f"from {exported[name]} import {name}\n"
        for name in sorted(unbound - _IMPORTABLE)
        if name in exported
    ]
    bases = {
        base.id
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Name)
    }
    if BASE_CLASS in bases - bound:
        missing.append(f"from {BASE_MODULE} import {BASE_CLASS}\n")
    return missing


_IMPORTABLE = ALLOWED_MODULES - {"__future__"}

MODULE_ORDER = (
    "collections",
    "itertools",
    "functools",
    "math",
    "heapq",
    "bisect",
    "fractions",
    "decimal",
    "string",
    "statistics",
    "operator",
    "random",
    "re",
    "json",
    "dataclasses",
    "enum",
    "typing",
)
"""Where a bare name several allowlisted modules export is imported from, first wins
(`Counter` from collections, not typing)."""


@functools.cache
def _exported_names() -> dict[str, str]:
    """Public names of the allowlisted modules (standard library only, never the file's code),
    except builtins and one-letter names (`math.e`), each with the module it comes from."""
    exported: dict[str, str] = {}
    order = [m for m in MODULE_ORDER if m in _IMPORTABLE]
    order += sorted(_IMPORTABLE - set(order))
    for module_name in order:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if n[:1] != "_"]
        for name in names:
            if len(name) > 1 and not name.startswith("_") and not hasattr(builtins, name):
                exported.setdefault(name, module_name)
    return exported


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(names the code binds anywhere: assignments, imports, definitions, arguments,
    exception names; names it reads)."""
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, loaded


def _is_future_import(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"
