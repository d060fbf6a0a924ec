"""Runnable stand-in for ComfyUI 0.3.64 ``main.py`` (same start-up order, serving ``server.PromptServer``).

Order as in the real file: enable argv parsing, import folder_paths (whose ``from comfy.cli_args import args``
parses argv), set up logging (bare messages, no level prefix), run custom-node prestartup
scripts (before torch), warn if torch is already imported, import comfy.utils (torch), execution
(→ comfy.model_management), server, nodes; under ``__main__`` log the versions, load custom nodes between
hook_breaker save/restore, ``add_routes()``, start ``prompt_worker``, exit 0 with ``--quick-test-for-ci``, else
serve on ``--listen``/``--port`` until interrupted.
Run: ``python tests/fake_comfy/v0_3_64/main.py --cpu --quick-test-for-ci``.
"""
import logging

from comfy_memx.cli.demo_world.standin import extend

LOG_FORMATTER = logging.Formatter     # bare messages, no level prefix
STARTUP_MODULES = ()
TASK_DONE_OPTIONS = {}


def prompt_extra_data(item):
    """The queue item's extra_data, as the executor gets it."""
    return item[3]


def make_executor(server_instance):
    """0.3.64's caches: classic, LRU (``--cache-lru``) or dependency-aware (``--cache-none``)."""
    cache_type = execution.CacheType.CLASSIC
    if args.cache_lru > 0:
        cache_type = execution.CacheType.LRU
    elif args.cache_none:
        cache_type = execution.CacheType.DEPENDENCY_AWARE
    return execution.PromptExecutor(server_instance, cache_type=cache_type, cache_size=args.cache_lru)


extend(globals(), "shared/main")
