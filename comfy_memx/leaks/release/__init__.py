"""Give a leaked model's memory back without a restart: cut the one cache entry of a pack that keeps it alive.

Opt-in (``COMFY_MEMX_RELEASE=ask|auto``, default off).  Only an entry of a container that a custom-node package keeps
as a module global or class attribute is cut, reached through containers only (dicts of any kind, lists and deques,
weak dictionaries, ``cachetools`` caches, a pack's mapping class, ``functools.lru_cache``), after walking the chain
again and checking every object on it; the entry goes whole, with ComfyUI's objects in it, and the pack rebuilds it
the next time it needs it.  :mod:`.plan` decides what may be cut, :mod:`.walk` walks and cuts, :mod:`.entries` picks
the entry, :mod:`.reach` walks what an entry holds and what ComfyUI still reaches, :mod:`.engine` runs one release and
writes its receipt.
"""

from comfy_memx.leaks.release.engine import book, in_use, release, release_automatically  # noqa: F401
from comfy_memx.leaks.release.plan import releasable_now  # noqa: F401
