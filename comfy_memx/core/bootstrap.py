"""The one bootstrap that every entry point runs: subscribe the wings, parse the config, arm the post-import hooks,
remember the source.

Order: every wing's ``subscriptions`` module is imported (``core.discovery`` finds them; each subscribes its
handlers to ``core.signals``), then the patch modules, then the settings are parsed; patches are applied only by the
post-import hooks armed last, so no ComfyUI event fires before every subscriber is in place.

  +--------------------------------------------------------------------------------------------+
  | Keep imports here minimal. NEVER import torch or any comfy.* module from this file (or from |
  | anything it imports): ComfyUI parses its command line at the first import of comfy.cli_args |
  | and sets CUDA/allocator variables before torch loads. Patches are applied by post-import    |
  | hooks right after ComfyUI imported their targets.                                           |
  +--------------------------------------------------------------------------------------------+
"""

import logging

from . import config, late, registry
from .discovery import require_patches
from .errors import ConfigError, MemxError
from .state import STATE

log = logging.getLogger("comfy_memx")
_REPORTED = set()   # the failures already logged in this process: COMFY_MEMX=1 and the node pack both try once
_FAILED = []        # the error of the last failed activation (the node pack's inactive /memx/status shows it)


def bootstrap(source, environ=None):
    """Activate comfy_memx once per process; returns the active Config.

    ``source`` says how it was activated (``launcher``, ``env``, ``auto``, ``api``, ``demo``, ``node pack``) and
    shows in the startup line; a second call (the node pack under the launcher, say) changes nothing.  Raises :class:`~comfy_memx.core.errors.ConfigError` on a bad setting and
    :class:`~comfy_memx.core.errors.SetupError` on an incomplete installation, before anything is patched.
    Warnings about the settings (an unknown ``COMFY_MEMX_*`` name) are logged at once, not when ComfyUI has set up
    its logging: until then Python prints them on stderr.
    """
    if STATE.source is not None:
        return STATE.config
    require_patches(config.PATCH_NAMES)
    registry.load_patches()  # the wings subscribe to the signals and register their settings before the parse
    try:
        cfg = config.parse(environ, launcher=source == "launcher")
    except ConfigError as exc:
        if str(exc) not in _REPORTED:
            for warning in exc.warnings:
                log.warning("comfy_memx: %s", warning)
        raise
    for warning in cfg.warnings:
        log.warning("comfy_memx: %s", warning)
    STATE.configure(cfg, source)
    late.note_if_late({registry.patch_of(name).target for name in config.PATCH_NAMES})
    registry.arm(cfg)
    return cfg


def bootstrap_quietly(source):
    """Bootstrap for the env-flag and ``comfy_memx.auto`` paths: never raises into ComfyUI's start-up.

    A bad setting or an incomplete installation is logged as one error and comfy_memx stays inactive, so ComfyUI
    runs unpatched rather than half-patched.
    """
    try:
        config = bootstrap(source)
        _FAILED.clear()
        return config
    except MemxError as exc:
        _FAILED[:] = [exc]
        _report_once(str(exc), "comfy_memx: %s; comfy_memx is NOT active, ComfyUI runs unpatched")
    except Exception as exc:  # never break the interpreter start-up of somebody's server
        _FAILED[:] = [exc]
        _report_once(repr(exc), "comfy_memx: start-up failed (%s); comfy_memx is NOT active, ComfyUI runs unpatched")
    return None


def last_failure():
    """The error that kept the last :func:`bootstrap_quietly` from activating comfy_memx in this process (a
    ``ConfigError``, a ``SetupError`` or an unexpected exception), or None."""
    return _FAILED[-1] if _FAILED else None


def _report_once(text, template):
    """Log a failed activation once per process: a second entry point (the node pack after ``COMFY_MEMX=1``) that
    fails the same way says so only at debug level."""
    if text in _REPORTED:
        log.debug("comfy_memx: still NOT active (%s, logged above)", text)
        return
    _REPORTED.add(text)
    log.error(template, text)
