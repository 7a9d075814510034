"""The memory of `evoenv up` and everything it started, sampled every `EVERY` seconds into
RUN/logs/memory.jsonl, and its peak for the run report. Proportional set sizes (PSS) are summed,
so pages that processes share (Celery's forked pool, common libraries) count once; the resident
sum (RSS) is recorded beside it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVERY = 10.0
"""Seconds between samples."""
MEMORY_LOG = "memory.jsonl"
_KIB = 1024


@dataclass(frozen=True)
class ProcessMemory:
    pss: int
    """Bytes, proportional set size."""
    rss: int
    """Bytes, resident set size."""


def process_memory(pid: int) -> ProcessMemory | None:
    """One process's PSS and RSS; None if it is gone (or /proc is not readable)."""
    fields: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Pss", "Rss"):
            fields[key] = int(rest.split()[0]) * _KIB
    if "Pss" in fields and "Rss" in fields:
        return ProcessMemory(fields["Pss"], fields["Rss"])
    try:  # no smaps_rollup: the resident size for both
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    rss = pages * os.sysconf("SC_PAGE_SIZE")
    return ProcessMemory(rss, rss)


def sample(groups: dict[str, set[int]]) -> dict[str, Any]:
    """One sample: for each named group of pids (a child and its descendants; `up` itself),
    its PSS in GiB, and the totals of PSS and RSS over every pid."""
    by_group: dict[str, float] = {}
    total_pss = total_rss = 0
    for name, pids in groups.items():
        pss = 0
        for pid in pids:
            memory = process_memory(pid)
            if memory is not None:
                pss += memory.pss
                total_rss += memory.rss
        by_group[name] = round(pss / 2**30, 3)
        total_pss += pss
    return {
        "time": round(time.time(), 1),
        "pss_gib": round(total_pss / 2**30, 3),
        "rss_gib": round(total_rss / 2**30, 3),
        "by_child": by_group,
    }


def append(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def read(path: Path) -> list[dict[str, Any]]:
    """The samples in `path`, oldest first (unreadable lines skipped; none if no file)."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "pss_gib" in record:
            records.append(record)
    return records


def peak(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sample with the largest total PSS, and each child's own largest PSS over the run."""
    if not records:
        return None
    top = max(records, key=lambda r: float(r["pss_gib"]))
    by_child: dict[str, float] = {}
    for record in records:
        for name, gib in dict(record.get("by_child", {})).items():
            by_child[name] = max(by_child.get(name, 0.0), float(gib))
    return {
        "pss_gib": top["pss_gib"],
        "rss_gib": top.get("rss_gib"),
        "at": top["time"],
        "samples": len(records),
        "by_child_peak": by_child,
        "seconds": round(float(records[-1]["time"]) - float(records[0]["time"]), 1),
    }
