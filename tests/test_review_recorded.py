"""The reviewer's verdict parsing on real responses of the embedded model (Qwen2.5-Coder-0.5B-
Instruct), recorded by tests/corpus/reviews/record.py: constrained ones as the review stage
asks for them, free ones without the schema, and truncated ones. Each response's expected
verdict was checked by hand when it was recorded (45 responses: 5 files x 3 modes x K = 3).

Among them: fenced JSON whose values are lists or objects instead of strings (read), a free
response that repeats one list item until max_tokens (unreadable), one whose "trace" string
holds unescaped quotes so the object is not JSON although it says "verdict": "accept"
(unreadable: a verdict is read only from a well-formed object, and that review also says the
scorer is wrong), and 15 cut at 48 tokens (unreadable)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from evoenv_worker.review import parse_verdict, summarise

RECORDED = Path(__file__).parent / "corpus" / "reviews" / "responses.jsonl"
RECORDS = [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]


def label(text: str) -> str:
    verdict = parse_verdict(text)
    if not verdict.readable:
        return "unreadable"
    return "accept" if verdict.accept else "reject"


@pytest.mark.parametrize(
    "record",
    RECORDS,
    ids=[f"{r['file'].split('/')[-1]}-{r['mode']}-{i}" for i, r in enumerate(RECORDS)],
)
def test_each_recorded_response_parses_as_checked(record: dict[str, str]) -> None:
    assert label(record["text"]) == record["expected"], record["text"][:500]


def test_the_recording_spans_every_kind_of_response() -> None:
    kinds = {(r["mode"], r["expected"]) for r in RECORDS}
    assert {"accept", "reject", "unreadable"} <= {expected for _, expected in kinds}
    # Constrained decoding gives readable verdicts unless the response was cut short.
    for record in RECORDS:
        if record["mode"] == "constrained" and record["finish_reason"] == "stop":
            assert record["expected"] != "unreadable", record["text"][:500]
    assert all(r["expected"] == "unreadable" for r in RECORDS if r["mode"] == "truncated")


def test_any_reject_or_unreadable_review_rejects_the_candidate() -> None:
    triples: dict[tuple[str, str], list[str]] = defaultdict(list)
    for record in RECORDS:
        triples[(record["file"], record["mode"])].append(record["text"])
    for texts in triples.values():
        verdicts = [parse_verdict(text) for text in texts]
        ok, detail = summarise(verdicts, len(texts))
        assert ok == all(v.readable and v.accept for v in verdicts)
        assert detail.count("review ") == len(texts)
