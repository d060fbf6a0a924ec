"""The ownership ledger: one record per torch module ComfyUI loaded, held by weakref only.

comfy_memx must never be the reason a model stays in memory, so a record keeps a ``weakref.ref`` to the module and a
``WeakSet`` of the ModelPatchers seen with it, and disappears by itself when the module is collected.  Records carry
identity (class name, a stable ``model_id``), the owner at load time, resident bytes, the last unloads and the leak
state; they never hold tensors, patchers or the module.  Patchers are kept in a plain ``{id: weakref}`` dict rather
than a WeakSet: adding a known patcher is then one dict lookup, and counting them costs no iteration guard.
"""

import collections
import itertools
import threading
import time
import weakref

from comfy_memx.attribution import Owner

UNLOADS_KEPT = 16


class ModelRecord:
    """What comfy_memx knows about one torch module."""
    __slots__ = ("model_id", "model", "module_ref", "patcher_id", "model_bytes", "device", "owner", "loaded_bytes",
                 "loaded_at", "last_used", "loads", "unloads", "patchers", "leak", "__weakref__")

    def __init__(self, model_id, module_ref, class_name):
        self.model_id = model_id
        self.model = class_name
        self.module_ref = module_ref
        self.patcher_id = None
        self.model_bytes = 0
        self.device = None
        self.owner = Owner()
        self.loaded_bytes = 0
        self.loaded_at = None
        self.last_used = None
        self.loads = 0
        self.unloads = collections.deque(maxlen=UNLOADS_KEPT)
        self.patchers = {}  # id(patcher) -> weakref.ref(patcher), pruned when a patcher dies
        self.leak = None  # None, or {"stage": ..., "prompt_id": ..., "time": ...}

    @property
    def alive(self):
        """True while the torch module exists."""
        return self.module_ref() is not None

    def add_patcher(self, patcher):
        """Remember (weakly) a ModelPatcher seen with this module."""
        key = id(patcher)
        if key not in self.patchers:
            patchers = self.patchers
            self.patchers[key] = weakref.ref(patcher, lambda _dead: patchers.pop(key, None))

    def live_patchers(self):
        """How many ModelPatchers seen by comfy_memx still reference this module (ComfyUI's own holders)."""
        module = self.module_ref()
        count = 0
        for ref in list(self.patchers.values()):
            patcher = ref()
            if patcher is not None and getattr(patcher, "model", None) is module:
                count += 1
        return count

    def touch(self):
        """Mark the model as used now."""
        self.last_used = time.time()

    def to_json(self):
        """A JSON-ready summary (no object references)."""
        return {"model": self.model, "model_id": self.model_id, "patcher_id": self.patcher_id,
                "bytes": self.model_bytes, "loaded_bytes": self.loaded_bytes, "device": self.device,
                "owner": self.owner._asdict(), "loaded_at": self.loaded_at, "last_used": self.last_used,
                "loads": self.loads, "unloads": list(self.unloads), "leak": self.leak, "alive": self.alive}


class Ledger:
    """All :class:`ModelRecord` objects of this process, keyed by the module's id while the module lives."""

    def __init__(self):
        self._records = {}
        self._lock = threading.Lock()
        self._numbers = collections.defaultdict(itertools.count)

    def record_for(self, module):
        """The record of ``module``, created on first sight (stable ``model_id`` = class name + '#' + number)."""
        key = id(module)
        record = self._records.get(key)
        if record is not None and record.module_ref() is module:
            return record
        with self._lock:
            record = self._records.get(key)
            if record is not None and record.module_ref() is module:
                return record
            class_name = type(module).__name__
            ref = weakref.ref(module, lambda dead, key=key: self._forget(key, dead))
            record = ModelRecord(f"{class_name}#{next(self._numbers[class_name]) + 1}", ref, class_name)
            self._records[key] = record
            return record

    def find(self, module):
        """The record of ``module`` or None; never creates one."""
        record = self._records.get(id(module))
        return record if record is not None and record.module_ref() is module else None

    def records(self):
        """A snapshot list of the records of live modules, most recently used first."""
        records = [r for r in list(self._records.values()) if r.alive]
        return sorted(records, key=lambda r: r.last_used or 0, reverse=True)

    def containers(self):
        """The ledger's own containers, for holder searches to ignore."""
        return [self._records, self]

    def _forget(self, key, dead_ref):
        with self._lock:
            record = self._records.get(key)
            if record is not None and record.module_ref is dead_ref:
                del self._records[key]

    def __len__(self):
        return sum(1 for r in list(self._records.values()) if r.alive)
