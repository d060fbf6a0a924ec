"""``GET /memx/models``' answer kept as bytes and answered from the event loop, as ComfyUI answers ``/queue``.

Under load the cost of ``/memx/models`` was never building the rows but the trip to an executor thread, which has
to win the GIL from whatever else runs (a sampler on the CPU, a holder search, a receipt) and then hand the bytes
back: ComfyUI's own ``GET /queue`` makes no such trip.  So :class:`ModelsSnapshot` keeps the serialized body and the
serialized bytes of each row next to the *row key* it was built from (:func:`row_key`: the counters and figures the
ledger, the leak wing and ComfyUI's loaded list change at every event that changes a row, read as plain attributes),
and a read, on the event loop:

- answers the kept body when no row key changed (a few attribute reads per model, no per-row Python work);
- otherwise rebuilds the rows whose key changed, and only those, joins the kept bytes of the others and keeps the
  result: a load, an unload, a leak record, a free or a release costs one row build, once, however many read.

A row key reads what a row shows rather than counting events, so an event nobody counted cannot leave a row stale;
what no key can see (a pack moving weights by hand: ``patcher.loaded_size()``, a patcher-less module's parameter
device) is caught by a full rebuild once the kept body is ``max_age_s`` old.  The snapshot holds bytes, strings and
numbers only, never a record, a patcher or a module.
"""

import json
import sys
import time

from comfy_memx.core.comfyui import running_prompt_ids
from comfy_memx.core.state import STATE
from comfy_memx.pins import api as pins
from comfy_memx.routekit.replies import clip
from comfy_memx.leaks import api as leaks
from comfy_memx.surface import readmodel

MAX_AGE_S = 1.0


class ModelsSnapshot:
    """The ``/memx/models`` body and its rows' bytes, rebuilt row by row when a row key changes (a part of the
    process state: :func:`models_snapshot`).  Read it from one thread only (the server's event loop)."""

    def __init__(self, max_age_s=MAX_AGE_S, clock=time.monotonic):
        self.max_age_s = max_age_s
        self._clock = clock
        self._rows = {}     # model_id -> (row key, the row's JSON bytes)
        self._body = None   # (every row key and the shared key, when its rows were all built, the body's bytes)

    def body(self):
        """The JSON body for the ledger as it is now: the kept one when no row changed since, else the kept rows
        that did not change joined with the rebuilt ones."""
        mm = sys.modules.get("comfy.model_management")
        listed = readmodel.listed_modules(mm)
        keyed = []
        for record in STATE.ledger.records():
            key = row_key(record, listed)
            if key is not None:
                keyed.append((record, key))
        shared = shared_key(mm)
        keys = (tuple(key for _record, key in keyed), shared)
        now = self._clock()
        kept = self._body
        if kept is not None and kept[0] == keys and now - kept[1] < self.max_age_s:
            return kept[2]
        whole = kept is None or kept[0][1] != shared or now - kept[1] >= self.max_age_s
        rows, parts = {}, []
        for record, key in keyed:
            row = None if whole else self._rows.get(key[0])
            if row is None or row[0] != key:
                built = readmodel.model_row(record, mm, listed)
                if built is None:   # its module died since the key was read
                    continue
                row = (key, json.dumps(clip(built)).encode("utf-8"))
            rows[key[0]] = row
            parts.append(row[1])
        self._rows = rows
        self._body = (keys, now if whole else kept[1], b"[" + b", ".join(parts) + b"]")
        return self._body[2]


def models_snapshot():
    """This process's ``/memx/models`` snapshot."""
    return STATE.part(ModelsSnapshot)


def row_key(record, listed):
    """What the ``/memx/models`` row of ``record`` is built from, as a tuple of plain values that changes whenever
    the row would (None once its module died): its load and unload counts, resident bytes, last use, reloads, the
    patchers that still exist, whether ComfyUI lists it (``listed``: ``readmodel.listed_modules``), its last gated
    search (the row's ``searched``) and its leak progress.  Attribute reads only (it runs on the event loop for every model at every read)."""
    module = record.module_ref()
    if module is None:
        return None
    in_list = id(module) in listed
    del module
    leak = record.leak
    searched = leaks.search_gate().last_search(record)
    return (record.model_id, record.loads, record.unload_seq, record.loaded_bytes, record.last_used,
            record.model_bytes, record.reloads, len(record.patchers), in_list, len(record.holder_steps),
            None if searched is None else (searched.get("time"), searched.get("result"), searched.get("holder")),
            None if leak is None else (id(leak), len(leak), leak.get("stage"), leak.get("sightings"),
                                       leak.get("searches"), leak.get("tries"), leak.get("last_seen"),
                                       id(leak.get("search")), id(leak.get("referrers")), id(leak.get("holder")),
                                       leak.get("release")))


def shared_key(mm):
    """What every row is built from: the pinned totals (the pin budget's, else ComfyUI's), the release policy and
    the prompts running (a leaked model a running prompt loaded again is in use until it ends); a change rebuilds
    every row."""
    budget = pins.budget()
    pinned = budget.totals() if budget is not None else getattr(mm, "TOTAL_PINNED_MEMORY", None)
    return pinned, STATE.config.release, tuple(sorted(running_prompt_ids()))
