"""A sound hand-written file reaches every model stage with the real model: through
`evoenv validate --all` locally and on the queues, and through `evoenv pool add`."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from e2e_support import Cluster, evoenv

from shared.db import Archive

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SOUND = Path(__file__).resolve().parents[1] / "corpus" / "sound" / "word_caesar_decode.py"
HARD = Path(__file__).with_name("long_product.py")
STAGES = ["L1", "L2", "L3", "L4", "L5", "review", "calibration", "novelty"]


def run(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        evoenv(*args), env=cluster.env, capture_output=True, text=True, timeout=1200, check=False
    )


def reports(result: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def check_all_stages(report: dict[str, object]) -> None:
    stages = report["stages"]
    assert isinstance(stages, list)
    assert [s["stage"] for s in stages] == STAGES, report
    assert all(s["ok"] for s in stages[:5]), report
    by_stage = {s["stage"]: s for s in stages}
    calibration = by_stage["calibration"]["data"]
    assert calibration["instances"] == 8 and 0 <= calibration["pass_rate"] <= 1
    assert 0 <= by_stage["novelty"]["data"]["similarity"] < 1
    assert len(by_stage["review"]["data"]["verdicts"]) == 3
    # The verdict follows the stages: admitted only if every one passed.
    assert report["verdict"] == ("admitted" if all(s["ok"] for s in stages) else "rejected")


def test_validate_all_runs_every_model_stage_locally_and_on_the_queues(cluster: Cluster) -> None:
    local = run(cluster, "validate", "--all", "--json", str(SOUND))
    assert local.returncode in (0, 1), local.stderr[-3000:]
    (report,) = reports(local)
    check_all_stages(report)

    queued = run(cluster, "validate", "--all", "--queue", "--json", str(SOUND))
    assert queued.returncode in (0, 1), queued.stderr[-3000:]
    (report,) = reports(queued)
    check_all_stages(report)


def test_pool_add_admits_only_what_passes_every_stage(cluster: Cluster) -> None:
    result = run(cluster, "pool", "add", "--json", str(SOUND))
    assert result.returncode in (0, 1), result.stderr[-3000:]
    (report,) = reports(result)
    check_all_stages(report)
    archive = Archive(cluster.settings().archive_url)
    row = archive.by_name("word_caesar_decode", ("admitted",))
    assert (row is not None) == (report["verdict"] == "admitted")
    listed = run(cluster, "pool", "list", "--json")
    names = {
        json.loads(line)["name"] for line in listed.stdout.splitlines() if line.startswith("{")
    }
    assert ("word_caesar_decode" in names) == (report["verdict"] == "admitted")


def test_a_file_the_solver_always_fails_is_rejected_at_calibration_but_gets_its_q(
    cluster: Cluster,
) -> None:
    """long_product.py (exact products of two 20+ digit integers) is sound, but the embedded
    model never multiplies them right: calibration's pass rate is 0 from eight real gradings,
    so it is not admitted; Q is still computed (exp(-(0 - 0.3)^2 / (2 * 0.2^2)) = 0.3247), and
    review and novelty run all the same (the generator's reward needs them)."""
    result = run(cluster, "pool", "add", "--json", str(HARD))
    assert result.returncode == 1, result.stderr[-3000:]
    (report,) = reports(result)
    check_all_stages(report)
    by_stage = {s["stage"]: s for s in report["stages"]}
    calibration = by_stage["calibration"]
    assert not calibration["ok"], calibration
    assert calibration["data"]["passes"] == 0 and calibration["data"]["env_errors"] == 0
    assert calibration["data"]["quality"] == pytest.approx(math.exp(-(0.3**2) / 0.08), abs=1e-4)
    assert "never solved" in calibration["detail"]
    assert report["verdict"] == "rejected"
    archive = Archive(cluster.settings().archive_url)
    assert archive.by_name("long_product", ("admitted",)) is None
