"""Read answers shared between requests: built once per change on the reads executor, sent from the event loop.

Under load the cost of ``GET /memx/models`` is not building the rows but the trip to an executor thread, which
has to win the GIL from whatever else runs (a sampler on the CPU, a search) and then hand the bytes back.  So
:class:`SharedAnswer` keeps the last serialized answer together with a *fingerprint* of what it was built from
(cheap attribute reads, taken on the event loop), and answers from the loop while the fingerprint is unchanged
and the answer is younger than ``max_age_s`` (the backstop for changes the fingerprint cannot see, such as a pack
moving weights by hand).  A changed fingerprint builds once: requests that arrive while that build runs wait for
it instead of starting their own (single flight), so a burst of readers costs one build.
"""

import asyncio
import json
import sys
import time

from comfy_memx.core.state import STATE
from comfy_memx.pins import api as pins
from comfy_memx.routekit.replies import clip
from comfy_memx.surface import readmodel

MAX_AGE_S = 1.0


class SharedAnswer:
    """One read answer (bytes) shared by every request made while what it shows is unchanged."""

    def __init__(self, build, fingerprint, max_age_s=MAX_AGE_S, clock=time.monotonic):
        self._build = build
        self._fingerprint = fingerprint
        self._max_age_s = max_age_s
        self._clock = clock
        self._answer = None   # (fingerprint, built at, bytes)
        self._pending = {}    # fingerprint -> asyncio future of the build started for it

    async def get(self, executor):
        """The answer for the state as it is now: the kept one when still current, else a build on ``executor``
        (joined when one for the same fingerprint is already running)."""
        key = self._fingerprint()
        kept = self._answer
        if kept is not None and kept[0] == key and self._clock() - kept[1] < self._max_age_s:
            return kept[2]
        pending = self._pending.get(key)
        if pending is None:
            started = self._clock()
            pending = asyncio.get_running_loop().run_in_executor(executor, self._build)
            self._pending[key] = pending
            pending.add_done_callback(lambda done: self._keep(key, started, done))
        return await asyncio.shield(pending)

    def _keep(self, key, started, done):
        if self._pending.get(key) is done:
            del self._pending[key]
        if not done.cancelled() and done.exception() is None:
            kept = self._answer
            if kept is None or kept[1] <= started:
                self._answer = (key, started, done.result())


class ModelsAnswer(SharedAnswer):
    """``GET /memx/models``' body (a part of the process state: ``models_answer()``)."""

    def __init__(self):
        super().__init__(models_body, models_fingerprint)


def models_answer():
    """This process's shared ``/memx/models`` answer."""
    return STATE.part(ModelsAnswer)


def models_body():
    """The ``/memx/models`` JSON body: every live model's row, clipped (see ``readmodel``)."""
    return json.dumps(clip(readmodel.model_rows())).encode("utf-8")


def models_fingerprint():
    """What ``/memx/models`` rows are built from, as a tuple that changes whenever a row would: every record's
    load and unload counts, resident bytes, last use and leak progress, ComfyUI's list of loaded models and the
    pinned totals.  Attribute reads only (it runs on the event loop)."""
    rows = []
    for record in STATE.ledger.records():
        leak = record.leak
        rows.append((record.model_id, record.loads, record.unload_seq, record.loaded_bytes, record.last_used,
                     record.model_bytes, record.reloads, len(record.patchers),
                     None if leak is None else (id(leak), len(leak), leak.get("stage"), leak.get("sightings"),
                                                leak.get("searches"), leak.get("tries"), leak.get("last_seen"),
                                                id(leak.get("search")), id(leak.get("referrers")),
                                                id(leak.get("holder")), leak.get("release"))))
    mm = sys.modules.get("comfy.model_management")
    listed = tuple(id(entry) for entry in list(getattr(mm, "current_loaded_models", ()) or ()))
    budget = pins.budget()
    pinned = budget.totals() if budget is not None else getattr(mm, "TOTAL_PINNED_MEMORY", None)
    return tuple(rows), listed, pinned
