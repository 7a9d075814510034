"""Record the embedded model's real review responses for tests/test_review_recorded.py.

    EVOENV_VLLM_URLS=http://127.0.0.1:8000 python tests/corpus/reviews/record.py

Against a running `evoenv serve` on the embedded default model (base weights), for each file
below: trace its instance in the sandbox (seed 0, the middle difficulty, as the review stage
does), send the review prompt, and keep every response text in responses.jsonl, tagged with
how it was sampled:
- "constrained": as the review stage asks (JSON schema, the review temperature, K = 3);
- "free": the same prompt without the schema (what a reviewer endpoint without structured
  outputs returns: prose, fences, partial objects);
- "truncated": constrained but cut at 48 tokens (an unfinished object).
The expected verdict of each response ("accept", "reject" or "unreadable") is written as the
parser reads it today and must be checked by hand before the file is committed (the test
then holds the parser to it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from evoenv_worker.model_stages import trace_instance  # noqa: E402
from evoenv_worker.review import VERDICT_SCHEMA, parse_verdict, review_messages  # noqa: E402
from evoenv_worker.sandbox.host import Sandbox  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.inference import InferenceClient, Sampling  # noqa: E402

FILES = [
    "seeds/knapsack_max_value.py",
    "seeds/sort_words.py",
    "tests/corpus/sound/word_caesar_decode.py",
    "tests/corpus/flawed/l5_oracle_disagrees.py",
    "tests/corpus/flawed/l5_accepts_everything.py",
]
MODES = {
    "constrained": {"json_schema": VERDICT_SCHEMA},
    "free": {},
    "truncated": {"json_schema": VERDICT_SCHEMA, "max_tokens": 48},
}


def main() -> None:
    settings = Settings()
    a = settings.admission
    out = Path(__file__).with_name("responses.jsonl")
    records = []
    with Sandbox(settings.sandbox) as sandbox, InferenceClient(
        settings.vllm_urls, settings.model
    ) as client:
        for name in FILES:
            source = (REPO / name).read_text()
            traced = trace_instance(sandbox, source, Path(name).name)
            assert traced is not None, name
            _, trace = traced
            messages = review_messages(source, trace)
            for mode, extra in MODES.items():
                sampling = Sampling(
                    n=a.reviews,
                    temperature=a.review_temperature,
                    max_tokens=int(extra.get("max_tokens", a.review_max_tokens)),
                    json_schema=extra.get("json_schema"),  # type: ignore[arg-type]
                    seed=7,
                )
                for completion in client.chat(messages, sampling):
                    verdict = parse_verdict(completion.text)
                    expected = (
                        "unreadable"
                        if not verdict.readable
                        else ("accept" if verdict.accept else "reject")
                    )
                    records.append(
                        {
                            "file": name,
                            "mode": mode,
                            "finish_reason": completion.finish_reason,
                            "expected": expected,
                            "text": completion.text,
                        }
                    )
                    print(name, mode, expected, completion.finish_reason, flush=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{len(records)} responses written to {out}")


if __name__ == "__main__":
    main()
