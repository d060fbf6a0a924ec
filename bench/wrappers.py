"""Added cost of each comfy_memx wrapper on the pass-through path, in microseconds per call.

Each model_management site's wrapper factory is applied to a no-op function of the same shape on an empty
ComfyUI-shaped namespace (no loaded models, so no bookkeeping fires), and compared with calling the no-op
directly: what every call pays for being wrapped.  The bookkeeping itself (owner, bytes, refcounts) runs only on
loads that move bytes and on unloads, and is measured by the cycle ratio of ``bench/overhead.py``.

Each round times ``number`` direct calls, ``number`` calls through the wrapper, and ``number`` direct calls again
(order rotated every round).  The added cost is the median over rounds of (wrapped - direct) per call; the second
direct timing gives the resolution of that difference (bench/common.py :func:`common.difference_record`): a cost
not above it is reported as ``< upper bound``, never as a negative number.  Target: <= 0.6 us per call.
The wings' subscriptions are loaded first, as the bootstrap does, so each wrapper pays for its signals' subscribers
(those of a server that started, without pinning or hand-off: no pin session, no hand-off registration).

``patcher_added_us`` is what the ``model_patcher`` wrapper adds to a ModelPatcher built around a model the ledger
knows (a clone), see :func:`patcher_records`.

``dispatch_added_us`` is what one signal costs over the guarded direct call it replaces (``try: f(x) except
Exception: internal_error``), for one subscriber and one argument; ``facade_added_us`` what a call through a guarded
facade (``comfy_memx.core.guard``, as the per-layer pin path calls the pin budget) costs over the same guarded direct
call: both at most 0.1 us per call.
"""

import os
import sys
import timeit
import types

from bench import common

TARGET_US = 0.6


class _Entry:
    def __init__(self):
        self.model = None
        self.real_model = None


def _noop(*args, **kwargs):
    return None


def _method_noop(self, *args, **kwargs):
    return None


def _guarded_direct(fn):
    from comfy_memx.core.errors import internal_error

    def call(value):
        try:
            fn(value)
        except Exception as exc:
            internal_error("bench", exc)
    return call


def dispatch_records(number, rounds):
    """Records ``{"case": "overhead", "metric": "dispatch_added_us"}`` (one ``Signal.fire`` with one subscriber) and
    ``"facade_added_us"`` (one call through a guarded facade), each over the guarded direct call of the same
    function."""
    from comfy_memx.core.signals import Signal
    signal = Signal("bench", "one no-op subscriber")
    signal.subscribe(_noop)
    guarded = _guarded_direct(_noop)
    direct = timeit.Timer(lambda: guarded(1))
    fired = timeit.Timer(lambda: signal.fire(1))
    facade = _facade()
    through = timeit.Timer(lambda: facade.noop(1))
    times = common.interleaved({"direct": lambda: direct.timeit(number), "fired": lambda: fired.timeit(number),
                                "facade": lambda: through.timeit(number),
                                "direct_again": lambda: direct.timeit(number)}, rounds)
    return [common.difference_record("overhead", "dispatch_added_us", times["fired"], times["direct"],
                                     times["direct_again"], per=number, site="one subscriber", target_max=0.1),
            common.difference_record("overhead", "facade_added_us", times["facade"], times["direct"],
                                     times["direct_again"], per=number, site="one guarded call", target_max=0.1)]


def _facade():
    """A guarded facade of one no-op (left out of the facades the fault suite enumerates)."""
    from comfy_memx.core import guard
    facade = guard.Facade("bench", {"noop": (_one, None)})
    guard.FACADES.remove(facade)
    return facade


def _one(value):
    return None


CLONE_TARGET_US = 2.0
"""Per clone: ComfyUI's own ``ModelPatcher.__init__`` builds a dozen dicts and two uuid4s (tens of microseconds a
clone), so a microsecond or two of bookkeeping is a few percent of it."""


class _Module:
    """Stands in for a torch module (weakly referenceable)."""


def _bare_patcher_init(self, model, *args, **kwargs):
    self.model = model


def patcher_records(number, rounds):
    """Records ``{"case": "overhead", "metric": "patcher_added_us"}``: what the ``model_patcher`` wrapper adds to
    building a ModelPatcher around a module the ledger already knows (a clone: every sampler, LoRA and patch node
    clones its model), over the bare constructor.  Each call builds and drops a new patcher, so the weak reference
    the ledger adds and its callback when the patcher dies are counted too.  The first sight of a module (a new
    model: its owner and its size) happens once per model built, and is left out."""
    from comfy_memx.core.wrapping import Switch
    from comfy_memx.patches import model_patcher as patch
    factory = patch.PATCH.sites["ModelPatcher.__init__"]
    bare = type("BarePatcher", (), {"__init__": _bare_patcher_init})
    wrapped = type("WrappedPatcher", (), {"__init__": factory(None, _bare_patcher_init, Switch())})
    module = _Module()
    first = wrapped(module)   # the module's creation; every later patcher is a clone's
    direct = timeit.Timer(lambda: bare(module))
    through = timeit.Timer(lambda: wrapped(module))
    times = common.interleaved({"direct": lambda: direct.timeit(number), "wrapped": lambda: through.timeit(number),
                                "direct_again": lambda: direct.timeit(number)}, rounds)
    del first
    return [common.difference_record("overhead", "patcher_added_us", times["wrapped"], times["direct"],
                                     times["direct_again"], per=number, site="ModelPatcher.__init__ (clone)",
                                     target_max=CLONE_TARGET_US)]


def run(quick=False):
    """Records ``{"case": "overhead", "metric": "wrapper_added_us", "site": ...}`` for each wrapped site, and the
    dispatch and facade records."""
    from comfy_memx.core import registry
    from comfy_memx.core.state import STATE
    from comfy_memx.core.wrapping import Switch
    from comfy_memx.patches import model_management as patch
    registry.load_subscriptions()
    mm = types.SimpleNamespace(current_loaded_models=[])
    STATE.reset()
    registry.announce()   # as a server that started: the first load's startup line is behind it
    number = 20000 if quick else 200000
    rounds = 5 if quick else 9
    records = []
    entry = _Entry()
    for site, factory in patch.PATCH.sites.items():
        is_method = site.startswith("LoadedModel.")
        bare = _method_noop if is_method else _noop
        wrapped = factory(mm, bare, Switch())
        # LoadedModel.model_load: a patcher-less entry takes the pass-through part and skips the bookkeeping
        args = (entry,) if is_method else (1,)
        direct = timeit.Timer(lambda: bare(*args))
        through = timeit.Timer(lambda: wrapped(*args))
        times = common.interleaved({"direct": lambda: direct.timeit(number),
                                    "wrapped": lambda: through.timeit(number),
                                    "direct_again": lambda: direct.timeit(number)}, rounds)
        records.append(common.difference_record(
            "overhead", "wrapper_added_us", times["wrapped"], times["direct"], times["direct_again"], per=number,
            site=site, target_max=TARGET_US))
    return records + patcher_records(number, rounds) + dispatch_records(number, rounds)


if __name__ == "__main__":
    import json
    for record in run(quick="--quick" in sys.argv):
        print(json.dumps(record))
