"""Probe scenario (issue 22): saves killed with SIGKILL leave at most one temporary.

One subprocess (`kill_saves_child.py`) kills 40 predictor saves and 40 run-folder saves,
each stopped at a random fsync or rename of an unfinished save. Every later save removes
what the killed one left, so the folder never holds more than the last kill's temporary,
and the target always loads.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")

KILLS = 40


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("killed")
    child = Path(__file__).with_name("kill_saves_child.py")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, str(child), str(folder), str(KILLS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["file", "run"])
def test_forty_killed_saves_never_leave_more_than_one_temporary(report, kind):
    after_each_kill = report[kind]
    assert len(after_each_kill) == KILLS
    assert max(len(names) for names in after_each_kill) <= 1, after_each_kill


@pytest.mark.parametrize("kind", ["file", "run"])
def test_kills_did_land_mid_save(report, kind):
    # Otherwise the test above would pass without testing anything.
    assert sum(len(names) == 1 for names in report[kind]) >= KILLS // 4


@pytest.mark.parametrize("kind", ["file", "run"])
def test_the_target_still_loads_after_forty_kills(report, kind):
    assert report[f"{kind}_loads"]
