"""The shipped Prometheus alert rules: ``promtool check rules``, ``promtool test rules`` with a firing and a resolving
case per alert (``tests/fleet/alerts_test.yml``), and a runbook per alert in docs/operations.md.

The promtool tests are skipped, with that reason, when promtool is not installed (Debian: ``apt-get install
prometheus``; ``.ci/run`` installs it). The coverage and runbook checks run everywhere.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from comfy_memx import fleet
from bench.harness import prom
from fleet_queries import alert_names

HERE = Path(__file__).resolve().parents[1]  # tests/
ROOT = HERE.parent
UNIT_TESTS = HERE / "fleet" / "alerts_test.yml"


def promtool():
    found = prom.find_binary("promtool")
    if found is None:
        pytest.skip("promtool is not installed (apt-get install prometheus, or set COMFY_MEMX_PROMETHEUS)")
    return found


def unit_cases():
    """``[(alertname, eval minutes, fires)]`` of every alert_rule_test block of the promtool unit tests."""
    text = UNIT_TESTS.read_text(encoding="utf-8")
    cases = []
    for block in re.split(r"^\s*- eval_time: ", text, flags=re.M)[1:]:
        when = re.match(r"(\d+)m\s*$", block.split("\n", 1)[0])
        name = re.search(r"^\s*alertname: (\w+)\s*$", block, re.M)
        expected = re.search(r"^\s*exp_alerts:(.*)$", block, re.M)
        assert when and name and expected, block[:300]
        fires = expected.group(1).strip() != "[]"
        assert fires == ("exp_labels:" in block), block[:300]
        cases.append((name.group(1), int(when.group(1)), fires))
    return cases


def test_the_rules_file_passes_promtool_check():
    done = subprocess.run([promtool(), "check", "rules", fleet.rules_path()], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in done.stdout


def test_promtool_unit_tests_pass():
    done = subprocess.run([promtool(), "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True,
                          timeout=120, cwd=str(UNIT_TESTS.parent))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_firing_case_and_a_later_resolving_case():
    names = alert_names()
    assert len(names) == len(set(names)) and len(names) >= 10
    cases = unit_cases()
    assert {name for name, _, _ in cases} == set(names)
    for name in names:
        fired = [when for alert, when, fires in cases if alert == name and fires]
        resolved = [when for alert, when, fires in cases if alert == name and not fires]
        assert fired and resolved and max(resolved) > min(fired), (name, fired, resolved)


def test_the_unit_tests_load_the_shipped_rules_file():
    text = UNIT_TESTS.read_text(encoding="utf-8")
    [listed] = re.findall(r"^rule_files:\n\s+- (\S+)$", text, re.M)
    # the checkout's rules file, which is byte for byte what the installed package ships (a wheel: another folder)
    source = (UNIT_TESTS.parent / listed).resolve()
    assert source == (ROOT / "comfy_memx" / "fleet" / "alerts.yml").resolve()
    assert source.read_bytes() == Path(fleet.rules_path()).read_bytes()


def test_every_alert_has_a_runbook_in_the_operations_page():
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = page.split("\n## Fleets\n", 1)
    assert len(section) == 2, "docs/operations.md has no 'Fleets' section"
    body = section[1].split("\n## ", 1)[0]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n## For fleets\n" in readme and "docs/operations.md#fleets" in readme  # where the rules' runbook points
    rules = Path(fleet.rules_path()).read_text(encoding="utf-8")
    for name in alert_names():
        assert f"\n#### {name}\n" in body, f"no runbook heading for {name} in docs/operations.md's Fleets section"
        assert f'runbook: "comfy_memx README, For fleets: {name}"' in rules, name
