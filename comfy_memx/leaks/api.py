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

For anyone who must tell a pack's holder from ComfyUI's or a library's: :func:`is_custom_node_package` (a
custom-node package loaded in this process; cheap, kept until ``sys.modules`` changes).

For the surface (what it shows and does about a leak): :func:`public_state` (a leak's state as JSON builtins),
:func:`search_now` (a strict holder search of one model now), :func:`gated_search`, :func:`gated_first_paths`,
:func:`search_gate` and :class:`Busy` (the searches no prompt pays for: one at a time, within ``COMFY_MEMX_SEARCH_CPU``),
:func:`in_comfyui_use` (why ComfyUI uses a model now), :func:`releasable_now` (what a release would cut) and
:func:`release` (cut the cache entry that keeps a leaked model alive), run through the release desk
(:func:`submit_release`, :func:`withdraw_release`, :func:`run_release_if_idle`, :func:`worker_seen`,
:func:`nudge_worker`, :func:`releasing_here`: on ComfyUI's prompt worker between prompts), :func:`recent_releases`
(the receipts of the last releases tried, for the panel's Released list); after a free's own collection,
:func:`check_unloaded` and :func:`record_searched` (a survivor its receipt searched, recorded as a leak when held).

For its subscriptions (ComfyUI's prompt worker): :func:`releases_due` (the worker's point between prompts: run the
queued releases), :func:`prompt_started` and :func:`prompt_ended` (without a worker, a prompt's end is that point).
"""

from comfy_memx.leaks import watch
from comfy_memx.leaks.release import book
from comfy_memx.leaks.release.engine import KEPT as RELEASES_KEPT  # noqa: F401
from comfy_memx.leaks.holders.packages import is_custom_node_package  # noqa: F401
from comfy_memx.leaks.gate import QUEUE_S, Busy, gate as search_gate  # noqa: F401
from comfy_memx.leaks.release import releasable_now, release, release_automatically  # noqa: F401
from comfy_memx.leaks.release.desk import nudge as nudge_worker, prompt_ended, prompt_started  # noqa: F401
from comfy_memx.leaks.release.desk import releasing_here, run_due as releases_due, worker_seen  # noqa: F401
from comfy_memx.leaks.release.desk import run_if_idle as run_release_if_idle  # noqa: F401
from comfy_memx.leaks.release.desk import submit as submit_release, withdraw as withdraw_release  # noqa: F401
from comfy_memx.leaks.release.engine import in_comfyui_use  # noqa: F401
from comfy_memx.leaks.unwarned import check as check_unloaded, loaded_again, note_unloaded  # noqa: F401
from comfy_memx.leaks.unwarned import record_searched  # noqa: F401
from comfy_memx.leaks.watch import before_collect, public_state, suspects  # noqa: F401


def gated_search(record, ignore=(), wait_s=QUEUE_S):
    """A holder search of ``record``'s model through the search gate (``leaks.watch.gated_search``: one at a time,
    within ``COMFY_MEMX_SEARCH_CPU``, at most ``wait_s`` seconds of waiting); raises :class:`Busy`."""
    return watch.gated_search(record, ignore=ignore, wait_s=wait_s)


def gated_first_paths(records, ignore=(), wait_s=QUEUE_S):
    """The shortest holder of each of ``records``' models by the forward probe, as one search through the search
    gate (``leaks.watch.gated_first_paths``): ``{model_id: answer}`` for those it reached; raises :class:`Busy`."""
    return watch.gated_first_paths(records, ignore=ignore, wait_s=wait_s)


def search_now(record, ignore=(), budget_s=None):
    """Search the holders of ``record``'s model now (``leaks.watch.search_now``: strict, within ``budget_s`` CPU
    seconds, ``ignore`` left out of the search); looked up at each call, so a test may stand in for it there."""
    return watch.search_now(record, ignore=ignore, budget_s=budget_s)


def after_collect(found):
    """Report the suspects that survived ComfyUI's collection (the ``auto`` release of the ones an opted-in package
    holds is :func:`release_automatically`, a subscription of its own)."""
    watch.after_collect(found)


COPY_TRIES = 5


def recent_releases():
    """The receipts of the last releases tried in this process (oldest first, at most :data:`RELEASES_KEPT`):
    copies of plain dicts of names and numbers, safe to serialize while another release is being written."""
    receipts = book().receipts
    for _ in range(COPY_TRIES):
        try:
            return [dict(receipt) for receipt in receipts]
        except RuntimeError:   # appended to while copied (a release on the work executor)
            continue
    return []
