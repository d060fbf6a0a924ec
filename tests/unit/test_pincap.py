"""The pin cap: the automatic rule, ComfyUI's own figures, and parsing COMFY_MEMX_PIN_LIMIT."""

import logging

import pytest

from comfy_memx.pins import host as hostmem
from comfy_memx.pins import cap as pincap
from comfy_memx.core.errors import ConfigError

GIB = 1024 ** 3
# Expected caps, worked out by hand from the rule max(0.4 RAM, min(0.9 RAM, RAM - 4 GiB, RAM + disk swap - 16 GiB)):
CAP_64_NO_SWAP = 51539607552        # 64 GiB RAM: 64 - 16 = 48 GiB
CAP_64_SWAP_32 = 61847529062        # 64 GiB RAM + 32 GiB swap: 0.9 x 64 GiB = 57.6 GiB (floor)
CAP_24_NO_SWAP = 10307921510        # 24 GiB: 0.4 x 24 GiB = 9.6 GiB (floor)
CAP_16_NO_SWAP = 6871947673         # 16 GiB: 0.4 x 16 GiB = 6.4 GiB (floor)


def host(ram_gib, swap_gib=0, zram_gib=0, platform="linux", limit=None, physical_gib=None):
    ram = int(ram_gib * GIB)
    return hostmem.HostMemory(ram_total=ram, ram_available=ram // 2, swap_disk=int(swap_gib * GIB),
                              swap_zram=int(zram_gib * GIB), cgroup_limit=limit, platform=platform,
                              ram_physical=int((physical_gib or ram_gib) * GIB))


@pytest.mark.parametrize("ram, swap, expected_gib", [(64, 0, 48), (64, 32, 57.6), (24, 0, 9.6), (16, 0, 6.4)])
def test_auto_cap_examples_from_the_issue(ram, swap, expected_gib):
    assert pincap.auto_cap(host(ram, swap)) == pytest.approx(expected_gib * GIB, abs=1)


def test_zram_does_not_raise_the_cap():
    assert pincap.auto_cap(host(64, zram_gib=32)) == CAP_64_NO_SWAP


def test_swap_is_ignored_under_a_cgroup_limit():
    limited = host(64, swap_gib=32, limit=64 * GIB, physical_gib=128)
    assert pincap.auto_cap(limited) == CAP_64_NO_SWAP


def test_windows_gets_forty_percent_whatever_the_swap():
    assert pincap.auto_cap(host(64, swap_gib=64, platform="win32")) == pytest.approx(0.4 * 64 * GIB, abs=1)


def test_cap_from_a_probed_container(tmp_path):
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: %d kB\nMemAvailable: %d kB\n" % (64 * 1024 ** 2,
                                                                                        60 * 1024 ** 2))
    (tmp_path / "proc" / "swaps").write_text("Filename Type Size Used Priority\n/swapfile file %d 0 -2\n"
                                             % (32 * 1024 ** 2))
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/ctr\n")
    (tmp_path / "cg" / "ctr").mkdir(parents=True)
    (tmp_path / "cg" / "ctr" / "memory.max").write_text(str(24 * GIB))
    probed = hostmem.probe_host(str(tmp_path / "proc"), str(tmp_path / "cg"), platform="linux")
    assert pincap.resolve_cap(probed, None) == pincap.PinCap(CAP_24_NO_SWAP, "auto")
    assert probed.ram_total == 24 * GIB and probed.swap_disk == 0  # the limit wins, and swap stops counting


@pytest.mark.parametrize("version", ["0.3.64", "0.3.10", None, "not a version"])
def test_comfyui_without_pinning_has_no_cap(version):
    assert pincap.comfyui_cap(host(64), version) is None


def test_comfyui_0270_uses_ninety_percent_of_physical_ram_ignoring_swap_and_cgroup():
    limited = host(16, swap_gib=32, limit=16 * GIB, physical_gib=64)
    assert pincap.comfyui_cap(limited, "0.27.0") == pytest.approx(0.9 * 64 * GIB, abs=1)
    assert pincap.comfyui_cap(host(64, platform="win32"), "v0.27.0") == pytest.approx(0.4 * 64 * GIB, abs=1)
    assert pincap.comfyui_cap(host(64), (0, 3, 75)) == pytest.approx(0.95 * 64 * GIB, abs=1)


def test_comfyui_after_0270_uses_the_swap_aware_rule():
    cases = [(host(64), CAP_64_NO_SWAP), (host(64, 32), CAP_64_SWAP_32), (host(24), CAP_24_NO_SWAP),
             (host(16, limit=16 * GIB, physical_gib=32), CAP_16_NO_SWAP)]
    for h, expected in cases:
        assert pincap.comfyui_cap(h, "0.28.0") == expected


@pytest.mark.parametrize("text, expected", [
    ("12GiB", 12 * GIB), ("800MB", 800 * 1000 ** 2), ("1.5GB", 1500 * 1000 ** 2), ("30%", int(0.3 * 64 * GIB)),
    ("1073741824", GIB), (" 12 gib ", 12 * GIB), ("512MiB", 512 * 1024 ** 2), ("0", 0), ("off", 0), ("OFF", 0),
    ("12.5%", 8 * GIB), ("2TB", 64 * GIB),
])
def test_parse_pin_limit_forms(text, expected):
    assert pincap.parse_pin_limit(text, 64 * GIB) == (expected, "COMFY_MEMX_PIN_LIMIT")


@pytest.mark.parametrize("text", [None, "", "auto", "  AUTO "])
def test_parse_pin_limit_auto(text):
    assert pincap.parse_pin_limit(text, 64 * GIB) == (None, "auto")


@pytest.mark.parametrize("text", ["12G", "lots", "-5GB", "1.5", "12 parsecs", "%", "12GiB8", "0x10", "on"])
def test_parse_pin_limit_rejects_with_the_variable_and_the_accepted_forms(text):
    with pytest.raises(ConfigError) as caught:
        pincap.parse_pin_limit(text, 64 * GIB)
    message = str(caught.value)
    assert "COMFY_MEMX_PIN_LIMIT" in message and repr(text) in message
    for form in ("12GiB", "800MB", "30%", "off"):
        assert form in message
    assert isinstance(caught.value, ValueError)


def test_limit_above_ram_is_clamped_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="comfy_memx"):
        assert pincap.parse_pin_limit("200GiB", 64 * GIB) == (64 * GIB, "COMFY_MEMX_PIN_LIMIT")
    assert any("clamped" in r.getMessage() and "COMFY_MEMX_PIN_LIMIT" in r.getMessage() for r in caplog.records)
    cap = pincap.resolve_cap(host(64), "150%")
    assert cap.bytes == 64 * GIB and cap.warnings and "clamped" in cap.warnings[0]


def test_resolve_cap_sources():
    assert pincap.resolve_cap(host(64), None) == pincap.PinCap(48 * GIB, "auto")
    assert pincap.resolve_cap(host(64), "12GiB") == pincap.PinCap(12 * GIB, "COMFY_MEMX_PIN_LIMIT")
    off = pincap.resolve_cap(host(64), "off")
    assert off.bytes == 0 and not off.enabled and off.source == "COMFY_MEMX_PIN_LIMIT"
    with pytest.raises(ConfigError):
        pincap.resolve_cap(host(64), "twelve")


def test_doctor_fields():
    fields = pincap.doctor_fields(host(64, swap_gib=8, zram_gib=4), "30%", "0.27.0")
    assert fields["ram_bytes"] == 64 * GIB and fields["swap_disk_bytes"] == 8 * GIB
    assert fields["swap_zram_bytes"] == 4 * GIB and fields["cgroup_limit_bytes"] is None
    assert fields["pin_cap_bytes"] == int(0.3 * 64 * GIB) and fields["pin_cap_source"] == "COMFY_MEMX_PIN_LIMIT"
    assert fields["comfyui_pin_cap_bytes"] == pytest.approx(0.9 * 64 * GIB, abs=1)
    assert pincap.doctor_fields(host(64), None)["comfyui_pin_cap_bytes"] is None
