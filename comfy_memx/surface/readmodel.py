"""The read-model of comfy_memx's production surface: what ``/memx/models``, the metrics and the receipts show.

Plain functions over the ledger and ComfyUI's own figures (attribute reads only, no heap walk), shared by
``routes``, ``metrics`` and ``freeing`` so that each surface shows the same numbers.  It reads the other wings
through their doors only (``ledger.api``, ``leaks.api``, ``pins.api``).  Answers hold names and numbers, never
objects (``routekit.replies.clip`` makes every answer JSON-safe).
"""

import sys

from comfy_memx.core.state import STATE
from comfy_memx.leaks import api as leaks
from comfy_memx.ledger import api as ledger
from comfy_memx.pins import api as pins


def model_rows(model_management=None):
    """One dict per live model in the ledger: identity, bytes by device, pinned bytes, owner, times, leak state.

    ``state`` is ``loaded`` (weights on the load device), ``offloaded`` (a ModelPatcher still refers to it),
    ``built`` (ComfyUI built it and never loaded it: a loader's output that no sampler used yet) or ``leaked`` (a
    leak record exists: ComfyUI warned about it, or ``leaks.unwarned`` found it held after a free or an unload, and
    ComfyUI does not use it again now: a leaked model that a running prompt loaded again shows
    ``loaded``/``offloaded`` and no possible release while that prompt runs; or no ModelPatcher refers to it any
    more).  ``created_by`` is who built it (the owner's keys; null when unknown).  Attribute reads only.
    """
    mm = model_management if model_management is not None else sys.modules.get("comfy.model_management")
    listed = listed_modules(mm)
    rows = []
    for record in STATE.ledger.records():
        row = model_row(record, mm, listed)
        if row is not None:
            rows.append(row)
    return rows


def model_row(record, mm, listed):
    """The row of one ledger record (see :func:`model_rows`), or None once its module died; ``mm`` is ComfyUI's
    model_management (or None) and ``listed`` what :func:`listed_modules` returned for it.  One row at a time, so
    that ``surface.answers`` rebuilds only the rows that changed."""
    module = record.module_ref()
    if module is None:
        return None
    try:
        return _row(record, module, mm, listed)
    finally:
        del module


def listed_modules(mm):
    """The ids of the torch modules that ComfyUI's ``current_loaded_models`` lists (a row's
    ``in_comfyui_loaded_list``)."""
    listed = set()
    for entry in list(getattr(mm, "current_loaded_models", ()) if mm is not None else ()):
        module = entry.real_model() if entry.real_model is not None else None
        if module is not None:   # a dead patcher's entry (ComfyUI warns about it) is still in the list
            listed.add(id(module))
        del module
    return listed


def _row(record, module, mm, listed):
    patcher = record.live_patcher()
    if patcher is not None:
        loaded = int(patcher.loaded_size() or 0)
        size = int(record.model_bytes or patcher.model_size() or 0)
        load_device, offload_device = str(patcher.load_device), str(patcher.offload_device)
    else:
        loaded = int(getattr(module, "model_loaded_weight_memory", 0) or 0)
        size = int(record.model_bytes or 0)
        load_device, offload_device = str(record.device), _parameter_device(module)
    by_device = {}
    for device, nbytes in ((load_device, loaded), (offload_device, size - loaded)):
        if nbytes > 0:
            by_device[device] = by_device.get(device, 0) + nbytes
    busy = leaks.in_comfyui_use(record, module, mm) if record.leak is not None else None
    if (record.leak is not None and busy is None) or patcher is None:
        state = "leaked"
    elif loaded > 0:   # a leak that a running prompt loaded again is in use while that prompt runs
        state = "loaded"
    else:
        state = "offloaded" if record.loads or record.unloads or id(module) in listed else "built"
    last = record.unloads[-1] if record.unloads else None
    return {"model": record.model, "model_id": record.model_id, "state": state, "bytes": size,
            "loaded_bytes": loaded, "load_device": load_device, "bytes_by_device": by_device,
            "pinned_bytes": _pinned_bytes(record, patcher, mm), "owner": record.owner._asdict(),
            "created_by": created_by(record), "created_at": record.created_at, "loaded_at": record.loaded_at,
            "last_used": record.last_used, "loads": record.loads, "unloads": len(record.unloads),
            "last_unload": {k: last.get(k) for k in ("reason", "requested_by", "bytes", "time")} if last else None,
            **ledger.reload_view(record),
            "in_comfyui_loaded_list": id(module) in listed, "leak": leaks.public_state(record.leak),
            "searched": leaks.search_gate().last_search(record), "release": release_view(record, busy)}


def created_by(record):
    """Who built ``record``'s model (``prompt_id``, ``node_id``, ``class_type``, ``package``, ``via``), or None when
    comfy_memx did not see it built (activated later, or the ``model_patcher`` patch is off)."""
    owner = record.created_by
    return owner._asdict() if owner is not None else None


def release_view(record, busy=None):
    """What a release of this model would do (``leaks.release``): None for a model that is not a rooted leak, else
    ``{"policy", "possible", "why", "path", "last"}`` (``last``: the outcome of the last release tried, or None).
    ``busy`` says why ComfyUI uses the model now (``in_use``): no release is possible while it does."""
    leak = record.leak
    if leak is None or leak.get("stage") != "rooted":
        return None
    view = leaks.releasable_now(leak.get("referrers") or (), record.holder_steps)
    policy = STATE.config.release
    if policy == "off":
        view.update(possible=False, why="release is off (COMFY_MEMX_RELEASE=off; ask or auto turn it on)")
    elif busy is not None:
        view.update(possible=False, why=f"in use: {busy}")
    return {"policy": policy, **view, "last": leak.get("release")}


def in_use(record, mm):
    """Why ComfyUI uses ``record``'s model now (a sentence: its loaded list holds it with a live ModelPatcher, or a
    running prompt loaded it, again), or None; such a model is neither leaked nor releasable while it does."""
    module = record.module_ref()
    if module is None:
        return None
    try:
        return leaks.in_comfyui_use(record, module, mm)
    finally:
        del module


def _parameter_device(module):
    parameters = getattr(module, "parameters", None)
    try:
        first = next(iter(parameters()), None) if parameters is not None else None
    except Exception:
        first = None
    return str(first.device) if first is not None else "unknown"


def _pinned_bytes(record, patcher, mm):
    budget = pins.budget()
    if budget is not None:
        return int(budget.pinned(record.model_id))
    if patcher is None:
        return 0
    total = 0
    try:
        total += int(patcher.pinned_memory_size() or 0) if hasattr(patcher, "pinned_memory_size") else 0
    except Exception:  # a dynamic patcher without pins for its device raises inside ComfyUI's accessor
        pass
    table = getattr(mm, "PINNED_MEMORY", None)
    if table:
        for key in list(getattr(patcher, "pinned", ()) or ()):
            weight = _attribute_path(patcher.model, key)
            pointer = getattr(weight, "data_ptr", None)
            if pointer is not None:
                total += int(table.get(pointer(), 0))
    return total


def _attribute_path(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def pin_facts(model_management=None):
    """``{"pinned_bytes", "cap_bytes", "comfyui_cap_bytes"}``: pinned host memory now, comfy_memx's cap in force
    (None when comfy_memx does not budget pins) and ComfyUI's own ``MAX_PINNED_MEMORY`` (None before 0.27.0)."""
    mm = model_management if model_management is not None else sys.modules.get("comfy.model_management")
    cap = pins.cap()
    comfyui_cap = pins.comfyui_max()
    if comfyui_cap is None and mm is not None:
        comfyui_cap = getattr(mm, "MAX_PINNED_MEMORY", None)
    pinned = getattr(mm, "TOTAL_PINNED_MEMORY", 0) if mm is not None else 0
    return {"pinned_bytes": int(pinned or 0), "cap_bytes": cap.bytes if cap is not None else None,
            "comfyui_cap_bytes": int(comfyui_cap) if comfyui_cap is not None else None}


def still_loaded(model_management=None):
    """[{model, model_id, loaded_bytes, device}] of what ComfyUI's ``current_loaded_models`` holds with a patcher."""
    mm = model_management if model_management is not None else sys.modules.get("comfy.model_management")
    rows = []
    if mm is None:
        return rows
    for entry in list(getattr(mm, "current_loaded_models", ())):
        patcher = entry.model
        module = entry.real_model() if entry.real_model is not None else None
        if patcher is not None and module is not None:
            record = STATE.ledger.record_for(module)
            rows.append({"model": record.model, "model_id": record.model_id,
                         "loaded_bytes": int(patcher.loaded_size()), "device": str(getattr(entry, "device", None))})
        del patcher, module
    return rows
