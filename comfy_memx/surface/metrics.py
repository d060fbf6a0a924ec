"""Prometheus metrics of model memory, in a registry of comfy_memx's own (nothing global is touched).

Counters and histograms are fed by ``STATE.events`` (``load``, ``unload``, ``leak``, ``pin_evict``,
``pin_refused``); gauges are read at scrape time from the ledger and ComfyUI's own figures, so a model that is gone
disappears from them.  Every name starts with ``comfy_memx_``:

=========================================  =========  =========================================================
name                                       type       labels
=========================================  =========  =========================================================
comfy_memx_loaded_bytes                    gauge      device: weights loaded on each load device
comfy_memx_model_loaded_bytes              gauge      model, model_id, package, device
comfy_memx_model_bytes                     gauge      model, model_id, package, state (loaded/offloaded/leaked)
comfy_memx_pinned_bytes                    gauge      -: pinned host memory (ComfyUI's TOTAL_PINNED_MEMORY)
comfy_memx_pin_cap_bytes                   gauge      source: comfy_memx (the cap in force), comfyui (its own)
comfy_memx_loads_total                     counter    package
comfy_memx_load_bytes_total                counter    package
comfy_memx_unloads_total                   counter    reason, package
comfy_memx_unload_bytes_total              counter    reason
comfy_memx_leaks_total                     counter    package, stage (once per leaked model)
comfy_memx_leak_sightings_total            counter    package: later prompts that saw a known leak again
comfy_memx_leak_searches_total             counter    reason (new, holders_changed, deferred)
comfy_memx_reloads_total                   counter    model, cause_package: reloads charged to an unload's cause
comfy_memx_reload_seconds_total            counter    model, cause_package
comfy_memx_models_ram_bytes                gauge      -: RAM held by live models (their CPU-resident weights)
comfy_memx_process_rss_bytes               gauge      -: resident memory of the ComfyUI process
comfy_memx_trim_returned_bytes_total       counter    -: bytes malloc_trim returned after /memx/free
comfy_memx_last_free_bytes                 gauge      kind: allocator_retained, held_by_models, rss_after
comfy_memx_pin_evictions_total             counter    reason
comfy_memx_pin_evicted_bytes_total         counter    reason
comfy_memx_pin_refusals_total              counter    reason
comfy_memx_load_seconds                    histogram  -
comfy_memx_offload_seconds                 histogram  -
=========================================  =========  =========================================================

``prometheus_client`` is an optional extra (``pip install comfy_memx[metrics]``), imported when metrics are
installed, never at import of this module.
"""

import logging

from comfy_memx.core.errors import MemxError
from comfy_memx.core.state import STATE
from comfy_memx.surface import readmodel, retention

log = logging.getLogger("comfy_memx")

PREFIX = "comfy_memx_"
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
INSTALL_HINT = "pip install prometheus_client  (or: pip install comfy_memx[metrics])"



class MetricsUnavailable(MemxError):
    """prometheus_client is not installed; the message says how to install it."""


def _prometheus():
    try:
        import prometheus_client
        import prometheus_client.core  # noqa: F401  (GaugeMetricFamily for the scrape-time gauges)
    except ImportError:
        raise MetricsUnavailable(f"prometheus_client is not installed; {INSTALL_HINT}") from None
    return prometheus_client


class Metrics:
    """The metric objects, their private registry, and the event handler that feeds them.

    Raises :class:`MetricsUnavailable` without prometheus_client.  ``model_rows`` (a callable returning
    /memx/models rows) and ``pin_facts`` (a callable returning ``{"pinned_bytes", "cap_bytes",
    "comfyui_cap_bytes"}``) feed the scrape-time gauges; tests pass their own.
    """

    def __init__(self, model_rows=None, pin_facts=None):
        pc = _prometheus()
        self._pc = pc
        self.registry = pc.CollectorRegistry(auto_describe=True)
        counter = self._counter
        self.loads = counter("loads", "Model loads that moved bytes onto a device", ["package"])
        self.load_bytes = counter("load_bytes", "Bytes moved onto devices by model loads", ["package"])
        self.unloads = counter("unloads", "Model unloads by reason", ["reason", "package"])
        self.unload_bytes = counter("unload_bytes", "Bytes freed on devices by model unloads", ["reason"])
        self.leaks = counter("leaks", "Leaked models reported after ComfyUI's leak warning (once per model)",
                             ["package", "stage"])
        self.leak_sightings = counter("leak_sightings", "Prompts in which ComfyUI warned again about a known leak",
                                      ["package"])
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
        self.last_free = pc.Gauge(PREFIX + "last_free_bytes", "Memory figures of the last /memx/free",
                                  ["kind"], registry=self.registry)
        self.load_seconds = pc.Histogram(PREFIX + "load_seconds", "Seconds per model load that moved bytes",
                                         buckets=SECONDS_BUCKETS, registry=self.registry)
        self.offload_seconds = pc.Histogram(PREFIX + "offload_seconds", "Seconds per model unload (offload)",
                                            buckets=SECONDS_BUCKETS, registry=self.registry)
        self.registry.register(_StateCollector(pc, model_rows, pin_facts))

    def _counter(self, name, documentation, labels):
        return self._pc.Counter(PREFIX + name, documentation, labels, registry=self.registry)

    def observe(self, event):
        """Update the counters and histograms from one comfy_memx event (unknown events are ignored)."""
        kind = event.get("event")
        if kind == "load":
            reload = event.get("reload")
            if isinstance(reload, dict):
                labels = (str(event.get("model") or "?"), str(reload.get("package") or "?"))
                self.reloads.labels(*labels).inc()
                self.reload_seconds.labels(*labels).inc(max(0.0, reload.get("seconds") or 0.0))
            package = _package(event)
            self.loads.labels(package).inc()
            self.load_bytes.labels(package).inc(max(0, event.get("bytes") or 0))
            if event.get("seconds") is not None:
                self.load_seconds.observe(event["seconds"])
        elif kind == "unload":
            reason = str(event.get("reason") or "other")
            self.unloads.labels(reason, _package(event)).inc()
            self.unload_bytes.labels(reason).inc(max(0, event.get("bytes") or 0))
            if event.get("seconds") is not None:
                self.offload_seconds.observe(event["seconds"])
        elif kind == "leak":
            if event.get("reason", "new") == "new":
                self.leaks.labels(_package(event), str(event.get("stage") or "?")).inc()
            search = event.get("search") or {}
            if "seconds" in search:
                self.leak_searches.labels(str(event.get("reason") or "new")).inc()
        elif kind == "leak_seen":
            self.leak_sightings.labels(_package(event)).inc()
        elif kind == "pin_evict":
            reason = str(event.get("reason") or "?")
            self.pin_evictions.labels(reason).inc()
            self.pin_evicted_bytes.labels(reason).inc(max(0, event.get("bytes") or 0))
        elif kind == "pin_refused":
            self.pin_refusals.labels(str(event.get("reason") or "?")).inc()
        elif kind == "free":
            memory = event.get("memory") or {}
            returned = (memory.get("trim") or {}).get("returned_bytes")
            if returned is not None:
                self.trim_returned.inc(max(0, returned))
                self.last_free.labels("allocator_retained").set(returned)
            if memory.get("held_bytes") is not None:
                self.last_free.labels("held_by_models").set(memory["held_bytes"])
            if memory.get("rss_after_trim") or memory.get("rss_after"):
                self.last_free.labels("rss_after").set(memory.get("rss_after_trim") or memory["rss_after"])

    def exposition(self):
        """``(body bytes, content type)`` of the Prometheus text format."""
        return self._pc.generate_latest(self.registry), self._pc.CONTENT_TYPE_LATEST


class _StateCollector:
    """Scrape-time gauges from the ledger and ComfyUI's pinned-memory figures."""

    def __init__(self, pc, model_rows, pin_facts):
        self._pc, self._model_rows, self._pin_facts = pc, model_rows, pin_facts

    def describe(self):
        return []

    def collect(self):
        gauge = self._pc.core.GaugeMetricFamily
        per_device = gauge(PREFIX + "loaded_bytes", "Model weights loaded on each load device", labels=["device"])
        per_model = gauge(PREFIX + "model_loaded_bytes", "Weights of one model loaded on its load device",
                          labels=["model", "model_id", "package", "device"])
        sizes = gauge(PREFIX + "model_bytes", "Weights of one model, wherever they are",
                      labels=["model", "model_id", "package", "state"])
        totals = {}
        rows = (self._model_rows or readmodel.model_rows)()
        for row in rows:
            package = str(row["owner"].get("package") or "?")
            device = str(row["load_device"])
            totals[device] = totals.get(device, 0) + row["loaded_bytes"]
            per_model.add_metric([row["model"], row["model_id"], package, device], row["loaded_bytes"])
            sizes.add_metric([row["model"], row["model_id"], package, row["state"]], row["bytes"])
        for device, nbytes in sorted(totals.items()):
            per_device.add_metric([device], nbytes)
        yield per_device
        yield per_model
        yield sizes
        held = gauge(PREFIX + "models_ram_bytes", "RAM that live models hold (their CPU-resident weights)")
        held.add_metric([], retention.held_bytes(rows))
        yield held
        rss = retention.rss_bytes()
        if rss is not None:
            process = gauge(PREFIX + "process_rss_bytes", "Resident memory of the ComfyUI process")
            process.add_metric([], rss)
            yield process
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


def _package(event):
    owner = event.get("owner")
    return str(owner.get("package") or "?") if isinstance(owner, dict) else "?"


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

