"""The memory panel's timeline: a bounded history of each model's loaded bytes since the server started.

A fixed-size ring (:data:`CAPACITY` entries, the oldest dropped first and counted) of the ``load``, ``unload``,
``leak``, ``leak_seen``, ``release`` and ``free`` events that ``STATE.events`` emits anyway (a leak once per model
and stage, not at every sighting; a release only when something was cut, one entry per model the cut entry held, its
``loaded_bytes`` 0 once the model is gone, so that the model's lane ends there); :meth:`Timeline.observe` is O(1)
per event (one append per model, bounded dict updates), keeps models by ``model_id`` and name only, and runs no
timer or thread.  ``GET /memx/timeline`` reads it
(``surface.routes``); with no browser open nobody reads it.

No lock: an event may be emitted from a garbage-collection callback while another is being observed on the same
thread, so every update is a single operation the interpreter does whole (``deque.append``, a dict assignment),
and a reader that meets a ring changed under it copies again (:meth:`Timeline.since`).
"""

import collections
import itertools
import time

from comfy_memx.core.state import STATE

CAPACITY = 4096          # entries in the ring
KNOWN_MODELS = 512       # models whose last loaded bytes are remembered (to place an unload's line)
MARKED = {"load": "load", "unload": "unload", "leak": "leak", "leak_seen": "leak", "release": "release",
          "free": "free"}
CUT = ("released", "survivor")   # release outcomes after which an entry was cut (the others changed nothing)
MODELS_PER_RELEASE = 16          # models of one release entry drawn (a cut entry rarely holds more than two)
COPY_TRIES = 5


class Timeline:
    """The ring of timeline entries of one process (see the module docstring)."""

    def __init__(self, capacity=CAPACITY, known_models=KNOWN_MODELS):
        if not (isinstance(capacity, int) and capacity > 0):
            raise ValueError(f"capacity must be a whole number > 0, not {capacity!r}")
        self.started = round(time.time(), 3)
        self.capacity = capacity
        self.known_models = known_models
        self._ring = collections.deque(maxlen=capacity)
        self._loaded = collections.OrderedDict()   # model_id -> last loaded bytes, at most known_models of them
        self._leak_stage = collections.OrderedDict()  # model_id -> the stage of its last leak entry (as bounded)
        self._numbers = itertools.count(1)
        self.seen = 0                              # entries ever recorded (seen - len(ring) were dropped)

    def observe(self, event):
        """Record one event of ``STATE.events`` when the timeline marks its kind; ignore the others."""
        kind = MARKED.get(event.get("event"))
        if kind is None:
            return
        if kind == "release":
            for entry in self._released(event):
                self._append(entry)
            return
        model_id = event.get("model_id")
        entry = {"time": event.get("time"), "kind": kind, "model_id": model_id, "model": event.get("model")}
        if kind == "load":
            entry["bytes"] = event.get("bytes")
            entry["loaded_bytes"] = self._remember(model_id, int(event.get("loaded_bytes") or 0))
            entry["owner"] = _short_owner(event.get("owner"))
            entry["reload"] = bool(event.get("reload"))
        elif kind == "unload":
            freed = int(event.get("bytes") or 0)
            before = self._loaded.get(model_id)
            after = max(0, before - freed) if before is not None else 0
            entry["bytes"] = freed
            entry["loaded_bytes"] = self._remember(model_id, after)
            entry["reason"] = event.get("reason")
            entry["requested_by"] = _short_owner(event.get("requested_by"))
        elif kind == "leak":
            entry["stage"] = event.get("stage") or event.get("event")
            if self._leak_stage.get(model_id) == entry["stage"]:
                return
            _bounded_put(self._leak_stage, model_id, entry["stage"], self.known_models)
            entry["holder_package"] = event.get("holder_package")
            entry["loaded_bytes"] = self._loaded.get(model_id)
        else:
            entry["status"] = event.get("status")
        self._append(entry)

    def _append(self, entry):
        entry["seq"] = next(self._numbers)
        self._ring.append(entry)
        self.seen += 1

    def _released(self, event):
        """The entries of one ``release`` event: none when nothing was cut, else one per model the cut entry held
        (``models`` when the receipt lists them, else its one ``model_id``)."""
        if event.get("outcome") not in CUT:
            return []
        models = event.get("models")
        if not isinstance(models, list) or not models:
            models = [{"model": event.get("model"), "model_id": event.get("model_id"), "bytes": event.get("bytes"),
                       "died": event.get("died")}]
        common = {"time": event.get("time"), "kind": "release", "trigger": event.get("trigger"),
                  "outcome": event.get("outcome"), "package": event.get("package"),
                  "cut": event.get("cut") or event.get("path")}
        entries = []
        for model in models[:MODELS_PER_RELEASE]:
            if not isinstance(model, dict):
                continue
            model_id, died = model.get("model_id"), bool(model.get("died"))
            loaded = self._remember(model_id, 0) if died else self._loaded.get(model_id)
            entries.append({**common, "model_id": model_id, "model": model.get("model"), "bytes": model.get("bytes"),
                            "died": died, "loaded_bytes": loaded})
        return entries

    def _remember(self, model_id, loaded):
        if model_id is not None:
            _bounded_put(self._loaded, model_id, loaded, self.known_models)
        return loaded

    def since(self, seq=0):
        """The entries numbered above ``seq`` (oldest first), at most :attr:`capacity` of them."""
        for _ in range(COPY_TRIES):
            try:
                entries = list(self._ring)
                break
            except RuntimeError:   # appended to while copied (another thread, or a GC callback on this one)
                continue
        else:
            entries = []
        return [entry for entry in entries if entry["seq"] > seq]

    def view(self, seq=0):
        """The answer of ``GET /memx/timeline?since=seq``: when it started, now, the ring's size and drops, the
        entries after ``seq`` and ``next`` (the ``since`` of the following call)."""
        entries = self.since(seq)
        return {"started": self.started, "now": round(time.time(), 3), "capacity": self.capacity,
                "dropped": max(0, self.seen - self.capacity), "next": entries[-1]["seq"] if entries else seq,
                "entries": entries}


def _bounded_put(table, key, value, limit):
    """``table[key] = value`` as the newest key of an OrderedDict that keeps at most ``limit`` keys."""
    table[key] = value
    table.move_to_end(key)
    if len(table) > limit:
        table.popitem(last=False)


def _short_owner(owner):
    """An owner or requester in a few names: who it was (``kind``, and ``route`` for an HTTP request), its package,
    node and ``via``; a ``load`` requester as the node that was loading."""
    if not isinstance(owner, dict):
        return None
    short = {key: owner.get(key) for key in ("kind", "route", "clients", "package", "class_type", "node_id", "via")
             if owner.get(key) is not None}
    if owner.get("kind") == "load" and isinstance(owner.get("node"), dict):
        short.update(_short_owner(owner["node"]))
        short["kind"] = "load"
    return short


class TimelinePart:
    """The process's timeline and the event log it is subscribed to (a part of ``STATE``)."""

    def __init__(self):
        self.timeline = None
        self.events = None

    def close(self):
        """Unsubscribe and forget the timeline (reset of the process state)."""
        if self.events is not None and self.timeline is not None:
            self.events.unsubscribe(self.timeline.observe)
        self.timeline = self.events = None


def install():
    """Create the process's :class:`Timeline` and subscribe it to ``STATE.events`` (once); returns it."""
    part = STATE.part(TimelinePart)
    if part.timeline is None:
        part.timeline = Timeline()
    if part.events is not STATE.events:
        if part.events is not None:
            part.events.unsubscribe(part.timeline.observe)
        part.events = STATE.events
        part.events.subscribe(part.timeline.observe)
    return part.timeline


def installed():
    """The installed :class:`Timeline` or None."""
    part = STATE.existing_part(TimelinePart)
    return part.timeline if part is not None else None
