"""Every comfy_memx setting, read once from ``COMFY_MEMX_*`` environment variables into a frozen :class:`Config`.

This is the only module that reads comfy_memx settings from the environment.  Each launcher option is the same
setting (``--leak-mode strict`` is ``COMFY_MEMX_LEAK_MODE=strict``): the launcher writes its options into the
environment and this module parses them, so every entry point behaves the same.  Bad values raise
:class:`~comfy_memx.core.errors.ConfigError` naming the variable and the accepted values; unknown ``COMFY_MEMX_*`` names
are returned as warnings (typo guard).
"""

import dataclasses
import math
import os
import re

from comfy_memx.core import private
from comfy_memx.core.discovery import patch_names
from comfy_memx.core.errors import ConfigError, MemxError

PREFIX = "COMFY_MEMX"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")
LEAK_MODES = ("off", "report", "strict")


PATCH_NAMES = patch_names()
PIN_SCOPES = ("process", "host")
HANDOFF_SCOPES = ("off", "host")
RELEASE_POLICIES = ("off", "ask", "auto")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: its parser, default, the words shown when a value is rejected, and its doc line."""
    env: str
    field: str
    parse: object
    default: object
    accepted: str
    doc: str
    option: bool = True  # whether the launcher offers it as --<name>

    @property
    def flag(self):
        """The launcher option for this setting: ``COMFY_MEMX_LEAK_MODE`` -> ``--leak-mode``."""
        return "--" + self.env[len(PREFIX) + 1:].lower().replace("_", "-")

    def rejected(self, raw, why, launcher=False):
        """The error message for value ``raw``: the variable, the value, why, and (to a user of the launcher only:
        a node pack or ``COMFY_MEMX=1`` has none) the launcher option if any."""
        option = f" (launcher option {self.flag})" if self.option and launcher else ""
        shown = "<hidden>" if self.field in SECRET_FIELDS else repr(raw)  # a secret never goes to a log
        return f"{self.env}={shown} {why}{option}"


def _bool(text):
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(text)


def _choice(words):
    def parse(text):
        word = text.strip().lower()
        if word not in words:
            raise ValueError(text)
        return word
    return parse


class Unusable(MemxError, ValueError):
    """A value of the right form that cannot be used here (a folder that does not exist); says why."""


def _absolute(text):
    text = text.strip()
    return os.path.abspath(os.path.expanduser(text)) if text else None


def _writable_folder(folder):
    if not os.path.isdir(folder):
        raise Unusable(f"the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise Unusable(f"the folder {folder} is not writable")


def _events_file(text):
    path = _absolute(text)
    if path is None:
        return None
    try:
        info = private.inspect(path)  # no link followed that another user made, the file itself no link
    except private.Refused as exc:
        raise Unusable(str(exc)) from None
    except FileNotFoundError:
        info = None                   # its folder does not exist: said below
    except OSError as exc:
        raise Unusable(f"{path} cannot be inspected ({exc.strerror or exc})") from None
    _writable_folder(os.path.dirname(path))
    if info is not None and not os.access(path, os.W_OK):
        raise Unusable(f"the file {path} is not writable")
    return path


def _graph_folder(text):
    path = _absolute(text)
    if path is not None:
        _writable_folder(path)
        try:
            private.open_folder(path).close()   # reached with no link of another user followed
        except private.Refused as exc:
            raise Unusable(str(exc)) from None
        except OSError as exc:
            raise Unusable(f"the folder {path} cannot be opened ({exc.strerror or exc})") from None
    return path


def _patch_list(text):
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if name not in PATCH_NAMES:
            raise ValueError(text)
    return names


PIN_LIMIT_FORMS = ("bytes with a unit (12GiB, 800MB, 1.5GB; units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), "
                   "a plain number of bytes (1073741824), a percentage of RAM (30%), 'off' (no pinning) or 'auto'")
_FORM_CHECKS = {}   # setting field -> check(text) registered by the wing that owns the setting (register_check)


def register_check(field, check):
    """Let the wing that owns setting ``field`` check its values' form when the settings are parsed.

    ``check(text)`` raises :class:`ConfigError` (or ValueError) for a value of a bad form.  The pin wing registers
    the ``COMFY_MEMX_PIN_LIMIT`` parser this way, so core imports no wing; the bootstrap imports the patch modules,
    and with them the wings, before it parses.  Without a registered check the value is kept as given (the wing
    that would use it is not installed).
    """
    _FORM_CHECKS[field] = check


def _pin_limit(text):
    check = _FORM_CHECKS.get("pin_limit")
    if check is not None:
        try:
            check(text)  # the form only: the cap is resolved against the host when pinning starts
        except ConfigError:
            raise ValueError(text) from None
    return text.strip()


def _prompt_count(text):
    value = int(text.strip())
    if value < 0:
        raise ValueError(text)
    return value


def _non_negative_seconds(text):
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


MIN_TOKEN_CHARS = 16
GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _token(text):
    token = text.strip()
    if not token:
        return None
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or any(c.isspace() for c in token):
        raise ValueError(text)
    return token


def _group(text):
    name = text.strip()
    if not GROUP_NAME.fullmatch(name):
        raise ValueError(text)
    return name


HOST_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")


def _host_names(text):
    """Comma-separated host names or IP addresses, lowercased (no port, no wildcard); an empty text is none."""
    import ipaddress
    names = []
    for item in text.split(","):
        name = item.strip().lower().rstrip(".")
        if not name:
            continue
        try:
            name = str(ipaddress.ip_address(name.strip("[]")))
        except ValueError:
            if not HOST_NAME.fullmatch(name):
                raise ValueError(text) from None
        names.append(name)
    return tuple(names)


def _positive_count(text):
    value = int(text.strip())
    if value < 1:
        raise ValueError(text)
    return value


PACKAGE_NAME = re.compile(r"[^\x00-\x1f/\\,]{1,200}")


def _package_list(text):
    """A comma list of custom-node package (folder) names, or ``*`` for every pack."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if names == ("*",):
        return names
    if "*" in names or not all(PACKAGE_NAME.fullmatch(name) for name in names):
        raise ValueError(text)
    return names


def _positive_seconds(text):
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(text)
    return value


SETTINGS = (
    Setting("COMFY_MEMX", "active", _bool, False, "1/true/yes/on or 0/false/no/off",
            "Activate comfy_memx in any ComfyUI start command: the interpreter-startup hook (`comfy_memx.pth`) reads "
            "it and does nothing else when it is unset or false. Under the launcher comfy_memx is on anyway.",
            option=False),
    Setting("COMFY_MEMX_LEAK_MODE", "leak_mode", _choice(LEAK_MODES), "report", ", ".join(LEAK_MODES),
            "off: no leak reporting; report: name the owner of a leaked model after ComfyUI's warning; strict: also "
            "find and name the objects that hold it, and the usual fix."),
    Setting("COMFY_MEMX_EVENTS", "events", _events_file, None, "a file path in a writable folder (unset: no log)",
            "Append one JSON object per line for every load, unload, leak and free (see "
            "[Events](operations.md#events)). The path must name a regular file or nothing yet: a FIFO, socket or "
            "device is refused, and so is a link, a file of another user or one that group or others can write, a "
            "file in a folder others can write (/tmp) unless it is this user's and private, and a folder reached "
            "through another user's link (see [Security](security.md#files-comfy_memx-writes))."),
    Setting("COMFY_MEMX_DISABLE", "disable", _patch_list, (), "comma list of " + ", ".join(PATCH_NAMES),
            "Patches to skip."),
    Setting("COMFY_MEMX_LEAK_BUDGET", "leak_budget", _positive_seconds, 2.0, "seconds > 0",
            "Strict mode: the CPU time of all holder searching in one prompt (and of one search asked for by a "
            "user), with a wall-clock cap of 5x that plus 1 s."),
    Setting("COMFY_MEMX_LEAK_GRAPH", "leak_graph", _graph_folder, None, "a writable folder (unset: none)",
            "Strict mode: write a Graphviz `.dot` file per leak there, and a PNG when a `dot` binary exists, each "
            "a new 0600 file under a name with a random part (a folder reached through another user's link is "
            "refused: see [Security](security.md#files-comfy_memx-writes))."),
    Setting("COMFY_MEMX_LEAK_FAIL", "leak_fail", _bool, False, "1/true/yes/on or 0/false/no/off",
            "Launcher: exit with status 3 at shutdown if a rooted leak was found and ComfyUI itself exited cleanly "
            "(its own non-zero status is kept). For custom-node authors' CI."),
    Setting("COMFY_MEMX_IDLE_UNLOAD", "idle_unload", _non_negative_seconds, 0.0, "seconds >= 0 (0: off)",
            "Once ComfyUI's queue has been empty this long, ask its worker to unload the models, as `/memx/free` "
            "does (see [Handing the GPU over](memory.md#handing-the-gpu-over))."),
    Setting("COMFY_MEMX_HANDOFF", "handoff", _choice(HANDOFF_SCOPES), "off", ", ".join(HANDOFF_SCOPES),
            "host: instances on this host find each other, and a load short of device memory asks idle peers on the "
            "same device to unload first."),
    Setting("COMFY_MEMX_HANDOFF_WAIT", "handoff_wait", _positive_seconds, 15.0, "seconds > 0",
            "How long a load waits in all for peers to unload (`COMFY_MEMX_HANDOFF=host`)."),
    Setting("COMFY_MEMX_TRIM", "trim", _bool, True, "1/true/yes/on or 0/false/no/off",
            "`/memx/free`: return the C allocator's free pages to the kernel (glibc `malloc_trim`) and report the "
            "bytes."),
    Setting("COMFY_MEMX_THRASH_PROMPTS", "thrash_prompts", _prompt_count, 3, "a whole number >= 0 (0: off)",
            "Warn once per prompt about a model reloaded in each of the last N prompts."),
    Setting("COMFY_MEMX_PIN_LIMIT", "pin_limit", _pin_limit, "auto", PIN_LIMIT_FORMS,
            "Cap on pinned host memory. auto: 40 % of RAM on Windows, else max(40 % RAM, min(90 % RAM, RAM - 4 GiB, "
            "RAM + disk swap - 16 GiB)), RAM clamped to the cgroup limit, zram not counted. A limit above RAM is "
            "clamped with a warning."),
    Setting("COMFY_MEMX_PIN_SCOPE", "pin_scope", _choice(PIN_SCOPES), "process", ", ".join(PIN_SCOPES),
            "process: the cap is per ComfyUI process; host: all ComfyUI processes of this user on the host share one "
            "pin cap through a lock-protected registry file in this user's private folder (see "
            "[Security](security.md)); when it cannot be used safely, each process keeps its own cap."),
    Setting("COMFY_MEMX_TOKEN", "token", _token, None,
            f"a string of at least {MIN_TOKEN_CHARS} printable characters without blanks (unset: none)",
            "Environment only: a command line is visible to every user. Callers that are not on loopback may use the "
            "guarded routes (holder searches, releases, `/memx/free`'s searches, `/memx/handoff/request`) when they "
            "send it as `Authorization: Bearer <token>` or `X-Memx-Token: <token>` (see [Security](security.md)). Shown as "
            "`<set>` by doctor.",
            option=False),
    Setting("COMFY_MEMX_ALLOWED_HOSTS", "allowed_hosts", _host_names, (),
            "comma list of host names or IP addresses, without ports (unset: none)",
            "Names (besides `localhost`, `*.localhost`, loopback addresses and the address the connection came in "
            "on) that a loopback caller's `Host` may carry for the guarded routes without the token: the "
            "DNS-rebinding defence (see [Security](security.md)). Set it when a browser on this host opens ComfyUI "
            "under another name (`gpu-box.lan`)."),
    Setting("COMFY_MEMX_SEARCH_CPU", "search_cpu", _positive_seconds, 2.0, "seconds > 0",
            "CPU seconds per minute that the holder searches no prompt pays for may use in all (asked for over HTTP, "
            "a free's, a release's, and the checks after a free or an unload outside prompts); beyond it they "
            "answer 429 with `Retry-After` or wait for a later point."),
    Setting("COMFY_MEMX_EVENT_RATE", "event_rate", _positive_count, 20, "a whole number >= 1",
            "Events per second that HTTP requests may write (`free`, `handoff` giver); the rest are dropped and "
            "counted (`events_dropped`)."),
    Setting("COMFY_MEMX_HANDOFF_GROUP", "handoff_group", _group, "default",
            "1-64 letters, digits, '_', '.', '-'",
            "`COMFY_MEMX_HANDOFF=host`: only this user's instances with the same group name hand the GPU to each "
            "other."),
    Setting("COMFY_MEMX_RELEASE", "release", _choice(RELEASE_POLICIES), "off", ", ".join(RELEASE_POLICIES),
            "Give a leaked model's memory back by cutting the one entry of a pack's cache that holds it (see [Giving "
            "memory back without a restart](leaks.md#giving-memory-back-without-a-restart)). off: never; ask: when "
            "asked (`POST /memx/models/{id}/release`, `free --release`, the panel's Release button); auto: also "
            "each leak of a package of `COMFY_MEMX_RELEASE_PACKAGES` once found (ComfyUI's warning, or a free or an "
            "unload for the leaks it never warns about). Releases run on ComfyUI's prompt worker between prompts. "
            "The pack rebuilds the entry the next time it needs it."),
    Setting("COMFY_MEMX_RELEASE_PACKAGES", "release_packages", _package_list, (),
            "comma list of custom-node folder names, or * for every pack",
            "`COMFY_MEMX_RELEASE=auto`: the packs whose caches may be cut automatically (auto with none is refused "
            "at start-up)."),
    Setting("COMFY_MEMX_RAISE_INTERNAL", "raise_internal", _bool, False, "1/true/yes/on or 0/false/no/off",
            "Re-raise comfy_memx's own internal errors instead of logging them once (tests, development).",
            option=False),
)

SECRET_FIELDS = ("token",)


def _shown(setting, value):
    """A setting's value as ``as_dict`` shows it (doctor, ``comfy_memx.status()``): secrets only as set or not."""
    if setting.field in SECRET_FIELDS and value is not None:
        return "<set>"
    return value


Config = dataclasses.make_dataclass(
    "Config", [(s.field, object, dataclasses.field(default=s.default)) for s in SETTINGS] + [
        ("warnings", tuple, dataclasses.field(default=()))],
    frozen=True, namespace={
        "__doc__": "The parsed, immutable comfy_memx settings; ``warnings`` holds typo-guard messages.",
        "as_dict": lambda self: {s.field: _shown(s, getattr(self, s.field)) for s in SETTINGS},
    })


def parse(environ=None, launcher=False):
    """Parse ``COMFY_MEMX*`` variables from ``environ`` (default ``os.environ``) into a :class:`Config`.

    Raises :class:`ConfigError` on the first bad value, naming the variable and the accepted values (and, when
    ``launcher``, the launcher option that sets it); the typo-guard warnings go with it (an unknown name next to a
    bad value is often the same mistake).
    """
    environ = os.environ if environ is None else environ
    known = {s.env for s in SETTINGS}
    unknown = sorted(k for k in environ if k.startswith(PREFIX + "_") and k not in known)
    warnings = tuple(f"unknown setting {name} ignored (known: {', '.join(sorted(known))})" for name in unknown)
    values = {"warnings": warnings}
    for setting in SETTINGS:
        raw = environ.get(setting.env)
        if raw is None:
            continue
        try:
            values[setting.field] = setting.parse(raw)
        except Unusable as exc:
            raise ConfigError(setting.rejected(raw, f"cannot be used: {exc}", launcher), warnings,
                              setting=setting.env, accepted=setting.accepted) from None
        except (ValueError, TypeError):
            raise ConfigError(setting.rejected(raw, f"is not valid; accepted: {setting.accepted}", launcher),
                              warnings, setting=setting.env, accepted=setting.accepted) from None
    if values.get("release") == "auto" and not values.get("release_packages"):
        options = "; launcher options --release auto --release-packages NAMES" if launcher else ""
        raise ConfigError("COMFY_MEMX_RELEASE=auto needs COMFY_MEMX_RELEASE_PACKAGES: the custom-node packages whose "
                          f"caches may be cut automatically (comma list of folder names, or * for every pack{options})",
                          warnings, setting="COMFY_MEMX_RELEASE_PACKAGES",
                          accepted=next(s.accepted for s in SETTINGS if s.env == "COMFY_MEMX_RELEASE_PACKAGES"),
                          fix="set COMFY_MEMX_RELEASE_PACKAGES to the packs whose caches auto may cut (or *), or set "
                              "COMFY_MEMX_RELEASE to ask or off, then restart ComfyUI")
    return Config(**values)


DEFAULT = Config()
