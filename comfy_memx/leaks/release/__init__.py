"""Give a leaked model's memory back without a restart: cut the one cache entry of a pack that keeps it alive.

Opt-in (``COMFY_MEMX_RELEASE=ask|auto``, default off).  Only the shapes comfy_memx classifies as a pack's cache are
cut (a dict entry of a class attribute or module global, an item of a list or deque the pack appends to, a
``functools.lru_cache`` entry), after walking the chain again and checking every object on it; the pack rebuilds
the entry the next time it needs it.  :mod:`.plan` decides what may be cut, :mod:`.walk` walks and cuts,
:mod:`.engine` runs one release and writes its receipt.
"""

from comfy_memx.leaks.release.engine import book, in_use, release, release_automatically  # noqa: F401
from comfy_memx.leaks.release.plan import releasable_now  # noqa: F401
