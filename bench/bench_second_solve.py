"""Does the second solve tell sound environments from unsound ones, beside the review?

Sound: the seed pool and `tests/corpus/sound/`; unsound: `tests/corpus/unsound/` (files that pass
L1-L5 but whose prompt does not ask what `solve` computes). For each file, on the embedded model
(or `--weights`, `--url`): the review stage as admission runs it (the baseline, K reviews) and
the second solve (`evoenv_worker/second_solve.py`, K written solves), each at the admission's
review temperature and seed. One line per file, then per kind: how many each check passes.

    python bench/bench_second_solve.py
    python bench/bench_second_solve.py --files tests/corpus/unsound/*.py   # some files only
    python bench/bench_second_solve.py --files candidates/*.py   # files of neither corpus: "given"
"""

from __future__ import annotations

import argparse
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_proposals import served  # the same server set-up as the proposals bench
from benchkit import REPO

from evoenv_worker.model_stages import review_stage, second_solve_of, trace_instance
from evoenv_worker.sandbox.host import Sandbox
from evoenv_worker.solver_completions import make_client
from shared.config import Settings
from shared.inference import InferenceClient
from shared.messages import EnvRef, StageJob

KINDS = {
    "sound": [
        *sorted((REPO / "seeds").glob("*.py")),
        *sorted((REPO / "tests/corpus/sound").glob("*.py")),
    ],
    "unsound": sorted((REPO / "tests/corpus/unsound").glob("*.py")),
}


def judge(
    client: InferenceClient, sandbox: Sandbox, path: Path, settings: Settings
) -> tuple[bool, bool, str, float, float]:
    """(review passes, second solve passes, second solve's agreements, seconds of each)."""
    source = path.read_text()
    traced = trace_instance(sandbox, source, path.name)
    assert traced is not None, f"{path}: the traced instance cannot be sampled"
    meta, trace = traced
    env = EnvRef(name=path.stem, sha=hashlib.sha256(source.encode()).hexdigest(), source=source)
    job = StageJob(
        job_id=f"bench-{path.stem}",
        run="bench",
        env=env,
        oracle=str(meta["oracle"]),
        difficulty=trace.difficulty,
        trace=trace,
        min_difficulty=int(meta["min_difficulty"]),
        max_difficulty=int(meta["max_difficulty"]),
    )
    started = time.perf_counter()
    review = review_stage(client, job, settings)  # second solves off: the reviews alone
    review_seconds = time.perf_counter() - started
    solves = settings.admission.model_copy(update={"second_solves": settings.admission.reviews})
    second = second_solve_of(
        client, job, settings.model_copy(update={"admission": solves}), sandbox
    )
    agreements = "/".join(str(n) for n in second.agreements) + f" of {second.instances}"
    return review.ok, second.ok, agreements, review_seconds, second.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--files",
        type=Path,
        nargs="+",
        default=None,
        help="only these files (any file: kind given)",
    )
    parser.add_argument("--weights", type=Path, default=None, help="a checkpoint (or model) folder")
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--parallel", type=int, default=4, help="files judged at once")
    args = parser.parse_args()
    chosen = {p.resolve() for p in args.files} if args.files else None
    base = Settings()
    counts: dict[str, list[int]] = {}
    lines = ["| kind | file | review | second solve | agreements | s review | s second |",
             "| --- | --- | --- | --- | --- | ---: | ---: |"]  # fmt: skip
    todo = [
        (kind, path)
        for kind, paths in KINDS.items()
        for path in paths
        if chosen is None or path.resolve() in chosen
    ]
    known = {path.resolve() for _, path in todo}
    todo += [("given", p) for p in args.files or [] if p.resolve() not in known]
    with (
        served(base, args.url, args.weights) as settings,
        make_client(settings) as client,
        Sandbox(settings.sandbox) as sandbox,
        ThreadPoolExecutor(max_workers=args.parallel) as pool,
    ):
        judged = pool.map(lambda item: judge(client, sandbox, item[1], settings), todo)
        for (kind, path), (review, second, agreements, rs, ss) in zip(todo, judged, strict=True):
            tally = counts.setdefault(kind, [0, 0, 0, 0])
            tally[0] += 1
            tally[1] += review
            tally[2] += second
            tally[3] += review and second
            lines.append(
                f"| {kind} | {path.stem} | {'pass' if review else 'reject'} | "
                f"{'pass' if second else 'reject'} | {agreements} | {rs:.0f} | {ss:.0f} |"
            )
            print(lines[-1], flush=True)
    print(f"\nmodel: {args.url or args.weights or base.model}")
    print("\n".join(lines))
    print("\n| kind | files | review passes | second solve passes | both pass |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for kind, tally in counts.items():
        print("| " + " | ".join([kind, *map(str, tally)]) + " |")


if __name__ == "__main__":
    main()
