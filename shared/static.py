"""L1, the static stage: what can be told from the source without running it, as
docs/CONTRACT.md#l1-static lists it (`check_static`). Module-level mutable state cannot be
told apart statically from constants: L3 catches state carried across calls.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from shared.environment import ORACLE_KINDS, is_snake_case

ALLOWED_MODULES = frozenset(
    [
        "random",
        "math",
        "itertools",
        "functools",
        "collections",
        "heapq",
        "bisect",
        "fractions",
        "decimal",
        "string",
        "re",
        "json",
        "statistics",
        "operator",
        "typing",
        "dataclasses",
        "enum",
        "__future__",
    ]
)
BASE_MODULE = "shared.environment"
BASE_CLASS = "Environment"
FORBIDDEN_NAMES = frozenset(
    [
        "eval",
        "exec",
        "compile",
        "__import__",
        "open",
        "input",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
    ]
)
ROUTINES = ("sample", "solve", "render", "score")


@dataclass(frozen=True, slots=True)
class StaticResult:
    ok: bool
    detail: str
    name: str | None = None
    oracle: str = "equality"
    difficulties: tuple[int, int] = (1, 10)
    """min and max difficulty when written as literals (else the base class's 1 and 10)."""


def check_static(data: bytes, max_bytes: int) -> StaticResult:
    """Run L1 on the raw bytes of a file."""
    if not data.strip():
        return StaticResult(False, "the file is empty")
    if len(data) > max_bytes:
        # "more than": a file named on the command line is read only up to the limit + 1 byte.
        return StaticResult(False, f"the file has more than {max_bytes} bytes (the limit)")
    try:
        source = data.decode("utf-8-sig")  # a byte-order mark is valid UTF-8 too
    except UnicodeDecodeError as exc:
        return StaticResult(False, f"the file is not UTF-8 text (byte {exc.start})")
    if "\x00" in source:
        return StaticResult(False, "the file contains NUL bytes (binary?)")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return StaticResult(False, f"syntax error on line {exc.lineno}: {exc.msg}")
    except (ValueError, RecursionError, MemoryError) as exc:
        return StaticResult(False, f"the file does not parse: {exc}")
    problem = _forbidden(tree)
    if problem:
        return StaticResult(False, problem)
    return _check_class(tree)


def _forbidden(tree: ast.Module) -> str | None:
    base_aliases = _base_aliases(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _allowed_module(alias.name):
                    return f"line {line}: import of {alias.name!r} is not allowed (stdlib allowlist only)"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                return f"line {line}: relative imports are not allowed"
            if not _allowed_module(module):
                return f"line {line}: import from {module!r} is not allowed (stdlib allowlist only)"
            for alias in node.names:
                if alias.name == "*":
                    return f"line {line}: 'from {module} import *' is not allowed"
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return f"line {line}: the name {node.id!r} is forbidden"
        elif isinstance(node, ast.Name) and _is_dunder(node.id) and node.id != "__name__":
            return f"line {line}: the name {node.id!r} is forbidden (dunder names)"
        elif isinstance(node, ast.Attribute) and _is_dunder(node.attr) and node.attr != "__init__":
            return f"line {line}: the attribute {node.attr!r} is forbidden (dunder attributes)"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in FORBIDDEN_NAMES or (_is_dunder(node.name) and node.name != "__init__"):
                return f"line {line}: defining {node.name!r} is forbidden"
        elif isinstance(node, ast.alias) and node.asname in FORBIDDEN_NAMES:
            return f"line {line}: importing as {node.asname!r} is forbidden"
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            return f"line {line}: 'global'/'nonlocal' state is not allowed"
    if not base_aliases:
        return "the file does not import Environment from shared.environment"
    return None


def _allowed_module(module: str) -> bool:
    return module == BASE_MODULE or module.split(".")[0] in ALLOWED_MODULES


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _base_aliases(tree: ast.Module) -> set[str]:
    """Names under which the file can refer to `Environment` (plain or dotted)."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == BASE_MODULE:
            aliases |= {a.asname or a.name for a in node.names if a.name == BASE_CLASS}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == BASE_MODULE:
                    prefix = alias.asname or BASE_MODULE
                    aliases.add(f"{prefix}.{BASE_CLASS}")
    return aliases


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _check_class(tree: ast.Module) -> StaticResult:
    aliases = _base_aliases(tree)
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    derived: dict[str, ast.ClassDef] = {}
    changed = True
    while changed:  # transitively: classes of this file deriving from Environment
        changed = False
        for name, node in classes.items():
            if name in derived:
                continue
            bases = {_dotted(base) for base in node.bases}
            if bases & aliases or bases & set(derived):
                derived[name] = node
                changed = True
    if len(derived) != 1:
        names = ", ".join(sorted(derived)) or "none"
        return StaticResult(
            False,
            f"expected exactly one class deriving from Environment, found {len(derived)} ({names})",
        )
    (cls,) = derived.values()
    lineage = _lineage(cls, classes)
    methods = {item.name for c in lineage for item in c.body if isinstance(item, ast.FunctionDef)}
    missing = [routine for routine in ROUTINES if routine not in methods]
    if missing:
        return StaticResult(False, f"class {cls.name} does not define {', '.join(missing)}")
    attrs = _class_constants(lineage)
    env_name = attrs.get("name")
    if not is_snake_case(env_name):
        return StaticResult(
            False, f"class {cls.name}: name must be a snake_case string literal, got {env_name!r}"
        )
    oracle = attrs.get("oracle", "equality")
    if oracle not in ORACLE_KINDS:
        return StaticResult(
            False, f"oracle must be one of {', '.join(ORACLE_KINDS)}, got {oracle!r}", str(env_name)
        )
    lo, hi = attrs.get("min_difficulty", 1), attrs.get("max_difficulty", 10)
    levels = (lo, hi) if type(lo) is int and type(hi) is int and lo <= hi else (1, 10)
    return StaticResult(
        True, f"class {cls.name} ({env_name}, {oracle})", str(env_name), str(oracle), levels
    )


def _lineage(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> list[ast.ClassDef]:
    """The class and its ancestors defined in the same file, nearest first."""
    seen = [cls]
    for base in cls.bases:
        parent = classes.get(_dotted(base) or "")
        if parent is not None and parent not in seen:
            seen.extend(c for c in _lineage(parent, classes) if c not in seen)
    return seen


def _class_constants(lineage: list[ast.ClassDef]) -> dict[str, object]:
    values: dict[str, object] = {}
    for cls in reversed(lineage):  # nearest definition wins
        for item in cls.body:
            targets: list[ast.expr] = []
            if isinstance(item, ast.Assign):
                targets, value = item.targets, item.value
            elif isinstance(item, ast.AnnAssign) and item.value is not None:
                targets, value = [item.target], item.value
            for target in targets:
                if isinstance(target, ast.Name):
                    try:
                        values[target.id] = ast.literal_eval(value)
                    except (ValueError, TypeError, SyntaxError, RecursionError):
                        values[target.id] = "<not a literal>"
    return values
