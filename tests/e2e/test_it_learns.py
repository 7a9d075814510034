"""It learns: a few GRPO steps on one seed raise the served policy's reward on held-out instances.

Everything is real: the embedded default model (Qwen2.5-Coder-0.5B-Instruct) served by vLLM on
the CPU (the e2e `cluster`, serving the prepared weights when this module starts), Redis, the
worker processes that sample, complete and grade in the sandbox, and `evoenv learner`, which
pushes its weights into that server after every step, so that the evaluation after training
measures the trained policy.

Seed and difficulty. `edit_distance` at difficulty 1 (strings of 3 to 5 letters over "abc"),
chosen by measuring the greedy pass rate of the untrained model on held-out instances of the
seeds at low difficulty with short generations (`evoenv eval`, temperature 0, the evaluation
seeds 1e9, 1e9 + 1, ...), and keeping the one inside the 10-60 % band that answers in a few
tokens (training on a 2-core CPU runs at 20-40 tokens a second, so short completions are what
buys enough steps within the time budget):

| seed, difficulty                    | max_tokens | n  | pass rate | mean completion    |
| ----------------------------------- | ---------- | -- | --------- | ------------------ |
| edit_distance, 1                    | 32         | 128| 0.27      | 8 tokens           |
| edit_distance, 1                    | 32         | 64 | 0.23      | 8 tokens           |
| edit_distance, 1                    | 128        | 32 | 0.16      | 8 tokens           |
| edit_distance, 2                    | 32         | 64 | 0.31      | 8 tokens           |
| knapsack_max_value, 1               | 128        | 32 | 0.06      | 9 tokens           |
| count_connected_components, 1       | 128        | 32 | 0.00      | 16 tokens          |
| longest_increasing_subsequence, 1   | 128        | 32 | 0.00      | all cut at 128     |
| modular_power_sum, 1                | 256        | 16 | 0.81      | 170 tokens         |
| modular_power_sum, 1                | 96         | 32 | 0.00      | all cut at 96      |
| modular_power_sum, 2                | 128        | 32 | 0.00      | all cut at 128     |

(An earlier measurement at difficulty 1, 12 instances each, greedy, long generations: the other
five seeds 0.00.) The test checks the assumption: the pass rate before training must lie in
[0.10, 0.60], or it fails saying so. Untrained, the model mostly answers "3"; at difficulty 1
the distance is 1 for about half of the instances, so there is room to learn.

Protocol. (1) Before: `evoenv eval` on the first `INSTANCES` held-out instances (greedy, one
completion each, graded by the workers; the evaluation seed range is never drawn for
training). (2) `evoenv learner --steps STEPS`, restricted to `edit_distance` at difficulty 1.
(3) After: the same instances again, on the same server, now serving the last pushed version.
The reward is the environment's own score (1 for the exact distance, else 0; no answer span is
a format error, reward 0): no reward shaping of any kind.

Learning settings, measured: 3 steps of 12 groups of 4 completions (144 sequences of ~150
tokens), temperature 1, learning rate 5e-6 (the default 1e-6 moves the bfloat16 weights vLLM
serves too little in 3 steps). At 1e-5 and above the policy was unstable within 2-3 steps on
this task: greedy pass rate 0.23 -> 0.34 after one step, then 0.00 (bare digits without the
answer tags: format errors), or collapsed onto "0" (0.03); once onto "1" (0.47).

Statistics. The outcomes are paired by instance. Let b be the instances wrong before and right
after, c those right before and wrong after. Under the null hypothesis that training changes
nothing (each changed outcome equally likely to go either way), b ~ Binomial(b + c, 1/2); the
test asserts the exact one-sided sign test (McNemar's exact test) gives p < 0.01, and that the
mean reward rose by at least `MIN_RISE`. Greedy decoding makes the before and after
measurements deterministic for a given policy: all the noise is in the training run.

Why 12 groups of 4 and 256 instances. In three steps the model learns little more than which
short answers to prefer for this kind of prompt, so a step pulls towards the answers of the
instances in its batch. With 4 groups of 8 (4 instances a step) the outcome was a coin toss
between runs on 128 held-out instances: 0.27 -> 0.49 (p = 1e-4) once, 0.266 -> 0.383 (38
wrong->right, 23 right->wrong, p = 0.036) in CI, and on 256 instances 0.281 -> 0.293 (54
wrong->right, 51 right->wrong, p = 0.42), the training batches' own mean reward falling from
0.31 to 0.16 over the three steps. 12 groups of 4 put three times as many instances in each
step for 1.5x the sequences (most groups of 4 have no reward variance and are skipped, so
more are sampled): two runs at these settings passed, 0.281 -> 0.566 (101 wrong->right, 28
right->wrong, p = 3.5e-11) in the second; 16-19.5 minutes with the cluster's start.
256 held-out instances: the same proportions as the CI run above give p = 0.004 there.
"""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import pytest
import redis
from e2e_support import Cluster, evoenv

from shared import keys
from shared.environment import EVAL_SEEDS
from shared.rollouts import decode_entry

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(1800)]

ENV = "edit_distance"
DIFFICULTY = 1
INSTANCES = 256
"""Held-out instances, the same ones before and after training (see Statistics)."""
MAX_TOKENS = 32
"""Longest completion, in training and evaluation (the model answers in about 8 tokens)."""
STEPS = 3
LEARNING_RATE = 5e-6
GROUP_SIZE = 4
BATCH_GROUPS = 12
BAND = (0.10, 0.60)
"""The pass rate before training must lie here (the issue's 10-60 %)."""
ALPHA = 0.01
MIN_RISE = 0.08


def learner_env(cluster: Cluster, run_dir: Path) -> dict[str, str]:
    return {
        **cluster.env,
        "EVOENV_RUN": "learns",
        "EVOENV_LEARNER__RUN_DIR": str(run_dir),
        "EVOENV_LEARNER__ENVIRONMENTS": f'["{ENV}"]',
        "EVOENV_LEARNER__DIFFICULTY": str(DIFFICULTY),
        "EVOENV_LEARNER__GENERATOR_GROUPS_IN_FLIGHT": "0",
        "EVOENV_LEARNER__SOLVER_GROUPS_IN_FLIGHT": str(2 * BATCH_GROUPS),
        "EVOENV_LEARNER__CHECKPOINT_EVERY": str(STEPS),
        "EVOENV_LEARNER__EVAL_EVERY": "1000",
        "EVOENV_GRPO__GROUP_SIZE": str(GROUP_SIZE),
        "EVOENV_GRPO__BATCH_GROUPS": str(BATCH_GROUPS),
        "EVOENV_GRPO__MAX_TOKENS": str(MAX_TOKENS),
        "EVOENV_GRPO__MICRO_BATCH": "4",
        "EVOENV_GRPO__LEARNING_RATE": str(LEARNING_RATE),
        "EVOENV_GRPO__TEMPERATURE": "1.0",
        # Sequences of ~150 tokens: activations are small, and recomputing them costs a third.
        "EVOENV_GRPO__GRADIENT_CHECKPOINTING": "false",
    }


def held_out(cluster: Cluster, run: str, log: Path) -> dict[int, float]:
    """Reward of each held-out instance (by seed) under the policy served now: `evoenv eval`,
    whose graded groups are read back from its stream (`RUN-eval`)."""
    env = {**cluster.env, "EVOENV_RUN": run, "EVOENV_GRPO__MAX_TOKENS": str(MAX_TOKENS)}
    with log.open("ab") as out:
        done = subprocess.run(
            evoenv(
                "eval",
                "--env",
                ENV,
                "--difficulty",
                str(DIFFICULTY),
                "--instances",
                str(INSTANCES),
                "--json",
            ),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
            check=False,
        )
    assert done.returncode == 0, log.read_text()[-4000:]
    client = redis.Redis.from_url(cluster.env["EVOENV_REDIS_URL"])
    try:
        entries = client.xrange(keys.rollout_stream(f"{run}-eval"))
    finally:
        client.close()
    rewards: dict[int, float] = {}
    for _, fields in entries:
        group = decode_entry(fields)
        (completion,) = group.completions
        assert completion.reward is not None, f"env_error on seed {group.seed}: {completion}"
        rewards[group.seed] = completion.reward
    assert sorted(rewards) == [EVAL_SEEDS.start + k for k in range(INSTANCES)]
    return rewards


def sign_test(b: int, c: int) -> float:
    """One-sided exact p-value of b or more successes in b + c fair coin flips."""
    n = b + c
    return sum(math.comb(n, k) for k in range(b, n + 1)) / 2**n if n else 1.0


def test_held_out_reward_rises_after_training(cluster: Cluster, tmp_path: Path) -> None:
    started = time.monotonic()
    log = tmp_path / "learns.log"
    before = held_out(cluster, "before", log)
    rate_before = sum(before.values()) / INSTANCES
    if not BAND[0] <= rate_before <= BAND[1]:
        pytest.fail(
            f"the untrained model's pass rate on {ENV} at difficulty {DIFFICULTY} is "
            f"{rate_before:.2f} ({INSTANCES} held-out instances), outside {BAND}: the test's "
            "choice of seed and difficulty no longer holds (model or seed changed?); measure "
            "again and choose another, see the module docstring"
        )

    with log.open("ab") as out:
        trained = subprocess.run(
            evoenv("learner", "--steps", str(STEPS)),
            env=learner_env(cluster, tmp_path / "run"),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=1200,
            check=False,
        )
    assert trained.returncode == 0, log.read_text()[-4000:]

    after = held_out(cluster, "after", log)
    rate_after = sum(after.values()) / INSTANCES
    b = sum(before[s] < 1.0 <= after[s] for s in before)
    c = sum(after[s] < 1.0 <= before[s] for s in before)
    p = sign_test(b, c)
    summary = (
        f"{ENV} d={DIFFICULTY}, {INSTANCES} held-out instances: mean reward "
        f"{rate_before:.3f} -> {rate_after:.3f}; wrong->right {b}, right->wrong {c}, "
        f"one-sided sign test p = {p:.2g}; {time.monotonic() - started:.0f} s after the cluster"
    )
    print(summary)
    assert rate_after - rate_before >= MIN_RISE, summary
    assert p < ALPHA, summary
