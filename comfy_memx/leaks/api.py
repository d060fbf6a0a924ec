"""The leak wing's one door: what its subscriptions (``leaks.subscriptions``) and the other wings call of it, so that
its modules can move without touching a caller.

For its subscriptions (``cleanup_models_gc``): :func:`suspects` (the loaded
entries whose patcher is gone while the module lives, before ComfyUI's collection), :func:`before_collect` and
:func:`after_collect` (the report of the ones that survive it) and :func:`release_automatically` (the ``auto``
release).

For its subscriptions (a full unload, then a collection point): :func:`note_unloaded` (the model left ComfyUI's
loaded list: watch it by weakref), :func:`loaded_again` (ComfyUI loads it again: a leak found after its unload is
over) and :func:`check_unloaded` (record the unloaded models that survived a full
collection and are held: leaks ComfyUI never warns about, ``leaks.unwarned``).

For the surface (what it shows and does about a leak): :func:`public_state` (a leak's state as JSON builtins),
:func:`search_now` (a strict holder search of one model now), :func:`releasable_now` (what a release would cut) and
:func:`release` (cut the cache entry that keeps a leaked model alive); after a free's own collection,
:func:`check_unloaded` and :func:`record_searched` (a survivor its receipt searched, recorded as a leak when held).
"""

from comfy_memx.leaks import watch
from comfy_memx.leaks.release import releasable_now, release, release_automatically  # noqa: F401
from comfy_memx.leaks.unwarned import check as check_unloaded, loaded_again, note_unloaded  # noqa: F401
from comfy_memx.leaks.unwarned import record_searched  # noqa: F401
from comfy_memx.leaks.watch import before_collect, public_state, suspects  # noqa: F401


def search_now(record, ignore=(), budget_s=None):
    """Search the holders of ``record``'s model now (``leaks.watch.search_now``: strict, within ``budget_s`` CPU
    seconds, ``ignore`` left out of the search); looked up at each call, so a test may stand in for it there."""
    return watch.search_now(record, ignore=ignore, budget_s=budget_s)


def after_collect(found):
    """Report the suspects that survived ComfyUI's collection (the ``auto`` release of the ones an opted-in package
    holds is :func:`release_automatically`, a subscription of its own)."""
    watch.after_collect(found)
