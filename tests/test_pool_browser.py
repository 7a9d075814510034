"""`evoenv pool serve` in a real browser: the command runs as a subprocess on an archive with
admitted, rejected and retired environments, a hostile one and a run's samples, and headless
Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium) clicks through the
pool, an environment, the funnel to a rejected candidate, and the run view to a step's samples;
no script from the hostile environment may run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from pool_web_archive import HOSTILE_NAME, PWN, RUN, Built, build_archive, pool_served
from support import chromium

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

USER, PASSWORD = "ada", "correct horse"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Built]]:
    """`evoenv pool serve --port 0` with basic auth on a fresh archive; its base URL."""
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    built = build_archive(url)
    with pool_served(tmp_path, url, USER, PASSWORD) as (base, log):
        yield base, built
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    with chromium(tmp_path, USER, PASSWORD) as driver:
        yield driver


def test_a_browser_clicks_through_the_pool_and_the_funnel_and_runs_nothing_hostile(
    served: tuple[str, Built], browser: WebDriver
) -> None:
    from selenium.webdriver.common.by import By

    base, built = served
    assert httpx.get(f"{base}/", timeout=10).status_code == 401  # auth on every page
    driver = browser

    def unharmed() -> None:
        assert driver.execute_script("return window.pwned === undefined")
        assert "pwned" not in driver.title

    def follow(by: str, value: str) -> None:
        """Click what leads to another page and wait until that page replaced this one: a
        click returns before its navigation ends, and the sample page waits on a sandbox."""
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.wait import WebDriverWait

        page = driver.find_element(By.TAG_NAME, "html")
        driver.find_element(by, value).click()
        WebDriverWait(driver, 60).until(expected_conditions.staleness_of(page))

    # the pool: every environment listed, the hostile name shown as text
    driver.get(f"{base}/")
    table = driver.find_element(By.CSS_SELECTOR, "table.pool").text
    for name in ("sort_words", "count_vowels", "count_vowels_v0", "broken_grid", HOSTILE_NAME):
        assert name in table
    unharmed()

    # an environment: its highlighted source; its form asks for a sample instance
    follow(By.LINK_TEXT, "count_vowels")
    assert driver.find_element(By.TAG_NAME, "h1").text.startswith("count_vowels")
    assert "class CountVowels(Environment)" in driver.find_element(By.ID, "source").text
    follow(By.CSS_SELECTOR, "form.sample-form button")
    shown = driver.find_elements(By.ID, "sample")
    assert shown, driver.find_element(By.TAG_NAME, "main").text  # what the page said instead
    sample = shown[0].text
    assert "How many vowels are in" in sample and "reference answer" in sample

    # the hostile environment: its prompt and description shown as text, nothing run
    driver.get(f"{base}/env/{built.hostile}?seed=0")
    assert HOSTILE_NAME in driver.find_element(By.TAG_NAME, "h1").text
    prompt = driver.find_element(By.CSS_SELECTOR, "pre.prompt").text
    assert "<script>window.pwned=1;" in prompt and "onerror=" in prompt
    assert not driver.find_elements(By.CSS_SELECTOR, "main script, main img, main iframe")
    unharmed()

    # the funnel, and one click to a rejected candidate's stage and trigger
    follow(By.LINK_TEXT, "admission funnel")
    counts = driver.find_element(By.CSS_SELECTOR, "table.funnel").text
    assert "L3 1" in counts and "L1 1" in counts
    follow(By.LINK_TEXT, "broken_grid")
    stopped = driver.find_element(By.ID, "stopped").text
    assert "stopped at L3" in stopped and "seed 3, difficulty 2, answer 7" in stopped
    driver.back()
    follow(By.LINK_TEXT, "candidate_g1_1.py")
    assert "stopped at L1: no Environment subclass" in driver.find_element(By.TAG_NAME, "main").text
    driver.get(f"{base}/funnel")
    follow(By.LINK_TEXT, HOSTILE_NAME)
    assert "stopped at L5" in driver.find_element(By.ID, "stopped").text
    unharmed()

    # the run view: a step's samples, the answer beside the reference, a candidate's report
    follow(By.LINK_TEXT, "runs")
    follow(By.LINK_TEXT, RUN)
    follow(By.LINK_TEXT, "1")  # step 1 in the table of steps
    sample = driver.find_element(By.ID, "sample-1").text
    assert "answer 3" in sample and "reference 3" in sample and PWN in sample
    unharmed()
    follow(By.LINK_TEXT, "its validation report")
    assert "stopped at L3" in driver.find_element(By.TAG_NAME, "main").text
