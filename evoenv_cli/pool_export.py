"""`evoenv pool export`: the pool as environment files (`files`), as an installable package of
reasoning-gym-style datasets (`reasoning-gym`: `evoenv_pool`, built from `pool_package/`), the
same package as a verifiers environment too (`verifiers`), or as JSON lines of fixed instances
(`jsonl`). Environment code runs only in the sandbox."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from evoenv_cli.envs import EXIT_ERROR, err, out
from evoenv_cli.terminal_text import plain
from shared import environment as base_module
from shared.errors import SandboxUnavailable, UsageError

if TYPE_CHECKING:
    from evoenv_worker.sandbox.host import OpResult, Sandbox
    from shared.config import Settings
    from shared.db import Archive, EnvironmentRow

FORMATS = ("files", "reasoning-gym", "verifiers", "jsonl")
PACKAGE_FORMATS = ("reasoning-gym", "verifiers")
"""The formats that write the installable package."""
SPLITS = {"train": base_module.TRAIN_SEEDS, "eval": base_module.EVAL_SEEDS}
"""Instance seeds of each split; `jsonl` item i uses seed `start + i` of its split."""
PACKAGE = "evoenv_pool"
"""The exported package's import name (distribution `evoenv-pool`)."""
TEMPLATE = Path(__file__).resolve().parent / "pool_package"
"""The exported package's own modules and README, copied as they are."""
BATCH = 256
"""Most instance operations sent to the sandbox in one request."""
POOL_JSON_FORMAT = 1
"""Version of the `pool.json` that `reasoning-gym`, `verifiers` and `jsonl` exports write."""

PACKAGE_DOCS = {
    "reasoning-gym": "An EvoEnv pool as reasoning-gym-style procedural datasets (see README.md). "
    "Written by\n`evoenv pool export --format reasoning-gym`; standard library only.",
    "verifiers": "An EvoEnv pool as reasoning-gym-style procedural datasets and a verifiers "
    "environment\n(see README.md). Written by `evoenv pool export --format verifiers`; standard "
    "library only\n(verifiers for its entry points).",
}
"""The docstring of the package's `__init__.py`, for each package format."""
PACKAGE_INIT = '''"""{doc}"""

from .dataset import (
    ALL,
    SPLITS,
    PoolDataset,
    create_dataset,
    extract_answer,
    metadata,
    names,
    score_answer,
    score_answers,
)
from .execution import EnvironmentFailed, SandboxNotAvailable

__all__ = [
    "ALL",
    "SPLITS",
    "EnvironmentFailed",
    "PoolDataset",
    "SandboxNotAvailable",
    "create_dataset",
    "extract_answer",
    "metadata",
    "names",
    "score_answer",
    "score_answers",
]
'''

VERIFIERS_INIT = '''
# verifiers' entry points (verifiers 0.3.1's `load_environment`, 0.4.0's taskset), imported on
# first use: they need verifiers, the datasets above do not.
_VERIFIERS = {"load_environment": "verifiers_env", "EvoEnvPoolTaskset": "verifiers_v1"}
__all__ += list(_VERIFIERS)


def __getattr__(name: str) -> object:
    if name in _VERIFIERS:
        from importlib import import_module

        return getattr(import_module(f".{_VERIFIERS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
'''
"""What `__init__.py` adds for `--format verifiers`: verifiers finds an environment by its id,
`evoenv-pool`, in the module `evoenv_pool`: its `load_environment` (0.3.1) or the `Taskset`
subclass its `__all__` names (0.4.0)."""
VERIFIERS_MODULES = ("verifiers_env.py", "verifiers_v1.py")
"""The template's modules that only `--format verifiers` copies."""

PACKAGE_PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "evoenv-pool"
version = "{version}"
description = "Procedural reasoning environments exported from an EvoEnv pool, as {shape}."
readme = "README.md"
requires-python = ">=3.11"
dependencies = []

[tool.setuptools]
packages = ["{package}", "{package}.environments"]

[tool.setuptools.package-data]
{package} = ["pool.json"]
"""


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """What to export, checked (`export_request`)."""

    folder: Path
    format: str = "files"
    statuses: tuple[str, ...] = ("seed", "admitted")
    """The archive statuses exported: seeds, admitted environments, or both."""
    difficulties: tuple[int, ...] = ()
    """Requested difficulties (each clamped into an environment's range); () for each one's
    default (`default_difficulty`)."""
    count: int = 100
    """`jsonl`: instances per environment and difficulty."""
    split: str = "train"
    """`jsonl`: the seed range instances come from."""


def export_request(
    folder: Path,
    fmt: str,
    *,
    seeds_only: bool = False,
    admitted_only: bool = False,
    difficulty: Sequence[str] = (),
    count: int | None = None,
    split: str | None = None,
) -> ExportRequest:
    """The command line's options as a request; `UsageError` (one line) for bad ones."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r} (one of: {', '.join(FORMATS)})")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is not a folder")
    if seeds_only and admitted_only:
        raise UsageError("--seeds-only and --admitted-only exclude each other")
    statuses = ("seed",) if seeds_only else ("admitted",) if admitted_only else ("seed", "admitted")
    if fmt != "jsonl" and (count is not None or split is not None):
        raise UsageError("--count and --split apply to --format jsonl only")
    if fmt == "files" and difficulty:
        raise UsageError("--difficulty applies to --format reasoning-gym, verifiers and jsonl only")
    levels = tuple(sorted({level for text in difficulty for level in _levels(text)}))
    if fmt in PACKAGE_FORMATS and len(levels) > 1:
        raise UsageError(f"--format {fmt} takes one --difficulty (the package's default)")
    if count is not None and count < 1:
        raise UsageError(f"--count must be at least 1, not {count}")
    if split is not None and split not in SPLITS:
        raise UsageError(f"--split must be train or eval, not {split!r}")
    return ExportRequest(folder, fmt, statuses, levels, count or 100, split or "train")


def _levels(text: str) -> range:
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if match is None:
        raise UsageError(f"--difficulty takes a level or a range LO-HI, not {text!r}")
    lo = int(match[1])
    hi = int(match[2] or lo)
    if hi < lo:
        raise UsageError(f"--difficulty {text}: the range is empty")
    return range(lo, hi + 1)


def export_pool(settings: Settings, archive: Archive, request: ExportRequest) -> None:
    """Write the export; prints one line on stdout when done, progress on stderr."""
    every = archive.environments()
    rows = sorted((r for r in every if r.status in request.statuses), key=lambda r: r.name)
    for row in [r for r in rows if not base_module.is_snake_case(r.name)]:
        # Admission admits snake_case names only; a name that is not (an archive written by
        # other means) would name a file outside the folder or a clash, so it is left out.
        err.print(f"skipped {row.name!r} ({row.sha[:12]}): not a snake_case name", markup=False)
        rows.remove(row)
    if not rows:
        which = " and ".join(request.statuses)
        raise UsageError(f"the pool has no environment of status {which} to export")
    try:
        request.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the folder {request.folder}: {exc.strerror}") from exc
    if request.format == "files":
        _write_files(rows, request.folder)
        written = f"{len(rows)} environments"
    else:
        named = {r.sha: r.name for r in every}
        with _sandbox(settings) as sandbox:
            package = request.format in PACKAGE_FORMATS
            requested = request.difficulties[0] if package and request.difficulties else None
            records = _describe(sandbox, rows, named, requested)
            if package:
                _write_package(rows, records, request.folder, request.format == "verifiers")
                written = f"{len(records)} environments as the package {PACKAGE}"
            else:
                lines = _write_jsonl(sandbox, rows, records, request)
                written = f"{lines} instances of {len(records)} environments"
    out.print(f"{written} written to {plain(request.folder)}", markup=False)


def _sandbox(settings: Settings) -> Sandbox:
    from evoenv_worker.sandbox.host import Sandbox

    sandbox = Sandbox(settings.sandbox)
    try:
        sandbox.start()
    except SandboxUnavailable as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_ERROR) from exc
    return sandbox


def _write_files(rows: list[EnvironmentRow], folder: Path) -> None:
    """NAME.py for each environment, and pool.json with `evoenv pool list --json`'s fields."""
    from evoenv_cli.pool import _summary

    for r in rows:
        (folder / f"{r.name}.py").write_text(r.source, "utf-8")
    (folder / "pool.json").write_text(json.dumps([_summary(r) for r in rows], indent=2), "utf-8")


def default_difficulty(row: EnvironmentRow, lo: int, hi: int) -> tuple[int, str]:
    """Where an environment is exported by default, and why: its serving difficulty, else the
    difficulty it was calibrated at (where the pool serves it before a search), else the middle
    of its range; clamped into its range."""
    stats = row.stats
    for level, source in (
        (stats.serving_difficulty, "serving"),
        (stats.calibration_difficulty, "calibration"),
    ):
        if level is not None:
            return min(max(level, lo), hi), source
    return (lo + hi) // 2, "middle"


def _describe(
    sandbox: Sandbox,
    rows: list[EnvironmentRow],
    named: dict[str, str],
    requested: int | None,
) -> dict[str, dict[str, Any]]:
    """Each loadable environment's metadata, from the archive and the sandbox's `describe`, its
    default difficulty `requested` (clamped) when given; one that cannot be loaded is left out
    with a line on stderr."""
    records: dict[str, dict[str, Any]] = {}
    for row in rows:
        (result,) = sandbox.run(row.source, [{"op": "describe"}], filename=f"{row.name}.py")
        if not result.ok:
            err.print(
                f"skipped {row.name}: it cannot be loaded ({plain(result.reason)})", markup=False
            )
            continue
        lo, hi = result.value["min_difficulty"], result.value["max_difficulty"]
        level, source = default_difficulty(row, lo, hi)
        if requested is not None:
            level, source = _clamped(row.name, (requested,), lo, hi)[0], "requested"
        calibration = row.stats.calibration
        records[row.name] = {
            "name": row.name,
            "sha": row.sha,
            "status": row.status,
            "origin": row.origin,
            "lineage": [{"sha": sha, "name": named.get(sha)} for sha in row.parents],
            "oracle": result.value["oracle"],
            "description": result.value["description"],
            "min_difficulty": lo,
            "max_difficulty": hi,
            "difficulty": level,
            "difficulty_from": source,
            "serving_difficulty": row.stats.serving_difficulty,
            "calibration": calibration.model_dump(exclude_none=True) if calibration else None,
            "calibration_difficulty": row.stats.calibration_difficulty,
            "file": f"environments/{row.name}.py",
        }
    if not records:
        raise UsageError("no environment of the selection can be loaded: nothing exported")
    return records


def _clamped(name: str, levels: Sequence[int], lo: int, hi: int) -> list[int]:
    """`levels` clamped into the range `lo`-`hi`, without repeats; a line on stderr if any
    was outside."""
    outside = [d for d in levels if not lo <= d <= hi]
    if outside:
        shown = ", ".join(map(str, outside))
        err.print(f"{name}: difficulty {shown} clamped into its range {lo}-{hi}", markup=False)
    return sorted({min(max(d, lo), hi) for d in levels})


def _pool_json(records: dict[str, dict[str, Any]], **extra: Any) -> str:
    from evoenv_worker import __version__

    return json.dumps(
        {
            "format": POOL_JSON_FORMAT,
            "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "evoenv_version": __version__,
            **extra,
            "environments": list(records.values()),
        },
        indent=2,
    )


def _write_package(
    rows: list[EnvironmentRow],
    records: dict[str, dict[str, Any]],
    folder: Path,
    verifiers: bool = False,
) -> None:
    """An installable package in `folder`: pyproject.toml, README.md and `evoenv_pool/` with its
    modules, its own copy of the base module, the sources and pool.json; with `verifiers`, its
    verifiers modules too. An earlier export of the package there is replaced; anything else of
    that name is refused."""
    package = folder / PACKAGE
    if package.exists() and not (package / "pool.json").is_file():
        raise UsageError(f"{package} exists and is not an earlier export: choose another folder")
    for stale in (package, folder / "build", folder / f"{PACKAGE}.egg-info"):
        if stale.is_dir():
            shutil.rmtree(stale)  # setuptools would build from its leftovers
    (package / "environments").mkdir(parents=True)
    for name in ("dataset.py", "execution.py", *(VERIFIERS_MODULES if verifiers else ())):
        shutil.copyfile(TEMPLATE / name, package / name)
    shutil.copyfile(Path(base_module.__file__), package / "environment.py")
    init = PACKAGE_INIT.format(doc=PACKAGE_DOCS["verifiers" if verifiers else "reasoning-gym"])
    if verifiers:
        init += VERIFIERS_INIT
    (package / "__init__.py").write_text(init, "utf-8")
    for row in rows:
        if row.name in records:
            (package / "environments" / f"{row.name}.py").write_text(row.source, "utf-8")
    (package / "pool.json").write_text(_pool_json(records), "utf-8")
    digest = hashlib.sha256(" ".join(sorted(r["sha"] for r in records.values())).encode())
    version = f"0.1.0+{digest.hexdigest()[:12]}"
    shape = "datasets and a verifiers environment" if verifiers else "datasets"
    (folder / "pyproject.toml").write_text(
        PACKAGE_PYPROJECT.format(
            version=version, package=PACKAGE, shape=f"reasoning-gym-style {shape}"
        ),
        "utf-8",
    )
    table = ["| name | oracle | difficulty (range) | origin |", "| --- | --- | --- | --- |"]
    table += [
        f"| `{r['name']}` | {r['oracle']} | {r['difficulty']} ({r['min_difficulty']}-"
        f"{r['max_difficulty']}) | {r['origin']} |"
        for r in records.values()
    ]
    readme = (TEMPLATE / "README.md").read_text("utf-8")
    if verifiers:
        readme += "\n" + (TEMPLATE / "VERIFIERS.md").read_text("utf-8")
    (folder / "README.md").write_text(readme + "\n" + "\n".join(table) + "\n", "utf-8")


def _write_jsonl(
    sandbox: Sandbox,
    rows: list[EnvironmentRow],
    records: dict[str, dict[str, Any]],
    request: ExportRequest,
) -> int:
    """`SPLIT.jsonl`: `count` instances per environment and difficulty, one JSON object a line
    (the reference and instance as JSON text, so that every line has the same columns), and
    pool.json. An instance the environment fails to make is left out, with a line on stderr."""
    seeds = SPLITS[request.split]
    path = request.folder / f"{request.split}.jsonl"
    lines = 0
    with path.open("w", encoding="utf-8") as file:
        for row in (r for r in rows if r.name in records):
            record = records[row.name]
            lo, hi = record["min_difficulty"], record["max_difficulty"]
            levels = request.difficulties or (record["difficulty"],)
            for level in _clamped(row.name, levels, lo, hi):
                started = time.monotonic()
                wanted = [seeds.start + i for i in range(request.count)]
                made = _instances(sandbox, row, wanted, level, _failure_note(row.name, level))
                for seed, value in made:
                    file.write(json.dumps(_line(record, request.split, seed, level, value)) + "\n")
                lines += len(made)
                took = time.monotonic() - started
                err.print(
                    f"{row.name}: {len(made)} instances at difficulty {level} ({took:.1f} s)",
                    markup=False,
                )
    (request.folder / "pool.json").write_text(_pool_json(records, split=request.split), "utf-8")
    return lines


def _instances(
    sandbox: Sandbox,
    row: EnvironmentRow,
    seeds: list[int],
    level: int,
    note: Callable[[int, str], None],
) -> list[tuple[int, dict[str, Any]]]:
    made = []
    for start in range(0, len(seeds), BATCH):
        batch = seeds[start : start + BATCH]
        ops = [{"op": "instance", "seed": seed, "difficulty": level} for seed in batch]
        results: list[OpResult] = sandbox.run(row.source, ops, filename=f"{row.name}.py")
        for seed, result in zip(batch, results, strict=True):
            trips = result.value.get("round_trip", {}) if result.ok else {}
            if result.ok and trips.get("instance") and trips.get("reference"):
                made.append((seed, result.value))
            else:
                note(seed, result.reason if not result.ok else "its output is not JSON")
    return made


def _failure_note(name: str, level: int) -> Callable[[int, str], None]:
    def note(seed: int, reason: str) -> None:
        err.print(
            f"{name}: left out seed {seed}, difficulty {level}: {plain(reason)}", markup=False
        )

    return note


def _line(
    record: dict[str, Any], split: str, seed: int, level: int, value: dict[str, Any]
) -> dict[str, Any]:
    return {
        "prompt": base_module.build_prompt(value["prompt"]),
        "answer": value["answer_text"].strip(),
        "reference": json.dumps(value["reference"]),
        "instance": json.dumps(value["instance"]),
        "environment": record["name"],
        "sha": record["sha"],
        "difficulty": level,
        "seed": seed,
        "split": split,
    }
