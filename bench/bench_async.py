"""Wall time per step of the asynchronous learner beside a synchronous generate-then-train loop.

    python bench/bench_async.py [--steps 6] [--env bench/tagged_word.py] [--difficulty 1]
        [--group-size 8] [--batch-groups 2] [--max-tokens 64] [--model smollm2-135m-instruct]
    python bench/bench_async.py --simulate sample=0.1,complete=13,grade=0.05,train=8,...

Where generation is a real share of a step (answers of ~170 tokens; measured 0.49x, simulated
0.50x on two cores, ~13 min):

    python bench/bench_async.py --model qwen2.5-coder-0.5b-instruct --env modular_power_sum \
        --difficulty 1 --steps 3 --max-tokens 256 --group-size 4 --batch-groups 1

Starts the real parts as tests/e2e does: a private Redis (append-only), `evoenv serve`'s vLLM
server on the small embedded model, `evoenv worker -Q generation` and `-Q grading`. Then runs
`evoenv learner --steps N` twice on them, each as a subprocess with a fresh run name and run
folder, on one environment at one difficulty, without generation groups:

- async: the learner as it is (`learner.solver_groups_in_flight` groups in flight, groups up to
  `learner.max_staleness` versions old trained, a push pausing the server between steps);
- sync: the same learner with `EVOENV_LEARNER__SYNCHRONOUS=true`: `grpo.batch_groups` groups
  at the current weights, then nothing until they are trained and pushed (the baseline).

The environment is a seed's name or a file, added to the run's archive as admitted (without
validation). The default, bench/tagged_word.py, is there because the small model answers no
seed in the <answer> format (no reward variance: nothing is trained); with a model that can,
e.g. `--model qwen2.5-coder-0.5b-instruct --env sort_words` on a GPU machine, use a seed.

Measured, from the learner's own records (its JSON log lines `train_step`, the records behind
its archive rows, and `weights_published`) and the workers' (Celery's "Task ... succeeded in"
lines): wall time per step as the mean interval between consecutive steps from step 1 on (the
first step, with the start-up, is the warm-up and left out), the trainer's seconds per step
(`StepMetrics.seconds`), the push (`push_seconds`: write the weights, pause the server, reload,
resume), and per group the seconds of its sample, complete (generation) and grade jobs.

On a CPU machine vLLM, the workers and the trainer share the same cores, so the async run's
stages slow each other down: those figures are printed as measured. The 0.67x target applies
where generation and training have their own hardware; for that the bench runs `simulate`, a
discrete-event model of both policies fed with the stage times of the sync run (where no two
stages overlap, so each was measured alone). Its assumptions:

- generation on its own accelerator: a group's complete job takes one of the measured complete
  times (drawn at random from them), whatever the number of groups in flight (batched
  decoding, far below the server's sequence limit);
- sample and grade jobs on `--grading-workers` grading processes of their own, first come
  first served, each taking one of the measured times;
- training on its own device: a step takes one of the measured trainer times; the push writes
  the weights (the measured write seconds, generation goes on), then pauses the server as the
  publisher does (`pause(mode="wait")`: requests in flight finish, new ones wait), reloads (the
  measured reload seconds) and resumes; the policy version then moves on;
- each group has reward variance (is trained) with the measured share of groups trained;
- async: the orchestrator's 0.5 s poll, `solver_groups_in_flight`, `stream_backlog`, the
  learner's queue of 4 x `batch_groups`, `max_staleness` (a group's version is the one it was
  generated at), batches of `batch_groups`; sync: rounds of `batch_groups`, an untrained group
  replaced at once, the next round when the push is done;
- nothing else costs time (metrics rows, Redis round trips, the consumer's reads).

The model's sync figure beside the measured sync figure checks it. Prints one Markdown table:
the measured (shared CPU) wall time per step of both modes and their ratio, the simulated
(separate hardware) ones with the ratio marked against the 0.67x target, and the stage times.
Everything it starts is killed at the end.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from benchkit import private_redis, start_process  # noqa: E402

from evoenv_cli.supervisor import descendants  # noqa: E402
from evoenv_learner.orchestrator import SEND_POLL_SECONDS  # noqa: E402
from evoenv_model.models import prepare_model  # noqa: E402
from evoenv_model.serve import VllmServer, start_server  # noqa: E402
from shared.config import LearnerSettings, ServeSettings, Settings  # noqa: E402
from shared.db import Archive  # noqa: E402
from shared.logging import configure_logging  # noqa: E402
from shared.ports import free_port  # noqa: E402

CLI = [sys.executable, "-c", "from evoenv_cli import main; main()", "-v"]
TARGET = 0.67
"""Async wall time per step at most this share of the synchronous loop's (own hardware)."""
TASK_LINE = re.compile(
    r"Task evoenv\.(sample|complete|grade)\[[^\]]+\] succeeded in ([0-9.eE+-]+)s"
)


# ------------------------------------------------------------------------------ the cluster


def kill_tree(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM a process and wait, then SIGKILL it and everything below it (sandboxes run in
    sessions of their own)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)


@dataclass
class Run:
    """What one learner run recorded."""

    mode: str
    step_times: list[float]
    """Seconds since the epoch at which each step's metrics were recorded."""
    train: list[float]
    push: list[float]
    write: list[float]
    reload: list[float]
    stages: dict[str, list[float]]
    """sample / complete / grade: seconds of each job of this run."""
    trained_groups: int
    skipped_groups: int
    stale_dropped: int
    seconds: float

    @property
    def per_step(self) -> float:
        """Mean interval between consecutive steps from step 1 on (step 1 is the warm-up)."""
        times = self.step_times
        return (times[-1] - times[0]) / (len(times) - 1)

    @property
    def trainable(self) -> float:
        return self.trained_groups / max(1, self.trained_groups + self.skipped_groups)


def learner_run(
    mode: str, args: argparse.Namespace, env: dict[str, str], work: Path, worker_logs: list[Path]
) -> Run:
    name = f"bench-async-{mode}-{uuid.uuid4().hex[:8]}"
    run_dir = work / name
    run_env = {
        **env,
        "EVOENV_RUN": name,
        "EVOENV_LEARNER__RUN_DIR": str(run_dir),
        "EVOENV_LEARNER__ENVIRONMENTS": json.dumps([args.env]),
        "EVOENV_LEARNER__DIFFICULTY": str(args.difficulty),
        "EVOENV_LEARNER__GENERATOR_GROUPS_IN_FLIGHT": "0",
        "EVOENV_LEARNER__CHECKPOINT_EVERY": "100000",
        "EVOENV_LEARNER__EVAL_EVERY": "100000",
        "EVOENV_LEARNER__SYNCHRONOUS": str(mode == "sync").lower(),
        "EVOENV_GRPO__GROUP_SIZE": str(args.group_size),
        "EVOENV_GRPO__BATCH_GROUPS": str(args.batch_groups),
        "EVOENV_GRPO__MAX_TOKENS": str(args.max_tokens),
    }
    log_path = work / f"{name}.log"
    offsets = [path.stat().st_size for path in worker_logs]
    print(f"{mode}: evoenv learner --steps {args.steps} (log: {log_path})", flush=True)
    begin = time.monotonic()
    learner = start_process([*CLI, "learner", "--steps", str(args.steps)], run_env, log_path)
    try:
        code = learner.wait(args.timeout)
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(
            f"the {mode} learner did not finish in {args.timeout:g} s; see {log_path}"
        ) from exc
    finally:
        kill_tree(learner, grace=10.0)  # stopped or interrupted: nothing of it is left
    seconds = time.monotonic() - begin
    if code != 0:
        raise SystemExit(f"the {mode} learner failed (exit {code}); see {log_path}")
    steps = [e for e in json_lines(log_path) if e.get("event") == "train_step"]
    published = [e for e in json_lines(log_path) if e.get("event") == "weights_published"]
    if len(steps) < 2:
        raise SystemExit(f"the {mode} learner recorded {len(steps)} steps; see {log_path}")
    stages: dict[str, list[float]] = {"sample": [], "complete": [], "grade": []}
    for path, offset in zip(worker_logs, offsets, strict=True):
        with path.open("rb") as log:
            log.seek(offset)
            for line in log.read().decode("utf-8", "replace").splitlines():
                if match := TASK_LINE.search(line):
                    stages[match.group(1)].append(float(match.group(2)))
    last = steps[-1]
    return Run(
        mode=mode,
        step_times=[timestamp(e) for e in steps],
        train=[float(e["seconds"]) for e in steps[1:]],
        push=[float(e["push_seconds"]) for e in steps[1:] if "push_seconds" in e],
        write=[float(e["write_seconds"]) for e in published[1:]],
        reload=[float(e["push_seconds"]) for e in published[1:]],
        stages=stages,
        trained_groups=sum(len(e.get("groups_trained", [])) for e in steps),
        skipped_groups=int(last.get("zero_variance_skipped", 0)),
        stale_dropped=int(last.get("stale_dropped", 0)),
        seconds=seconds,
    )


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text("utf-8", "replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def timestamp(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------------------- the simulation


@dataclass
class Stages:
    """Measured stage times (seconds; each a list of observations drawn from at random)."""

    sample: Sequence[float]
    complete: Sequence[float]
    grade: Sequence[float]
    train: Sequence[float]
    write: Sequence[float]
    reload: Sequence[float]
    trainable: float
    """Share of groups with reward variance (trained; the rest are skipped)."""


@dataclass
class Policy:
    """The learner's settings that shape the pipeline."""

    synchronous: bool
    batch_groups: int
    in_flight: int
    max_staleness: int
    stream_backlog: int
    grading_workers: int
    poll: float = SEND_POLL_SECONDS


@dataclass(eq=False)
class Group:
    trainable: bool
    version: int = -1
    done: bool = False


@dataclass
class Simulation:
    """A discrete-event model of the learner's pipeline (see the module docstring)."""

    stages: Stages
    policy: Policy
    rng: random.Random
    now: float = 0.0
    events: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    order: itertools.count[int] = field(default_factory=itertools.count)
    version: int = 0
    in_flight: set[Group] = field(default_factory=set)
    round_pending: set[Group] = field(default_factory=set)
    round_trained: int = 0
    grading: deque[tuple[str, Group]] = field(default_factory=deque)
    grading_busy: int = 0
    generating: set[Group] = field(default_factory=set)
    waiting: deque[Group] = field(default_factory=deque)
    paused: bool = False
    draining: bool = False
    stream: deque[Group] = field(default_factory=deque)
    queue: deque[Group] = field(default_factory=deque)
    training: bool = False
    poll_token: int = 0
    stale: int = 0
    step_times: list[float] = field(default_factory=list)

    def at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (self.now + delay, next(self.order), action))

    def draw(self, values: Sequence[float]) -> float:
        return self.rng.choice(values)

    def run(self, steps: int) -> list[float]:
        self.orchestrate()
        while len(self.step_times) < steps:
            self.now, _, action = heapq.heappop(self.events)
            action()
        return self.step_times

    # orchestrator
    def orchestrate(self) -> None:
        self.in_flight = {g for g in self.in_flight if not g.done}  # reap
        if len(self.stream) < self.policy.stream_backlog:
            if self.policy.synchronous:
                wanted = self.policy.batch_groups - self.round_trained - len(self.round_pending)
            else:
                wanted = self.policy.in_flight - len(self.in_flight)
            for _ in range(max(0, wanted)):
                self.send()
        self.poll_token += 1
        token = self.poll_token
        self.at(self.policy.poll, lambda: self.orchestrate() if token == self.poll_token else None)

    def send(self) -> None:
        group = Group(trainable=self.rng.random() < self.stages.trainable)
        self.in_flight.add(group)
        if self.policy.synchronous:
            self.round_pending.add(group)
        self.grade_job("sample", group)

    # grading workers
    def grade_job(self, kind: str, group: Group) -> None:
        self.grading.append((kind, group))
        self.start_grading()

    def start_grading(self) -> None:
        while self.grading and self.grading_busy < self.policy.grading_workers:
            kind, group = self.grading.popleft()
            self.grading_busy += 1
            seconds = self.draw(self.stages.sample if kind == "sample" else self.stages.grade)
            self.at(seconds, lambda kind=kind, group=group: self.graded(kind, group))  # type: ignore[misc]

    def graded(self, kind: str, group: Group) -> None:
        self.grading_busy -= 1
        if kind == "sample":
            self.generate(group)
        else:
            group.done = True
            self.stream.append(group)
            self.consume()
        self.start_grading()

    # the generation server
    def generate(self, group: Group) -> None:
        if self.paused:
            self.waiting.append(group)
            return
        group.version = self.version
        self.generating.add(group)
        self.at(self.draw(self.stages.complete), lambda: self.generated(group))

    def generated(self, group: Group) -> None:
        self.generating.discard(group)
        self.grade_job("grade", group)
        if self.draining and not self.generating:
            self.draining = False
            self.at(self.draw(self.stages.reload), self.pushed)

    # the learner: consumer, trainer, publisher
    def consume(self) -> None:
        while self.stream and len(self.queue) < 4 * self.policy.batch_groups:
            group = self.stream.popleft()
            if self.version - group.version > self.policy.max_staleness:
                self.stale += 1
                continue
            if group in self.round_pending:
                self.round_pending.discard(group)
                self.round_trained += group.trainable
                if not group.trainable:
                    self.orchestrate()  # replaced at once
            if group.trainable:
                self.queue.append(group)
        self.train()

    def train(self) -> None:
        if self.training or len(self.queue) < self.policy.batch_groups:
            return
        for _ in range(self.policy.batch_groups):
            self.queue.popleft()
        self.training = True
        self.consume()
        self.at(
            self.draw(self.stages.train), lambda: self.at(self.draw(self.stages.write), self.pause)
        )

    def pause(self) -> None:
        self.paused = True
        if self.generating:
            self.draining = True  # requests in flight finish first
        else:
            self.at(self.draw(self.stages.reload), self.pushed)

    def pushed(self) -> None:
        self.paused = False
        self.version += 1
        self.training = False
        self.step_times.append(self.now)
        waiting, self.waiting = self.waiting, deque()
        for group in waiting:
            self.generate(group)
        if self.policy.synchronous:
            self.round_trained = max(0, self.round_trained - self.policy.batch_groups)
            self.orchestrate()  # the next round, at once
        self.consume()


def simulate(stages: Stages, policy: Policy, steps: int = 400, seed: int = 0) -> float:
    """Mean wall time per step of `policy` on `stages`, over `steps` steps after 20 of warm-up."""
    warm = 20
    times = Simulation(stages, policy, random.Random(seed)).run(steps + warm)
    return (times[-1] - times[warm - 1]) / steps


# ---------------------------------------------------------------------------------- the table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="embedded model")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".cache" / "evoenv")
    parser.add_argument("--steps", type=int, default=6, help="optimiser steps per learner run")
    parser.add_argument(
        "--env",
        default=str(REPO / "bench" / "tagged_word.py"),
        help="a seed's name, or an environment file (admitted to the archive as it is)",
    )
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-groups", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--grading-workers", type=int, default=1, help="grading worker processes")
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per learner run")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument(
        "--simulate",
        metavar="STAGES",
        help="only the simulation, on given stage times, e.g. sample=0.1,complete=13,grade=0.05,"
        "train=8,write=0.5,reload=1.5,trainable=0.5 (seconds; trainable: share of groups)",
    )
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be at least 3 (step 1 is the warm-up)")
    if args.simulate:
        given = {k: float(v) for k, v in (kv.split("=") for kv in args.simulate.split(","))}
        trainable = given.pop("trainable", 1.0)
        stages = Stages(**{k: [v] for k, v in given.items()}, trainable=trainable)
        defaults = Settings().learner
        sim_sync = simulate(stages, policy(True, args, defaults))
        sim_async = simulate(stages, policy(False, args, defaults))
        mark = "ok" if sim_async / sim_sync <= TARGET else "MISS"
        print("| | sync (s/step) | async (s/step) | async/sync |")
        print("|---|---:|---:|---:|")
        print(
            f"| simulated, own hardware ({args.simulate}) | {sim_sync:.1f} | {sim_async:.1f} "
            f"| {sim_async / sim_sync:.2f}x {mark} (target <= {TARGET:g}x) |"
        )
        return

    configure_logging("console", "WARNING")
    work = Path(tempfile.mkdtemp(prefix="bench-async-"))
    database_url = f"sqlite:///{work / 'archive.db'}"
    env_file = Path(args.env)
    if env_file.suffix == ".py":
        args.env = env_file.stem
        Archive(database_url).add_environment(
            args.env, env_file.read_text(), status="admitted", origin="user"
        )
    port = free_port()
    settings = Settings(
        model=args.model,
        data_dir=args.data_dir,
        serve=ServeSettings(port=port, kv_cache_gib=args.kv_cache_gib, max_model_len=2048),
    )
    folder = prepare_model(settings)
    redis_proc, redis_url = private_redis(work, append_only=True)
    env = {
        **os.environ,
        "EVOENV_REDIS_URL": redis_url,
        "EVOENV_DATA_DIR": str(args.data_dir),
        "EVOENV_DATABASE_URL": database_url,
        "EVOENV_VLLM_URLS": f"http://127.0.0.1:{port}",
        "EVOENV_MODEL": args.model,
        "EVOENV_LOG_FORMAT": "json",
        "EVOENV_LOG_LEVEL": "INFO",
    }
    server: VllmServer | None = None
    workers: list[subprocess.Popen[bytes]] = []
    runs: dict[str, Run] = {}
    try:
        print(f"vLLM on {args.model} (log: {work / 'vllm.log'})", flush=True)
        with (work / "vllm.log").open("wb") as log:
            server = start_server(settings, folder, output=log)
        worker_logs = [work / "worker-generation.log", work / "worker-grading.log"]
        workers.append(start_process([*CLI, "worker", "-Q", "generation"], env, worker_logs[0]))
        workers.append(
            start_process(
                [*CLI, "worker", "-Q", "grading", "-c", str(args.grading_workers)],
                env,
                worker_logs[1],
            )
        )
        time.sleep(5)
        for mode in ("async", "sync"):
            runs[mode] = learner_run(mode, args, env, work, worker_logs)
    finally:
        for worker in workers:
            kill_tree(worker)
        if server is not None:
            server.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    report(runs, args, Settings())


def report(runs: dict[str, Run], args: argparse.Namespace, defaults: Settings) -> None:
    sync, fast = runs["sync"], runs["async"]
    stages = Stages(
        sample=sync.stages["sample"],
        complete=sync.stages["complete"],
        grade=sync.stages["grade"],
        train=sync.train,
        write=sync.write,
        reload=sync.reload,
        trainable=sync.trainable,
    )
    learner = defaults.learner
    sim_sync = simulate(stages, policy(True, args, learner))
    sim_async = simulate(stages, policy(False, args, learner))
    ratio, sim_ratio = fast.per_step / sync.per_step, sim_async / sim_sync
    mark = "ok" if sim_ratio <= TARGET else "MISS"
    print(
        f"\n{args.model}, {args.env} at difficulty {args.difficulty}: {args.steps} steps per run, "
        f"batches of {args.batch_groups} groups of {args.group_size}, max {args.max_tokens} "
        f"tokens; async = {learner.solver_groups_in_flight} groups in flight, max staleness "
        f"{learner.max_staleness}; {args.grading_workers} grading worker(s)\n"
    )
    print("| | sync (s/step) | async (s/step) | async/sync |")
    print("|---|---:|---:|---:|")
    print(
        f"| measured, one CPU machine (mean of steps 2-{args.steps}) | {sync.per_step:.1f} | "
        f"{fast.per_step:.1f} | {ratio:.2f}x |"
    )
    print(
        f"| simulated, own hardware (sync run's stage times) | {sim_sync:.1f} | {sim_async:.1f} "
        f"| {sim_ratio:.2f}x {mark} (target <= {TARGET:g}x) |"
    )
    print("\nstage times, median (n) of each run (steps 2 on for train and push):\n")
    print("| stage | sync run | async run |")
    print("|---|---:|---:|")
    rows: list[tuple[str, Sequence[float], Sequence[float]]] = [
        ("sample job (grading)", sync.stages["sample"], fast.stages["sample"]),
        ("complete job (generation, a group)", sync.stages["complete"], fast.stages["complete"]),
        ("grade job (grading)", sync.stages["grade"], fast.stages["grade"]),
        ("train step (StepMetrics.seconds)", sync.train, fast.train),
        ("push (push_seconds)", sync.push, fast.push),
        ("  of it: write weights", sync.write, fast.write),
        ("  of it: pause, reload, resume", sync.reload, fast.reload),
    ]
    for name, a, b in rows:
        print(f"| {name} | {median(a)} | {median(b)} |")
    print(
        f"| groups trained / skipped (no variance) / stale | {sync.trained_groups} / "
        f"{sync.skipped_groups} / {sync.stale_dropped} | {fast.trained_groups} / "
        f"{fast.skipped_groups} / {fast.stale_dropped} |"
    )
    print(f"| learner run, start to stop | {sync.seconds:.0f} s | {fast.seconds:.0f} s |")
    print(
        f"\nmodel check: simulated sync {sim_sync:.1f} s/step on the sync run's stage times vs "
        f"{sync.per_step:.1f} measured. The 0.67x target applies to the simulated line only."
    )


def policy(synchronous: bool, args: argparse.Namespace, learner: LearnerSettings) -> Policy:
    """The simulated learner: the bench's batch and grading workers, the default settings."""
    return Policy(
        synchronous=synchronous,
        batch_groups=args.batch_groups,
        in_flight=learner.solver_groups_in_flight,
        max_staleness=learner.max_staleness,
        stream_backlog=learner.stream_backlog,
        grading_workers=args.grading_workers,
    )


def median(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} s ({len(values)})" if values else "-"


if __name__ == "__main__":
    main()
