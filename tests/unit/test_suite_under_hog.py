"""``tests/scripts/suite_under_hog.sh``: N runs of a suite under CPU hogs, each run's summary, the count, the exit
status, and no hog left running afterwards (here on a two-test suite of its own, with one hog)."""

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "suite_under_hog.sh"


def run_script(tmp_path, body, runs):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_tiny.py").write_text(body)
    env = dict(os.environ, PYTHON=sys.executable, MEMX_HOGS="1", MEMX_SUITE=str(suite), TMPDIR=str(tmp_path))
    done = subprocess.run(["bash", str(SCRIPT), str(runs)], env=env, capture_output=True, text=True, timeout=600)
    hogs = re.search(r"pids ([\d ]+)\)", done.stdout).group(1).split()
    return done, hogs


def gone(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_every_run_is_summarised_and_counted_and_the_hogs_are_stopped(tmp_path):
    done, hogs = run_script(tmp_path, "def test_a():\n    pass\n\n\ndef test_b():\n    pass\n", 2)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"run 1/2: exit 0 in \d+ s: .*2 passed", done.stdout)
    assert re.search(r"run 2/2: exit 0 in \d+ s: .*2 passed", done.stdout)
    assert done.stdout.rstrip().endswith("2 passed runs of 2")
    assert hogs and all(gone(pid) for pid in hogs)


def test_a_failed_run_fails_the_script_and_names_the_test(tmp_path):
    done, hogs = run_script(tmp_path, "def test_a():\n    pass\n\n\ndef test_broken():\n    assert False\n", 1)
    assert done.returncode == 1
    assert "FAILED" in done.stdout and "test_broken" in done.stdout and "1 failed, 1 passed" in done.stdout
    assert done.stdout.rstrip().endswith("0 passed runs of 1")
    assert all(gone(pid) for pid in hogs)


def test_a_bad_count_is_refused_naming_it():
    done = subprocess.run(["bash", str(SCRIPT), "five"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "N must be a whole number >= 1, got 'five'" in done.stderr
