"""The sandbox's ordinary behaviour: operations, limits, recovery, leaks, and how it starts.

These run the real confined sandbox; only the tests about refusing to start, the unconfined
mode and the host's backstop replace a piece (the isolation check, the server command).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from evoenv_worker.grade import grade_group, grade_op_seconds
from evoenv_worker.model_stages import calibration_stage
from evoenv_worker.sandbox import confine, host, launch
from evoenv_worker.sandbox.host import Sandbox
from shared.config import SandboxSettings, Settings
from shared.env_stats import CalibrationFigures
from shared.environment import Environment, make_rng, seed_global_random
from shared.errors import SandboxFailure, SandboxUnavailable
from shared.messages import (
    CompletionRecord,
    EnvRef,
    SolverGroupData,
    SolverJob,
    StageJob,
    Trace,
)

REPO = Path(__file__).resolve().parents[2]

TOOLS_SOURCE = '''
import os
import random

from shared.environment import Environment


class Tools(Environment):
    """Its scorer does what the answer says: loop, allocate, crash, start threads, hash."""

    name = "tools"
    description = "A scorer that follows orders."

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"hash": hash("evoenv"), "n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return "Give an order."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        order, _, amount = answer.partition(" ")
        if order == "loop":
            while True:
                pass
        if order == "allocate":
            block = bytearray(int(amount) << 20)
            return float(len(block) > 0)
        if order == "abort":
            os.abort()
        if order == "threads":
            import threading
            import time

            threads = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(int(amount))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return 1.0
'''


GRADE_SOURCE = """
import random

from shared.environment import Environment


class Graded(Environment):
    \"\"\"Its sampler fails at difficulty 9; its scorer mutates what it is given, then obeys.\"\"\"

    name = "graded"
    description = "Double a number; the scorer follows orders."

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        if difficulty == 9:
            raise RuntimeError("no instance at difficulty 9")
        return {"n": rng.randint(1, 10 ** difficulty), "seen": []}

    def solve(self, instance: dict) -> list:
        return [2 * instance["n"]]

    def render(self, instance: dict) -> str:
        return f"What is twice {instance['n']}?"

    def score(self, instance: dict, reference: list, answer: str) -> float:
        if instance["seen"] or reference != [2 * instance["n"]]:
            return 0.5  # what an earlier call did to its instance or reference leaked here
        instance["seen"].append(answer)
        instance["n"] = -1
        reference.append(0)
        if answer == "raise":
            raise ValueError("cannot read " + answer)
        if answer == "big":
            return 2.0
        if answer == "loop":
            while True:
                pass
        return 1.0 if answer == str(reference[0]) else 0.0
"""
"""An environment for the `grade` op: per-answer copies, per-answer failures, failed ops."""


def grade(seed: int, difficulty: int, answers: list[object]) -> dict[str, object]:
    return {"op": "grade", "seed": seed, "difficulty": difficulty, "answers": answers}


def right_answer(sandbox: Sandbox, seed: int, difficulty: int) -> tuple[str, dict[str, Any]]:
    [made] = sandbox.run(GRADE_SOURCE, [{"op": "instance", "seed": seed, "difficulty": difficulty}])
    assert made.ok, made
    return made.value["answer_text"], made.value


def order(text: str) -> dict[str, object]:
    return {"op": "score", "answer": text, "instance": {}, "reference": 0}


def load_seed(name: str) -> Environment:
    spec = importlib.util.spec_from_file_location(f"seed_{name}", REPO / "seeds" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    [cls] = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Environment) and v is not Environment
    ]
    return cls()


# ----------------------------------------------------------------------------- confined


def test_the_server_reports_its_confinement(
    sandbox: Sandbox, confined_settings: SandboxSettings
) -> None:
    status = sandbox.confinement
    assert sandbox.isolated and status["isolated"] is True
    assert status["landlock_abi"] >= confine.MIN_LANDLOCK_ABI
    assert status["seccomp"] and status["no_new_privs"] and status["scoped"]
    expected_uid = confined_settings.uid if os.geteuid() == 0 else os.getuid()
    assert status["uid"] == expected_uid != 0


def test_ops_match_the_seed_run_in_process(sandbox: Sandbox) -> None:
    seed = load_seed("sort_words")
    source = (REPO / "seeds" / "sort_words.py").read_text()
    ops: list[dict[str, object]] = [{"op": "describe"}]
    for s in range(3):
        ops.append({"op": "instance", "seed": s, "difficulty": 4})
        ops.append({"op": "score", "answer": "wrong", "from": len(ops) - 1})
    results = sandbox.run(source, ops)
    assert all(r.ok for r in results), results
    assert results[0].value["name"] == "sort_words"
    for s in range(3):
        seed_global_random("sort_words", s, 4)
        instance = seed.sample(make_rng("sort_words", s, 4), 4)
        value = results[1 + 2 * s].value
        assert value["instance"] == instance
        assert value["reference"] == seed.solve(instance)
        assert value["prompt"] == seed.render(instance)
        assert results[2 + 2 * s].value == 0.0
        [right] = sandbox.run(
            source,
            [
                {
                    "op": "score",
                    "answer": value["answer_text"],
                    "instance": instance,
                    "reference": value["reference"],
                }
            ],
        )
        assert right.ok and right.value == 1.0


def test_the_solve_op_solves_a_given_instance(sandbox: Sandbox) -> None:
    """Another environment's instance, as admission's same-oracle check sends it: the
    reference and answer text when solve copes, a failed op when it does not."""
    seed = load_seed("sort_words")
    source = (REPO / "seeds" / "sort_words.py").read_text()
    instance = seed.sample(make_rng("sort_words", 3, 2), 2)
    results = sandbox.run(
        source,
        [
            {"op": "solve", "instance": instance},
            {"op": "solve", "instance": {"numbers": [3, 1, 2]}},  # another shape
            {"op": "solve", "instance": [1, 2]},
        ],
    )
    assert results[0].ok, results[0]
    assert results[0].value == {
        "reference": seed.solve(instance),
        "answer_text": seed.answer_text(seed.solve(instance)),
    }
    assert (results[1].ok, results[1].kind, results[1].routine) == (False, "exception", "solve")
    assert "KeyError" in results[1].error
    assert (results[2].ok, results[2].kind) == (False, "type")


def hash_with_seed_zero(text: str) -> int:
    """`hash(text)` in a Python started with PYTHONHASHSEED=0."""
    done = subprocess.run(
        [sys.executable, "-c", f"print(hash({text!r}))"],
        check=True,
        env={"PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_the_hash_seed_is_fixed(sandbox: Sandbox) -> None:
    [result] = sandbox.run(TOOLS_SOURCE, [{"op": "instance", "seed": 1, "difficulty": 1}])
    assert result.value["instance"]["hash"] == hash_with_seed_zero("evoenv")


def test_a_timeout_leaves_the_other_ops_running(sandbox: Sandbox) -> None:
    start = time.monotonic()
    results = sandbox.run(TOOLS_SOURCE, [order("loop"), order("ok"), order("ok")])
    assert [r.kind for r in results] == ["timeout", "", ""]
    assert [r.value for r in results[1:]] == [1.0, 1.0]
    assert time.monotonic() - start < sandbox.settings.op_seconds + 2.0


def test_memory_limit(sandbox: Sandbox) -> None:
    results = sandbox.run(TOOLS_SOURCE, [order("allocate 64"), order("allocate 4096")])
    assert results[0].ok and results[0].value == 1.0
    assert not results[1].ok and results[1].kind == "memory"


def test_threads_fit_in_the_memory_limit(sandbox: Sandbox) -> None:
    """1 MiB thread stacks and two malloc arenas: 100 threads fit in a 512 MiB limit."""
    [result] = sandbox.run(TOOLS_SOURCE, [order("threads 100")])
    assert result.ok, result


def test_a_crashed_child_and_a_killed_server_are_recovered(
    sandbox: Sandbox, sandbox_processes: Callable[[Sandbox], tuple[int, list[int]]]
) -> None:
    results = sandbox.run(TOOLS_SOURCE, [order("abort"), order("ok")])
    assert [(r.kind, r.value) for r in results] == [("crash", None), ("", 1.0)]
    assert "SIGABRT" in results[0].error
    pid, _ = sandbox_processes(sandbox)
    fds = len(os.listdir("/proc/self/fd"))
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while sandbox_processes(sandbox)[0] != -1:  # dead between calls, then restarted by run
        assert time.monotonic() < deadline
        time.sleep(0.01)
    [after] = sandbox.run(TOOLS_SOURCE, [order("ok")])
    assert after.ok
    assert sandbox_processes(sandbox)[0] not in (pid, -1)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_thousand_calls_leak_no_process_or_descriptor(
    sandbox: Sandbox, sandbox_processes: Callable[[Sandbox], tuple[int, list[int]]]
) -> None:
    sandbox.run(TOOLS_SOURCE, [order("ok")])
    fds = len(os.listdir("/proc/self/fd"))
    processes = sandbox_processes(sandbox)
    restarts = sandbox.restarts
    for _ in range(1000):
        [result] = sandbox.run(TOOLS_SOURCE, [order("ok")])
        assert result.ok
    assert len(os.listdir("/proc/self/fd")) == fds
    assert sandbox_processes(sandbox) == processes
    assert sandbox.restarts == restarts


def test_closing_leaves_no_process(
    confined_settings: SandboxSettings,
    sandbox_processes: Callable[[Sandbox], tuple[int, list[int]]],
) -> None:
    sandbox = Sandbox(confined_settings)
    sandbox.start()
    pid, inside = sandbox_processes(sandbox)
    assert len(inside) >= 2  # bubblewrap's init, the fork server
    sandbox.close()
    deadline = time.monotonic() + 5.0
    while any(Path(f"/proc/{p}").exists() for p in [pid, *inside]):
        assert time.monotonic() < deadline, "sandbox processes outlived close()"
        time.sleep(0.05)


def test_the_confined_command_binds_only_what_it_needs(
    confined_settings: SandboxSettings,
) -> None:
    argv, env, isolated = launch.server_command(confined_settings, hash_seed=0)
    assert isolated and env == {}
    assert Path(argv[0]).name == "bwrap"
    for flag in (
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in argv
    sources = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind"]
    assert str(REPO) not in sources and str(REPO / ".venv") not in sources
    assert not any(src.startswith(str(REPO / ".venv")) for src in sources)
    project = sorted(src for src in sources if src.startswith(str(REPO)))
    assert project == sorted(
        str(p)
        for p in (
            launch.RUNNER,
            launch.CONFINE,
            REPO / "shared/__init__.py",
            REPO / "shared/environment.py",
        )
    )
    assert argv[-3:] == [f"{confine.ROOT}/sandbox/runner.py", confine.ROOT, "--confine"]
    if os.geteuid() == 0:
        assert f"--reuid={confined_settings.uid}" in argv and "--bounding-set=-all" in argv


# ----------------------------------------------------------------------------- the grade op


def rewards(graded: dict[str, Any]) -> list[float | None]:
    """Each answer's reward in a `grade` op's value (None where it has none)."""
    return [None if k is None else graded["scores"][k] for k in graded["outcomes"]]


def test_the_grade_op_scores_every_answer_against_one_instance(sandbox: Sandbox) -> None:
    right, made = right_answer(sandbox, 3, 2)
    answers: list[object] = [right, "0", None, right, right + "0"]
    [result] = sandbox.run(GRADE_SOURCE, [grade(3, 2, answers)])
    assert result.ok, result
    # Every call gets its own instance and reference: what the scorer did to them in one call
    # (it mutates both) never reaches the next, so the second right answer scores 1.0 too.
    assert rewards(result.value) == [1.0, 0.0, None, 1.0, 0.0]
    assert result.value["scores"] == [1.0, 0.0]  # each distinct reward once
    assert result.value["errors"] == {}
    assert result.value["prompt"] == made["prompt"]
    assert result.value["answer_text"] == right
    assert {"sample", "solve", "score"} <= set(result.seconds)


def test_the_grade_op_matches_the_seed_run_in_process(sandbox: Sandbox) -> None:
    seed = load_seed("sort_words")
    source = (REPO / "seeds" / "sort_words.py").read_text()
    seed_global_random("sort_words", 5, 4)
    instance = seed.sample(make_rng("sort_words", 5, 4), 4)
    reference = seed.solve(instance)
    right = seed.answer_text(reference)
    answers = [right, "wrong", right.replace(", ", ","), right[::-1]]
    [result] = sandbox.run(source, [grade(5, 4, list(answers))])
    assert result.ok, result
    assert rewards(result.value) == [seed.score(instance, reference, a) for a in answers]
    assert result.value["prompt"] == seed.render(instance)
    assert result.value["answer_text"] == right


def test_a_request_of_megabytes_arrives_whole(sandbox: Sandbox) -> None:
    """A request far larger than a pipe's buffer reaches the server in many reads, whole."""
    right, _ = right_answer(sandbox, 3, 2)
    answers: list[object] = [right, "x" * 5000] * 400  # some 2 MB
    [result] = sandbox.run(GRADE_SOURCE, [grade(3, 2, answers)], op_seconds=30.0)
    assert result.ok, result
    assert rewards(result.value) == [1.0, 0.0] * 400


def test_a_request_that_is_not_json_values_is_refused_before_it_is_sent(
    sandbox: Sandbox,
) -> None:
    with pytest.raises(TypeError, match="JSON values only"):
        sandbox.run(GRADE_SOURCE, [grade(3, 2, [object()])])
    [result] = sandbox.run(GRADE_SOURCE, [grade(3, 2, ["0"])])
    assert result.ok and rewards(result.value) == [0.0]


def test_a_failing_answer_fails_alone(sandbox: Sandbox) -> None:
    right, _ = right_answer(sandbox, 4, 2)
    [result] = sandbox.run(GRADE_SOURCE, [grade(4, 2, ["raise", right, "big", 7, right])])
    assert result.ok, result
    assert rewards(result.value) == [None, 1.0, None, None, 1.0]
    errors = result.value["errors"]
    assert sorted(errors) == ["0", "2", "3"]  # by position, only the answers that failed
    assert "ValueError: cannot read raise" in errors["0"]
    assert "outside [0, 1]" in errors["2"]
    assert errors["3"] == "answer must be a string"


def test_a_sampling_failure_fails_the_grade_op(sandbox: Sandbox) -> None:
    [failed, malformed] = sandbox.run(
        GRADE_SOURCE,
        [grade(1, 9, ["2", None]), {"op": "grade", "seed": 1, "difficulty": 2, "answers": "2"}],
    )
    assert (failed.ok, failed.kind, failed.routine) == (False, "exception", "sample")
    assert "no instance at difficulty 9" in failed.error
    assert (malformed.ok, malformed.kind) == (False, "type")


def test_a_timeout_fails_the_whole_grade_op(
    sandbox: Sandbox, check_benign: Callable[[Sandbox], None]
) -> None:
    right, _ = right_answer(sandbox, 2, 2)
    start = time.monotonic()
    [result] = sandbox.run(GRADE_SOURCE, [grade(2, 2, [right, "loop", right])], op_seconds=1.0)
    assert (result.ok, result.kind) == (False, "timeout"), result
    assert "no result within 1 s" in result.error
    assert time.monotonic() - start < 1.0 + 2.0
    check_benign(sandbox)


WRITER_SOURCE = """
import marshal
import os
import random

from shared.environment import Environment

FORGED = marshal.dumps(compile("raise SystemExit('forged')", "environment.py", "exec")).hex()


class Writer(Environment):
    \"\"\"Its scorer writes a line of its own on every descriptor it has.\"\"\"

    name = "NAME"
    description = "Write a line of its own where its results go."

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(1, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return "Repeat the number."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        line = LINE
        for fd in range(3, 256):
            try:
                os.write(fd, line)
            except OSError:
                pass
        return 1.0
"""


def writer_source(name: str, line: str) -> str:
    """An environment named `name` whose scorer writes the bytes of the expression `line`."""
    return WRITER_SOURCE.replace("NAME", name).replace("LINE", line)


POISON_SOURCE = writer_source("poison", """('{"code":"%s"}\\n' % FORGED).encode()""")
"""Writes a code line: compiled code of its own, as if for the host's code cache."""


def test_a_child_cannot_plant_code_in_the_code_cache(sandbox: Sandbox) -> None:
    """The host keeps the compiled module of a source (the first line of the first child
    that compiles it, written before any environment code runs). A forged code line written by
    environment code, whether or not the source is cached yet, is a malformed result, and later
    requests still run the real module."""
    source = POISON_SOURCE + f"# {time.time_ns()}\n"  # not cached yet
    for _ in range(2):  # the first compiles (and the host keeps it), the second unmarshals
        [attack] = sandbox.run(source, [grade(1, 1, ["1"])])
        assert (attack.ok, attack.kind) == (False, "output"), attack
        [describe, made] = sandbox.run(
            source, [{"op": "describe"}, {"op": "instance", "seed": 1, "difficulty": 1}]
        )
        assert describe.ok and describe.value["name"] == "poison", describe
        assert made.ok and made.value["prompt"] == "Repeat the number.", made


GARBLE_SOURCE = writer_source(
    "garble", """('{"i":0,"ok":true,"value":' + "[" * 100_000 + "\\n").encode()"""
)
"""Writes a line that begins as the result of op 0 does, then nests deeper than any JSON
reader goes."""


def test_a_malformed_result_line_fails_its_op_only(sandbox: Sandbox) -> None:
    """A line that begins as op 0's result does but cannot be read fails op 0. The child's
    own result for op 0 then comes where op 1's is due: the host stops the child there (op 1
    fails), and op 2 runs in a fresh one. The server lives on."""
    restarts = sandbox.restarts
    score = {"op": "score", "answer": "1", "instance": {"n": 1}, "reference": 1}
    [garbled, late, described] = sandbox.run(
        GARBLE_SOURCE, [score, {"op": "describe"}, {"op": "describe"}]
    )
    assert (garbled.ok, garbled.kind) == (False, "output"), garbled
    assert "malformed" in garbled.error
    assert (late.ok, late.kind) == (False, "output"), late
    assert described.ok and described.value["name"] == "garble", described
    assert sandbox.restarts == restarts


def _counting_runs(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    run = sandbox.run

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return run(*args, **kwargs)

    monkeypatch.setattr(sandbox, "run", counting)
    return calls


def test_grade_group_grades_a_group_in_one_grade_op(
    sandbox: Sandbox, confined_settings: SandboxSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the solver's answers alone: the probes and re-scores are test_probes.py's
    settings = Settings(sandbox=confined_settings, pool={"probe_rate": 0, "rescore_rate": 0})
    right, _ = right_answer(sandbox, 6, 2)
    texts = [f"<answer>{right}</answer>", "<answer>0</answer>", "no span", "<answer>raise</answer>"]
    job = SolverJob(
        run="test",
        group_id="group",
        env=EnvRef(name="graded", sha="0" * 64, source=GRADE_SOURCE),
        seed=6,
        difficulty=2,
        group_size=len(texts),
        prompt="(prompt)",
        completions=[CompletionRecord(text=t) for t in texts],
    )
    calls = _counting_runs(sandbox, monkeypatch)
    group = grade_group(sandbox, job, settings)
    [(args, kwargs)] = calls
    assert args[1] == [grade(6, 2, [right, "0", None, "raise"])]
    assert kwargs["op_seconds"] == grade_op_seconds(settings, 3) == 4 * confined_settings.op_seconds
    graded = [(c.outcome, c.reward) for c in group.completions]
    assert graded == [("scored", 1.0), ("scored", 0.0), ("format_error", 0.0), ("env_error", None)]
    assert "ValueError: cannot read raise" in group.completions[3].detail
    assert group.data == SolverGroupData(reference=str(right))  # the answer text beside

    failed = grade_group(sandbox, job.model_copy(update={"difficulty": 9}), settings)
    assert [(c.outcome, c.reward) for c in failed.completions] == [("env_error", None)] * 4
    assert isinstance(failed.data, SolverGroupData) and failed.data.env_error is not None
    assert failed.data.env_error.startswith("sampling failed: sample raised RuntimeError")


def test_calibration_grades_one_answer_per_instance(
    sandbox: Sandbox, confined_settings: SandboxSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(sandbox=confined_settings)
    seeds = [1, 2, 3]
    rights = [right_answer(sandbox, s, 2)[0] for s in seeds]
    job = StageJob(
        job_id="job",
        run="test",
        env=EnvRef(name="graded", sha="0" * 64, source=GRADE_SOURCE),
        oracle="equality",
        difficulty=2,
        trace=Trace(seed=0, difficulty=2, prompt="(prompt)", reference=[0], answer_text="0"),
        seeds=seeds,
        completions=[
            CompletionRecord(text=t)
            for t in (f"<answer>{rights[0]}</answer>", f"<answer>{rights[1]}</answer>", "none")
        ],
    )
    calls = _counting_runs(sandbox, monkeypatch)
    report = calibration_stage(sandbox, job, settings)
    assert report.ok, report
    assert (report.data["passes"], report.data["env_errors"]) == (2, 0)
    assert CalibrationFigures.model_validate(report.data).instances == 3  # the archive keeps it
    [(args, kwargs)] = calls
    assert args[1] == [grade(1, 2, [rights[0]]), grade(2, 2, [rights[1]]), grade(3, 2, [None])]
    assert kwargs["op_seconds"] == grade_op_seconds(settings, 1)

    raising = [CompletionRecord(text="<answer>raise</answer>"), *job.completions[1:]]
    report = calibration_stage(sandbox, job.model_copy(update={"completions": raising}), settings)
    assert not report.ok and report.data["env_errors"] == 1
    assert "scorer failed on 1 of 3" in report.detail


# ----------------------------------------------------------------------------- start-up


def test_the_filter_is_refused_on_other_architectures() -> None:
    assert len(confine.build_filter("x86_64")) % 8 == 0
    with pytest.raises(confine.ConfinementError, match="x86_64 only"):
        confine.build_filter("aarch64")


def _run_filter(program: bytes, nr: int, arch: int = 0xC000003E, arg0: int = 0) -> int:
    """What the classic BPF `program` returns for a syscall: the few instructions it uses."""
    words = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF, 20: arg0 >> 32}
    code = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    pc = accumulator = 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:  # load a word of seccomp_data
            accumulator, pc = words[k], pc + 1
        elif op == 0x06:  # return
            return k
        else:
            taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: accumulator & k}[op]
            pc += 1 + (jt if taken else jf)


def test_the_filter_denies_exactly_its_list() -> None:
    """Every x86_64 syscall number up to 1023: the denied ones (listed, or removed from the
    kernel) get EPERM, every other one passes; clone only for threads, clone3 ENOSYS, prlimit
    only on itself, and another ABI kills."""
    program = bytes(confine.build_filter("x86_64"))
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000
    denied = {*confine._X86_64_DENIED.values(), *confine._X86_64_OBSOLETE.values()}
    special = {56, 435, 302}  # clone, clone3, prlimit64
    for nr in set(range(1024)) - special:
        assert _run_filter(program, nr) == (eperm if nr in denied else allow), nr
    thread = 0x00010000 | 0x00000100 | 0x00000200  # CLONE_THREAD | CLONE_VM | CLONE_FS
    assert _run_filter(program, 56, arg0=thread) == allow
    assert _run_filter(program, 56, arg0=0x11) == eperm  # fork as glibc does it
    assert _run_filter(program, 56, arg0=thread | 0x10000000) == eperm  # CLONE_NEWUSER
    assert _run_filter(program, 435) == enosys
    assert _run_filter(program, 302, arg0=0) == allow
    assert _run_filter(program, 302, arg0=1) == eperm
    assert _run_filter(program, 0x40000000 | 1) == kill  # x32
    assert _run_filter(program, 1, arch=0x40000003) == kill  # i386


def test_missing_isolation_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "_verified_uids", set())
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    monkeypatch.setattr(launch.confine, "landlock_abi", lambda: 3)
    text = "; ".join(launch.missing_isolation())
    assert "apt-get install bubblewrap" in text
    assert "Landlock ABI 3" in text
    if os.geteuid() == 0:
        assert "apt-get install util-linux" in text


def test_refuses_to_start_without_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        launch,
        "missing_isolation",
        lambda uid=0: ["bubblewrap is missing: apt-get install bubblewrap"],
    )
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap") as caught:
        Sandbox(SandboxSettings()).start()
    assert "EVOENV_SANDBOX__ALLOW_UNCONFINED" in str(caught.value)


def test_unconfined_mode_says_it_is_not_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "missing_isolation", lambda uid=0: ["no bubblewrap"])
    with (
        structlog.testing.capture_logs() as logs,
        Sandbox(SandboxSettings(allow_unconfined=True)) as sandbox,
    ):
        [result] = sandbox.run(TOOLS_SOURCE, [{"op": "instance", "seed": 1, "difficulty": 1}])
        assert sandbox.isolated is False
        assert sandbox.confinement == {"isolated": False}
    assert result.ok and result.value["instance"]["hash"] == hash_with_seed_zero("evoenv")
    events = {log["event"] for log in logs}
    assert {"sandbox_unconfined", "sandbox_not_isolated"} <= events


def test_the_host_kills_a_server_that_stops_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    hung = [
        sys.executable,
        "-c",
        "import socket, time; control = socket.socket(fileno=0); "
        "control.send(b'{\"ready\": true}'); time.sleep(60)",
    ]
    monkeypatch.setattr(host, "server_command", lambda settings, hash_seed: (hung, {}, False))
    monkeypatch.setattr(host, "_SLACK_SECONDS", 0.5)
    sandbox = Sandbox(SandboxSettings(op_seconds=0.5, allow_unconfined=True))
    sandbox.start()
    first = sandbox._proc
    assert first is not None
    start = time.monotonic()
    with pytest.raises(SandboxFailure, match="deadline"):
        sandbox.run(TOOLS_SOURCE, [order("ok")])
    assert time.monotonic() - start < 5.0
    assert first.poll() is not None
    assert sandbox.restarts == 2


@pytest.mark.parametrize(
    "message",
    [b'["status", 1, "crash", "where a child is due"]', b'["child", 1]', b"not json"],
)
def test_the_host_ends_a_server_that_breaks_the_protocol(
    monkeypatch: pytest.MonkeyPatch, message: bytes
) -> None:
    """What the server sends is untrusted too: a message the protocol does not allow where it
    comes (here a status where a child is due, a child without its pipes, garbage) ends that
    server; the host restarts it once, then gives up with the reason."""
    broken = [
        sys.executable,
        "-c",
        "import socket, sys, time; control = socket.socket(fileno=0); "
        "control.send(b'{\"ready\": true}'); control.send(sys.argv[1].encode()); time.sleep(60)",
        message.decode(),
    ]
    monkeypatch.setattr(host, "server_command", lambda settings, hash_seed: (broken, {}, False))
    sandbox = Sandbox(SandboxSettings(op_seconds=0.5, allow_unconfined=True))
    sandbox.start()
    first = sandbox._proc
    assert first is not None
    with pytest.raises(SandboxFailure, match=r"unexpected message|not JSON"):
        sandbox.run(TOOLS_SOURCE, [order("ok")])
    assert first.poll() is not None
    assert sandbox.restarts == 2
    sandbox.close()
