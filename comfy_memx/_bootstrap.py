"""The one bootstrap that every entry point runs: parse the config, arm the post-import hooks, remember the source.

  +--------------------------------------------------------------------------------------------+
  | Keep imports here minimal. NEVER import torch or any comfy.* module from this file (or from |
  | anything it imports): ComfyUI parses its command line at the first import of comfy.cli_args |
  | and sets CUDA/allocator variables before torch loads. Patches are applied by post-import    |
  | hooks right after ComfyUI imported their targets.                                           |
  +--------------------------------------------------------------------------------------------+
"""

import logging

log = logging.getLogger("comfy_memx")


def bootstrap(source, environ=None):
    """Activate comfy_memx once per process; returns the active Config.

    ``source`` says how it was activated (``launcher``, ``env``, ``auto``, ``api``) and shows in the startup line.
    Raises :class:`~comfy_memx.errors.ConfigError` on a bad setting, before anything is patched.
    """
    from . import config, errors, registry, runtime
    if runtime.source is not None:
        return runtime.config
    cfg = config.parse(environ)
    errors.RAISE_INTERNAL = errors.RAISE_INTERNAL or cfg.raise_internal
    runtime.configure(cfg, source)
    registry.arm(cfg)
    return cfg


def bootstrap_quietly(source):
    """Bootstrap for the env-flag and ``comfy_memx.auto`` paths: never raises into ComfyUI's start-up.

    A bad setting is logged as an error and comfy_memx stays inactive, so ComfyUI runs unpatched rather than
    half-patched.
    """
    from .errors import ConfigError
    try:
        return bootstrap(source)
    except ConfigError as exc:
        log.error("comfy_memx: %s; comfy_memx is NOT active, ComfyUI runs unpatched", exc)
    except Exception as exc:  # never break the interpreter start-up of somebody's server
        log.error("comfy_memx: start-up failed (%r); comfy_memx is NOT active, ComfyUI runs unpatched", exc)
    return None
