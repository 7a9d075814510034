"""`evoenv pool serve`: its pages through FastAPI's TestClient over an archive with a seed,
admitted, retired and rejected environments and a hostile one; auth, escaping, 404, the
sample cache, and the command's refusals (one line, exit 2)."""

from __future__ import annotations

import asyncio
import base64
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pool_web_archive import HOSTILE_STRINGS, PWN, RUN, SCRIPT, Built, build_archive

from evoenv_cli.pool_web import create_app
from evoenv_cli.pool_web_guard import SECURITY_HEADERS
from evoenv_cli.pool_web_sample import Sampler
from shared.config import Settings
from shared.ports import is_loopback


def settings_for(folder: Path, **pool_web: object) -> Settings:
    return Settings(
        data_dir=folder, database_url=f"sqlite:///{folder / 'archive.db'}", pool_web=pool_web
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, Settings]:
    folder = tmp_path_factory.mktemp("pool_web")
    settings = settings_for(folder)
    return build_archive(settings.archive_url), settings


@pytest.fixture(scope="module")
def client(built: tuple[Built, Settings]) -> Iterator[TestClient]:
    with TestClient(create_app(built[1])) as client:
        yield client


def text_of(html: str) -> str:
    """The page's text, tags dropped (entities left as they are)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def assert_escaped(html: str) -> None:
    for hostile in HOSTILE_STRINGS:
        assert hostile not in html, f"unescaped {hostile!r} in the page"


def test_the_pool_lists_every_environment_and_filters_by_status(
    client: TestClient, built: tuple[Built, Settings]
) -> None:
    b = built[0]
    page = client.get("/")
    assert page.status_code == 200
    for sha in (b.seed, b.admitted, b.retired, b.rejected, b.hostile):
        assert f'href="/env/{sha}"' in page.text
    row = text_of(page.text.split(f'href="/env/{b.admitted}"')[1].split("</tr>")[0])
    assert "admitted user 2 0.38 @ 3 40 0.03 (8/320)" in row
    retired = client.get("/?status=retired")
    assert b.retired in retired.text and b.admitted not in retired.text
    assert "1 environment, retired" in text_of(retired.text)
    assert client.get("/?status=nonsense").status_code == 404


def test_an_environment_page_shows_source_sample_reports_lineage_and_history(
    client: TestClient, built: tuple[Built, Settings]
) -> None:
    b = built[0]
    page = client.get(f"/env/{b.admitted}?seed=0")
    assert page.status_code == 200
    text = text_of(page.text)
    assert '<div class="highlight">' in page.text  # Pygments
    assert "CountVowels" in text and "Count the vowels in a made-up word." in text
    assert "seed 0, difficulty 2" in text  # the serving difficulty by default
    assert "How many vowels are in" in text and "reference answer" in text
    assert f'href="/env/{b.rejected}">broken_grid' in page.text  # a child
    assert f'href="/env/{b.hostile}"' in page.text  # another
    assert "<polyline" in page.text and "2025-01-02T00:00:00Z" in text  # pass-rate history
    clamped = client.get(f"/env/{b.admitted}?seed=4&difficulty=99")
    assert "seed 4, difficulty 5" in text_of(clamped.text)  # clamped to the range 1-5
    assert "seed 4, difficulty 1" in text_of(
        client.get(f"/env/{b.admitted}?seed=4&difficulty=-3").text
    )
    by_name = client.get("/env/count_vowels")
    assert by_name.status_code == 200 and b.admitted in by_name.text
    # without a seed nothing is sampled: a form to ask for one, at the serving difficulty
    assert 'id="sample"' not in by_name.text and "none shown yet" in text_of(by_name.text)
    assert 'name="seed" min="0" value="0"' in by_name.text and 'value="2"' in by_name.text
    seed_page = text_of(client.get(f"/env/{b.retired}").text)
    assert "parents: sort_words" in seed_page and "rotation" in seed_page


def test_a_rejected_environment_shows_each_stage_and_the_trigger_that_stopped_it(
    client: TestClient, built: tuple[Built, Settings]
) -> None:
    text = text_of(client.get(f"/env/{built[0].rejected}").text)
    assert "stopped at L3 : the reference does not score 1.0 on its own instance" in text
    assert "triggered by seed 3, difficulty 2, answer 7" in text
    assert "L1 ok 0.25 static checks passed" in text
    assert "L3 FAIL 0.25" in text
    assert "parents: count_vowels" in text


def test_the_funnel_counts_candidates_by_stage_and_links_every_rejected_one(
    client: TestClient, built: tuple[Built, Settings]
) -> None:
    b = built[0]
    page = client.get("/funnel")
    text = text_of(page.text)
    assert "4 candidates" in text
    for stage, count in [
        ("L1", 1),
        ("L2", 0),
        ("L3", 1),
        ("L5", 1),
        ("novelty", 0),
        ("admitted", 1),
    ]:
        assert f" {stage} {count} " in text
    rejected = dict(
        re.findall(r'<td><a href="([^"]+)">([^<]+)</a></td>\s*<td>(?:L\d)</td>', page.text)
    )
    assert set(rejected) == {f"/env/{b.rejected}", f"/env/{b.hostile}", f"/report/{b.l1_job}"}
    assert "count_vowels_v0" not in text  # admitted (and retired since): not listed
    report = text_of(client.get(f"/report/{b.l1_job}").text)
    assert "stopped at L1 : no Environment subclass" in report
    assert "candidate_g1_1.py" in report and "not in the archive's environments" in report
    only_l3 = text_of(client.get("/funnel?stage=L3").text)
    assert "broken_grid" in only_l3 and "candidate_g1_1.py" not in only_l3


def test_nothing_the_model_wrote_reaches_a_page_unescaped(
    client: TestClient, built: tuple[Built, Settings]
) -> None:
    b = built[0]
    pages = ["/", "/?status=rejected", f"/env/{b.hostile}", "/funnel", "/funnel?stage=L5"]
    pages += [f"/env/{b.hostile}?seed=0", f"/env/{b.admitted}", f"/env/{b.admitted}?seed=0"]
    pages += ["/report/job-hostile", f"/env/{SCRIPT}", "/nowhere/<b>x</b>"]
    pages += [f"/funnel?stage={SCRIPT}", f"/?status={SCRIPT}", "/env/%3Cimg%20src=x%3E"]
    pages += ["/runs", f"/run/{RUN}?step=1", f"/run/{RUN}", "/run/%3Cscript%3E"]
    for path in pages:
        html = client.get(path).text
        assert_escaped(html)
    hostile = client.get(f"/env/{b.hostile}?seed=0").text
    # shown, as text: the name, the description, the rendered prompt, the reference, the trigger
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hostile
    assert "&#34;&gt;&lt;img src=x onerror=&#34;document.title=" in hostile
    assert "&lt;iframe src=javascript:alert(1)&gt;" in hostile
    escaped_pwn = PWN.replace("<", "&lt;").replace(">", "&gt;").replace("'", "&#39;")
    assert f'<pre class="prompt">{escaped_pwn}' in hostile
    assert f'<pre class="answer">&lt;/pre&gt;{escaped_pwn}' in hostile
    assert "<script" not in client.get("/static/pool.css").text


def test_the_run_view_shows_each_steps_samples_and_links_the_reports_that_exist(
    client: TestClient, built: tuple[Built, Settings]
) -> None:
    runs = text_of(client.get("/runs").text)
    assert f"{RUN} 2 2" in runs  # two steps kept, the latest 2
    latest = client.get(f"/run/{RUN}")
    assert latest.status_code == 200 and "Step 2: what it trained on 1 samples" in text_of(
        latest.text
    )
    assert f'href="/run/{RUN}?step=1"' in latest.text
    assert "verdict L1" in text_of(latest.text) and "/report/g9-0" not in latest.text
    first = client.get(f"/run/{RUN}?step=1").text
    shown = text_of(first)
    assert "solver · count_vowels · difficulty 2 · seed 4 · version 1" in shown
    assert "answer 3 · reference 3" in shown and "reward 1.0 · scored" in shown
    assert "verdict L3 · its validation report" in shown
    assert 'href="/report/job-rejected"' in first  # a candidate's report, where stored
    assert f'href="/env/{built[0].admitted}"' in first
    for path in (f"/run/{RUN}?step=7", "/run/no-such-run"):
        assert client.get(path).status_code == 404, path


def test_every_response_carries_the_security_headers(
    client: TestClient, built: tuple[Built, Settings]
) -> None:
    for path in ["/", f"/env/{built[0].admitted}", "/funnel", "/static/pool.css", "/nope"]:
        response = client.get(path)
        for header, value in SECURITY_HEADERS.items():
            assert response.headers[header] == value
    csp = SECURITY_HEADERS["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp


def test_unknown_names_shas_jobs_and_paths_are_a_404_page(client: TestClient) -> None:
    for path in ["/env/no_such_env", f"/env/{'0' * 64}", "/report/no-such-job", "/nowhere"]:
        response = client.get(path)
        assert response.status_code == 404
        assert response.headers["content-type"].startswith("text/html")
        assert "not found" in response.text
    assert "no environment &#39;no_such_env&#39;" in client.get("/env/no_such_env").text
    bad = client.get("/env/count_vowels?seed=-1")
    assert bad.status_code == 400 and "seed" in bad.text


def test_with_a_user_set_every_page_needs_the_password(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, user="ada", password="s3cret:pw")
    build_archive(settings.archive_url)
    with TestClient(create_app(settings)) as anonymous:
        for path in ["/", "/funnel", "/static/pool.css", "/nowhere"]:
            response = anonymous.get(path)
            assert response.status_code == 401
            assert response.headers["WWW-Authenticate"].startswith("Basic")
            assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert anonymous.get("/", auth=("ada", "wrong")).status_code == 401
        assert anonymous.get("/", auth=("bob", "s3cret:pw")).status_code == 401
        assert anonymous.get("/", headers={"Authorization": "Basic %%%"}).status_code == 401
        nothing = base64.b64encode(b"ada").decode()
        assert anonymous.get("/", headers={"Authorization": f"Basic {nothing}"}).status_code == 401
        assert anonymous.get("/", auth=("ada", "s3cret:pw")).status_code == 200
        assert anonymous.get("/nowhere", auth=("ada", "s3cret:pw")).status_code == 404


def test_samples_are_cached_by_sha_seed_and_difficulty(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, sample_cache=2)
    b = build_archive(settings.archive_url)
    app = create_app(settings)
    sampler: Sampler = app.state.sampler
    with TestClient(app) as client:
        first = client.get(f"/env/{b.admitted}?seed=1").text
        assert sampler.computed == 2  # describe + instance
        assert client.get(f"/env/{b.admitted}?seed=1").text == first
        client.get(f"/env/{b.admitted}?seed=1&difficulty=2")  # the same key: 2 is the default
        assert sampler.computed == 2  # all from the cache
        client.get(f"/env/{b.admitted}?seed=2")
        client.get(f"/env/{b.admitted}?seed=3")
        assert sampler.computed == 4
        client.get(f"/env/{b.admitted}?seed=3")
        assert sampler.computed == 4
        client.get(f"/env/{b.admitted}?seed=1")  # evicted (2 kept): computed again
        assert sampler.computed == 5


def test_text_past_the_limit_is_cut(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, sample_chars=100)
    b = build_archive(settings.archive_url)
    row = b.archive.environment(b.seed)
    assert row is not None
    sampler = Sampler(settings)
    try:
        sample = asyncio.run(sampler.sample(row.sha, row.source, 0, 10))
    finally:
        sampler.close()
    assert sample.prompt.endswith("characters; the first 100 shown)")
    assert len(sample.prompt.split("\n... (")[0]) == 100
    assert sample.reference.endswith("shown)")


def test_loopback_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.org"))


def evoenv(*args: str, folder: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "EVOENV_DATA_DIR": str(folder),
        "EVOENV_DATABASE_URL": f"sqlite:///{folder / 'archive.db'}",
    }
    return subprocess.run(
        [sys.executable, "-c", "from evoenv_cli import main; main()", "pool", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--host", "0.0.0.0"], "refusing to serve the archive on 0.0.0.0 without basic auth"),
        (["--host", "::", "--user", "ada"], "user 'ada' has no password"),
        (["--user", "ada", "--password-file", "/nonexistent/pw"], "cannot read the password file"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(
    tmp_path: Path, args: list[str], says: str
) -> None:
    done = evoenv(*args, folder=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and says in done.stderr
    assert not (tmp_path / "archive.db").exists()  # refused before the archive was opened


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = evoenv("--port", str(port), folder=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in done.stderr
