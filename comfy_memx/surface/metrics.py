"""Prometheus metrics of model memory, in a registry of comfy_memx's own (nothing global is touched).

Counters and histograms are fed by ``STATE.events`` (``load``, ``unload``, ``leak``, ``leak_seen``, ``pin_evict``,
``pin_refused``, ``free``, ``release``); gauges are read at scrape time from the ledger, the patch table and ComfyUI's own
figures, so a model that is gone disappears from them.  Every name starts with ``comfy_memx_``:

=========================================  =========  =========================================================
name                                       type       labels
=========================================  =========  =========================================================
comfy_memx_info                            gauge      version, leak_mode, source: 1 while comfy_memx is active
comfy_memx_patch_sites                     gauge      state (patched/rewrapped/skipped): number of patch sites
comfy_memx_patch_skipped                   gauge      patch, site, reason (absent/disabled/not_imported/other): 1
comfy_memx_loaded_bytes                    gauge      device: weights loaded on each load device
comfy_memx_model_loaded_bytes              gauge      model, package, device (copies of one model summed)
comfy_memx_model_bytes                     gauge      model, package, state (loaded/offloaded/built/leaked)
comfy_memx_leaked_bytes                    gauge      package (holder), loader_package, found_by: live leaked weights
comfy_memx_leak_found_timestamp_seconds    gauge      package, loader_package, stage, found_by: newest live leak's time
comfy_memx_free_survivor_models            gauge      package (holder), loader_package: live models a free left alive
comfy_memx_release_failed_models           gauge      package (holder), outcome: live leaks whose last release failed
comfy_memx_pinned_bytes                    gauge      -: pinned host memory (ComfyUI's TOTAL_PINNED_MEMORY)
comfy_memx_pin_cap_bytes                   gauge      source: comfy_memx (the cap in force), comfyui (its own)
comfy_memx_loads_total                     counter    package
comfy_memx_load_bytes_total                counter    package
comfy_memx_unloads_total                   counter    reason, package
comfy_memx_unload_bytes_total              counter    reason
comfy_memx_leaks_total                     counter    package (holder), loader_package, stage, found_by (once per model)
comfy_memx_leak_sightings_total            counter    package (holder), loader_package: later prompts that saw it
comfy_memx_leak_searches_total             counter    reason (new, holders_changed, deferred)
comfy_memx_reloads_total                   counter    model, cause_package: reloads charged to an unload's cause
comfy_memx_reload_seconds_total            counter    model, cause_package
comfy_memx_models_ram_bytes                gauge      -: RAM held by live models (their CPU-resident weights)
comfy_memx_process_rss_bytes               gauge      -: resident memory of the ComfyUI process
comfy_memx_trim_returned_bytes_total       counter    -: bytes malloc_trim returned after /memx/free
comfy_memx_last_free_bytes                 gauge      kind: allocator_retained, held_by_models, rss_after, survivors
comfy_memx_last_free_survivors             gauge      -: models the last free's receipt listed as survivors
comfy_memx_last_free_survivor_models       gauge      package (holder), loader_package: the same, by package
comfy_memx_host_memory_bytes               gauge      -: memory the process may use (RAM, or a lower cgroup limit)
process_start_time_seconds (and process_*) gauge      -: prometheus_client's process collector (Linux)
comfy_memx_frees_total                     counter    origin (/memx/free, idle_unload, ...): finished free requests
comfy_memx_free_freed_bytes_total          counter    origin: device bytes the frees unloaded
comfy_memx_free_survivors_total            counter    origin: survivors listed by the frees' receipts
comfy_memx_releases_total                  counter    package (holder), outcome (released, survivor, refused ...)
comfy_memx_released_bytes_total            counter    package (holder): bytes of released models that died (every model of the cut entry)
comfy_memx_pin_evictions_total             counter    reason
comfy_memx_pin_evicted_bytes_total         counter    reason
comfy_memx_pin_refusals_total              counter    reason
comfy_memx_load_seconds                    histogram  -
comfy_memx_offload_seconds                 histogram  -
comfy_memx_load_gbps                       histogram  -: GB/s of loads that copied bytes (none on CPU-only runs)
comfy_memx_offload_gbps                    histogram  -: GB/s of unloads that copied bytes
=========================================  =========  =========================================================

Leak counters name two packages: ``package`` is the custom-node package that *holds* the leaked model (the
event's ``holder_package``, found by the probe in every leak mode and by strict mode's search; ``unknown`` when
neither found one) and ``loader_package`` the one that loaded it (its owner); ``found_by`` says how the leak was
found (``comfyui_warning``, ``after_free``, ``after_unload``; ``no_patcher`` in ``leaked_bytes`` for a live model no
ModelPatcher refers to that has no leak record yet).

What the alerts page on is read at scrape time from the live leak records, so that a released model, a restart or
a failed scrape never leaves a stale value behind: ``leak_found_timestamp_seconds`` (when the newest live leak of
each label set was found: a new rooted leak is one found in the last minutes, and a release ends it),
``free_survivor_models`` (live leaked models that a free left alive: found after a free, last unloaded by one, or
leaked before the last free this process saw, ComfyUI's own ``POST /free`` included) and
``release_failed_models`` (live leaked models whose last release did not give them back).  The counters and
histograms see every event: the events file's rate limit (``COMFY_MEMX_EVENT_RATE``) drops file lines only.

Label cardinality is capped so that a fleet can afford it: every package-like label (``package``,
``loader_package``, ``cause_package``) and the ``model`` label of counters admit the first :data:`MAX_PACKAGES` /
:data:`MAX_MODELS` values a process sees and fold later ones into ``other``; the per-model gauges show the
:data:`MAX_MODEL_SERIES` largest models and sum the rest into one ``other`` series per device or state.  Counters
and histograms export no ``_created`` series (one sample fewer per series; Prometheus does not read them).
Counters whose label values are known in advance (free origins, unload reasons, search reasons, pin refusals) start
at 0 for each, so ``rate``/``increase`` see their first event. The per-model gauges carry no ``model_id`` (a new id
per load would make new series all day); copies of one model of one package are summed.

``prometheus_client`` is optional (``pip install prometheus_client`` in ComfyUI's environment), imported when metrics are
installed, never at import of this module.
"""

import logging
import os
import time

from comfy_memx._version import __version__
from comfy_memx.core.errors import MemxError
from comfy_memx.core.state import STATE
from comfy_memx.surface import readmodel, retention

log = logging.getLogger("comfy_memx")

PREFIX = "comfy_memx_"
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
GBPS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
INSTALL_HINT = "install prometheus_client into the Python environment ComfyUI runs in: path/to/python -m pip install prometheus_client"
MAX_PACKAGES = 40      # distinct package-like label values per process (the rest: "other")
MAX_MODELS = 40        # distinct model names in counters
MAX_MODEL_SERIES = 25  # models shown one by one in the per-model gauges (largest first)
KNOWN_FREE_ORIGINS = ("/memx/free", "idle_unload", "handoff")
KNOWN_UNLOAD_REASONS = ("unload_all", "free_request", "oom", "memory_pressure", "dropped", "other")
KNOWN_SEARCH_REASONS = ("new", "holders_changed", "deferred")
KNOWN_PIN_REFUSALS = ("eviction_failed",)
OTHER = "other"
FOUND_BY_WARNING = "comfyui_warning"   # found_by of a leak event that names none (events written before it existed)
NO_PATCHER = "no_patcher"              # found_by of a leaked row without a leak record (no ModelPatcher refers to it)
FAILED_RELEASES = ("survivor", "in_use", "changed", "failed", "refused")  # release outcomes that gave nothing back
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
UNKNOWN = "unknown"


class MetricsUnavailable(MemxError):
    """prometheus_client is not installed; the message says how to install it."""


def _prometheus():
    try:
        import prometheus_client
        import prometheus_client.core  # noqa: F401  (GaugeMetricFamily for the scrape-time gauges)
    except ImportError:
        raise MetricsUnavailable(f"prometheus_client is not installed; {INSTALL_HINT}") from None
    return prometheus_client


class LabelCap:
    """Admits the first ``limit`` distinct values of a label and answers :data:`OTHER` for any later one.

    Values once admitted stay admitted (a counter's series never changes its labels); the set is bounded by
    ``limit``, so the series of the counters that use it are too.
    """

    def __init__(self, limit):
        self.limit = limit
        self._seen = set()

    def __call__(self, value):
        """``value`` as a label: itself when admitted (or room is left), else :data:`OTHER`."""
        value = str(value)
        if value in self._seen:
            return value
        if len(self._seen) < self.limit:
            self._seen.add(value)
            return value
        return OTHER


class Metrics:
    """The metric objects, their private registry, and the event handler that feeds them.

    Raises :class:`MetricsUnavailable` without prometheus_client.  ``model_rows`` (a callable returning
    /memx/models rows), ``pin_facts`` (a callable returning ``{"pinned_bytes", "cap_bytes",
    "comfyui_cap_bytes"}``) and ``process_facts`` (a callable returning ``{"version", "leak_mode", "source",
    "sites"}``, ``sites`` as in :func:`comfy_memx.core.registry.site_status`) feed the scrape-time gauges; tests
    pass their own.
    """

    def __init__(self, model_rows=None, pin_facts=None, process_facts=None):
        pc = _prometheus()
        self._pc = pc
        self.packages = LabelCap(MAX_PACKAGES)
        self.models = LabelCap(MAX_MODELS)
        self.books = _Books()
        self.holders = self.books.holders
        self.registry = pc.CollectorRegistry(auto_describe=True)
        counter = self._counter
        self.loads = counter("loads", "Model loads that moved bytes onto a device", ["package"])
        self.load_bytes = counter("load_bytes", "Bytes moved onto devices by model loads", ["package"])
        self.unloads = counter("unloads", "Model unloads by reason", ["reason", "package"])
        self.unload_bytes = counter("unload_bytes", "Bytes freed on devices by model unloads", ["reason"])
        self.leaks = counter("leaks", "Leaked models (once per model: after ComfyUI's leak warning, a free or an "
                             "unload), by holding package and how they were found",
                             ["package", "loader_package", "stage", "found_by"])
        self.leak_sightings = counter("leak_sightings", "Prompts in which ComfyUI warned again about a known leak",
                                      ["package", "loader_package"])
        self.leak_searches = counter("leak_searches", "Strict holder searches run after leak warnings", ["reason"])
        self.reloads = counter("reloads", "Loads of weights that an earlier unload had moved off the device",
                               ["model", "cause_package"])
        self.reload_seconds = counter("reload_seconds", "Seconds spent reloading weights, by the unload's cause",
                                      ["model", "cause_package"])
        self.pin_evictions = counter("pin_evictions", "Pinned-memory evictions", ["reason"])
        self.pin_evicted_bytes = counter("pin_evicted_bytes", "Pinned bytes evicted", ["reason"])
        self.pin_refusals = counter("pin_refusals", "Pin requests refused", ["reason"])
        self.trim_returned = counter("trim_returned_bytes", "Bytes malloc_trim gave back to the kernel after "
                                     "/memx/free (what the C allocator had kept)", [])
        self.frees = counter("frees", "Free requests that finished (/memx/free, idle unload, hand-off)", ["origin"])
        self.free_freed_bytes = counter("free_freed_bytes", "Device bytes unloaded by free requests", ["origin"])
        self.free_survivors = counter("free_survivors", "Survivors listed by free receipts (models still alive "
                                      "that the free should have released)", ["origin"])
        self.releases = counter("releases", "Releases of leaked models (a pack's cache entry cut), by holding "
                                "package and outcome", ["package", "outcome"])
        self.released_bytes = counter("released_bytes", "Bytes of leaked models that died after a release, by "
                                      "holding package", ["package"])
        self.last_free = pc.Gauge(PREFIX + "last_free_bytes", "Memory figures of the last /memx/free",
                                  ["kind"], registry=self.registry)
        self.last_free_survivors = pc.Gauge(PREFIX + "last_free_survivors", "Models the last free request left "
                                            "alive (the survivors of its receipt)", registry=self.registry)
        self.last_free_survivor_models = pc.Gauge(PREFIX + "last_free_survivor_models", "Models the last free "
                                                  "request left alive, by holding and loading package",
                                                  ["package", "loader_package"], registry=self.registry)
        self.load_seconds = pc.Histogram(PREFIX + "load_seconds", "Seconds per model load that moved bytes",
                                         buckets=SECONDS_BUCKETS, registry=self.registry)
        self.offload_seconds = pc.Histogram(PREFIX + "offload_seconds", "Seconds per model unload (offload)",
                                            buckets=SECONDS_BUCKETS, registry=self.registry)
        self.load_gbps = pc.Histogram(PREFIX + "load_gbps", "GB/s of model loads that copied bytes",
                                      buckets=GBPS_BUCKETS, registry=self.registry)
        self.offload_gbps = pc.Histogram(PREFIX + "offload_gbps", "GB/s of model unloads that copied bytes",
                                         buckets=GBPS_BUCKETS, registry=self.registry)
        self.registry.register(_StateCollector(pc, model_rows, pin_facts, process_facts, self.books))
        pc.ProcessCollector(registry=self.registry)
        self._start_known_labels()

    def _start_known_labels(self):
        """Create the counter series of label values known in advance at 0, so that ``increase`` and ``rate`` count
        their first event (a series born at 1 reads as no increase)."""
        for origin in KNOWN_FREE_ORIGINS:
            for family in (self.frees, self.free_freed_bytes, self.free_survivors):
                family.labels(origin)
        for reason in KNOWN_UNLOAD_REASONS:
            self.unload_bytes.labels(reason)
        for reason in KNOWN_SEARCH_REASONS:
            self.leak_searches.labels(reason)
        for reason in KNOWN_PIN_REFUSALS:
            self.pin_refusals.labels(reason)

    def _counter(self, name, documentation, labels):
        return self._pc.Counter(PREFIX + name, documentation, labels, registry=self.registry)

    def observe(self, event):
        """Update the counters and histograms from one comfy_memx event (unknown events are ignored)."""
        observer = self._OBSERVERS.get(event.get("event"))
        if observer is not None:
            observer(self, event)

    def _observe_load(self, event):
        reload = event.get("reload")
        if isinstance(reload, dict):
            labels = (self.models(event.get("model") or "?"), self.packages(reload.get("package") or "?"))
            self.reloads.labels(*labels).inc()
            self.reload_seconds.labels(*labels).inc(max(0.0, reload.get("seconds") or 0.0))
        package = self.packages(_package(event))
        self.loads.labels(package).inc()
        self.load_bytes.labels(package).inc(max(0, event.get("bytes") or 0))
        if event.get("seconds") is not None:
            self.load_seconds.observe(event["seconds"])
        if event.get("gb_per_s") is not None:
            self.load_gbps.observe(event["gb_per_s"])

    def _observe_unload(self, event):
        reason = str(event.get("reason") or "other")
        if reason == "free_request":   # the worker unloads for a free: ComfyUI's /free, /memx/free, idle, hand-off
            self.books.saw_free(event.get("time"))
        self.unloads.labels(reason, self.packages(_package(event))).inc()
        self.unload_bytes.labels(reason).inc(max(0, event.get("bytes") or 0))
        if event.get("seconds") is not None:
            self.offload_seconds.observe(event["seconds"])
        if event.get("gb_per_s") is not None:
            self.offload_gbps.observe(event["gb_per_s"])

    def _observe_leak(self, event):
        holder = self._holder(event)
        if event.get("reason", "new") == "new":
            self.leaks.labels(holder, self.packages(_package(event)), str(event.get("stage") or "?"),
                              str(event.get("found_by") or FOUND_BY_WARNING)).inc()
        search = event.get("search") or {}
        if "seconds" in search:
            self.leak_searches.labels(str(event.get("reason") or "new")).inc()

    def _observe_leak_seen(self, event):
        self.leak_sightings.labels(self._holder(event), self.packages(_package(event))).inc()

    def _observe_pin_evict(self, event):
        reason = str(event.get("reason") or "?")
        self.pin_evictions.labels(reason).inc()
        self.pin_evicted_bytes.labels(reason).inc(max(0, event.get("bytes") or 0))

    def _observe_pin_refused(self, event):
        self.pin_refusals.labels(str(event.get("reason") or "?")).inc()

    def _observe_release(self, event):
        package = self.packages(event.get("package") or UNKNOWN)
        self.releases.labels(package, str(event.get("outcome") or "?")).inc()
        died = event.get("released_bytes")   # every model that died with the cut entry (the asked-for one included)
        if died is None and event.get("died"):
            died = event.get("bytes")
        if died:
            self.released_bytes.labels(package).inc(max(0, died))

    def _holder(self, event):
        """The holding package of a leak event as a label; remembered per model for the leaked-bytes gauge."""
        holder = event.get("holder_package")
        model_id = event.get("model_id")
        if holder:
            holder = self.packages(holder)
            if model_id is not None:
                self.holders[str(model_id)] = holder
            return holder
        return self.holders.get(str(model_id), UNKNOWN) if model_id is not None else UNKNOWN

    def _observe_free(self, event):
        self.books.saw_free(event.get("time"))
        origin = self.packages(_origin(event.get("origin")))
        self.frees.labels(origin).inc()
        self.free_freed_bytes.labels(origin).inc(max(0, event.get("freed_bytes") or 0))
        self.free_survivors.labels(origin).inc(max(0, event.get("survivors") or 0))
        self.last_free_survivors.set(max(0, event.get("survivors") or 0))
        self.last_free.labels("survivors").set(max(0, event.get("survivor_bytes") or 0))
        self._survivor_models(event.get("survivor_packages"))
        memory = event.get("memory") or {}
        returned = (memory.get("trim") or {}).get("returned_bytes")
        if returned is not None:
            self.trim_returned.inc(max(0, returned))
            self.last_free.labels("allocator_retained").set(returned)
        if memory.get("held_bytes") is not None:
            self.last_free.labels("held_by_models").set(memory["held_bytes"])
        if memory.get("rss_after_trim") or memory.get("rss_after"):
            self.last_free.labels("rss_after").set(memory.get("rss_after_trim") or memory["rss_after"])

    def _survivor_models(self, packages):
        """Replace the by-package survivors of the last free with those of this one (``survivor_packages``: a list
        of ``{"package", "loader_package"}``, one per survivor)."""
        self.last_free_survivor_models.clear()
        for survivor in packages if isinstance(packages, list) else ():
            labels = (self.packages(survivor.get("package") or UNKNOWN),
                      self.packages(survivor.get("loader_package") or "?"))
            self.last_free_survivor_models.labels(*labels).inc()

    _OBSERVERS = {"load": _observe_load, "unload": _observe_unload, "leak": _observe_leak,
                  "leak_seen": _observe_leak_seen, "pin_evict": _observe_pin_evict,
                  "pin_refused": _observe_pin_refused, "free": _observe_free, "release": _observe_release}

    def exposition(self):
        """``(body bytes, content type)`` of the Prometheus text format (no ``_created`` series)."""
        return self._pc.generate_latest(_WithoutCreated(self.registry)), self._pc.CONTENT_TYPE_LATEST


class _WithoutCreated:
    """A registry view whose families carry no ``_created`` samples (Prometheus ignores them; each would be one
    more series per counter and histogram series)."""

    def __init__(self, registry):
        self._registry = registry

    def collect(self):
        for family in self._registry.collect():
            created = family.name + "_created"
            if any(sample.name == created for sample in family.samples):
                family.samples = [sample for sample in family.samples if sample.name != created]
            yield family


class _Books:
    """What the scrape-time leak gauges need beside the ledger: the holding package that leak events named for each
    model (pruned at scrape to live models) and when this process last saw a free run."""

    def __init__(self):
        self.holders = {}      # model_id -> holding package, from leak events
        self.last_free = None  # unix time of the last free this process saw (an unload for one, or a receipt)

    def saw_free(self, when):
        """A free ran at ``when`` (unix seconds; now when not a number)."""
        when = float(when) if isinstance(when, (int, float)) else time.time()
        if self.last_free is None or when > self.last_free:
            self.last_free = when

    def survived_a_free(self, leak):
        """Whether a live leak (``leaks.public_state``) outlived a free: found after one, or found before the last
        free this process saw."""
        if leak.get("found_by") == "after_free":
            return True
        found = leak.get("time")
        return self.last_free is not None and isinstance(found, (int, float)) and found <= self.last_free


class _StateCollector:
    """Scrape-time gauges from the ledger, the patch table and ComfyUI's pinned-memory figures."""

    def __init__(self, pc, model_rows, pin_facts, process_facts, books):
        self._pc, self._model_rows, self._pin_facts = pc, model_rows, pin_facts
        self._process_facts, self._books = process_facts, books

    def describe(self):
        return []

    def collect(self):
        yield from self._process()
        gauge = self._pc.core.GaugeMetricFamily
        per_device = gauge(PREFIX + "loaded_bytes", "Model weights loaded on each load device", labels=["device"])
        per_model = gauge(PREFIX + "model_loaded_bytes", "Weights of one model loaded on its load device",
                          labels=["model", "package", "device"])
        sizes = gauge(PREFIX + "model_bytes", "Weights of one model, wherever they are",
                      labels=["model", "package", "state"])
        totals, loaded_sums, size_sums = {}, {}, {}
        rows = (self._model_rows or readmodel.model_rows)()
        shown = sorted(rows, key=lambda row: row["bytes"], reverse=True)[:MAX_MODEL_SERIES]
        shown_ids = {id(row) for row in shown}
        for row in rows:
            package = _loader_package(row)
            device = str(row["load_device"])
            totals[device] = totals.get(device, 0) + row["loaded_bytes"]
            named = (str(row["model"]), package) if id(row) in shown_ids else (OTHER, OTHER)
            _add(loaded_sums, (*named, device), row["loaded_bytes"])
            _add(size_sums, (*named, str(row["state"])), row["bytes"])
        for labels, nbytes in sorted(loaded_sums.items()):
            per_model.add_metric(list(labels), nbytes)
        for labels, nbytes in sorted(size_sums.items()):
            sizes.add_metric(list(labels), nbytes)
        for device, nbytes in sorted(totals.items()):
            per_device.add_metric([device], nbytes)
        yield per_device
        yield per_model
        yield sizes
        yield from self._leaks(gauge, [row for row in rows if row["state"] == "leaked"])
        live = {str(row["model_id"]) for row in rows}
        holders = self._books.holders
        for model_id in [model_id for model_id in list(holders) if model_id not in live]:
            holders.pop(model_id, None)
        held = gauge(PREFIX + "models_ram_bytes", "RAM that live models hold (their CPU-resident weights)")
        held.add_metric([], retention.held_bytes(rows))
        yield held
        rss = retention.rss_bytes()
        if rss is not None:
            process = gauge(PREFIX + "process_rss_bytes", "Resident memory of the ComfyUI process")
            process.add_metric([], rss)
            yield process
        yield from self._pins(gauge)
        yield from _host_memory(gauge)

    def _leaks(self, gauge, rows):
        """The gauges of live leaked models (``rows``: their /memx/models rows): bytes, when the newest of each kind
        was found, the ones a free left alive, and the ones a release did not give back."""
        sums = {"bytes": {}, "found": {}, "survivors": {}, "failed": {}}
        for row in rows:
            leak = row.get("leak") or {}
            holder, loader = self._holder_of(row), str(row["owner"].get("package") or "?")
            found_by = str(leak.get("found_by") or (FOUND_BY_WARNING if leak else NO_PATCHER))
            _add(sums["bytes"], (holder, loader, found_by), row["bytes"])
            if not leak:
                continue
            if isinstance(leak.get("time"), (int, float)):
                key = (holder, loader, str(leak.get("stage") or "?"), found_by)
                sums["found"][key] = max(sums["found"].get(key, 0), leak["time"])
            if self._books.survived_a_free(leak):
                _add(sums["survivors"], (holder, loader), 1)
            outcome = (row.get("release") or {}).get("last")
            if outcome in FAILED_RELEASES:
                _add(sums["failed"], (holder, str(outcome)), 1)
        families = (
            ("bytes", gauge(PREFIX + "leaked_bytes", "Weights of live leaked models, by holding and loading package "
                            "and how the leak was found", labels=["package", "loader_package", "found_by"])),
            ("found", gauge(PREFIX + "leak_found_timestamp_seconds", "When the newest live leaked model of each "
                            "holding and loading package, stage and way of finding was found (unix seconds)",
                            labels=["package", "loader_package", "stage", "found_by"])),
            ("survivors", gauge(PREFIX + "free_survivor_models", "Live leaked models that a free left alive (any "
                                "free: ComfyUI's own /free, /memx/free, idle unload, hand-off), by holding and "
                                "loading package", labels=["package", "loader_package"])),
            ("failed", gauge(PREFIX + "release_failed_models", "Live leaked models whose last release gave nothing "
                             "back, by holding package and the release's outcome", labels=["package", "outcome"])),
        )
        for name, family in families:
            for labels, value in sorted(sums[name].items()):
                family.add_metric(list(labels), value)
            yield family

    def _pins(self, gauge):
        facts = (self._pin_facts or readmodel.pin_facts)()
        pinned = gauge(PREFIX + "pinned_bytes", "Pinned (page-locked) host memory")
        pinned.add_metric([], facts.get("pinned_bytes") or 0)
        yield pinned
        cap = gauge(PREFIX + "pin_cap_bytes", "Cap on pinned host memory (0 or less: pinning off)", labels=["source"])
        if facts.get("cap_bytes") is not None:
            cap.add_metric(["comfy_memx"], facts["cap_bytes"])
        if facts.get("comfyui_cap_bytes") is not None:
            cap.add_metric(["comfyui"], facts["comfyui_cap_bytes"])
        yield cap

    def _holder_of(self, row):
        leak = row.get("leak") or {}
        return str(leak.get("holder_package") or self._books.holders.get(str(row["model_id"])) or UNKNOWN)

    def _process(self):
        gauge = self._pc.core.GaugeMetricFamily
        facts = (self._process_facts or process_facts)()
        info = gauge(PREFIX + "info", "comfy_memx is active in this process (always 1): its version and settings",
                     labels=["version", "leak_mode", "source"])
        info.add_metric([str(facts.get("version") or UNKNOWN), str(facts.get("leak_mode") or UNKNOWN),
                         str(facts.get("source") or UNKNOWN)], 1)
        yield info
        counts = {"patched": 0, "rewrapped": 0, "skipped": 0}
        skipped = gauge(PREFIX + "patch_skipped", "Patch sites that comfy_memx skipped in this process (always 1), "
                        "with why", labels=["patch", "site", "reason"])
        for site in facts.get("sites") or ():
            state = site.get("state")
            if state in counts:
                counts[state] += 1
            if state == "skipped":
                skipped.add_metric([str(site.get("patch")), str(site.get("site")), skip_reason(site.get("reason"))], 1)
        sites = gauge(PREFIX + "patch_sites", "Patch sites by state (patched; rewrapped: another pack replaced the "
                      "wrapper and comfy_memx wraps the replacement; skipped)", labels=["state"])
        for state, number in counts.items():
            sites.add_metric([state], number)
        yield sites
        yield skipped


def _loader_package(row):
    """The package a ``/memx/models`` row is charged to: the one that loaded it, else the one that built it (a model
    no sampler loaded yet), else ``?``."""
    return str(row["owner"].get("package") or (row.get("created_by") or {}).get("package") or "?")


def _add(sums, key, nbytes):
    sums[key] = sums.get(key, 0) + nbytes


def _host_memory(gauge):
    """The ``host_memory_bytes`` gauge, when the memory is known: the yardstick of the fleet's thresholds."""
    total = host_memory_bytes()
    if total is not None:
        family = gauge(PREFIX + "host_memory_bytes", "Memory the ComfyUI process may use: the host's RAM, or its "
                       "cgroup's limit when lower")
        family.add_metric([], total)
        yield family


def host_memory_bytes():
    """Bytes of memory this process may use: physical RAM, or the cgroup's memory limit when that is lower (a
    container); None where neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isascii() and text.isdigit():
            limits.append(int(text))
    limits = [limit for limit in limits if limit > 0]
    return min(limits) if limits else None


def skip_reason(reason):
    """A skipped site's reason as a short label: ``absent``, ``disabled``, ``not_imported`` or ``other``."""
    text = str(reason or "")
    if "absent" in text:
        return "absent"
    if "disabled" in text:
        return "disabled"
    if "not imported" in text:
        return "not_imported"
    return "other"


def process_facts():
    """``{"version", "leak_mode", "source", "sites"}`` of this process: comfy_memx's version, its leak mode, how it
    was activated, and every patch site with its state (sites of patches whose target is not imported yet count
    as skipped, as in the startup line)."""
    from comfy_memx.core import registry

    sites = registry.site_status()
    for name, target in list(registry.table().armed.items()):
        for site in registry.patch_of(name).sites:
            sites.append({"patch": name, "site": site, "state": "skipped", "reason": f"{target} not imported"})
    return {"version": __version__, "leak_mode": STATE.config.leak_mode, "source": STATE.source, "sites": sites}


def _package(event):
    owner = event.get("owner")
    return str(owner.get("package") or "?") if isinstance(owner, dict) else "?"


def _origin(origin):
    """The origin of a free request as a label: its route or ``via`` (``/memx/free``, ``idle_unload``), else kind."""
    if isinstance(origin, dict):
        return str(origin.get("route") or origin.get("via") or origin.get("kind") or UNKNOWN)
    return UNKNOWN


class MetricsPart:
    """The metrics of this process (a part of the process state): the installed :class:`Metrics`, the event log
    that feeds them, and whether "metrics off" was said already."""

    def __init__(self):
        self.metrics = None
        self.events = None
        self.said_unavailable = False

    def observe(self, event):
        """Event subscriber: feed one event to the installed metrics."""
        if self.metrics is not None:
            self.metrics.observe(event)

    def unsubscribe(self):
        """Stop receiving events."""
        if self.events is not None:
            self.events.unsubscribe(self.observe)
            self.events = None

    def close(self):
        """Unsubscribe and forget the metrics (reset of the process state)."""
        self.unsubscribe()
        self.metrics = None


def install():
    """Create the process's :class:`Metrics` and subscribe it to ``STATE.events``; returns it, or None when
    prometheus_client is missing (the /metrics route then answers 501 with :data:`INSTALL_HINT`)."""
    part = STATE.part(MetricsPart)
    if part.metrics is None:
        try:
            part.metrics = Metrics()
        except MetricsUnavailable as exc:
            if not part.said_unavailable:
                part.said_unavailable = True
                log.debug("comfy_memx: metrics off (%s)", exc)
            return None
    if part.events is not STATE.events:
        part.unsubscribe()
        part.events = STATE.events
        part.events.subscribe(part.observe)
    return part.metrics


def installed():
    """The installed :class:`Metrics` or None."""
    part = STATE.existing_part(MetricsPart)
    return part.metrics if part is not None else None


def uninstall():
    """Unsubscribe and forget the installed metrics (unpatch, tests)."""
    part = STATE.existing_part(MetricsPart)
    if part is not None:
        part.close()

