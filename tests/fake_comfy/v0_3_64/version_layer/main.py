"""ComfyUI 0.3.64's part of ``main.py``: bare log messages (no level prefix), the classic cache by default
(``--cache-lru``, ``--cache-none``: dependency-aware), a queue item's extra data passed to the executor as it is.

Runs at the start of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

import logging

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

