"""ComfyUI 0.3.64's part of ``execution.py``: caches CLASSIC/LRU/DEPENDENCY_AWARE,
``PromptExecutor(server, cache_type=False, cache_size=None)``, the OOM test ``isinstance(ex, OOM_EXCEPTION)``
and no RAM-pressure cache (nothing to do after a node).

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

import contextlib


class CacheType(Enum):
    CLASSIC = 0
    LRU = 1
    DEPENDENCY_AWARE = 2


UNCACHED = CacheType.DEPENDENCY_AWARE   # --cache-none: outputs dropped after every prompt


class OutputCache(_SharedOutputCache):
    """Node outputs keyed by input signature (class and inputs, links resolved recursively).

    CLASSIC drops what the current prompt does not use, LRU keeps the ``lru_size`` most recent and
    DEPENDENCY_AWARE (``--cache-none``) keeps nothing across prompts.
    """


class CacheSet(_SharedCacheSet):
    """The executor's caches; ``cache_size`` is the LRU size."""

    def __init__(self, cache_type=None, cache_size=None):
        self._setup(cache_type, cache_size or 0)


class PromptExecutor(_SharedPromptExecutor):
    """Runs prompts, keeping node outputs cached between them."""

    def __init__(self, server, cache_type=False, cache_size=None):
        self.cache_size = cache_size
        self._start(server, cache_type)

    def _ram_pressure(self):
        """0.3.64 has no RAM-pressure cache: nothing to set up, nothing to do after a node."""
        return contextlib.nullcontext(_nothing)

    def _new_caches(self):
        return CacheSet(cache_type=self.cache_type, cache_size=self.cache_size)


def _nothing():
    pass


def oom_detected(ex):
    """Whether ``ex`` is a CUDA out-of-memory error (0.3.64 checks the exception type only)."""
    return isinstance(ex, comfy.model_management.OOM_EXCEPTION)
