"""The generator's code extraction and the reviewer's verdict parsing (no model needed)."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from evoenv_worker.mechanical import validate_source
from evoenv_worker.proposal_code import (
    repaired_code,
    repairs,
    with_missing_helpers,
    with_missing_imports,
    written_code,
)
from evoenv_worker.review import parse_verdict, review_messages, summarise
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.messages import Trace
from shared.proposal_prompt import (
    TOPICS,
    Example,
    choose_examples,
    helpers_first,
    proposal_messages,
)
from shared.static import check_static

SEEDS = sorted((Path(__file__).resolve().parents[1] / "seeds").glob("*.py"))

CLASS = "from shared.environment import Environment\n\nclass A(Environment):\n    name = 'a'\n"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (f"Here it is:\n```python\n{CLASS}```\nDone.", CLASS),
        (f"```py\n{CLASS}```", CLASS),
        (f"```\n{CLASS}```", CLASS),
        (f"```python\nx = 1\n```\nand the file:\n```python\n{CLASS}```", CLASS),  # the class wins
        (f"```python\n{CLASS}", CLASS),  # unterminated fence (ran out of tokens)
        (f"Sure! {CLASS}".replace("Sure! from", "Sure!\nfrom"), CLASS),  # no fence at all
        ("I cannot help with that.", ""),
    ],
)
def test_written_code(response: str, expected: str) -> None:
    assert written_code(response).strip() == expected.strip()
    assert repaired_code(response).strip() == expected.strip()  # nothing missing


DROPPED_IMPORTS = """\
\"\"\"A docstring.\"\"\"

from __future__ import annotations

from shared.environment import Environment

INTEGER = re.compile(r"[0-9]+")


class Pick(Environment):
    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"items": sorted(collections.Counter([1, 1]).elements())}

    def solve(self, instance: dict, math=None) -> int:
        return math


def _parse(json: str) -> int:
    return json.count("1")  # an argument called json, not the module
"""


def test_extraction_adds_the_standard_imports_a_proposal_dropped() -> None:
    code = repaired_code(f"```python\n{DROPPED_IMPORTS}```")
    lines = code.splitlines()
    base = lines.index("from shared.environment import Environment")
    added = lines[base - 3 : base]  # after the docstring and the __future__ import
    assert added == ["import collections", "import random", "import re"]
    assert code.replace("import collections\nimport random\nimport re\n", "") == DROPPED_IMPORTS
    namespace: dict[str, object] = {}
    exec(compile(code, "pick.py", "exec"), namespace)  # this test's own text: it now runs
    assert namespace["Pick"]().sample(random.Random(0), 1) == {"items": [1, 1]}  # type: ignore[operator]
    complete = (SEEDS[0]).read_text("utf-8")
    assert with_missing_imports(complete) == complete  # nothing missing: unchanged
    assert with_missing_imports("def f(:\n    re.x\n") == "def f(:\n    re.x\n"  # not Python


def test_extraction_adds_the_base_class_import_a_proposal_dropped() -> None:
    for seed in SEEDS:
        source = seed.read_text("utf-8")
        dropped = source.replace("from shared.environment import Environment\n", "")
        assert not check_static(dropped.encode(), 64 * 1024).ok  # L1: no Environment import
        code = repaired_code(f"```python\n{dropped}```")
        assert check_static(code.encode(), 64 * 1024).ok, seed.name
        assert code.count("from shared.environment import Environment") == 1
    aliased = "from shared.environment import Environment as Base\n\n\nclass A(Base):\n    pass\n"
    assert with_missing_imports(aliased) == aliased  # bound under another name: unchanged


def test_a_proposal_calling_its_example_helpers_gets_them_and_passes_l1_to_l5() -> None:
    """Each seed's class alone (its helpers, constants and imports dropped), answered to a
    prompt showing that seed: completed from the prompt, it is admitted at L1-L5 again."""
    settings = Settings()
    completed = 0
    with Sandbox(settings.sandbox) as box:
        for path in SEEDS:
            source = path.read_text("utf-8")
            tree = ast.parse(source)
            (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
            class_only = ast.get_source_segment(source, cls) or ""
            prompt = proposal_messages([Example(path.stem, "equality", source, "x")])[-1]
            code = repaired_code(f"```python\n{class_only}\n```", prompt["content"])
            report = validate_source(code.encode(), path.name, box, settings)
            assert report.failed_stage is None, (path.name, report.stages[-1].detail, code)
            completed += code.count("\ndef ") > 0
    assert completed >= 8  # the seeds with module-level helpers
    assert with_missing_helpers("class A(:\n", prompt["content"]) == "class A(:\n"


def test_helpers_come_only_from_the_prompt_and_only_when_called() -> None:
    prompt = "```python\nLIMIT = 3\n\n\ndef _clip(x):\n    return min(x, LIMIT)\n```"
    calls = "class A:\n    def f(self, x):\n        return _clip(x)\n"
    assert with_missing_helpers(calls, prompt) == (
        "LIMIT = 3\n\n\ndef _clip(x):\n    return min(x, LIMIT)\n\n\nclass A:\n"
        "    def f(self, x):\n        return _clip(x)\n"
    )
    own = "def _clip(x):\n    return x\n\n\n" + calls  # defined its own: kept as it is
    assert with_missing_helpers(own, prompt) == own
    assert with_missing_helpers(calls, "") == calls  # no examples: nothing to add


def test_repairs_name_what_extraction_would_add_and_the_candidate_is_as_written() -> None:
    response = f"```python\n{DROPPED_IMPORTS}```"
    assert written_code(response) == DROPPED_IMPORTS  # the candidate: nothing added
    assert repairs(response) == ["import collections", "import random", "import re"]
    prompt = "```python\nLIMIT = 3\n\n\ndef _clip(x):\n    return min(x, LIMIT)\n```"
    calls = "import math\n\n\nclass A:\n    def f(self, x):\n        return _clip(x)\n"
    assert repairs(f"```python\n{calls}```", prompt) == [
        "LIMIT (the example's helper)",
        "_clip (the example's helper)",
    ]
    assert repairs(f"```python\n{SEEDS[0].read_text('utf-8')}```", prompt) == []


def test_bare_names_of_allowlisted_modules_are_imported() -> None:
    code = (
        "class A:\n    def f(self, xs):\n        q = deque(xs)\n"
        "        return gcd(len(q), 4), Counter(q), undefined_thing\n"
    )
    completed = with_missing_imports(code)
    assert completed.splitlines()[:3] == [
        "from collections import Counter",
        "from collections import deque",
        "from math import gcd",
    ]
    assert "undefined_thing" not in completed.split("class")[0]  # not exported: left to L2
    assert with_missing_imports("e = 1\nprint(len([e]))\n") == "e = 1\nprint(len([e]))\n"


def test_examples_are_distinct_and_spread_across_kinds() -> None:
    pool = [Example(f"e{i}", "equality", "", str(i)) for i in range(6)]
    pool += [Example(f"f{i}", "feasibility", "", f"f{i}") for i in range(2)]
    rng = random.Random(0)
    draws = [choose_examples(pool, 2, rng) for _ in range(2000)]
    assert all(len({e.sha for e in chosen}) == 2 for chosen in draws)
    mixed = sum({e.oracle for e in chosen} == {"equality", "feasibility"} for chosen in draws)
    # Without the spread, a feasibility member is in 1 - (6/8)(5/7) = 46% of the pairs.
    assert mixed / len(draws) > 0.55
    assert sorted(e.sha for e in choose_examples(pool, 20, rng)) == sorted(e.sha for e in pool)


def test_examples_favour_the_solvers_frontier() -> None:
    rates = {"never": 0.0, "always": 1.0, "half": 0.5, "some": 0.2, "new": None}
    pool = [Example(name, "equality", "", name, rate) for name, rate in rates.items()]
    rng = random.Random(1)
    counts = dict.fromkeys(rates, 0)
    for _ in range(4000):
        counts[choose_examples(pool, 1, rng)[0].name] += 1
    assert counts["half"] > counts["some"] > counts["new"] > counts["never"]
    assert counts["never"] > 0 and counts["always"] > 0  # a floor, not an exclusion
    assert counts["half"] > 8 * counts["never"]


def test_proposal_prompt_shows_examples_whole() -> None:
    examples = [
        Example("x", "equality", "SOURCE-X", "1"),
        Example("y", "feasibility", "SOURCE-Y", "2"),
    ]
    text = proposal_messages(examples)[-1]["content"]
    assert "SOURCE-X" in text and "SOURCE-Y" in text and "Environment" in text
    assert "Pick a new algorithmic task" in text
    named = proposal_messages(examples, TOPICS[0])[-1]["content"]
    assert f"Its task: {TOPICS[0]}." in named and "Pick a new" not in named


def test_topics_are_distinct_and_none_is_a_seed() -> None:
    assert len(set(TOPICS)) == len(TOPICS) >= 50
    for path in SEEDS:
        words = path.stem.replace("_", " ")
        assert not any(words in topic for topic in TOPICS), path.stem


def test_examples_show_their_helpers_above_the_class_and_behave_the_same() -> None:
    ops = [{"op": "instance", "seed": s, "difficulty": d} for s in range(3) for d in (1, 5, 10)]
    with Sandbox(Settings().sandbox) as box:
        for path in SEEDS:
            source = path.read_text("utf-8")
            shown = helpers_first(source)
            assert check_static(shown.encode(), 64 * 1024).ok, path.name
            body = ast.parse(shown).body
            assert isinstance(body[-1], ast.ClassDef), path.name
            lines = sorted(line for line in source.splitlines() if line.strip())
            assert sorted(line for line in shown.splitlines() if line.strip()) == lines  # moved
            before = box.run(source, ops, filename=path.name)
            after = box.run(shown, ops, filename=path.name)
            assert all(r.ok for r in before), path.name
            assert [r.value for r in after] == [r.value for r in before], path.name


@pytest.mark.parametrize(
    "source",
    [
        "class A:\n    pass\n\nA.x = 1\n",  # uses the class after it
        "class A:\n    pass\n\nINSTANCE = A()\n",
        "class A:\n    pass\n\nif True:\n    pass\n",  # not a definition
        "def f(:\n",  # not Python
    ],
)
def test_helpers_stay_put_when_moving_them_could_change_the_file(source: str) -> None:
    assert helpers_first(source) == source


@pytest.mark.parametrize(
    ("text", "accept", "readable"),
    [
        (
            '{"data_flow": "ok", "trace": "ok", "algorithm": "ok", "scorer": "ok", "verdict": "accept", "bug": ""}',
            True,
            True,
        ),
        ('{"verdict": "reject", "bug": "solve ignores the last item"}', False, True),
        ('Findings...\n```json\n{"verdict": "ACCEPT", "bug": ""}\n```', True, True),
        ('The verdict: {"verdict": "accept"} trailing words', True, True),
        ("I think it is fine.", False, False),  # no verdict: a reject
        ('{"verdict": "maybe"}', False, False),
        ('{"verdict": "accept"', False, False),  # truncated JSON
        ("", False, False),
    ],
)
def test_parse_verdict(text: str, accept: bool, readable: bool) -> None:
    verdict = parse_verdict(text)
    assert (verdict.accept, verdict.readable) == (accept, readable)


def test_any_reject_or_unreadable_review_rejects() -> None:
    ok = parse_verdict('{"verdict": "accept", "bug": ""}')
    bad = parse_verdict('{"verdict": "reject", "bug": "off by one"}')
    unreadable = parse_verdict("no idea")
    assert summarise([ok, ok, ok], 3)[0]
    assert not summarise([ok, bad, ok], 3)[0]
    passes, detail = summarise([ok, ok, unreadable], 3)
    assert not passes and "could not be read" in detail
    assert not summarise([], 3)[0]


def test_review_prompt_carries_the_traced_instance() -> None:
    trace = Trace(seed=0, difficulty=5, prompt="PROMPT-TEXT", reference=[1, 2], answer_text="1, 2")
    text = review_messages("SOURCE", trace)[-1]["content"]
    assert "PROMPT-TEXT" in text and "[1, 2]" in text and "SOURCE" in text and "verdict" in text
