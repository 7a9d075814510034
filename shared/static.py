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
    problem = _forbidden(tree) or _introspection(tree)
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


INTROSPECTION_ATTRIBUTES = frozenset(
    [
        *("f_back", "f_builtins", "f_code", "f_globals", "f_locals", "f_trace", "f_lasti"),
        *("f_lineno", "f_generator", "f_trace_lines", "f_trace_opcodes"),
        *("settrace", "setprofile", "gettrace", "getprofile", "exc_info", "last_traceback"),
        *("last_exc", "last_value", "last_type"),
    ]
)
"""Attributes that reach frames, code objects and tracebacks: the runner's state, beyond what
a routine is given (with the prefixes of `INTROSPECTION_PREFIXES`)."""
INTROSPECTION_PREFIXES = ("co_", "gi_", "cr_", "ag_", "tb_")
"""Code objects' (co_code, co_consts, ...), generators', coroutines', async generators' and
tracebacks' attributes: gi_frame, cr_frame, ag_frame, tb_frame, tb_next, ..."""


def _introspection(tree: ast.Module) -> str | None:
    """Why the file reaches beyond what its routines are given, or None: an attribute that
    leads to frames, code or tracebacks (`INTROSPECTION_ATTRIBUTES`), and any private
    attribute (`_name`) but the object's own (`_own_private`), whether read as an attribute,
    a keyword of a class pattern (`case C(f_back=x)`) or an imported name."""
    own = _own_private(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.MatchClass):
            names = list(node.kwd_attrs)
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name in INTROSPECTION_ATTRIBUTES or name.startswith(INTROSPECTION_PREFIXES):
                return (
                    f"line {line}: the attribute {name!r} is forbidden (it reaches frames, code "
                    "objects or tracebacks)"
                )
            if name.startswith("_") and not _is_dunder(name) and node not in own:
                return (
                    f"line {line}: the private attribute {name!r} is forbidden (only the "
                    "object's own private attributes, through self or cls, are allowed)"
                )
    return None


def _own_private(tree: ast.Module) -> set[ast.AST]:
    """The private attribute nodes that are the object's own: `first._name`, where `first` is
    the first parameter of a method (a function in a class body, not a staticmethod) bound
    nowhere else in it, read directly in that method or in a function or lambda nested in it
    that does not bind `first` again, and `_name` a name some class of the file defines (a
    method, a class attribute, or an assignment to `first._name` in a method). Anything else
    (a module's `random._os`, another object's `x._name`) is not."""
    defined: set[str] = set()
    methods: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]] = []
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(item.name)
                first = _first_parameter(item)
                if first is not None:
                    methods.append((item, first))
            targets = item.targets if isinstance(item, ast.Assign) else []
            if isinstance(item, (ast.AnnAssign, ast.AugAssign)):
                targets = [item.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
    candidates: list[ast.Attribute] = []
    for method, first in methods:
        rebound = any(
            isinstance(node, ast.Name) and node.id == first and not isinstance(node.ctx, ast.Load)
            for node in ast.walk(method)
        )
        if rebound:
            continue
        for node in _scope_walk(method, first):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == first
                and node.attr.startswith("_")
            ):
                candidates.append(node)
                if not isinstance(node.ctx, ast.Load):
                    defined.add(node.attr)
    return {node for node in candidates if node.attr in defined}


def _first_parameter(method: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The name of a method's first positional parameter (None: a staticmethod, or none)."""
    if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in method.decorator_list):
        return None
    positional = [*method.args.posonlyargs, *method.args.args]
    return positional[0].arg if positional else None


def _scope_walk(method: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> list[ast.AST]:
    """The nodes of `method` where `name` is still its first parameter: not inside a nested
    function or lambda that has a parameter of that name, nor inside a nested class."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = list(ast.iter_child_nodes(method))
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ClassDef):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            if any(a.arg == name for a in every):
                continue
        found.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return found


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


def declared_oracle(data: bytes) -> str:
    """The oracle the file's environment class declares, read from its syntax tree as L1 reads
    it whatever else L1 finds in the file (`equality` where it declares none, or the file has
    no single environment class): a grader's view of an environment admitted before a rule it
    breaks."""
    try:
        tree = ast.parse(data.decode("utf-8-sig"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "equality"
    return _check_class(tree).oracle
