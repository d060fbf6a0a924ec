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
        cfg = config.parse(environ)
    except ConfigError as exc:
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
        return bootstrap(source)
    except MemxError as exc:
        log.error("comfy_memx: %s; comfy_memx is NOT active, ComfyUI runs unpatched", exc)
    except Exception as exc:  # never break the interpreter start-up of somebody's server
        log.error("comfy_memx: start-up failed (%r); comfy_memx is NOT active, ComfyUI runs unpatched", exc)
    return None
