"""The learner's Celery client (`evoenv_learner/jobs.py`) sends, by task name, the very message
the workers' own app would send for the same job: same body, headers (time limits included),
queue and sent event. Compared in a fresh interpreter that configures both apps on a Redis
that is never reached (publishing is captured), so this process keeps its Celery state.
Importing the client connects to nothing and leaves Celery's current app alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CAPTURE = r"""
import json, re, sys, tempfile
from pathlib import Path

from celery import chain

from evoenv_learner import jobs
from evoenv_worker import tasks
from evoenv_worker.app import configure
from shared.config import Settings

settings = Settings(
    redis_url="redis://127.0.0.1:9/0",
    data_dir=Path(tempfile.mkdtemp()),
    worker={"grade_time_limit": 77.0, "complete_time_limit": 555.0, "validate_time_limit": 222.0},
)
sent = {"workers": [], "learner": []}


def capture(app, into):
    def record(producer, name, message, **options):
        into.append(
            {
                "name": name,
                "headers": message.headers,
                "properties": message.properties,
                "body": message.body,
                "sent_event": message.sent_event,
                "options": {k: repr(v) for k, v in options.items()},
            }
        )

    app.amqp.send_task_message = record
    app.backend.on_task_call = lambda *args, **kwargs: None


capture(configure(settings), sent["workers"])
capture(jobs.configure(settings), sent["learner"])
payload = {"schema_version": 1, "run": "r", "group_id": "g"}
tasks.propose.apply_async(args=[payload])
jobs.send("evoenv.propose", payload)
tasks.constant_baseline.apply_async(args=[payload])
jobs.send("evoenv.constant_baseline", payload)
chain(tasks.sample.s(payload), tasks.complete.s(), tasks.grade.s()).apply_async()
jobs.send_chain(("evoenv.sample", "evoenv.complete", "evoenv.grade"), payload)
text = json.dumps(sent, sort_keys=True, default=repr)
text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", text)
print(text)
"""


def test_the_client_sends_by_name_what_the_workers_app_would_send() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CAPTURE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sent = json.loads(done.stdout.splitlines()[-1])
    assert [m["name"] for m in sent["learner"]] == [
        "evoenv.propose",
        "evoenv.constant_baseline",
        "evoenv.sample",
    ]
    for ours, theirs in zip(sent["learner"], sent["workers"], strict=True):
        assert ours == theirs
    propose, baseline, sample = sent["learner"]
    # the generation queue's hard limit is its wall limit: 555 s plus 90 % of the 900 - 555 s
    # the visibility timeout leaves (its requests' limit counts generating seconds only)
    wall = 555.0 + 0.9 * (900.0 - 555.0)
    assert propose["headers"]["timelimit"] == [wall, wall * 0.9]
    assert baseline["headers"]["timelimit"] == [222.0, 222.0 * 0.9]
    assert "Queue generation" in propose["options"]["queue"]
    assert "Queue grading" in baseline["options"]["queue"]
    chained = [step["task"] for step in sample["body"][2]["chain"]]
    assert chained == ["evoenv.grade", "evoenv.complete"]  # the rest of the chain, last first


def test_importing_the_client_connects_nothing_and_keeps_the_current_app() -> None:
    code = (
        "import celery; before = celery.current_app._get_current_object()\n"
        "from evoenv_learner import jobs\n"
        "assert celery.current_app._get_current_object() is before\n"
        "assert jobs._limits is None and not jobs.app.configured\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
