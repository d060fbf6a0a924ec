"""The one process-state object of comfy_memx: everything it remembers in this process, and one ``reset()``.

Kept in its own module (never in ``__main__``) so that the launcher, the startup hook and the patches all see one
copy.  The fields every wrapper reads on ComfyUI's hot paths are plain attributes (``config``, ``events``,
``stacks`` (this thread's prompts in progress, kept by ``comfy_memx.core.pairs``), and ``ledger``, which the ledger
wing registers with :meth:`ProcessState.register`: a part lookup on every load and unload would cost more than the
attribute read); each feature keeps the rest of its state in a *part*, an object of its own class created on first
use by :meth:`ProcessState.part` and dropped (after its ``close()``, if it has one)
by :meth:`ProcessState.reset`.  So core code never imports the features, and a test resets all of comfy_memx with
one call.  STATE holds data only: who reacts to which ComfyUI event is ``comfy_memx.core.signals``'s business.
"""

import threading
import weakref

from comfy_memx.core import errors
from comfy_memx.core.config import DEFAULT
from comfy_memx.core.events import EventLog


class ThreadStacks(threading.local):
    """This thread's calls in progress of the pairs stacked by thread (the prompt): ``calls``, one record per call,
    innermost last, pushed and removed by ``comfy_memx.core.pairs`` alone (never by a wing), holding ids, weak
    references and the wings' memos only."""

    def __init__(self):
        self.calls = []


class ProcessState:
    """comfy_memx's state in this process; see the module docstring.  Use the :data:`STATE` instance."""

    def __init__(self):
        self.errors = errors.POLICY
        # Kept by reset: what is wrapped in ComfyUI's modules stays wrapped until unwrapped (registry.remove_all),
        # and this table is what undoes it exactly; and this process's identity in host registries, whose live
        # files it holds for as long as it lives (a reset must not make it look dead to its peers).
        self.wrapped = {}            # (id(owner), attr) -> what core.wrapping installed there
        self.host_identity = {}      # pid -> this process's token in host registries (core.hostshare)
        self.host_live_locks = {}    # (pid, folder) -> the held lock of this process's live file
        self._parts = {}
        self._fields = {}   # name -> factory of a hot-path field a wing registered (see register)
        self._initialize()

    def _initialize(self):
        self.config = DEFAULT
        self.source = None           # "launcher", "env", "auto", "api" or "demo" once bootstrapped
        for name, factory in self._fields.items():
            setattr(self, name, factory())
        self.event_loops_without_io = weakref.WeakSet()   # loops that no event write may block (the server's)
        self.events = EventLog(avoided_loops=self.event_loops_without_io)
        self.stacks = ThreadStacks()

    def configure(self, cfg, activation_source):
        """Install ``cfg`` as the active config and open the event log it names."""
        self.events.close()
        self.config = cfg
        self.source = activation_source
        self.events = EventLog(cfg.events, request_rate=cfg.event_rate, avoided_loops=self.event_loops_without_io)
        self.errors.raise_internal = self.errors.raise_internal or cfg.raise_internal

    def register(self, name, factory):
        """Give STATE a plain attribute ``name`` made by ``factory()``, now and at every :meth:`reset`.

        For a wing's store that ComfyUI's hot paths read (the ledger registers ``STATE.ledger``): core defines the
        slot's life cycle, the wing what is in it, and core imports no wing.
        """
        self._fields[name] = factory
        setattr(self, name, factory())

    def part(self, cls):
        """This process's instance of the feature-state class ``cls`` (created with ``cls()`` on first use)."""
        try:
            return self._parts[cls]
        except KeyError:
            return self._parts.setdefault(cls, cls())

    def existing_part(self, cls):
        """This process's instance of ``cls`` if one was created, else None (never creates one)."""
        return self._parts.get(cls)

    def reset(self):
        """Forget everything: close every part (pending import hooks included), inactive default config, fresh
        registered fields (an empty ledger), fresh thread stacks, no event log, production error policy.  Patches
        already applied stay (``registry.remove_all`` undoes them), and so does this process's host identity.
        """
        parts, self._parts = list(self._parts.values()), {}
        for part in parts:
            close = getattr(part, "close", None)
            if close is not None:
                close()
        self.events.close()
        self.errors.reset()
        self._initialize()


STATE = ProcessState()
