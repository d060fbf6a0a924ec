import re
from pathlib import Path

import pytest

from comfy_memx.core import config
from comfy_memx.core.errors import ConfigError


def test_defaults_without_environment():
    cfg = config.parse({})
    assert (cfg.active, cfg.leak_mode, cfg.events, cfg.disable) == (False, "report", None, ())


def test_values_are_parsed(tmp_path):
    cfg = config.parse({"COMFY_MEMX": "yes", "COMFY_MEMX_LEAK_MODE": "Strict",
                        "COMFY_MEMX_EVENTS": str(tmp_path / "e.jsonl"),
                        "COMFY_MEMX_DISABLE": " execution , model_management",
                        "COMFY_MEMX_LEAK_BUDGET": "0.5"})
    assert cfg.active is True and cfg.leak_mode == "strict"
    assert cfg.events == str(tmp_path / "e.jsonl")
    assert cfg.disable == ("execution", "model_management")
    assert cfg.leak_budget == 0.5


@pytest.mark.parametrize("name,value,accepted", [
    ("COMFY_MEMX", "maybe", "1/true/yes/on"),
    ("COMFY_MEMX_LEAK_MODE", "loud", "off, report, strict"),
    ("COMFY_MEMX_DISABLE", "model_management,pinz", "comma list of model_management, "),
    ("COMFY_MEMX_LEAK_BUDGET", "-1", "seconds > 0"),
    ("COMFY_MEMX_LEAK_BUDGET", "nan", "seconds > 0"),
    ("COMFY_MEMX_RAISE_INTERNAL", "2", "1/true/yes/on"),
])
def test_bad_values_name_the_variable_and_accepted_values(name, value, accepted):
    with pytest.raises(ConfigError) as info:
        config.parse({name: value})
    assert name in str(info.value) and repr(value) in str(info.value) and accepted in str(info.value)


def test_only_the_launcher_is_told_its_option_and_everyone_else_the_variable():
    """A node-pack or ``COMFY_MEMX=1`` user sets environment variables; a launcher option would send them looking
    for a command line they do not use."""
    bad = {"COMFY_MEMX_LEAK_MODE": "loud"}
    with pytest.raises(ConfigError) as plain:
        config.parse(bad)
    assert str(plain.value).startswith("COMFY_MEMX_LEAK_MODE='loud' is not valid") and "launcher" not in str(plain.value)
    with pytest.raises(ConfigError) as launcher:
        config.parse(bad, launcher=True)
    assert str(launcher.value).endswith("(launcher option --leak-mode)"), str(launcher.value)
    auto = {"COMFY_MEMX_RELEASE": "auto"}
    with pytest.raises(ConfigError) as plain:
        config.parse(auto)
    assert "COMFY_MEMX_RELEASE_PACKAGES" in str(plain.value) and "launcher" not in str(plain.value)
    with pytest.raises(ConfigError) as launcher:
        config.parse(auto, launcher=True)
    assert "launcher options --release auto --release-packages NAMES" in str(launcher.value)


def test_unknown_names_are_warned_about():
    cfg = config.parse({"COMFY_MEMX_LEAKMODE": "strict", "OTHER": "1"})
    assert len(cfg.warnings) == 1 and "COMFY_MEMX_LEAKMODE" in cfg.warnings[0]
    assert cfg.leak_mode == "report"


def test_an_unknown_name_next_to_a_bad_value_travels_with_the_error():
    with pytest.raises(config.ConfigError) as info:
        config.parse({"COMFY_MEMX_EVENT": "/tmp/x.jsonl", "COMFY_MEMX_LEAK_MODE": "loud"})
    assert "COMFY_MEMX_LEAK_MODE" in str(info.value)
    assert len(info.value.warnings) == 1 and "unknown setting COMFY_MEMX_EVENT ignored" in info.value.warnings[0]


def test_config_is_immutable():
    with pytest.raises(Exception):
        config.parse({}).leak_mode = "off"


def test_launcher_flags_derive_from_names():
    flags = {s.env: s.flag for s in config.SETTINGS}
    assert flags["COMFY_MEMX_LEAK_MODE"] == "--leak-mode"
    assert flags["COMFY_MEMX_EVENTS"] == "--events"


def test_configuration_reference_lists_every_setting_with_its_option():
    table = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(COMFY_MEMX[A-Z_]*)`", table, flags=re.M))
    assert documented == {s.env for s in config.SETTINGS}
    for setting in config.SETTINGS:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{setting.env}`"))
        if setting.option:
            assert f"`{setting.flag}`" in row, setting.env
