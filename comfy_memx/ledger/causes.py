"""Why a model was unloaded, and what reloading it cost: ``requested_by`` for every unload, reloads and thrash.

Every unload names who asked for it (``requested_by``), found from the frame that entered the outermost unload
scope (``unload_all_models``, ``free_memory``, ``unload_model_and_clones``) or that called ``model_unload``
directly, as loads are attributed:

* ``{"kind": "node", prompt_id, node_id, class_type, package}``: code of a custom-node package asked (a pack's
  "unload all models" node, a ``free_memory(1e30, ...)`` call, an entry removed from ``current_loaded_models``);
* ``{"kind": "load", "models": [...], "node": {...}}``: memory pressure, or a clone replacement, while
  ``load_models_gpu`` made room for (or loaded) these models for this node;
* ``{"kind": "http", "route": "/memx/free", "clients": [...]}``: a ``/memx/free`` request served by the worker run;
* ``{"kind": "node", "via": "PromptQueue.set_flag", ..., package}``: ComfyUI's worker served free flags that a
  custom-node package's code set (:func:`note_flag_set`);
* ``{"kind": "comfyui", "via": ...}``: ComfyUI itself (its prompt worker for POST ``/free`` or an OOM, the executor
  for ``--disable-smart-memory``), with the node context when there is one.

When a model whose bytes were unloaded is loaded again, the load is a *reload*: its seconds and bytes are charged
to the cause of the unload that preceded it, on the ledger record (``reloads``, ``reload_seconds``, per cause) and
in the ``load`` event (``reload``).  A model reloaded in each of the last ``COMFY_MEMX_THRASH_PROMPTS`` prompts
gets one ``thrash`` warning line (and event) per prompt.  Everything here is bounded by the number of models and
of distinct causes, never by prompts.
"""

import collections
import logging
import sys

from comfy_memx.core import pairs, signals
from comfy_memx.core.state import STATE
from comfy_memx.ledger import attribution

log = logging.getLogger("comfy_memx")
MAX_MODELS_NAMED = 4


class ReloadBook:
    """The prompts this process executed most recently (a part of the process state), for the thrash rule."""

    def __init__(self):
        self.recent_prompts = collections.deque(maxlen=max(1, STATE.config.thrash_prompts))

    def note_prompt(self, prompt_id):
        """A prompt starts executing."""
        if not self.recent_prompts or self.recent_prompts[-1] != prompt_id:
            self.recent_prompts.append(prompt_id)


def note_prompt(prompt_id):
    """Called when a prompt starts (the execution patch): keeps the window of recent prompts."""
    STATE.part(ReloadBook).note_prompt(prompt_id)


class FlagSetters:
    """Who set each of ComfyUI's free flags last, when it was a custom-node package's code (a part of the process
    state): ComfyUI's worker serves the flags later, on its own thread, with no trace of who set them."""

    def __init__(self):
        self.by_flag = {}   # flag name -> the requester that set it and that no worker served yet
        self.served = {}    # the flags the worker read last, with their pack requesters (its unloads use them)


FREE_FLAGS = ("unload_models", "free_memory")


def note_flag_set(name, frame):
    """``PromptQueue.set_flag(name, ...)`` is called from ``frame``: remember a pack that sets a free flag (a pack's
    RAM monitor, say), or forget the last one when someone else sets it."""
    if name not in FREE_FLAGS:
        return
    kind, package = attribution.caller_on_stack(frame)
    setters = STATE.part(FlagSetters).by_flag
    if kind != "package":
        setters.pop(name, None)
        return
    prompt_id, node_id, class_type = attribution.node_context()
    setters[name] = {"kind": "node", "via": "PromptQueue.set_flag", "prompt_id": prompt_id, "node_id": node_id,
                     "class_type": class_type, "package": package}


def flags_served(flags):
    """ComfyUI's worker read (and reset) the free flags ``flags``: the unloads it runs now are charged to the packs
    that set them, if any."""
    setters = STATE.existing_part(FlagSetters)
    if setters is None:
        return
    served = {}
    for name in FREE_FLAGS:
        setter = setters.by_flag.pop(name, None)
        if setter is not None and isinstance(flags, dict) and flags.get(name):
            served[name] = setter
    setters.served = served


def _flag_setter():
    setters = STATE.existing_part(FlagSetters)
    if setters is None:
        return None
    found = setters.served.get("unload_models") or setters.served.get("free_memory")
    return dict(found) if found is not None else None


def requested_by(reason, frame, load_call):
    """Who asked for an unload of ``reason`` whose scope was entered from ``frame`` (see the module docstring)."""
    found = signals.unload_requester.ask(reason)
    if found is not None:
        return found
    if reason == "free_request":
        setter = _flag_setter()
        if setter is not None:
            return setter
    if load_call is not None and reason in ("memory_pressure", "clone_replaced"):
        return _load_requester(load_call)
    kind, package = attribution.caller_on_stack(frame)
    prompt_id, node_id, class_type = attribution.node_context()
    if kind == "package":
        return {"kind": "node", "prompt_id": prompt_id, "node_id": node_id, "class_type": class_type,
                "package": package}
    via = "prompt_worker" if kind == "worker" else _module_of(frame)
    return {"kind": "comfyui", "via": via, "prompt_id": prompt_id, "node_id": node_id, "class_type": class_type}


def node_requester(prompt_id, node_id, node):
    """``requested_by`` of node ``node_id`` (the object ``node``) of ``prompt_id``: its package's, or ComfyUI's for
    a core node."""
    module = sys.modules.get(type(node).__module__)
    package = attribution.package_of_file(getattr(module, "__file__", None) or "")
    owner = attribution.current_owner()
    class_type = owner.class_type if str(owner.node_id) == str(node_id) else type(node).__name__
    if package is None:
        return {"kind": "comfyui", "via": "node", "prompt_id": prompt_id, "node_id": str(node_id),
                "class_type": class_type}
    return {"kind": "node", "prompt_id": prompt_id, "node_id": str(node_id), "class_type": class_type,
            "package": package}


def _load_requester(load_call):
    models = []
    for patcher in pairs.subjects(load_call)[:MAX_MODELS_NAMED]:
        module = getattr(patcher, "model", None)
        if module is None:
            continue
        record = STATE.ledger.record_for(module)
        try:
            size = int(patcher.model_size())
        except Exception:
            size = None
        models.append({"model": record.model, "model_id": record.model_id, "bytes": size})
        del module
    node = attribution.current_owner(pairs.caller(load_call))
    return {"kind": "load", "models": models, "node": node._asdict()}


def _module_of(frame):
    while frame is not None:
        name = frame.f_globals.get("__name__", "") if isinstance(frame.f_globals, dict) else ""
        if not name.startswith("comfy_memx"):
            return name or "?"
        frame = frame.f_back
    return "?"


def cause_label(requested, reason):
    """A short text for a cause, as reports group by it: ``ComfyUI-Unload-Model/UnloadAllModels``,
    ``core/KSampler loading SDXL``, ``POST /memx/free``, ``comfyui (free_request)``."""
    kind = requested.get("kind")
    if kind == "node":
        return f"{requested.get('package')}/{requested.get('class_type') or requested.get('node_id') or '?'}"
    if kind == "load":
        node = requested.get("node") or {}
        loading = ", ".join(m["model"] for m in requested.get("models") or ()) or "?"
        return f"{node.get('package') or '?'}/{node.get('class_type') or '?'} loading {loading}"
    if kind == "http":
        return f"POST {requested.get('route')}"
    return f"comfyui ({reason})"


def cause_package(requested):
    """The package a cause is charged to in metrics: the node's package, ``comfyui`` or ``http``."""
    kind = requested.get("kind")
    if kind == "node":
        return requested.get("package") or "?"
    if kind == "load":
        return (requested.get("node") or {}).get("package") or "?"
    return "http" if kind == "http" else "comfyui"


def on_unloaded(record, reason, requested, freed, when):
    """Remember the cause of an unload that moved bytes off the device at ``when`` (a later load of them is a
    reload)."""
    if freed > 0:
        record.last_unload_cause = {"reason": reason, "requested_by": requested, "time": when}


def on_loaded(record, moved, seconds):
    """Charge a load that moved bytes to the unload before it, if any; returns the ``reload`` event field."""
    cause = record.last_unload_cause
    if cause is None or moved <= 0:
        return None
    record.last_unload_cause = None
    label = cause_label(cause["requested_by"], cause["reason"])
    record.reloads += 1
    record.reload_seconds += seconds
    record.reload_bytes += moved
    tally = record.reload_causes.setdefault(label, {"reloads": 0, "seconds": 0.0, "bytes": 0,
                                                    "package": cause_package(cause["requested_by"]),
                                                    "reason": cause["reason"]})
    tally["reloads"] += 1
    tally["seconds"] += seconds
    tally["bytes"] += moved
    reload = {"cause": label, "package": tally["package"], "reason": cause["reason"],
              "requested_by": cause["requested_by"], "unloaded_at": cause["time"], "seconds": round(seconds, 6),
              "bytes": moved}
    _check_thrash(record, label)
    return reload


def _check_thrash(record, label):
    window = STATE.config.thrash_prompts
    prompt_id = attribution.current_prompt_id()
    if window <= 0 or prompt_id is None:
        return
    prompts = record.reload_prompts
    if prompts.maxlen != window:
        prompts = record.reload_prompts = collections.deque(prompts, maxlen=window)
    if not prompts or prompts[-1] != prompt_id:
        prompts.append(prompt_id)
    recent = list(STATE.part(ReloadBook).recent_prompts)[-window:]
    if len(recent) < window or list(prompts) != recent or record.thrash_warned == prompt_id:
        return
    record.thrash_warned = prompt_id
    log.warning("comfy_memx: thrash: %s (%s) was reloaded in each of the last %d prompts (%d reloads, %.1f s in "
                "all); the last unload was asked for by %s", record.model, record.model_id, window, record.reloads,
                record.reload_seconds, label)
    STATE.events.emit("thrash", model=record.model, model_id=record.model_id, prompts=recent,
                      reloads=record.reloads, reload_seconds=round(record.reload_seconds, 6), cause=label)


def reload_view(record):
    """The reload figures of a record as the surfaces show them."""
    causes = sorted(record.reload_causes.items(), key=lambda item: -item[1]["seconds"])
    return {"reloads": record.reloads, "reload_seconds": round(record.reload_seconds, 6),
            "reload_bytes": record.reload_bytes,
            "reload_causes": [{"cause": label, **{k: (round(v, 6) if isinstance(v, float) else v)
                                                  for k, v in tally.items()}} for label, tally in causes]}
