"""The novelty stage (docs/CONTRACT.md#novelty) with the real all-MiniLM-L6-v2, loaded with no
network.

Prompts come from the sandbox (seed 0, the middle difficulty), as in admission. Near-copies live
in `tests/corpus/novelty/`: a seed with its class, name, constants, helpers and local variables
renamed and its prompt reworded.
"""

from __future__ import annotations

import itertools
import math
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from evoenv_worker.novelty import (
    RECIPE,
    Embedder,
    EnvEmbedding,
    _balanced_chunks,
    code_for_embedding,
    cosine,
    group_novelty,
    novelty,
    similarity,
)
from evoenv_worker.sandbox.host import Sandbox
from shared.config import AdmissionSettings, Settings
from shared.env_stats import NoveltyFigures
from shared.messages import StageReport

REPO = Path(__file__).resolve().parents[1]
SEEDS = sorted((REPO / "seeds").glob("*.py"))
COPIES = {  # near-copy file -> the seed it copies
    "knapsack_renamed": "knapsack_max_value",
    "sort_words_renamed": "sort_words",
}
GATE = AdmissionSettings().novelty_gate
WEIGHT = AdmissionSettings().novelty_prompt_weight


@dataclass(frozen=True)
class Env:
    name: str
    source: str
    prompt: str


@pytest.fixture(scope="module")
def embedder() -> Iterator[Embedder]:
    """Loaded once per module, offline, with every socket connection refused and recorded."""
    attempts: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError(f"test_novelty: no network (tried {address!r})")

    model = Embedder()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket.socket, "connect_ex", refuse)
        model.load()
        (vector,) = model.embed_texts(["loaded with no network"])
    assert attempts == [], f"loading the embedder tried the network: {attempts}"
    assert len(vector) == 384
    yield model


@pytest.fixture(scope="module")
def envs() -> dict[str, Env]:
    """The ten seeds and the near-copies, with their prompts at seed 0, middle difficulty."""
    paths = [*SEEDS, *(REPO / "tests" / "corpus" / "novelty" / f"{n}.py" for n in COPIES)]
    found: dict[str, Env] = {}
    with Sandbox(Settings().sandbox) as box:
        for path in paths:
            source = path.read_text("utf-8")
            (meta,) = box.run(source, [{"op": "describe"}], filename=path.name)
            assert meta.ok, meta.reason
            middle = (meta.value["min_difficulty"] + meta.value["max_difficulty"]) // 2
            op = {"op": "instance", "seed": 0, "difficulty": middle}
            (instance,) = box.run(source, [op], filename=path.name)
            assert instance.ok, instance.reason
            found[path.stem] = Env(path.stem, source, instance.value["prompt"])
    return found


@pytest.fixture(scope="module")
def embedded(embedder: Embedder, envs: dict[str, Env]) -> dict[str, EnvEmbedding]:
    return {name: embedder.embed_environment(env.source, env.prompt) for name, env in envs.items()}


# --------------------------------------------------------------------------- with the model


def test_embedder_matches_the_sentence_transformers_recipe(embedder: Embedder) -> None:
    """Tokenizer with [CLS]/[SEP], cut at 256, mean over the mask, L2 norm: as ST computes it."""
    import torch

    texts = ["Sort the words by length.", "word " * 400]
    tokenizer, model = embedder._tokenizer, embedder._model
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 256
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1)
    got = torch.tensor(embedder.embed_texts(texts))
    assert torch.allclose(got, expected, atol=1e-5)


def test_embeddings_are_deterministic_and_unit_norm(
    embedder: Embedder, envs: dict[str, Env], embedded: dict[str, EnvEmbedding]
) -> None:
    env = envs["graph_coloring"]
    again = embedder.embed_environment(env.source, env.prompt)
    assert again == embedded["graph_coloring"]
    for name, vectors in embedded.items():
        for vector in (vectors.prompt, vectors.code):
            assert len(vector) == 384
            assert math.isclose(math.fsum(x * x for x in vector), 1.0, abs_tol=1e-6), name
    assert similarity(again, embedded["graph_coloring"]) == pytest.approx(1.0)


def test_long_code_is_embedded_in_several_chunks(embedder: Embedder, envs: dict[str, Env]) -> None:
    source = envs["planted_sat"].source
    tokens = embedder.tokens(code_for_embedding(source))
    assert len(tokens) > 2 * 254, "a seed long enough to need three windows"
    head = embedder.embed_texts([code_for_embedding(source)])[0]  # the first window only
    assert cosine(embedder.embed_code(source), head) < 0.999


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_a_renamed_reworded_seed_is_a_near_copy(
    copy: str, envs: dict[str, Env], embedded: dict[str, EnvEmbedding]
) -> None:
    original = COPIES[copy]
    assert envs[copy].prompt != envs[original].prompt
    score = similarity(embedded[copy], embedded[original], WEIGHT)
    assert score >= GATE, f"{copy} vs {original}: {score:.3f}"

    pool_names = [path.stem for path in SEEDS]
    result = novelty(embedded[copy], [embedded[n] for n in pool_names], (), GATE, WEIGHT)
    assert not result.passes
    assert result.nearest == "pool" and result.index == pool_names.index(original)
    assert result.similarity == pytest.approx(score)


def test_distinct_seeds_are_not_near_copies(embedded: dict[str, EnvEmbedding]) -> None:
    names = [path.stem for path in SEEDS]
    pairs = {
        (a, b): similarity(embedded[a], embedded[b], WEIGHT)
        for a, b in itertools.combinations(names, 2)
    }
    (a, b), highest = max(pairs.items(), key=lambda item: item[1])
    assert highest < GATE, f"{a} vs {b}: {highest:.3f}"
    for name in names:  # each seed, as a candidate against the other nine
        others = [embedded[n] for n in names if n != name]
        assert novelty(embedded[name], others, (), GATE, WEIGHT).passes, name


def test_a_later_candidate_copying_an_earlier_one_is_rejected(
    embedded: dict[str, EnvEmbedding],
) -> None:
    """The pool lacks the knapsack seed, so only the group can catch the copy, in order."""
    pool = [embedded[p.stem] for p in SEEDS if p.stem != "knapsack_max_value"]
    group = [embedded["knapsack_max_value"], embedded["knapsack_renamed"]]
    first, second = group_novelty(group, pool, GATE, WEIGHT)
    assert first.passes and first.nearest == "pool"
    assert not second.passes and (second.nearest, second.index) == ("group", 0)
    assert second.similarity == pytest.approx(similarity(group[0], group[1], WEIGHT))

    # In the other order it is the other one that is rejected: candidate order decides.
    assert [r.passes for r in group_novelty(group[::-1], pool, GATE, WEIGHT)] == [True, False]
    # Compared with the pool only (an ad-hoc file), the copy passes.
    assert novelty(group[1], pool, (), GATE, WEIGHT).passes


def novelty_report(
    embedder: Embedder, tmp_path: Path, name: str, source: str, **settings: object
) -> StageReport:
    """The novelty stage of `source` against the ten seeds, as admission runs it."""
    from evoenv_learner.pool import seed_pool
    from evoenv_worker.context import WorkerContext
    from evoenv_worker.model_stages import novelty_stage, trace_instance
    from shared.db import source_sha
    from shared.messages import EnvRef, StageJob

    admission = AdmissionSettings(**settings)  # type: ignore[arg-type]
    ctx = WorkerContext(Settings(data_dir=tmp_path, admission=admission), _embedder=embedder)
    seed_pool(ctx.archive(), REPO / "seeds")
    try:
        traced = trace_instance(ctx.sandbox(), source, f"{name}.py")
        assert traced is not None
        meta, trace = traced
        job = StageJob(
            job_id="j",
            run="r",
            env=EnvRef(name=name, sha=source_sha(source), source=source),
            oracle=meta["oracle"],
            difficulty=1,
            trace=trace,
        )
        return novelty_stage(ctx, job)
    finally:
        ctx.sandbox().close()


def test_the_novelty_stage_rejects_the_very_file_of_a_pool_member(
    embedder: Embedder, tmp_path: Path
) -> None:
    """A generator that copies its example file verbatim gets no admission: the stage compares
    with every pool member, the candidate's own file included."""
    source = (REPO / "seeds" / "edit_distance.py").read_text("utf-8")
    report = novelty_report(embedder, tmp_path, "edit_distance", source)
    assert not report.ok
    assert (report.data["similarity"], report.data["nearest"]) == (1.0, "edit_distance")
    assert "already in the pool" in report.detail


LIS = (REPO / "seeds" / "longest_increasing_subsequence.py").read_text("utf-8")
EVEN_SUM_PROMPT = (
    LIS.replace("LongestIncreasingSubsequence", "SumOfEvenValues")
    .replace('"longest_increasing_subsequence"', '"sum_of_even_values"')
    .replace(
        "Length of the longest strictly increasing subsequence of a list of integers.",
        "Sum of the even values of a list of integers.",
    )
    .replace(
        '''            "A subsequence keeps some of the elements in their original order (not necessarily "
            "adjacent). What is the length of the longest subsequence whose elements are "
            "strictly increasing?\\n"''',
        '''            "What is the sum of the even values in the list?\\n"''',
    )
)
"""The seed's problem asking another question, its reference still the seed's (what the 0.5B
generator writes when asked for a new task over its example's instances)."""
EVEN_SUM = EVEN_SUM_PROMPT.replace(
    EVEN_SUM_PROMPT[
        EVEN_SUM_PROMPT.index("        # tails[k]") : EVEN_SUM_PROMPT.index(
            "        return len(tails)\n"
        )
        + len("        return len(tails)\n")
    ],
    '        return sum(number for number in instance["numbers"] if number % 2 == 0)\n',
)
"""The same prompt with a solve that answers it: a new task over the seed's instances."""


def test_a_members_solve_under_another_prompt_is_a_near_copy(
    embedder: Embedder, tmp_path: Path
) -> None:
    assert "sum of the even values" in EVEN_SUM_PROMPT and "len(tails)" in EVEN_SUM_PROMPT
    report = novelty_report(embedder, tmp_path, "sum_of_even_values", EVEN_SUM_PROMPT)
    assert not report.ok, report.detail
    assert report.data["same_oracle"] == "longest_increasing_subsequence"
    assert report.data["similarity"] == 1.0  # no novelty bonus for the generator either
    kept = {k: v for k, v in report.data.items() if k != "embedding"}  # what the archive keeps
    assert NoveltyFigures.model_validate(kept).same_oracle == "longest_increasing_subsequence"
    assert "its reference equals longest_increasing_subsequence's on each of 8" in report.detail

    # With the check off only the embeddings decide; they do not see it.
    off = novelty_report(
        embedder, tmp_path / "off", "sum_of_even_values", EVEN_SUM_PROMPT, same_oracle_members=0
    )
    assert "same_oracle" not in off.data and off.data["similarity"] < 1.0


def test_a_new_task_over_a_members_instances_is_not_a_copy(
    embedder: Embedder, tmp_path: Path
) -> None:
    assert "len(tails)" not in EVEN_SUM and "number % 2 == 0" in EVEN_SUM
    report = novelty_report(embedder, tmp_path, "sum_of_even_values", EVEN_SUM)
    assert "same_oracle" not in report.data, report.detail
    assert report.data["similarity"] < 1.0
    assert report.detail.startswith("max similarity")


def test_embedding_json_round_trip(embedded: dict[str, EnvEmbedding]) -> None:
    import json

    vectors = embedded["sort_words"]
    stored = json.loads(json.dumps(vectors.to_json()))
    assert stored["recipe"] == RECIPE
    assert EnvEmbedding.from_json(stored) == vectors
    assert EnvEmbedding.from_json({**stored, "recipe": "another/v0"}) is None
    assert EnvEmbedding.from_json(None) is None
    with pytest.raises(ValueError, match="malformed"):
        EnvEmbedding.from_json({**stored, "code": stored["code"][:10]})


# ------------------------------------------------------------------------------- no model


SOURCE = '''"""Doc."""
from __future__ import annotations

import random
from shared.environment import (
    Environment,
)


@decorated
class Doubling(
    Environment,
):
    """Double a number."""

    name = "doubling"

    def solve(self, instance: dict) -> int:
        import math
        return 2 * instance["n"]


class Helper: pass
'''


def test_code_for_embedding_drops_imports_and_class_headers() -> None:
    code = code_for_embedding(SOURCE)
    assert "import" not in code and "class" not in code and "@decorated" not in code
    assert "Environment" not in code and "Doubling" not in code
    for kept in ('"""Doc."""', '"""Double a number."""', 'name = "doubling"', "def solve", "pass"):
        assert kept in code
    renamed = SOURCE.replace("Doubling", "Twice").replace("import random\n", "")
    assert code_for_embedding(renamed) == code


def test_code_for_embedding_falls_back_to_lines_when_the_file_does_not_parse() -> None:
    broken = SOURCE + "\ndef broken(:\n"
    code = code_for_embedding(broken)
    assert "import" not in code and "class Doubling" not in code
    assert "Environment," not in code  # inside the parenthesised import
    assert "def solve" in code and "def broken(:" in code


def test_balanced_chunks() -> None:
    assert _balanced_chunks([], 4) == [[]]
    assert _balanced_chunks(list(range(4)), 4) == [[0, 1, 2, 3]]
    chunks = _balanced_chunks(list(range(9)), 4)
    assert chunks == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def _unit(*xs: float) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


def test_similarity_weights_and_the_gate() -> None:
    a = EnvEmbedding(prompt=_unit(1, 0), code=_unit(1, 0))
    b = EnvEmbedding(prompt=_unit(1, 0), code=_unit(0, 1))
    assert similarity(a, b) == pytest.approx(0.5)
    assert similarity(a, b, prompt_weight=0.8) == pytest.approx(0.8)
    assert novelty(a, [b], (), gate=0.5).passes is False  # at the gate: rejected
    assert novelty(a, [b], (), gate=0.51).passes is True
    empty = novelty(a, [], ())
    assert empty.passes and empty.nearest is None and empty.similarity == 0.0
    result = novelty(a, [b], [b, a], gate=0.8)
    assert (result.nearest, result.index, result.passes) == ("group", 1, False)
