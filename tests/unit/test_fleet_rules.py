"""The shipped Prometheus alert rules: ``promtool check rules``, ``promtool test rules`` with a firing and a resolving
case per alert (``tests/fleet/alerts_test.yml``), the file as the default rendering of its template, annotations
and tiers, and a runbook per alert on the page every server serves (comfy_memx/fleet/runbooks.md).

The promtool tests are skipped, with that reason, when promtool is not installed (Debian: ``apt-get install
prometheus``; ``.ci/run`` installs it). The coverage and runbook checks run everywhere.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from comfy_memx import fleet
from comfy_memx.cli import fleet as fleet_cli
from comfy_memx.fleet import rules, runbooks
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
    recorded = len(re.findall(r"^\s*- record: ", Path(fleet.rules_path()).read_text(encoding="utf-8"), re.M))
    assert recorded >= 5 and f"SUCCESS: {len(alert_names()) + recorded} rules found" in done.stdout


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


def rule_blocks():
    """``{alertname: its text in the shipped rules file}``."""
    text = Path(fleet.rules_path()).read_text(encoding="utf-8")
    blocks = re.split(r"^\s*- alert: ", text, flags=re.M)[1:]
    return {block.split("\n", 1)[0].strip(): block.split("\n\n", 1)[0] for block in blocks}


def test_every_alert_has_a_runbook_on_the_page_the_servers_serve():
    page = runbooks.page().decode("utf-8")
    for name in alert_names():   # each runbook_url's anchor is the alert's name in lower case
        assert f'<h2 id="{name.lower()}">{name}</h2>' in page, f"no runbook heading for {name} in runbooks.md"
    source = Path(runbooks.SOURCE).read_text(encoding="utf-8")
    assert set(re.findall(r"^## (\w+)$", source, re.M)) == set(alert_names())


def test_the_runbook_page_escapes_what_it_shows_and_keeps_code_and_lists():
    html = runbooks.render("## Alert\n\nA <b> and `x < 1` and [a link](../x.md).\n\n* one\n  more\n* two\n\n```\n<raw>\n```\n")
    assert '<h2 id="alert">Alert</h2>' in html
    assert "<p>A &lt;b&gt; and <code>x &lt; 1</code> and a link.</p>" in html
    assert "<ul><li>one more</li><li>two</li></ul>" in html and "<pre>&lt;raw&gt;</pre>" in html


def test_every_alert_has_a_summary_a_description_a_runbook_url_and_a_tier():
    blocks = rule_blocks()
    assert set(blocks) == set(alert_names())
    tiers = {}
    for name, block in blocks.items():
        for annotation in ("summary", "description"):
            assert re.search(rf'^\s+{annotation}: "[^"]+', block, re.M), (name, annotation)
        assert name.lower() in rules.SERVERLESS or f'runbook_url: "{rules.RUNBOOK_BASE}#{name.lower()}"' in block, name
        [tier] = re.findall(r"^\s+severity: (\w+)$", block, re.M)
        tiers.setdefault(tier, []).append(name)
    assert set(tiers) == {"warning", "critical"}, tiers
    assert {"ComfyMemxLeakedMemoryCritical", "ComfyMemxRSSNearHostMemory"} <= set(tiers["critical"])


def test_the_shipped_rules_file_is_the_default_rendering(capsys):
    shipped = Path(fleet.rules_path()).read_text(encoding="utf-8")
    assert rules.render() == shipped
    assert fleet_cli.main(["--rules"]) == 0
    assert capsys.readouterr().out == shipped


def test_a_rendering_selects_the_given_job_links_the_given_runbooks_and_keeps_thresholds_in_one_place(capsys):
    assert fleet_cli.main(["--rules", "--job-selector", 'job="gpu-box"', "--runbook-base",
                           "https://ops.example/memx.md", "--set", "leak_package_fraction=0.1",
                           "--set", "leak_package_bytes=2GiB", "--set", "rss_window=6h",
                           "--set", "scrape_gap=5m"]) == 0
    text = capsys.readouterr().out
    assert "comfyui.*" not in text and text.count('{job="gpu-box"') >= 20
    assert text.count("runbook_url: \"https://ops.example/memx.md#comfymemx") == len(alert_names())
    assert "clamp_max(0.1 * comfy_memx:host_memory_bytes, 2147483648)" in text
    assert "more than 10 % of the memory of {{ $labels.instance }} or 2 GiB, whichever is lower" in text
    assert "deriv(comfy_memx:rss_unexplained_floor_bytes[6h])" in text and "> 23700)" in text   # 6h + 5m + 30m
    assert "[2m]" not in text and text.count("[5m])") >= 15
    shipped = Path(fleet.rules_path()).read_text(encoding="utf-8")
    assert "clamp_max(0.02 * comfy_memx:host_memory_bytes, 1073741824)" in shipped and "> 9300)" in shipped


def test_every_alert_bridges_failed_scrapes_and_keeps_firing(tmp_path, capsys):
    """Every alert keeps firing after its condition ends and reads no instant sample that one failed scrape (a
    stale marker) would empty: its series are read through a range (last_over_time, increase, absent_over_time)
    or through recording rules that are."""
    text = Path(fleet.rules_path()).read_text(encoding="utf-8")
    blocks = rule_blocks()
    for name, block in blocks.items():
        assert re.search(r"^\s+keep_firing_for: 5m$", block, re.M), name
        expr = block.split("expr:", 1)[1].split("labels:", 1)[0]
        bare = re.sub(r"\b(last_over_time|increase|absent_over_time)\((\w+)\{[^}]*\}\[[^]]+\]( offset \w+)?\)", "",
                      expr)
        if name == "ComfyMemxPinRefusals":   # the new-series branch: a counter's sample now, unless one earlier
            bare = re.sub(r"comfy_memx_pin_refusals_total\{[^}]*\}\s+unless", "", bare)
        assert not re.search(r"\b(comfy_memx_\w+|up|process_start_time_seconds)\{", bare), (name, bare)
    assert "keep_firing_for:" not in rules.render(overrides={"keep_firing": "0"})
    assert text.count("keep_firing_for: 5m") == len(alert_names())


def test_an_older_prometheus_gets_a_rendering_without_keep_firing_for(tmp_path, capsys):
    tool = promtool()
    assert fleet_cli.main(["--rules", "--set", "keep_firing=0"]) == 0
    path = tmp_path / "rules.yml"
    path.write_text(capsys.readouterr().out, encoding="utf-8")
    assert "keep_firing_for:" not in path.read_text(encoding="utf-8")
    done = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_runbook_links_point_at_the_page_of_the_server_that_raised_the_alert():
    blocks = rule_blocks()
    for name, block in blocks.items():
        links = re.findall(r'runbook_url: "([^"]+)"', block)
        if name.lower() in rules.SERVERLESS:   # no instance label: no server to link to, the description says
            assert links == [] and "Check that" in block, name
            continue
        assert links == [f"http://{{{{$labels.instance}}}}/memx/runbooks#{name.lower()}"], (name, links)
        labels = re.search(r"by \(([^)]*)\)", block)
        assert "instance" in (labels.group(1) if labels else "instance"), name   # the link needs the label
    rendered = rules.render(runbook_base="https://wiki.example/memx")
    assert 'runbook_url: "https://wiki.example/memx#comfymemxabsent"' in rendered   # a static page links them all


def test_thresholds_take_the_lower_of_a_fraction_and_bytes():
    values = rules.checked_thresholds({"leak_package_bytes": "1.5GiB", "leak_total_bytes": 123456789,
                                       "rss_growth_bytes": "256 MiB"})
    assert values["leak_package_bytes"] == 1610612736 and values["leak_total_bytes"] == 123456789
    assert values["rss_growth_bytes"] == 268435456
    for name in [name for name in rules.THRESHOLDS if name.endswith("_bytes")]:
        stem = name[:-len("_bytes")].upper()
        assert f"clamp_max(@{stem}_FRACTION@ * comfy_memx:host_memory_bytes, @{stem}_BYTES@)" in Path(
            rules.TEMPLATE).read_text(encoding="utf-8"), name


@pytest.mark.parametrize("argv", [["--set", "bogus=1"], ["--set", "leak_total_fraction=2"],
                                  ["--set", "rss_window=3 hours"], ["--set", "reload_seconds"],
                                  ["--set", "leak_package_bytes=lots"], ["--set", "leak_total_bytes=0"],
                                  ["--set", "scrape_gap=0"], ["--runbook-base", "docs/operations.md"],
                                  ["--job-selector", "{job=\"x\"}"]])
def test_bad_rendering_options_are_refused_with_the_reason(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        fleet_cli.main(["--rules", *argv])
    assert stopped.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_custom_rendering_passes_promtool(tmp_path, capsys):
    tool = promtool()
    assert fleet_cli.main(["--rules", "--job-selector", 'job="gpu-box"', "--set", "rss_warmup=1h",
                           "--set", "rss_fast_growth_bytes=8GiB", "--set", "keep_firing=15m"]) == 0
    path = tmp_path / "rules.yml"
    path.write_text(capsys.readouterr().out, encoding="utf-8")
    done = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
