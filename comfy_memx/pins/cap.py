"""The pinned-memory cap: the automatic rule, the ``COMFY_MEMX_PIN_LIMIT`` override, and ComfyUI's own figure.

Pinned (page-locked) host memory cannot be swapped or reclaimed, so a cap that ignores what really relieves RAM
gets processes OOM-killed: ComfyUI 0.27.0 caps pins at 90 % of RAM on Linux, which on a 93.7 GiB box whose only
swap is zram came out at 77.7 GiB.  The automatic rule here is the swap-aware one of ComfyUI after 0.27.0, applied
on every version that pins::

    Windows:    0.40 x RAM
    elsewhere:  max(0.40 x RAM, min(0.90 x RAM, RAM - 4 GiB, RAM + disk swap - 16 GiB))

with RAM clamped to the cgroup limit and swap counted as 0 under a limit (both done by
:func:`comfy_memx.pins.host.probe_host`).  Pure arithmetic on a :class:`~comfy_memx.pins.host.HostMemory`; no I/O.
"""

import dataclasses
import logging
import re

from comfy_memx.core.config import PIN_LIMIT_FORMS as ACCEPTED_FORMS, register_check
from comfy_memx.core.errors import ConfigError
from comfy_memx.core.units import format_bytes

log = logging.getLogger("comfy_memx")

ENV_NAME = "COMFY_MEMX_PIN_LIMIT"
SOURCE_AUTO = "auto"
SOURCE_ENV = ENV_NAME
GIB = 1024 ** 3


_UNITS = {"": 1, "b": 1,
          "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4}
_SIZE = re.compile(r"^(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[a-z]*)$")
_PERCENT = re.compile(r"^(?P<number>\d+(?:\.\d+)?|\.\d+)\s*%$")


@dataclasses.dataclass(frozen=True)
class PinCap:
    """The cap in force: ``bytes`` (0 = no pinning), ``source`` ("auto" or "COMFY_MEMX_PIN_LIMIT"), ``warnings``."""

    bytes: int
    source: str
    warnings: tuple[str, ...] = ()

    @property
    def enabled(self):
        """True when pinning is allowed at all."""
        return self.bytes > 0


def auto_cap(host):
    """Return the automatic pin cap in bytes for ``host`` (a HostMemory), by the rule in the module docstring.

    The rule keeps at least 40 % of RAM pinnable and otherwise leaves 4 GiB of RAM, and 16 GiB of RAM plus disk swap,
    outside the pins; zram and swap under a cgroup limit do not count (the probe already zeroes the latter).
    """
    ram = host.ram_total
    floor = ram * 2 // 5
    if host.platform.startswith("win"):
        return floor
    swap = 0 if host.cgroup_limit is not None else host.swap_disk
    return max(floor, min(ram * 9 // 10, ram - 4 * GIB, ram + swap - 16 * GIB))


def comfyui_cap(host, version):
    """Return the ``MAX_PINNED_MEMORY`` that ComfyUI ``version`` computes on ``host``, or None if it does not pin.

    ``version`` is a string such as "0.27.0" (a leading "v" is allowed) or a tuple; None or an unparsable string
    gives None.  The figure is the one ComfyUI uses where it pins at all (an NVIDIA or AMD GPU and no
    ``--disable-pinned-memory``); on other machines ComfyUI leaves the cap at -1.  Rules, as read in the sources:
    0.3.64 and older have no pinning; 0.3.75 uses 95 % of physical RAM (Windows 45 %); 0.4 up to 0.27.0 use 90 %
    (Windows 40 %), neither swap- nor cgroup-aware; newer releases use :func:`auto_cap`'s rule.  The boundaries
    between the releases that were read (0.3.64, 0.3.75, 0.27.0) are assumptions.
    """
    parsed = _parse_version(version)
    if parsed is None or parsed <= (0, 3, 64):
        return None
    ram = host.ram_physical or host.ram_total
    windows = host.platform.startswith("win")
    if parsed < (0, 4, 0):
        return ram * 45 // 100 if windows else ram * 95 // 100
    if parsed <= (0, 27, 0):
        return ram * 2 // 5 if windows else ram * 9 // 10
    return auto_cap(host)


def parse_pin_limit(text, ram_total):
    """Parse a ``COMFY_MEMX_PIN_LIMIT`` value into ``(bytes, source)``.

    Accepts bytes with a decimal or binary unit ("12GiB", "800MB", "1.5GB"), plain bytes, a percentage of
    ``ram_total`` ("30%") and "off" (returns 0: no pinning).  None, "" and "auto" return ``(None, "auto")``: the
    caller applies :func:`auto_cap`.  A limit above ``ram_total`` is clamped to it with a logged warning.  Anything
    else raises :class:`ConfigError` naming the variable and the accepted forms, so a typo fails at startup instead
    of silently pinning the default.
    """
    limit, source, _ = _parse(text, ram_total)
    return limit, source


def resolve_cap(host, env_value):
    """Return the :class:`PinCap` in force for ``host`` given the raw ``COMFY_MEMX_PIN_LIMIT`` value (or None).

    Raises :class:`ConfigError` for an invalid value (see :func:`parse_pin_limit`).
    """
    limit, source, warnings = _parse(env_value, host.ram_total)
    if limit is None:
        return PinCap(auto_cap(host), SOURCE_AUTO, warnings)
    return PinCap(limit, source, warnings)


def doctor_fields(host, env_value, comfyui_version=None):
    """Return the host and pin-cap fields of ``doctor --json`` as a dict of plain values.

    ``comfyui_pin_cap_bytes`` is what ComfyUI itself would use (None when that version does not pin or no version
    is known); ``pin_cap_bytes``/``pin_cap_source`` are what comfy_memx applies.
    """
    cap = resolve_cap(host, env_value)
    return {
        "ram_bytes": host.ram_total,
        "ram_physical_bytes": host.ram_physical or host.ram_total,
        "ram_available_bytes": host.ram_available,
        "swap_disk_bytes": host.swap_disk,
        "swap_zram_bytes": host.swap_zram,
        "cgroup_limit_bytes": host.cgroup_limit,
        "pin_cap_bytes": cap.bytes,
        "pin_cap_source": cap.source,
        "comfyui_pin_cap_bytes": comfyui_cap(host, comfyui_version),
        "warnings": list(host.warnings) + list(cap.warnings),
    }


def check_form(text):
    """Raise :class:`ConfigError` unless ``text`` is a ``COMFY_MEMX_PIN_LIMIT`` value in one of the accepted forms.

    Needs no host: the settings are checked at start-up, the cap is resolved against the host when pinning starts.
    """
    _form(text)


register_check("pin_limit", check_form)


def _form(text):
    """``(kind, number)``: ("auto", None), ("off", 0), ("percent", float) or ("bytes", int)."""
    if text is None:
        return "auto", None
    value = str(text).strip().lower()
    if value in ("", "auto"):
        return "auto", None
    if value == "off":
        return "off", 0
    percent = _PERCENT.match(value)
    if percent:
        return "percent", float(percent["number"])
    size = _SIZE.match(value)
    if size and size["unit"] in _UNITS and not (size["unit"] == "" and "." in size["number"]):
        return "bytes", int(float(size["number"]) * _UNITS[size["unit"]])
    raise _invalid(text)


def _parse(text, ram_total):
    kind, number = _form(text)
    if kind == "auto":
        return None, SOURCE_AUTO, ()
    limit = int(ram_total * number / 100) if kind == "percent" else number
    if limit > ram_total:
        message = "%s=%s is above RAM (%s); clamped to RAM" % (ENV_NAME, str(text).strip(), format_bytes(ram_total))
        log.warning("comfy_memx: %s", message)
        return ram_total, SOURCE_ENV, (message,)
    return limit, SOURCE_ENV, ()


def _invalid(text):
    return ConfigError("%s=%r is not a valid pin limit; accepted: %s" % (ENV_NAME, text, ACCEPTED_FORMS))


def _parse_version(version):
    if version is None:
        return None
    if isinstance(version, tuple):
        return tuple(int(part) for part in version[:3])
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(version).strip())
    if not match:
        return None
    return tuple(int(part or 0) for part in match.groups())
