"""An external yardstick: the reasoning-gym suite on the served policy before and after the
learning protocol of `tests/e2e/test_it_learns.py`.

    python bench/yardstick_reasoning_gym.py [--steps 3] [-n 16] [--data-dir DIR]

Starts what it needs on this machine (a private Redis, a vLLM server on the embedded model,
one worker for the generation queue and one for grading), then: `evoenv eval --suite
reasoning-gym --json` (greedy, six short-answer tasks, fixed seed); `evoenv learner --steps N`
on `copy_word` at difficulty 1 with the learning test's settings (8 groups of 4, temperature
1.0, learning rate 5e-6, 32-token answers; the learner pushes its weights into the server after
every step); the same suite again, now on the trained policy; and `evoenv eval` on the learning
test's 128 held-out copy_word instances before and after, as the baseline that training
happened. Prints one table: each task's pass rate before and after. Not part of CI (about 15
minutes on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchkit import private_redis, start_process  # noqa: E402

from evoenv_model.models import prepare_model  # noqa: E402
from evoenv_model.serve import VllmServer, start_server  # noqa: E402
from shared.config import ServeSettings, Settings  # noqa: E402
from shared.db import Archive  # noqa: E402
from shared.ports import free_port  # noqa: E402

CLI = [sys.executable, "-c", "from evoenv_cli import main; main()"]
ENV_FILE = REPO / "tests" / "e2e" / "copy_word.py"
PROTOCOL = {
    "EVOENV_LEARNER__ENVIRONMENTS": '["copy_word"]',
    "EVOENV_LEARNER__DIFFICULTY": "1",
    "EVOENV_LEARNER__GENERATOR_GROUPS_IN_FLIGHT": "0",
    "EVOENV_LEARNER__SOLVER_GROUPS_IN_FLIGHT": "8",
    "EVOENV_LEARNER__EVAL_EVERY": "1000",
    "EVOENV_GRPO__GROUP_SIZE": "4",
    "EVOENV_GRPO__BATCH_GROUPS": "8",
    "EVOENV_GRPO__MAX_TOKENS": "32",
    "EVOENV_GRPO__MICRO_BATCH": "4",
    "EVOENV_GRPO__LEARNING_RATE": "5e-6",
    "EVOENV_GRPO__TEMPERATURE": "1.0",
    "EVOENV_GRPO__GRADIENT_CHECKPOINTING": "false",
}


def cli_json(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [*CLI, *args, "--json"], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"error: evoenv {' '.join(args)} failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(env: dict[str, str], n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    suite = cli_json(["eval", "--suite", "reasoning-gym", "-n", str(n)], env)
    held_out = cli_json(
        ["eval", "-e", "copy_word", "-d", "1", "-n", "128", "--first", "1000"],
        {**env, "EVOENV_GRPO__MAX_TOKENS": "32"},
    )
    return suite, held_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("-n", type=int, default=16, help="instances per reasoning-gym task")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".cache" / "evoenv")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="yardstick-"))
    database_url = f"sqlite:///{work / 'archive.db'}"
    Archive(database_url).add_environment(
        "copy_word", ENV_FILE.read_text(), status="admitted", origin="user"
    )
    port = free_port()
    settings = Settings(
        data_dir=args.data_dir,
        serve=ServeSettings(port=port, kv_cache_gib=1, max_model_len=4096),
    )
    folder = prepare_model(settings)
    redis_proc, redis_url = private_redis(work, append_only=False)
    env = {
        **os.environ,
        "EVOENV_REDIS_URL": redis_url,
        "EVOENV_DATA_DIR": str(args.data_dir),
        "EVOENV_DATABASE_URL": database_url,
        "EVOENV_VLLM_URLS": f"http://127.0.0.1:{port}",
        "EVOENV_LEARNER__RUN_DIR": str(work / "run"),
        "EVOENV_RUN": "yardstick",
    }
    server: VllmServer | None = None
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with (work / "vllm.log").open("wb") as log:
            server = start_server(settings, folder, output=log)
        for queue in ("generation", "grading"):
            workers.append(
                start_process([*CLI, "worker", "-Q", queue], env, work / f"worker-{queue}.log")
            )
        print("before training ...", flush=True)
        before = measure(env, args.n)
        print(f"training {args.steps} steps ...", flush=True)
        learner = subprocess.run(
            [*CLI, "learner", "--steps", str(args.steps)],
            env={**env, **PROTOCOL, "EVOENV_LEARNER__CHECKPOINT_EVERY": str(args.steps)},
            stdout=(work / "learner.log").open("wb"),
            stderr=subprocess.STDOUT,
            check=False,
        )
        if learner.returncode != 0:
            raise SystemExit(f"error: the learner failed; its log: {work / 'learner.log'}")
        print("after training ...", flush=True)
        after = measure(env, args.n)
    finally:
        for worker in workers:
            subprocess.run(["pkill", "-KILL", "-g", str(worker.pid)], check=False)
        if server is not None:
            server.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(work / "run", ignore_errors=True)
    report(before, after, args)


def report(before: tuple[Any, Any], after: tuple[Any, Any], args: argparse.Namespace) -> None:
    (suite_b, held_b), (suite_a, held_a) = before, after
    print(f"\nreasoning-gym (greedy, {args.n} instances a task) before and after {args.steps}")
    print("GRPO steps on copy_word at difficulty 1 (the learning test's protocol)\n")
    print("| task | before | after |")
    print("| --- | ---: | ---: |")
    tasks = sorted(k.removeprefix("pass_rate_") for k in suite_b if k.startswith("pass_rate_"))
    for task in tasks:
        key = f"pass_rate_{task}"
        print(f"| {task} | {suite_b[key]:.3f} | {suite_a.get(key, float('nan')):.3f} |")
    print(
        f"| all ({suite_b.get('instances')}) | {suite_b['pass_rate']:.3f} | {suite_a['pass_rate']:.3f} |"
    )
    print(
        f"| copy_word, 128 held-out (the trained task) | {held_b['pass_rate']:.3f} "
        f"| {held_a['pass_rate']:.3f} |"
    )


if __name__ == "__main__":
    main()
