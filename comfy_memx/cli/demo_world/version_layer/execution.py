"""ComfyUI 0.27.0's part of ``execution.py``: caches CLASSIC/LRU/NONE/RAM_PRESSURE,
``PromptExecutor(server, cache_type=False, cache_args=None)``, ``is_oom`` (after which the memory summary is
logged) and the RAM-pressure step after each node.

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

import contextlib

import psutil

import comfy.memory_management


class CacheType(Enum):
    CLASSIC = 0
    LRU = 1
    NONE = 2
    RAM_PRESSURE = 3


UNCACHED = CacheType.NONE   # outputs dropped after every prompt


class OutputCache(_SharedOutputCache):
    """Node outputs keyed by input signature (class and inputs, links resolved recursively).

    CLASSIC drops what the current prompt does not use, LRU keeps the ``lru_size`` most recent, NONE keeps
    nothing across prompts, RAM_PRESSURE keeps everything until ``ram_release`` finds RAM short.
    """

    def ram_release(self, target, free_active=False):
        """Drop entries the current prompt does not use (all with ``free_active``) while available RAM < target."""
        if psutil.virtual_memory().available >= target:
            return 0
        used = set(self.signatures.values())
        dropped = [k for k in self.entries if free_active or k not in used]
        for k in dropped:
            del self.entries[k]
        return len(dropped)


class CacheSet(_SharedCacheSet):
    """The executor's caches; ``cache_args["lru"]`` is the LRU size."""

    def __init__(self, cache_type=None, cache_args={}):
        self._setup(cache_type, (cache_args or {}).get("lru", 0))


class PromptExecutor(_SharedPromptExecutor):
    """Runs prompts, keeping node outputs cached between them."""

    def __init__(self, server, cache_type=False, cache_args=None):
        self.cache_args = cache_args
        self._start(server, cache_type)

    @contextlib.contextmanager
    def _ram_pressure(self):
        """While a prompt runs: the RAM-pressure release state, and the step to run after every node."""
        cache_args = self.cache_args or {}
        ram_headroom = int(cache_args.get("ram", 0) * (1024 ** 3))
        ram_inactive_headroom = int(cache_args.get("ram_inactive", 0) * (1024 ** 3))
        ram_release_callback = self.caches.outputs.ram_release if self.cache_type == CacheType.RAM_PRESSURE else None
        comfy.memory_management.set_ram_cache_release_state(ram_release_callback, ram_headroom)

        def after_node():
            if ram_release_callback is not None:
                ram_release_callback(ram_inactive_headroom)
                ram_shortfall = ram_headroom - psutil.virtual_memory().available
                freed = comfy.model_management.free_pins(ram_shortfall + 512 * (1024 ** 2))
                if freed < ram_shortfall:
                    ram_release_callback(ram_headroom, free_active=True)

        try:
            yield after_node
        finally:
            comfy.memory_management.set_ram_cache_release_state(None, 0)

    def _new_caches(self):
        return CacheSet(cache_type=self.cache_type, cache_args=self.cache_args)


def oom_detected(ex):
    """Whether ``ex`` is an out-of-memory error; 0.27.0 logs the memory summary first."""
    if not comfy.model_management.is_oom(ex):
        return False
    logging.info("Memory summary:\n{}".format(comfy.model_management.debug_memory_summary()))
    return True
