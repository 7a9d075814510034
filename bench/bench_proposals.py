"""How far real proposals get through admission, by proposal mode (and generator temperature).

Starts a vLLM server on the embedded model (EVOENV_MODEL), or on a checkpoint (`--weights`: a
`step-N` folder, a run's `checkpoints/` folder or a Hugging Face folder), or uses `--url`. For
each proposal i of `--n` it draws one plan from `--seed`: the example seed files and a topic.
Every mode uses the same plan: `topic` (the learner's prompt: the examples and the topic),
`mutation` (of example 1), `own_task` (the examples, a task of the reply's naming), `repair`
(one more turn for each `topic` proposal that failed L1-L5, with its report; its count is the
number of those). Each file, taken from the reply as admission takes it, is judged as
admission judges it: L1-L5 (`mechanical.validate_source`), then review, calibration and
novelty against the seeds (`verdict.run_locally`, the code path of `evoenv validate --all`),
and rewarded by the generator's reward table with gamma at its no-history value (in-group
novelty does not apply: each proposal is alone). One table: per mode, the share past L1-L5,
admitted per 100 proposals, the median pool similarity of those past L1-L5, completion tokens
and seconds (generation and judging) per admitted environment, the mean reward of each
outcome; then where each stopped. The baseline, in the same run: `topic`.

    python bench/bench_proposals.py --modes topic,mutation,repair,own_task --n 48
    python bench/bench_proposals.py --modes topic,mutation,repair,own_task --n 48 \\
        --weights ~/.evoenv/runs/default/checkpoints/step-00000014
    python bench/bench_proposals.py --n 2 --modes topic,own_task        # smoke check
    python bench/bench_proposals.py --modes topic,mutation --n 48 --calibration-search 2

`--calibration-search K` adds, after each mode, the same proposals with the calibration search
at K levels (`EVOENV_ADMISSION__CALIBRATION_SEARCH`): those that failed calibration go on from
it, the others keep their reports. `--out FILE` keeps every proposal (mode, reply, report, reward) as JSON lines. No Redis, no
workers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evoenv_learner.checkpoints import STATE_FILE, latest_checkpoint
from evoenv_learner.pool import seed_pool
from evoenv_model.models import prepare_model
from evoenv_model.serve import start_server
from evoenv_worker.context import WorkerContext
from evoenv_worker.mechanical import validate_source
from evoenv_worker.proposal_code import written_code
from evoenv_worker.sandbox.host import Sandbox
from evoenv_worker.solver_completions import make_client
from evoenv_worker.verdict import calibrate_locally, combine, run_locally, stage_job_for
from shared.config import Settings
from shared.errors import UsageError
from shared.inference import Completion, InferenceClient, Sampling
from shared.messages import MODEL_STAGES, PROPOSAL_MODES, ValidateJob, ValidationReport
from shared.ports import free_port
from shared.proposal_modes import (
    mutation_messages,
    own_task_messages,
    own_task_of,
    repair_messages,
    repairable,
)
from shared.proposal_prompt import TOPICS, Example, choose_examples, proposal_messages
from shared.rewards import RepetitionTracker, generator_reward
from shared.static import check_static

OUTCOMES = ("L1", "L2", "L3", "L4", "L5", "review", "calibration", "novelty", "error", "admitted")
REPO = Path(__file__).resolve().parents[1]
Messages = list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class Plan:
    """What proposal i shows, the same for every mode."""

    examples: list[Example]
    topic: str


@dataclass
class Judged:
    """One proposal as admission judged it."""

    index: int
    messages: Messages
    text: str
    tokens: int
    report: ValidationReport
    reward: float | None
    task: str | None = None

    @property
    def outcome(self) -> str:
        if self.report.verdict == "error":
            return "error"
        return self.report.failed_stage or "admitted"

    @property
    def past_mechanical(self) -> bool:
        """It passed L1-L5 (L5 runs only after L1-L4 passed)."""
        return any(s.stage == "L5" and s.ok for s in self.report.stages)

    @property
    def similarity(self) -> float | None:
        novelty = next((s for s in self.report.stages if s.stage == "novelty"), None)
        value = novelty.data.get("similarity") if novelty is not None else None
        return None if value is None else float(value)


@dataclass
class Row:
    """One mode at one temperature."""

    mode: str
    temperature: float
    judged: list[Judged] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""
    search: int = 0
    """Levels of the calibration search (`--calibration-search`; 0: the first calibration
    decides)."""


def checkpoint_model(weights: Path) -> Path:
    """The Hugging Face folder of `--weights`: the folder itself (config.json), a checkpoint's
    `model/`, or that of the newest checkpoint under a run's `checkpoints/`."""
    weights = weights.expanduser()
    if (weights / "config.json").is_file():
        return weights
    folder = weights if (weights / STATE_FILE).is_file() else latest_checkpoint(weights)
    if folder is None:
        raise UsageError(
            f"{weights}: neither a model folder nor a checkpoint (or a folder of them)"
        )
    if (folder / "adapter").is_dir():
        raise UsageError(f"{folder} is a LoRA checkpoint: merge it first (evoenv export DIR)")
    if not (folder / "model" / "config.json").is_file():
        raise UsageError(f"{folder} has no model/ folder")
    return folder / "model"


@contextlib.contextmanager
def served(settings: Settings, url: str | None, weights: Path | None) -> Iterator[Settings]:
    """`settings` pointed at `url`, or at a server started here on the embedded model or on
    `weights`."""
    if url:
        yield settings.model_copy(update={"vllm_urls": [url]})
        return
    # The bench seeds every request: the server must be started for seeded requests (on a CPU,
    # without chunked prefill: evoenv_model/serve.py, cpu_prefill_args), so the settings say so.
    seed = settings.admission.sampling_seed
    update: dict[str, Any] = {
        "data_dir": REPO / ".cache" / "evoenv",
        "serve": settings.serve.model_copy(update={"port": free_port(), "max_model_len": 8192}),
        "admission": settings.admission.model_copy(update={"sampling_seed": seed or 0}),
    }
    if weights is not None:
        update["model"] = str(checkpoint_model(weights))
    settings = settings.model_copy(update=update)
    folder = prepare_model(settings)
    log_path = Path(tempfile.mkdtemp(prefix="bench-proposals-")) / "vllm.log"
    with log_path.open("ab") as log_file:
        server = start_server(settings, folder, output=log_file)
    try:
        yield settings.model_copy(update={"vllm_urls": [server.url]})
    finally:
        server.stop()


def seed_examples(settings: Settings) -> list[Example]:
    examples = []
    for path in sorted(settings.seeds_dir.glob("*.py")):
        source = path.read_text()
        static = check_static(source.encode(), settings.validation.max_source_bytes)
        examples.append(Example(path.stem, static.oracle, source, path.stem))
    return examples


def plans(examples: list[Example], n: int, k: int, seed: int) -> list[Plan]:
    """The n plans, drawn once: every mode shows proposal i the same examples."""
    rng = random.Random(seed)
    return [Plan(choose_examples(examples, k, rng), rng.choice(TOPICS)) for _ in range(n)]


def prompt_of(mode: str, plan: Plan, topics: bool) -> Messages:
    if mode == "mutation":
        return mutation_messages(plan.examples[0])
    if mode == "own_task":
        return own_task_messages(plan.examples)
    return proposal_messages(plan.examples, plan.topic if topics else "")


def sample_all(
    client: InferenceClient, prompts: Sequence[Messages], sampling: Sampling, seed: int
) -> list[Completion]:
    """One completion per prompt, all in flight together (the server batches them); request i
    seeded from `seed` and i."""

    def one(item: tuple[int, Messages]) -> Completion:
        index, messages = item
        (completion,) = client.chat(messages, dataclasses.replace(sampling, seed=seed + index))
        return completion

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(prompts)))) as pool:
        return list(pool.map(one, enumerate(prompts)))


def judge(
    ctx: WorkerContext, index: int, text: str, gamma: float
) -> tuple[ValidationReport, float | None]:
    """The reply's file as admission judges it, and the generator's reward for it (None: a
    check could not run)."""
    file = f"candidate_{index}.py"
    data = written_code(text).encode()
    report = validate_source(data, file, ctx.sandbox(), ctx.settings)
    if report.verdict == "admitted":
        job = ValidateJob.for_file(f"bench-{index}", file, data)
        report = run_locally(ctx, job, report, list(MODEL_STAGES))
    return report, reward_of(report, gamma, ctx.settings)


def reward_of(report: ValidationReport, gamma: float, settings: Settings) -> float | None:
    """The generator's reward for a judged file (None: a check could not run)."""
    if report.verdict == "error":
        return None
    stages = {s.stage: s for s in report.stages}
    failed = {s.stage for s in report.stages if not s.ok}
    rate = stages["calibration"].data.get("pass_rate") if "calibration" in stages else None
    similarity = stages["novelty"].data.get("similarity") if "novelty" in stages else None
    return generator_reward(failed, rate, similarity, gamma, settings.admission).total


def with_search(ctx: WorkerContext, row: Row, k: int, gamma: float) -> Row:
    """`row` judged again with the calibration search at `k` levels: each proposal that failed
    calibration (a = 0 or 1) goes on from that very calibration (its draws count as the search's
    first level, as in admission); every other one keeps its report."""
    admission = ctx.settings.admission.model_copy(update={"calibration_search": k})
    settings = ctx.settings.model_copy(update={"admission": admission})
    out = Row(row.mode, row.temperature, note=f"{row.note} +search {k}", search=k)
    started = time.perf_counter()
    for j in row.judged:
        calibration = next((s for s in j.report.stages if s.stage == "calibration"), None)
        stage_job = None
        if calibration is not None and not calibration.ok and "passes" in calibration.data:
            data = written_code(j.text).encode()
            job = ValidateJob.for_file(f"bench-{j.index}", f"candidate_{j.index}.py", data)
            stage_job = stage_job_for(ctx, job)
        if calibration is None or stage_job is None or calibration.data.get("env_errors"):
            out.judged.append(j)
            continue
        final = calibrate_locally(ctx, stage_job, settings, found=calibration)
        stages = [final if s.stage == "calibration" else s for s in j.report.stages]
        mechanical = j.report.model_copy(
            update={"stages": [s for s in stages if s.stage not in MODEL_STAGES]}
        )
        report = combine(mechanical, [s for s in stages if s.stage in MODEL_STAGES])
        out.judged.append(
            dataclasses.replace(j, report=report, reward=reward_of(report, gamma, settings))
        )
        print(f"{out.mode}{out.note} #{j.index}: {out.judged[-1].outcome}", flush=True)
    out.seconds = row.seconds + time.perf_counter() - started
    return out


def run_mode(
    ctx: WorkerContext,
    client: InferenceClient,
    row: Row,
    asked: list[tuple[int, Messages]],
    args: argparse.Namespace,
    gamma: float,
) -> None:
    """Sample a completion for each prompt of `asked` and judge it, into `row`."""
    started = time.perf_counter()
    sampling = Sampling(n=1, temperature=row.temperature, max_tokens=args.max_tokens)
    completions = sample_all(client, [m for _, m in asked], sampling, args.seed * 100_003)
    for (index, messages), completion in zip(asked, completions, strict=True):
        report, reward = judge(ctx, index, completion.text, gamma)
        task = own_task_of(completion.text) if row.mode == "own_task" else None
        row.judged.append(
            Judged(
                index, messages, completion.text, len(completion.token_ids), report, reward, task
            )
        )
        print(f"{row.mode} t={row.temperature} #{index}: {row.judged[-1].outcome}", flush=True)
    row.seconds = time.perf_counter() - started


def repairs_of(topic: Row) -> list[tuple[int, Messages]]:
    """One more turn for each `topic` proposal that failed L1-L5, with its report."""
    return [
        (j.index, repair_messages(j.messages, j.text, j.report))
        for j in topic.judged
        if repairable(j.report)
    ]


def table(rows: list[Row]) -> list[str]:
    """The bench's table: one line per mode and temperature."""
    lines = [
        "| mode | temp | proposals | past L1-L5 | admitted /100 | vs topic | median similarity "
        "| tokens / admitted | seconds / admitted | mean reward by outcome (count) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    baseline: dict[float, float] = {}
    for row in rows:
        n = len(row.judged)
        admitted = sum(j.outcome == "admitted" for j in row.judged)
        per100 = 100 * admitted / n if n else 0.0
        if row.mode == "topic" and not row.search:
            baseline[row.temperature] = per100
        base = baseline.get(row.temperature)
        ratio = f"{per100 / base:.2f}x" if base else "–"
        past = sum(j.past_mechanical for j in row.judged)
        sims = [s for j in row.judged if j.past_mechanical and (s := j.similarity) is not None]
        median = f"{statistics.median(sims):.3f}" if sims else "–"
        tokens = sum(j.tokens for j in row.judged)
        per_tokens = f"{tokens / admitted:.0f}" if admitted else f"– ({tokens} for 0)"
        per_seconds = (
            f"{row.seconds / admitted:.0f}" if admitted else f"– ({row.seconds:.0f} for 0)"
        )
        rewards: dict[str, list[float]] = defaultdict(list)
        for j in row.judged:
            if j.reward is not None:
                rewards[j.outcome].append(j.reward)
        by_outcome = " · ".join(
            f"{o} {statistics.mean(rewards[o]):+.2f} ({len(rewards[o])})"
            for o in OUTCOMES
            if rewards[o]
        )
        share = f"{past / n:.2f}" if n else "–"
        lines.append(
            f"| {row.mode}{row.note} | {row.temperature:g} | {n} | {share} | {per100:.1f} | {ratio} "
            f"| {median} | {per_tokens} | {per_seconds} | {by_outcome or '–'} |"
        )
    return lines


def funnel(rows: list[Row]) -> list[str]:
    """Where each mode's proposals stopped (the first stage failed, or admitted)."""
    lines = [
        "| mode | temp | " + " | ".join(OUTCOMES) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in OUTCOMES) + " |",
    ]
    for row in rows:
        counts = Counter(j.outcome for j in row.judged)
        cells = " | ".join(str(counts[o]) for o in OUTCOMES)
        lines.append(f"| {row.mode}{row.note} | {row.temperature:g} | {cells} |")
    return lines


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--modes",
        default="topic,mutation,repair,own_task",
        help="comma-separated, of: " + ", ".join(PROPOSAL_MODES) + " (topic always runs first)",
    )
    parser.add_argument("--n", type=int, default=48, help="proposals per mode and temperature")
    parser.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=None,
        help="generator temperatures (default: EVOENV_GRPO__GENERATOR_TEMPERATURE)",
    )
    parser.add_argument("--examples", type=int, default=None, help="example files per prompt")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0, help="draws the plans and request seeds")
    parser.add_argument(
        "--no-topics",
        dest="topics",
        action="store_false",
        help="topic mode asks for any new task instead of one drawn from proposal_prompt.TOPICS",
    )
    parser.add_argument(
        "--calibration-search",
        type=int,
        default=0,
        metavar="K",
        help="also each mode with the calibration search at K levels (a row '+search K')",
    )
    parser.add_argument("--weights", type=Path, default=None, help="a checkpoint (or model) folder")
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--out", type=Path, default=None, help="every proposal as JSON lines")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(PROPOSAL_MODES))
    if unknown or args.n < 1:
        parser.error(f"unknown modes {unknown}" if unknown else "--n must be at least 1")
    if args.url and args.weights:
        parser.error("--url and --weights exclude each other (the server decides the weights)")
    args.modes = ["topic", *(m for m in PROPOSAL_MODES if m in modes and m != "topic")]
    return args


def main() -> None:
    args = arguments()
    base = Settings()
    temperatures = args.temperatures or [base.grpo.generator_temperature]
    k = args.examples or base.learner.proposal_examples
    drawn = plans(seed_examples(base), args.n, k, args.seed)
    gamma = RepetitionTracker(base.admission.repetition_window).gamma(base.admission)
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-proposals-") as scratch,
        served(base, args.url, args.weights) as settings,
        make_client(settings) as client,
        Sandbox(settings.sandbox) as sandbox,
    ):
        judging = settings.model_copy(update={"data_dir": Path(scratch)})  # seeds-only archive
        ctx = WorkerContext(judging, _sandbox=sandbox, _inference=client)
        seed_pool(ctx.archive(), judging.seeds_dir)
        for temperature in temperatures:
            topic = Row("topic", temperature)
            for mode in args.modes:
                row = topic if mode == "topic" else Row(mode, temperature)
                if mode == "repair":
                    asked = repairs_of(topic)
                    row.note = f" (of {len(asked)} L1-L5 failures)"
                else:
                    asked = [(i, prompt_of(mode, p, args.topics)) for i, p in enumerate(drawn)]
                if asked:
                    run_mode(ctx, client, row, asked, args, gamma)
                rows.append(row)
                if args.calibration_search:
                    rows.append(with_search(ctx, row, args.calibration_search, gamma))
    model = args.url or (str(args.weights) if args.weights else base.model)
    print(
        f"\nmodel: {model}; proposals per mode: {args.n}; examples per prompt: {k}; "
        f"plans drawn with seed {args.seed}; gamma {gamma:g}"
    )
    print("\n".join(table(rows)))
    print("\nwhere they stopped:")
    print("\n".join(funnel(rows)))
    if args.out:
        write_out(args.out, rows)


def write_out(path: Path, rows: list[Row]) -> None:
    with path.open("w") as out:
        for row in rows:
            for j in row.judged:
                record = {
                    "mode": row.mode,
                    "temperature": row.temperature,
                    "index": j.index,
                    "outcome": j.outcome,
                    "reward": j.reward,
                    "tokens": j.tokens,
                    "task": j.task,
                    "reply": j.text,
                    "report": j.report.public(),
                }
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
