"""ComfyUI 0.27.0's part of ``main.py``: the ``[LEVEL]`` log prefix with ANSI colours, the RAM-pressure cache by
default, the sensitive part of a queue item (``item[5]``) passed to the executor and dropped from the history.

Runs at the start of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

import logging

_LEVEL_COLORS = {"DEBUG": "\033[36m", "INFO": "\033[32m", "WARNING": "\033[33m", "ERROR": "\033[31m", "CRITICAL": "\033[35m"}
STARTUP_MODULES = ("comfy.memory_management", "comfy.model_patcher")
TASK_DONE_OPTIONS = {"process_item": lambda queued: queued[:5] + queued[6:]}


class ColoredFormatter(logging.Formatter):
    """``[LEVEL] message`` with the ANSI-coloured tag 0.27.0 prints even when output is redirected."""

    def format(self, record):
        bold = "\033[1m" if record.levelno >= logging.WARNING else ""
        return f"{bold}{_LEVEL_COLORS.get(record.levelname, '')}[{record.levelname}]\033[0m " + super().format(record)


LOG_FORMATTER = ColoredFormatter


def prompt_extra_data(item):
    """The queue item's extra_data merged with its sensitive part (item[5]), as 0.27.0's worker passes them."""
    return {**item[3], **(item[5] if len(item) > 5 else {})}


def make_executor(server_instance):
    """0.27.0's caches: RAM-pressure by default (``--cache-ram``), classic, LRU or none."""
    cache_type = execution.CacheType.RAM_PRESSURE
    cache_ram = cache_ram_inactive = 0
    if args.cache_classic:
        cache_type = execution.CacheType.CLASSIC
    elif args.cache_lru > 0:
        cache_type = execution.CacheType.LRU
    elif args.cache_none:
        cache_type = execution.CacheType.NONE
    else:
        total_gb = comfy.model_management.total_ram / 1024.0
        cache_ram = args.cache_ram[0] if args.cache_ram else min(10.0, max(2.0, total_gb * 0.10))
        cache_ram_inactive = args.cache_ram[1] if len(args.cache_ram) > 1 else min(96.0, total_gb)
    return execution.PromptExecutor(server_instance, cache_type=cache_type,
                                    cache_args={"lru": args.cache_lru, "ram": cache_ram, "ram_inactive": cache_ram_inactive})

