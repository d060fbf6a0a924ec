"""A thread-safe pinned-memory budget with most-recently-used eviction, per process or shared by a whole host.

The budget only does bookkeeping: it is told about pins and unpins by model key (a ``model_id`` string, never the
model, so it can keep nothing alive) and answers each pin request with a :class:`Decision`: granted, granted after
the caller first unpins the listed ``(model_id, bytes)`` of other models, or refused with a reason.

Why most-recently-used first: a ComfyUI workflow cycles through its models (text encoder, diffusion model, VAE,
again).  In a cycle the model used most recently is the one needed last, so evicting it first keeps a stable subset
pinned, while least-recently-used eviction (ComfyUI 0.27.0's ``free_pins``/``free_registrations`` order) evicts
exactly the model needed next.  ``bench/pins.py`` measures the difference.

Rules:

* Never evict the model asking, the models of the current load (``loading``/:meth:`PinBudget.begin_load`), or a
  model granted pins during the current load: within one ``load_models_gpu`` nothing is unpinned and pinned again.
* A request that cannot be met even after evicting everything allowed is refused and evicts nothing.
* Live RAM pressure: with an ``available_ram`` gauge, a pin that would leave less than ``headroom_bytes`` of
  available RAM needs that much room made first (RAM freed by evictions), or is refused.
* Every eviction and refusal is reported to ``on_event`` as a ``pin_evict`` / ``pin_refused`` dict.

Protocol for the caller: for a granted decision, unpin ``decision.evict`` first, and report every unpin, evictions
included, with :meth:`PinBudget.release`; an eviction that could not be carried out is reported with
:meth:`PinBudget.cancel_eviction`.  If the pin itself then fails, :meth:`PinBudget.release` the requester's bytes.

A caller that can read what is really registered (comfy_memx reads ComfyUI's own counters) uses the second
protocol instead: it requests with ``in_flight=True``, calls :meth:`PinBudget.conclude` when the pin call returned,
and then :meth:`PinBudget.settle` each model to the bytes really registered for it.  ``settle`` is idempotent, so
it may run at any time (also from a finalizer that saw an unpin): a model's record is always what is registered
for it plus its grants still in flight.

The one lock (``_lock``, a plain :class:`threading.Lock`) guards every figure; it is held only inside these
methods, which allocate small dicts and tuples.  A garbage-collection finalizer or weakref callback of the caller
must therefore not call into the budget while its own thread is inside it (``comfy_memx.pins.session`` defers
such calls); no callback is ever invoked with the lock held (``on_event`` runs after it is released).

With ``scope="host"`` all processes of this user on the host share one cap through a :class:`HostRegistry` file.
Standard library only.
"""

import collections
import contextlib
import dataclasses
import logging
import os
import threading

from comfy_memx.core.errors import ConfigError, internal_error
from comfy_memx.core.hostshare import HostRegistry, RegistryUnavailable

log = logging.getLogger("comfy_memx")

MIB = 1024 ** 2
POLICIES = ("mru", "lru")
SCOPES = ("process", "host")


@dataclasses.dataclass(frozen=True)
class Decision:
    """The answer to one pin request.

    ``granted`` with an empty ``evict``: pin now.  ``granted`` with ``evict``: unpin those ``(model_id, bytes)``
    first, in the order given, then pin; ``reason`` says what forced it ("cap" or "ram_pressure").  Not granted:
    do not pin; ``reason`` is "pinning_off", "over_cap" or "ram_pressure".
    """

    model_id: str
    nbytes: int
    granted: bool
    evict: tuple[tuple[str, int], ...] = ()
    reason: str | None = None

    @property
    def refused(self):
        """True when the pin must not be made."""
        return not self.granted


class PinBudget:
    """Tracks pinned bytes per model key against a cap and decides which pins to evict when a new one does not fit.

    ``cap_bytes``: the pin cap (0 or less: pinning off).  ``headroom_bytes`` and ``available_ram`` (a callable
    returning bytes, e.g. ``functools.partial(hostmem.available_ram, host)``): the live RAM-pressure rule; without
    ``available_ram`` RAM is not checked.  ``policy``: "mru" (default) or "lru", the order in which other models'
    pins are evicted.  ``scope``: "process" or "host"; host scope uses ``registry`` (default: a
    :class:`HostRegistry` at its default path) and reserves host budget in steps of ``host_chunk_bytes`` so that
    the shared file is touched only when this process's pins cross a step.  ``on_event(dict)`` receives
    ``pin_evict``/``pin_refused`` events; ``describe(model_id)`` names the model in them.
    """

    def __init__(self, cap_bytes, headroom_bytes=0, available_ram=None, scope="process", registry=None,
                 policy="mru", on_event=None, describe=None, host_chunk_bytes=256 * MIB):
        if policy not in POLICIES:
            raise ConfigError("pin eviction policy %r is not one of %s" % (policy, ", ".join(POLICIES)))
        if scope not in SCOPES:
            raise ConfigError("COMFY_MEMX_PIN_SCOPE=%r is not valid; accepted: %s" % (scope, ", ".join(SCOPES)))
        self.cap_bytes = int(cap_bytes)
        self.headroom_bytes = int(headroom_bytes)
        self.policy = policy
        self.scope = scope
        self._available_ram = available_ram
        self._on_event = on_event
        self._describe = describe
        self._lock = threading.Lock()
        self._pinned = {}
        self._pending = {}
        self._pinned_total = 0
        self._pending_total = 0
        self._inflight = {}        # model_id -> bytes granted whose pin call has not returned yet (in_flight=True)
        self._inflight_total = 0
        self._recency = collections.OrderedDict()  # least recently used first
        self._load_depth = 0
        self._protected = set()
        self._counters = collections.Counter()
        self._peak_committed = 0
        self._registry = None
        self._reserved = 0
        self._others = 0
        self._chunk = max(1, int(host_chunk_bytes))
        if scope == "host":
            self._registry = registry if registry is not None else HostRegistry()

    # -- requests -------------------------------------------------------------------------------------------------

    def request(self, model_id, nbytes, loading=(), in_flight=False):
        """Decide whether ``model_id`` may pin ``nbytes`` more; the bytes are counted as pinned if granted.

        ``loading`` names the models of the current load, whose pins must not be evicted (added to those given to
        :meth:`begin_load`).  With ``in_flight`` a granted request is also counted as in flight until
        :meth:`conclude`, so that :meth:`settle` keeps it.  See the module docstring for what the caller must do
        with the :class:`Decision`.
        """
        nbytes = int(nbytes)
        with self._lock:
            decision = self._decide(model_id, nbytes, loading)
            if in_flight and decision.granted and nbytes > 0:
                self._inflight[model_id] = self._inflight.get(model_id, 0) + nbytes
                self._inflight_total += nbytes
            events = self._events_for(decision)
        self._emit(events)
        return decision

    def conclude(self, model_id, nbytes):
        """The pin call of an ``in_flight`` grant of ``nbytes`` to ``model_id`` returned: stop counting it as in
        flight.  The bytes stay recorded until :meth:`settle` (or :meth:`release`) says what was registered."""
        with self._lock:
            held = self._inflight.get(model_id, 0)
            done = min(held, max(0, int(nbytes)))
            if held - done > 0:
                self._inflight[model_id] = held - done
            else:
                self._inflight.pop(model_id, None)
            self._inflight_total -= done

    def settle(self, model_id, actual):
        """Make ``model_id``'s record equal ``actual`` (the bytes really registered for it) plus its grants in flight.

        A record above that target gives the difference back (settling evictions asked for first, as
        :meth:`release` does); a record below it adopts the difference: counted as pinned without a decision
        (something registered it without asking, or before comfy_memx started), never refused.  Returns the change
        in bytes (negative: given back).
        """
        with self._lock:
            target = max(0, int(actual)) + self._inflight.get(model_id, 0)
            held = self._pinned.get(model_id, 0)
            if target < held:
                self._release(model_id, held - target)
                self._maybe_shrink_reservation()
            elif target > held:
                self._pinned[model_id] = target
                self._pinned_total += target - held
                self._counters["adopted_bytes"] += target - held
                self._peak_committed = max(self._peak_committed, self._committed())
                if model_id not in self._recency:
                    self._recency[model_id] = None
                self._grow_reservation()
            return target - held

    def totals(self):
        """``(pinned, in_flight)``: all bytes recorded, and the part of them granted but not concluded yet."""
        with self._lock:
            return self._pinned_total, self._inflight_total

    def models(self):
        """The model keys that hold bytes or grants in flight."""
        with self._lock:
            return list(self._pinned.keys() | self._inflight.keys())

    def release(self, model_id, nbytes):
        """Record that ``nbytes`` of ``model_id``'s pins were unpinned (an eviction carried out, or any unpin).

        Bytes that a decision asked to evict are settled first.  Releasing more than is recorded clamps at zero.
        """
        with self._lock:
            self._release(model_id, int(nbytes))
            self._maybe_shrink_reservation()

    def cancel_eviction(self, model_id, nbytes):
        """Record that an eviction of ``nbytes`` from ``model_id`` asked for by a decision was not carried out."""
        with self._lock:
            undo = min(int(nbytes), self._pending.get(model_id, 0))
            if undo > 0:
                self._set_pending(model_id, self._pending[model_id] - undo)

    def forget(self, model_id):
        """Drop every record of ``model_id`` (its model is gone and its pins with it); return the bytes it held."""
        with self._lock:
            held = self._pinned.get(model_id, 0)
            self._release(model_id, held)
            self._inflight_total -= self._inflight.pop(model_id, 0)
            self._recency.pop(model_id, None)
            self._protected.discard(model_id)
            self._maybe_shrink_reservation()
        return held

    def touch(self, model_id):
        """Mark ``model_id`` as the most recently used model."""
        with self._lock:
            self._touch(model_id)

    def begin_load(self, model_ids):
        """Start a load of ``model_ids``: mark them most recently used and protect them, and every model granted
        pins until the matching :meth:`end_load`, from eviction.  Loads may nest; protection ends with the outermost.
        """
        with self._lock:
            for model_id in model_ids:
                self._touch(model_id)
                self._protected.add(model_id)
            self._load_depth += 1

    def end_load(self):
        """End the load started by the matching :meth:`begin_load`."""
        with self._lock:
            self._load_depth = max(0, self._load_depth - 1)
            if self._load_depth == 0:
                self._protected.clear()

    @contextlib.contextmanager
    def load(self, model_ids):
        """Context manager form of :meth:`begin_load` / :meth:`end_load`."""
        self.begin_load(model_ids)
        try:
            yield self
        finally:
            self.end_load()

    # -- inspection -----------------------------------------------------------------------------------------------

    def pinned(self, model_id):
        """Bytes currently recorded as pinned for ``model_id`` (evictions not yet released included)."""
        with self._lock:
            return self._pinned.get(model_id, 0)

    def recency(self):
        """Model keys from least to most recently used."""
        with self._lock:
            return list(self._recency)

    def stats(self):
        """Return a snapshot of the budget: cap, totals, per-model bytes and cumulative counters, as plain values."""
        with self._lock:
            return {
                "cap_bytes": self.cap_bytes,
                "headroom_bytes": self.headroom_bytes,
                "policy": self.policy,
                "scope": self.scope,
                "pinned_bytes": self._pinned_total,
                "pending_evict_bytes": self._pending_total,
                "in_flight_bytes": self._inflight_total,
                "committed_bytes": self._committed(),
                "peak_committed_bytes": self._peak_committed,
                "per_model": dict(self._pinned),
                "reserved_bytes": self._reserved if self.scope == "host" else None,
                "other_processes_bytes": self._others if self.scope == "host" else None,
                "registered_bytes": self._counters["registered_bytes"],
                "grants": self._counters["grants"],
                "evicted_bytes": self._counters["evicted_bytes"],
                "evictions": self._counters["evictions"],
                "refusals": self._counters["refusals"],
                "refused_bytes": self._counters["refused_bytes"],
                "adopted_bytes": self._counters["adopted_bytes"],
            }

    def close(self):
        """Give this process's share of a host budget back to the registry (host scope; no-op otherwise)."""
        if self._registry is None:
            return
        with self._lock:
            try:
                with self._registry.transaction() as entries:
                    entries.pop(self._registry.me, None)
            except RegistryUnavailable as exc:
                self._unavailable(exc)
            except OSError as exc:
                internal_error("pinbudget.registry", exc)
            self._reserved = 0

    # -- internals (called with self._lock held) ------------------------------------------------------------------

    def _committed(self):
        """Bytes that stay pinned once every eviction already asked for is carried out."""
        return self._pinned_total - self._pending_total

    def _decide(self, model_id, nbytes, loading):
        if nbytes <= 0:
            return Decision(model_id, nbytes, True)
        if self.cap_bytes <= 0:
            return self._refuse(model_id, nbytes, "pinning_off")
        if self._registry is not None and self._committed() + nbytes > self._reserved:
            return self._decide_with_registry(model_id, nbytes, loading)
        limit = self._reserved if self._registry is not None else self.cap_bytes
        return self._decide_within(model_id, nbytes, loading, limit)

    def _decide_with_registry(self, model_id, nbytes, loading):
        """Decide against the cap minus the other live processes' shares, and grow this process's reservation."""
        decision = None
        try:
            with self._registry.transaction() as entries:
                me = self._registry.me
                self._others = sum(size for other, size in entries.items() if other != me)
                decision = self._decide_within(model_id, nbytes, loading, self.cap_bytes - self._others)
                if decision.granted:
                    wanted = -(-self._committed() // self._chunk) * self._chunk
                    self._reserved = max(self._committed(), min(wanted, self.cap_bytes - self._others))
                    entries[me] = self._reserved
        except RegistryUnavailable as exc:  # never no cap: the in-process cap with the last known shares
            self._unavailable(exc)
            if decision is None:
                decision = self._decide_within(model_id, nbytes, loading, self.cap_bytes - self._others)
        except OSError as exc:  # a vanished runtime dir must not stop pinning: use the last known shares
            internal_error("pinbudget.registry", exc)
            if decision is None:
                decision = self._decide_within(model_id, nbytes, loading, self.cap_bytes - self._others)
        return decision

    def _decide_within(self, model_id, nbytes, loading, limit):
        cap_need = self._committed() + nbytes - limit
        ram_need = 0
        if self._available_ram is not None:
            ram_need = nbytes + self.headroom_bytes - (self._available_ram() + self._pending_total)
        need = max(cap_need, ram_need)
        victims = ()
        if need > 0:
            victims, found = self._plan(need, self._protected.union(loading, (model_id,)))
            if found < need:
                return self._refuse(model_id, nbytes, "over_cap" if cap_need > found else "ram_pressure")
            for victim, size in victims:
                self._set_pending(victim, self._pending.get(victim, 0) + size)
                self._counters["evicted_bytes"] += size
                self._counters["evictions"] += 1
        self._pinned[model_id] = self._pinned.get(model_id, 0) + nbytes
        self._pinned_total += nbytes
        self._counters["registered_bytes"] += nbytes
        self._counters["grants"] += 1
        self._peak_committed = max(self._peak_committed, self._committed())
        if model_id not in self._recency:
            self._recency[model_id] = None
        if self._load_depth > 0:
            self._protected.add(model_id)
        reason = None if not victims else ("cap" if cap_need >= ram_need else "ram_pressure")
        return Decision(model_id, nbytes, True, tuple(victims), reason)

    def _plan(self, need, protected):
        """Pick (model_id, bytes) to evict, in policy order, until ``need`` bytes are covered."""
        order = reversed(self._recency) if self.policy == "mru" else iter(self._recency)
        victims, found = [], 0
        for candidate in order:
            if found >= need:
                break
            if candidate in protected:
                continue
            evictable = self._pinned.get(candidate, 0) - self._pending.get(candidate, 0)
            if evictable <= 0:
                continue
            take = min(evictable, need - found)
            victims.append((candidate, take))
            found += take
        return victims, found

    def _refuse(self, model_id, nbytes, reason):
        self._counters["refusals"] += 1
        self._counters["refused_bytes"] += nbytes
        return Decision(model_id, nbytes, False, (), reason)

    def _release(self, model_id, nbytes):
        held = self._pinned.get(model_id, 0)
        nbytes = min(max(0, nbytes), held)
        if nbytes == 0:
            return
        settled = min(nbytes, self._pending.get(model_id, 0))
        if settled:
            self._set_pending(model_id, self._pending[model_id] - settled)
        if held - nbytes > 0:
            self._pinned[model_id] = held - nbytes
        else:
            del self._pinned[model_id]
        self._pinned_total -= nbytes

    def _set_pending(self, model_id, size):
        self._pending_total += size - self._pending.get(model_id, 0)
        if size > 0:
            self._pending[model_id] = size
        else:
            self._pending.pop(model_id, None)

    def _touch(self, model_id):
        self._recency.pop(model_id, None)
        self._recency[model_id] = None

    def _grow_reservation(self):
        """Host scope: reserve at least what is committed (adopted bytes exist whether the others like it or not)."""
        if self._registry is None or self._committed() <= self._reserved:
            return
        self._reserve_committed()

    def _maybe_shrink_reservation(self):
        if self._registry is None or self._reserved - self._committed() <= 2 * self._chunk:
            return
        self._reserve_committed()

    def _reserve_committed(self):
        """Host scope: reserve what is committed, rounded up to whole chunks, in the host registry."""
        try:
            with self._registry.transaction() as entries:
                self._reserved = -(-self._committed() // self._chunk) * self._chunk
                entries[self._registry.me] = self._reserved
        except RegistryUnavailable as exc:
            self._unavailable(exc)
        except OSError as exc:
            internal_error("pinbudget.registry", exc)

    def _unavailable(self, exc):
        """The host registry cannot be used safely (``core.hostshare``): say so once; decisions keep this
        process's cap minus the other processes' last known shares (never no cap)."""
        if not self._counters["registry_unavailable"]:
            log.warning("comfy_memx: the host pin registry cannot be used (%s); this process keeps its own cap of "
                        "%d bytes minus the %d bytes other processes last held", exc, self.cap_bytes, self._others)
        self._counters["registry_unavailable"] += 1

    def _events_for(self, decision):
        base = {"policy": self.policy, "scope": self.scope}
        if decision.refused:
            return [dict(base, event="pin_refused", model_id=decision.model_id, bytes=decision.nbytes,
                         reason=decision.reason)]
        return [dict(base, event="pin_evict", model_id=victim, bytes=size, reason=decision.reason,
                     for_model_id=decision.model_id) for victim, size in decision.evict]

    def _emit(self, events):
        if self._on_event is None:
            return
        for event in events:
            try:
                event["model"] = self._describe(event["model_id"]) if self._describe else event["model_id"]
                self._on_event(event)
            except Exception as exc:  # a broken sink must not break pinning
                internal_error("pinbudget.on_event", exc)
