"""`evoenv pool serve` under what an archive or an environment may throw at it: a page that
fails answers a 500 with the security headers and logs no credential; unencodable text is
replaced; an environment whose sample hangs stalls neither the pages that do not sample nor
identical requests, which share one sandbox run."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from pool_web_archive import ADMITTED, build_archive, pool_served
from test_pool_web import settings_for, text_of

from evoenv_cli.pool_web import create_app
from evoenv_cli.pool_web_guard import SECURITY_HEADERS
from evoenv_cli.pool_web_sample import Sampler
from shared.config import Settings
from shared.db import Archive, ValidationRow
from shared.messages import ValidationReport

USER, PASSWORD = "ada", "correct horse battery"
TOKEN = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

HANGS = ADMITTED.replace("count_vowels", "hangs").replace(
    "        letters = ", "        import time\n\n        time.sleep(600)\n        letters = "
)
"""Describes itself at once; every sample sleeps past any op time limit."""
UNENCODABLE = (
    ADMITTED.replace("count_vowels", "lone_surrogates")
    .replace('"Count the vowels in a made-up word."', '"half a pair \\ud800 here"')
    .replace('return f"How many', 'return "\\udcff " + f"How many')
)
"""Its description and prompt hold lone surrogates, which no UTF-8 page can carry."""


def test_a_failing_page_is_a_500_with_the_headers_and_logs_no_credential(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    built = build_archive(url)
    valid = ValidationReport(
        file="broken.py", name=None, verdict="rejected", failed_stage=None, stages=[]
    )
    # a row no report validates from, whose error quotes the two wrong values: the credentials
    # stand in for whatever secret an error message may hold
    with built.archive.session() as session:
        session.add(
            ValidationRow(
                job_id="job-broken",
                env_sha=built.admitted,
                file="broken.py",
                verdict="rejected",
                adhoc=False,
                report={**valid.model_dump(mode="json"), "verdict": PASSWORD, "stages": TOKEN},
            )
        )
        session.commit()
    with pool_served(tmp_path, url, USER, PASSWORD) as (base, log):
        headers = {"Authorization": f"Basic {TOKEN}"}
        for path in ["/report/job-broken", "/funnel", f"/env/{built.admitted}"]:
            response = httpx.get(base + path, headers=headers, timeout=30)
            assert response.status_code == 500, path
            assert response.headers["content-type"].startswith("text/html")
            for header, value in SECURITY_HEADERS.items():
                assert response.headers.get(header) == value, (path, header)
        assert httpx.get(base + "/", headers=headers, timeout=30).status_code == 200
    logged = log.read_text()
    assert "pool_web_failed" in logged and "ValidationError" in logged  # logged, and why
    assert "input_value='[redacted]'" in logged
    assert PASSWORD not in logged and TOKEN not in logged, logged[-3000:]
    assert "correct" not in logged and "locals" not in logged


def test_an_error_logged_with_its_traceback_shows_no_values_of_locals() -> None:
    """The console log (the server's stderr) prints a traceback's lines, never its locals."""
    code = (
        "import structlog\n"
        "from shared.logging import configure_logging\n"
        "configure_logging('console')\n"
        "def check(password):\n"
        "    raise ValueError('refused')\n"
        "try:\n"
        f"    check({PASSWORD!r})\n"
        "except ValueError:\n"
        "    structlog.get_logger().exception('check_failed')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "check_failed" in done.stderr and "ValueError: refused" in done.stderr
    assert PASSWORD not in done.stderr, done.stderr


def test_unencodable_text_from_an_environment_is_replaced_and_the_page_renders(
    tmp_path: Path,
) -> None:
    settings = settings_for(tmp_path)
    archive = Archive(settings.archive_url)
    sha = archive.add_environment("lone_surrogates", UNENCODABLE, status="admitted", origin="user")
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        sampled = client.get(f"/env/{sha}?seed=0")
        assert sampled.status_code == 200
        text = text_of(sampled.text)
        assert "half a pair \ufffd here" in text
        assert "\ufffd How many vowels are in" in text
        described = client.get(f"/env/{sha}")  # the cached description, with no sample
        assert described.status_code == 200
        assert "half a pair \ufffd here" in text_of(described.text)


def test_a_hanging_sample_stalls_no_other_page_and_identical_requests_share_one_run(
    tmp_path: Path,
) -> None:
    op_seconds = 2.0
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'archive.db'}",
        pool_web={"sample_workers": 2},
        sandbox={"op_seconds": op_seconds},
    )
    built = build_archive(settings.archive_url)
    hangs = built.archive.add_environment("hangs", HANGS, status="admitted", origin="user")
    app = create_app(settings)
    sampler: Sampler = app.state.sampler
    identical = 41

    def timed(path: str) -> tuple[float, httpx.Response]:
        started = time.monotonic()
        response = client.get(path)
        return time.monotonic() - started, response

    with TestClient(app) as client, ThreadPoolExecutor(identical + 8) as pool:
        same = [pool.submit(timed, f"/env/{hangs}?seed=7") for _ in range(identical)]
        others = [pool.submit(timed, f"/env/{hangs}?seed={seed}") for seed in (1, 2, 3)]
        time.sleep(op_seconds / 4)  # every request in flight, the first run hanging
        for path in ["/", "/funnel", f"/env/{built.admitted}", f"/env/{hangs}"]:
            seconds, response = timed(path)
            assert response.status_code == 200
            assert seconds < op_seconds / 2, f"{path} took {seconds:.2f} s"
        # another environment's sample does not queue behind the hanging one's
        seconds, response = timed(f"/env/{built.admitted}?seed=5")
        assert "How many vowels are in" in text_of(response.text)
        assert seconds < op_seconds, f"a sample of another environment took {seconds:.2f} s"
        answers = [future.result(timeout=60) for future in same + others]
    for _, response in answers:
        assert response.status_code == 200
        failed = text_of(response.text)
        assert "the instance failed:" in failed and "no result within 2 s" in failed
    # one describe and one sample of each environment and seed: the 41 identical shared one
    assert sampler.computed == 1 + 1 + 2 + 3
