"""It learns, and no shortcut explains it: a few GRPO steps raise the served policy's greedy pass
rate on held-out instances above where it was and above the best constant answer.

Everything is real: the embedded model (Qwen2.5-Coder-0.5B-Instruct) served by vLLM on the CPU
(the e2e `cluster`, serving the prepared weights when this module starts), Redis, the worker
processes that sample, complete and grade in the sandbox, and `evoenv learner`, which pushes its
weights into that server after every step, so that the evaluation after training measures the
trained policy. The reward is the environment's own score: no shaping.

Protocol. (1) Before: `evoenv eval --json` on `INSTANCES` held-out instances (greedy, one
completion each, graded by the workers; the evaluation seed range is never drawn for training).
Its output also gives, on the same instances, the best constant answer (for an equality oracle
the most frequent reference answer) and its score. (2) `evoenv learner --steps STEPS` on
`copy_word` alone. (3) After: the same instances again, now under the last pushed version.

Pass only if, paired by instance (b: wrong before and right after; c: right before and wrong
after; `_nm`: the same on the non-modal instances, those the best constant gets wrong):
- the pass rate after beats before: exact one-sided sign test p < 0.01;
- the pass rate after beats the best constant's score by at least 0.05;
- on the non-modal instances alone the pass rate rises, sign test p < 0.05.

The instances are the evaluation seeds from index `FIRST` on; the environment, difficulty and
settings were chosen on the first 64 (a tuning slice), so the test's p-values mean what they
say. The untrained model's greedy answers, measured on the tuning slice (`evoenv eval -e ENV -d D
-n 64`, 32 tokens):

| environment, difficulty | pass rate | best constant | format errors | mean completion |
| ----------------------- | --------- | ------------- | ------------- | --------------- |
| copy_word, 1            | 0.77      | 0.02          | 10 of 64      | 8 tokens        |
| copy_word, 3            | 0.88      | 0.02          | 4 of 64       | 10 tokens       |
| edit_distance, 2        | 0.09      | 0.50 ('1')    | 0             | 8 tokens        |
| sort_words, 1           | 0.03      | 0.03          | 0             | 14 tokens       |
| planted_subset_sum, 1   | 0.13      | 0.19          | 0             | 15 tokens       |
| knapsack_max_value, 1   | 0.03      | 0.22 ('10')   | 4             | 14 tokens       |

(32 instances each below the first two rows.) On the seeds the small model is either near zero
(sort_words copies the prompt's example answer), or below a constant (edit_distance at
difficulty 1: 0.27 against 0.535 for always answering "1"). copy_word is the one where the model
knows most answers but not always how to give them: a quarter of its greedy answers are
`<word>` instead of `<answer>word</answer>`, so every answer differs (the best constant passes
about one instance in 64) and what training can add is visible in the format errors and the
pass rate alike. The line the test prints says how much of the change is format
(`fmt_err_before`, `fmt_err_after`).

Measured (AMD EPYC with AVX2 only, float32 serving and training, 2 cores; the cluster serving
the prepared weights, the same 128 instances each time):

| run | before | after | b  | c | fmt_err before -> after | p       | seconds without the cluster's start |
| --- | ------ | ----- | -- | - | ----------------------- | ------- | ----------------------------------- |
| 1   | 0.852  | 0.977 | 17 | 1 | 4 -> 0                  | 7.2e-05 | 1,362 (steps sharing the cores)     |
| 2   | 0.852  | 0.969 | 19 | 4 | 4 -> 0                  | 0.0013  | 1,286 (the learner taking turns)    |

On an AMD EPYC with AVX512-BF16 (bfloat16 serving and autocast), in `.ci/run`: 0.852 -> 1.000,
b 19, c 0, format errors 3 -> 0, p 1.9e-06, 256 s. On an Intel Xeon with AMX, in `.ci/run`:
0.875 -> 1.000, b 16, c 0, format errors 3 -> 0, p 1.5e-05, 266 s (the greedy answers before
training differ between CPU kinds: other bfloat16 kernels).

The best constant ('baqu') passes 1 of the 128; every instance is non-modal but that one. Most
of the rise is not format: 4 answers had no answer span before, 17-19 went from wrong to right.
Greedy decoding makes the measurement before training the same on every run (0.852): the noise
is in training.

The same protocol runs in LoRA mode (`EVOENV_GRPO__LORA_RANK=16 IT_LEARNS_LEARNING_RATE=...
pytest tests/e2e/test_it_learns.py`: not gated). Rank 8 at 1e-4, Intel Xeon with AMX: 0.875 ->
1.000, b 16, c 0, p 1.5e-05 (docs/results.md).

The line, parsed by whoever reads the output (also in pytest's terminal summary):
`it-learns: env=NAME difficulty=D n=N before=... after=... best_constant=... answer='A'
non_modal_before=... non_modal_after=... b=B c=C b_nm=B c_nm=C fmt_err_before=K fmt_err_after=K
p=X p_non_modal=Y lenient_before=... lenient_after=... b_lenient=B c_lenient=C p_lenient=Z
lora_rank=R lr=X`. The `lenient` figures pair the same instances with each answer taken
leniently (`evoenv eval`'s lenient pass rate: the tagged answer, else the last line, scored by
the environment; docs/CONTRACT.md): strict moving with lenient still is format, lenient moving
is content. They are reported, not gated: the test's margins are on the strict rates.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Cluster, evoenv, within_float32_budget

from shared.db import Archive
from shared.environment import EVAL_SEEDS

TIMEOUT = int(os.environ.get("IT_LEARNS_TIMEOUT", "1500"))
"""Seconds the test may take; `IT_LEARNS_TIMEOUT` gives an untuned environment with longer
prompts and answers more (bench/it_learns_untuned.py)."""
pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(TIMEOUT),
    within_float32_budget(22),
]

ENV = os.environ.get("IT_LEARNS_ENV", "copy_word")
"""The environment trained and measured. `IT_LEARNS_ENV` (a seed's name) and
`IT_LEARNS_DIFFICULTY` run the same protocol on another one, the claim untuned there (see
docs/results.md); the test then checks the same margins."""
ENV_FILE = Path(__file__).with_name("copy_word.py")
"""Added to the pool for the run when ENV is copy_word (the seeds are in it already)."""
DIFFICULTY = int(os.environ.get("IT_LEARNS_DIFFICULTY", "1"))
INSTANCES = 128
"""Held-out instances, the same ones before and after training."""
FIRST = 1000
"""Index of the first evaluation seed used: the tuning slice was the first 64."""
MAX_TOKENS = 32
"""Longest completion, in training and evaluation (the model answers in about 8 tokens)."""
STEPS = 2
"""Two steps, not three: after two, nearly every group of four answers is all right (no spread,
skipped). On an AMD EPYC with AVX2 only, steps 1 and 2 came 4 and 8.5 minutes after the
learner's start, then 131 groups in a row were skipped and no third step came in the 11.5
minutes the learner had left (the tables above were measured after three steps)."""
LEARNING_RATE = float(os.environ.get("IT_LEARNS_LEARNING_RATE", "5e-6"))
"""`IT_LEARNS_LEARNING_RATE` with `EVOENV_GRPO__LORA_RANK` > 0 runs the protocol in LoRA mode
(the cluster's server then takes adapters; an adapter needs a larger rate than full weights)."""
GROUP_SIZE = 4
BATCH_GROUPS = 8
CEILING = 0.9
"""Above this before training, the test could not show a rise: it says so and fails."""
ALPHA = 0.01
ALPHA_NON_MODAL = 0.05
MARGIN = 0.05
"""How far above the best constant's score the pass rate after training must be."""


def learner_env(cluster: Cluster, run_dir: Path) -> dict[str, str]:
    return {
        **cluster.env,
        "EVOENV_RUN": "learns",
        "EVOENV_LEARNER__RUN_DIR": str(run_dir),
        "EVOENV_LEARNER__ENVIRONMENTS": f'["{ENV}"]',
        "EVOENV_LEARNER__DIFFICULTY": str(DIFFICULTY),
        "EVOENV_LEARNER__GENERATOR_GROUPS_IN_FLIGHT": "0",
        # Groups still in flight when the learner stops are generated all the same, beside the
        # evaluation after training: no more than one batch's worth.
        "EVOENV_LEARNER__SOLVER_GROUPS_IN_FLIGHT": str(BATCH_GROUPS),
        "EVOENV_LEARNER__CHECKPOINT_EVERY": str(STEPS),
        "EVOENV_LEARNER__EVAL_EVERY": "1000",
        "EVOENV_GRPO__GROUP_SIZE": str(GROUP_SIZE),
        "EVOENV_GRPO__BATCH_GROUPS": str(BATCH_GROUPS),
        "EVOENV_GRPO__MAX_TOKENS": str(MAX_TOKENS),
        "EVOENV_GRPO__MICRO_BATCH": "4",
        "EVOENV_GRPO__LEARNING_RATE": str(LEARNING_RATE),
        "EVOENV_GRPO__TEMPERATURE": "1.0",
        # Sequences of ~120 tokens: activations are small, and recomputing them costs a third.
        "EVOENV_GRPO__GRADIENT_CHECKPOINTING": "false",
    }


def held_out(cluster: Cluster, run: str, log: Path) -> dict[str, Any]:
    """`evoenv eval --json`'s object for ENV under the policy served now: pass rate, best
    constant and one record per instance."""
    env = {**cluster.env, "EVOENV_RUN": run, "EVOENV_GRPO__MAX_TOKENS": str(MAX_TOKENS)}
    args = ("-e", ENV, "-d", str(DIFFICULTY), "-n", str(INSTANCES), "--first", str(FIRST))
    with log.open("ab") as errors:
        done = subprocess.run(
            evoenv("eval", *args, "--json"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            timeout=600,
            check=False,
        )
    assert done.returncode == 0, log.read_text()[-4000:]
    result = json.loads(done.stdout.decode().splitlines()[-1])["environments"][ENV]
    seeds = sorted(r["seed"] for r in result["records"])
    assert seeds == [EVAL_SEEDS.start + FIRST + k for k in range(INSTANCES)], "env errors?"
    assert result["best_constant"] is not None, "the best constant was not found"
    return result


def sign_test(b: int, c: int) -> float:
    """One-sided exact p-value of b or more successes in b + c fair coin flips."""
    n = b + c
    return sum(math.comb(n, k) for k in range(b, n + 1)) / 2**n if n else 1.0


def passes(result: dict[str, Any], reward: str = "reward") -> dict[int, bool]:
    """Per seed, whether the instance passed: strict (`reward`) or lenient (`lenient_reward`,
    its answer taken leniently: docs/CONTRACT.md)."""
    return {r["seed"]: r[reward] == 1.0 for r in result["records"]}


def paired(
    old: dict[int, bool], new: dict[int, bool], seeds: Collection[int] | None = None
) -> tuple[int, int]:
    """(b, c) over `seeds` (default: all): wrong before and right after, right before and wrong
    after."""
    chosen = old if seeds is None else seeds
    return sum(not old[s] and new[s] for s in chosen), sum(old[s] and not new[s] for s in chosen)


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The paired comparison and the line the test prints; the same pairs taken leniently
    (`_lenient`) say whether the content moved or only the format."""
    old, new = passes(before), passes(after)
    loose_old, loose_new = passes(before, "lenient_reward"), passes(after, "lenient_reward")
    # The best constant of either run (for an equality oracle the two are the same answer).
    best = max(before["best_constant"], after["best_constant"], key=lambda c: c["score"])
    source = before if best is before["best_constant"] else after
    non_modal = {r["seed"] for r in source["records"] if r["constant_reward"] != 1.0}
    b, c = paired(old, new)
    b_nm, c_nm = paired(old, new, non_modal)
    b_lenient, c_lenient = paired(loose_old, loose_new)
    n_nm = max(1, len(non_modal))
    out = {
        "before": sum(old.values()) / len(old),
        "after": sum(new.values()) / len(new),
        "best_constant": best["score"],
        "non_modal_before": sum(old[s] for s in non_modal) / n_nm,
        "non_modal_after": sum(new[s] for s in non_modal) / n_nm,
        "b": b,
        "c": c,
        "b_nm": b_nm,
        "c_nm": c_nm,
        "p": sign_test(b, c),
        "p_non_modal": sign_test(b_nm, c_nm),
        "lenient_before": sum(loose_old.values()) / len(loose_old),
        "lenient_after": sum(loose_new.values()) / len(loose_new),
        "b_lenient": b_lenient,
        "c_lenient": c_lenient,
        "p_lenient": sign_test(b_lenient, c_lenient),
    }
    fmt_before = sum(r["answer"] is None for r in before["records"])
    fmt_after = sum(r["answer"] is None for r in after["records"])
    out["line"] = (
        f"it-learns: env={ENV} difficulty={DIFFICULTY} n={len(old)} before={out['before']:.3f} "
        f"after={out['after']:.3f} best_constant={best['score']:.3f} answer={best['answer']!r} "
        f"non_modal_before={out['non_modal_before']:.3f} "
        f"non_modal_after={out['non_modal_after']:.3f} b={b} c={c} b_nm={b_nm} c_nm={c_nm} "
        f"fmt_err_before={fmt_before} fmt_err_after={fmt_after} p={out['p']:.2g} "
        f"p_non_modal={out['p_non_modal']:.2g} "
        f"lenient_before={out['lenient_before']:.3f} lenient_after={out['lenient_after']:.3f} "
        f"b_lenient={b_lenient} c_lenient={c_lenient} p_lenient={out['p_lenient']:.2g} "
        f"lora_rank={os.environ.get('EVOENV_GRPO__LORA_RANK', '0')} lr={LEARNING_RATE:g}"
    )
    return out


def test_greedy_pass_rate_rises_above_before_and_above_the_best_constant(
    cluster: Cluster, tmp_path: Path, claim: Any
) -> None:
    if ENV == "copy_word":
        Archive(cluster.settings().archive_url).add_environment(
            ENV, ENV_FILE.read_text(), status="admitted", origin="user"
        )
    log = tmp_path / "learns.log"
    before = held_out(cluster, "before", log)
    if before["pass_rate"] > CEILING:
        pytest.fail(
            f"the untrained model's pass rate on {ENV} at difficulty {DIFFICULTY} is "
            f"{before['pass_rate']:.2f}, above {CEILING}: no room to show a rise (model or "
            "environment changed?); measure again and choose another, see the module docstring"
        )

    with log.open("ab") as out:
        trained = subprocess.run(
            evoenv("learner", "--steps", str(STEPS)),
            env=learner_env(cluster, tmp_path / "run"),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=TIMEOUT - 300,  # the evaluations before and after take the rest
            check=False,
        )
    assert trained.returncode == 0, log.read_text()[-4000:]

    result = compare(before, held_out(cluster, "after", log))
    claim(result["line"])
    assert result["p"] < ALPHA, result["line"]
    assert result["after"] >= result["best_constant"] + MARGIN, result["line"]
    assert result["non_modal_after"] > result["non_modal_before"], result["line"]
    assert result["p_non_modal"] < ALPHA_NON_MODAL, result["line"]
