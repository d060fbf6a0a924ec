"""The ownership ledger: one record per torch module ComfyUI built or loaded, held by weakref only.

comfy_memx must never be the reason a model stays in memory, so a record keeps a ``weakref.ref`` to the module and
``{id: weakref}`` of the ModelPatchers seen with it, and is dropped once the module is collected.  Records carry
identity (class name, a stable ``model_id``), who built it and when (``created_by``, ``created_at``: a model enters
the ledger when ComfyUI builds its first ModelPatcher, see ``ledger.creation``), the owner at load time, resident
bytes, the last unloads and the leak state; they never hold tensors, patchers or the module.

Lock rule (docs/architecture.md, "Threads and locks"): a weakref callback can run inside any allocation, on any
thread, while that thread holds whatever lock it holds.  So the callbacks here take no lock: a module's death only
appends to a deque (atomic), and the entries are purged by the next :meth:`Ledger.record_for` or
:meth:`Ledger.records`, under a lock that no callback ever takes.
"""

import collections
import itertools
import threading
import time
import weakref

from comfy_memx.core.state import STATE
from comfy_memx.ledger.attribution import Owner

UNLOADS_KEPT = 16


class ModelRecord:
    """What comfy_memx knows about one torch module."""
    __slots__ = ("model_id", "model", "module_ref", "patcher_id", "model_bytes", "device", "copies", "owner", "loaded_bytes",
                 "loaded_at", "last_used", "loads", "unloads", "patchers", "leak", "last_unload_cause", "reloads",
                 "reload_seconds", "reload_bytes", "reload_causes", "reload_prompts", "thrash_warned",
                 "unload_seq", "holder_steps", "created_by", "created_at", "__weakref__")

    def __init__(self, model_id, module_ref, class_name):
        self.model_id = model_id
        self.model = class_name
        self.module_ref = module_ref
        self.patcher_id = None
        self.model_bytes = 0
        self.device = None
        self.copies = None      # False when its last load had one device for load and offload (see accounting)
        self.owner = Owner()
        self.loaded_bytes = 0
        self.loaded_at = None
        self.last_used = None
        self.loads = 0
        self.unloads = collections.deque(maxlen=UNLOADS_KEPT)
        self.patchers = {}  # id(patcher) -> weakref.ref(patcher), pruned when a patcher dies
        self.leak = None    # None, or the leak state kept by comfy_memx.leaks.watch (a plain dict)
        self.last_unload_cause = None   # the cause of the last unload that moved bytes (comfy_memx.ledger.causes)
        self.reloads = 0
        self.reload_seconds = 0.0
        self.reload_bytes = 0
        self.reload_causes = {}         # cause label -> tally; bounded by the distinct causes
        self.reload_prompts = collections.deque(maxlen=3)
        self.thrash_warned = None
        self.unload_seq = -1            # the number of its last reported unload (see accounting.entries_snapshot)
        self.holder_steps = {}          # holder path -> its steps (leaks.holders.steps), from the last search
        self.created_by = None          # the Owner of the node run that built it (ledger.creation), None if unknown
        self.created_at = None          # when it was built (time.time()), None if unknown

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

    def live_patcher(self):
        """One ModelPatcher seen with this module that still refers to it, or None."""
        module = self.module_ref()
        for ref in list(self.patchers.values()):
            patcher = ref()
            if patcher is not None and getattr(patcher, "model", None) is module:
                return patcher
        return None

    def touch(self):
        """Mark the model as used now."""
        self.last_used = time.time()


class Ledger:
    """All :class:`ModelRecord` objects of this process, keyed by the module's id while the module lives."""

    def __init__(self):
        self._records = {}
        self._dead = collections.deque()  # (key, dead weakref) appended by weakref callbacks, purged under _lock
        self._lock = threading.Lock()     # never taken by a callback: see the module docstring
        self._numbers = collections.defaultdict(itertools.count)
        self._unload_numbers = itertools.count()

    def record_for(self, module):
        """The record of ``module``, created on first sight (stable ``model_id`` = class name + '#' + number)."""
        key = id(module)
        record = self._records.get(key)
        if record is not None and record.module_ref() is module:
            return record
        with self._lock:
            self._purge()
            record = self._records.get(key)
            if record is not None and record.module_ref() is module:
                return record
            class_name = type(module).__name__
            dead = self._dead
            ref = weakref.ref(module, lambda dead_ref, key=key: dead.append((key, dead_ref)))
            record = ModelRecord(f"{class_name}#{next(self._numbers[class_name]) + 1}", ref, class_name)
            self._records[key] = record
            return record

    def find(self, module):
        """The record of ``module`` or None; never creates one."""
        record = self._records.get(id(module))
        return record if record is not None and record.module_ref() is module else None

    def records(self):
        """A snapshot list of the records of live modules, most recently used first."""
        if self._dead:
            with self._lock:
                self._purge()
        records = [r for r in list(self._records.values()) if r.alive]
        return sorted(records, key=lambda r: r.last_used or 0, reverse=True)

    def next_unload_number(self):
        """The next number of the process's unload sequence (``ModelRecord.unload_seq``, ``entries_snapshot``)."""
        return next(self._unload_numbers)

    def containers(self):
        """The ledger's own containers, for holder searches to ignore."""
        return [self._records, self]

    def _purge(self):
        while self._dead:
            key, dead_ref = self._dead.popleft()
            record = self._records.get(key)
            if record is not None and record.module_ref is dead_ref:
                del self._records[key]

    def __len__(self):
        return sum(1 for r in list(self._records.values()) if r.alive)


STATE.register("ledger", Ledger)
