"""How far the served policy's proposals get through L1-L5, by generator temperature.

Starts a vLLM server on the embedded model (EVOENV_MODEL; or uses `--url`), asks it for `--n`
proposals per temperature with the learner's own prompt (seed files as examples), validates
each through the sandbox exactly as admission does (L1-L5, locally), and prints where each
temperature's candidates stopped. The baseline, in the same run: the first temperature.

    python bench/bench_proposals.py --temperatures 1.0 0.7 --n 16 --examples 1

No Redis, no workers.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from evoenv_model.models import prepare_model
from evoenv_model.serve import start_server
from evoenv_worker.mechanical import validate_source
from evoenv_worker.proposal_code import written_code
from evoenv_worker.sandbox.host import Sandbox
from evoenv_worker.solver_completions import make_client
from shared.config import Settings
from shared.inference import Sampling
from shared.ports import free_port
from shared.proposal_prompt import TOPICS, Example, choose_examples, proposal_messages
from shared.static import check_static

STAGES = ("L1", "L2", "L3", "L4", "L5", "passed")
REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def served(settings: Settings, url: str | None) -> Iterator[Settings]:
    """`settings` pointed at `url`, or at a server started here on the embedded model."""
    if url:
        yield settings.model_copy(update={"vllm_urls": [url]})
        return
    port = free_port()
    settings = settings.model_copy(
        update={
            "data_dir": REPO / ".cache" / "evoenv",
            "serve": settings.serve.model_copy(update={"port": port, "max_model_len": 4096}),
        }
    )
    folder = prepare_model(settings)
    log_path = Path(tempfile.mkdtemp(prefix="bench-proposals-")) / "vllm.log"
    with log_path.open("ab") as log_file:
        server = start_server(settings, folder, output=log_file)
    try:
        yield settings.model_copy(update={"vllm_urls": [server.url]})
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    parser.add_argument("--n", type=int, default=16, help="proposals per temperature")
    parser.add_argument("--examples", type=int, default=1, help="example files per prompt")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-topics",
        dest="topics",
        action="store_false",
        help="ask for any new task instead of one drawn from proposal_prompt.TOPICS",
    )
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    args = parser.parse_args()

    base = Settings()
    examples = []
    for path in sorted(base.seeds_dir.glob("*.py")):
        source = path.read_text()
        static = check_static(source.encode(), 64 * 1024)
        examples.append(Example(path.stem, static.oracle, source, path.stem))
    rng = random.Random(args.seed)
    rows: list[tuple[float, Counter[str], float]] = []
    with (
        served(base, args.url) as settings,
        make_client(settings) as client,
        Sandbox(settings.sandbox) as sandbox,
    ):
        for temperature in args.temperatures:
            funnel: Counter[str] = Counter()
            started = time.perf_counter()
            for _ in range(args.n):
                chosen = choose_examples(examples, args.examples, rng)
                messages = proposal_messages(chosen, rng.choice(TOPICS) if args.topics else "")
                (completion,) = client.chat(
                    messages,
                    Sampling(n=1, temperature=temperature, max_tokens=args.max_tokens),
                )
                code = written_code(completion.text).encode()  # as admission judges it
                report = validate_source(code, "candidate.py", sandbox, settings)
                funnel[report.failed_stage or "passed"] += 1
            rows.append((temperature, funnel, time.perf_counter() - started))

    print(f"\nproposals per temperature: {args.n}, example files per prompt: {args.examples}")
    print(f"{'temperature':>11} | " + " | ".join(f"{s:>6}" for s in STAGES) + " | past L1 | ratio")
    baseline: float | None = None
    for temperature, funnel, _seconds in rows:
        past = sum(funnel[s] for s in STAGES[1:]) / args.n
        baseline = past if baseline is None else baseline
        ratio = f"{past / baseline:.2f}x" if baseline else "-"
        cells = " | ".join(f"{funnel[s]:>6}" for s in STAGES)
        print(f"{temperature:>11} | {cells} | {past:>7.2f} | {ratio}")


if __name__ == "__main__":
    main()
