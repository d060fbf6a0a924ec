"""The ComfyUI events comfy_memx reacts to: patches fire them, wings subscribe to them.

A ComfyUI call that comfy_memx follows from start to end is a :class:`~comfy_memx.core.pairs.Pair` (``load``:
``load_models_gpu``; ``model_load``, ``model_unload``, ``unload_scope``, ``collect``, ``prompt``, ``node``): the
wrapper runs its "before" half, ComfyUI's call, then its "after" half, and the pair owns what the wings keep between
the halves (see ``comfy_memx.core.pairs``).  A one-phase event is a :class:`Signal` (``file_loaded``,
``flags_served``, ``routes_adding``...): the wrapper fires it once.  A patch knows nothing of who listens; each wing
subscribes its handlers at import, in its ``comfy_memx/<wing>/subscriptions.py`` (the bootstrap imports every such
module before it applies a patch).  So a patch reads as a site table, a wing's reactions are listed in one file, and
one guard applies the error policy to every handler, a signal's and a pair's alike:

* each subscriber runs in subscription order under its own guard: an ``Exception`` goes to
  ``errors.internal_error`` with the kind ``"<signal> -> <module>.<function>"`` (a pair's: ``"<pair>.before -> ..."``
  or ``"<pair>.after -> ..."``), logged once per kind and counted in production, re-raised under the test policy,
  and the next subscriber still runs;
* ``errors.UNCHANGED`` (``MemoryError``, ``RecursionError``) propagate unchanged, and so does every
  ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``);
* a signal's subscriber's return value is ignored; a pair's "before" half returns the memo its "after" half gets.

:meth:`Signal.ask` is the one query form: the first non-None answer of the subscribers (each guarded the same way),
used between wings (who asked for the unload running now), never by a patch.

Nothing here imports a wing, torch or ComfyUI; a signal or pair holds its subscribers (functions defined at import),
never data, so :meth:`~comfy_memx.core.state.ProcessState.reset` leaves the subscriptions as they are.
"""

from comfy_memx.core.errors import UNCHANGED, internal_error
from comfy_memx.core.pairs import Pair, label


class Signal:
    """One named one-phase ComfyUI event; see the module docstring.  ``doc`` says when it fires and with what."""

    __slots__ = ("name", "doc", "_subscribers")

    def __init__(self, name, doc):
        self.name = name
        self.doc = doc
        self._subscribers = ()   # ((function, error kind), ...): a tuple, so a subscription during fire is safe

    def __repr__(self):
        return f"<Signal {self.name}: {len(self._subscribers)} subscribers>"

    def subscribe(self, fn):
        """Call ``fn(*args)`` on every :meth:`fire` from now on, after the earlier subscribers; returns ``fn`` (so it
        works as a decorator).  Subscribing the same function twice keeps one subscription."""
        if all(existing is not fn for existing, _kind in self._subscribers):
            self._subscribers = (*self._subscribers, (fn, f"{self.name} -> {label(fn)}"))
        return fn

    def unsubscribe(self, fn):
        """Stop calling ``fn`` (nothing happens when it was not subscribed)."""
        self._subscribers = tuple(entry for entry in self._subscribers if entry[0] is not fn)

    def subscribers(self):
        """The subscribed functions, in the order :meth:`fire` calls them."""
        return [fn for fn, _kind in self._subscribers]

    def guards(self):
        """Every subscriber as ``(function, error kind)``: what the fault suite plants a failure in, with the kind
        its guard reports."""
        return list(self._subscribers)

    def fire(self, *args):
        """Call every subscriber with ``args``, each under the guard (see the module docstring); returns None."""
        for fn, kind in self._subscribers:
            try:
                fn(*args)
            except UNCHANGED:
                raise
            except Exception as exc:
                internal_error(kind, exc)

    def ask(self, *args):
        """The first answer that is not None of the subscribers called with ``args`` in order (each guarded as in
        :meth:`fire`; a failing one counts as no answer), or None."""
        for fn, kind in self._subscribers:
            try:
                answer = fn(*args)
            except UNCHANGED:
                raise
            except Exception as exc:
                internal_error(kind, exc)
                continue
            if answer is not None:
                return answer
        return None


# -- comfy.model_management ------------------------------------------------------------------------------------------

load = Pair("load", "``load_models_gpu(models)``: before it runs ``(mm, models, caller_frame)``, ``models`` being "
                    "ComfyUI's own list object; after it returned or raised ``(mm, models)``.  Stacked: the load in "
                    "progress (``load.current()``, its models by weakref) is what unloads inside it serve.",
            ("mm", "models", "caller_frame"), ("mm", "models"), stacked="frames")
model_load = Pair("model_load", "``LoadedModel.model_load``: before it runs ``(entry,)``; after it returned "
                                "``(entry, seconds, caller_frame)`` (nothing after when it raised).",
                  ("entry",), ("entry", "seconds", "caller_frame"))
model_unload = Pair("model_unload", "``LoadedModel.model_unload``: before it runs ``(entry,)``; after it returned "
                                    "``(entry, result, seconds, caller_frame)``, ``result`` being ComfyUI's answer "
                                    "(nothing after when it raised).",
                    ("entry",), ("entry", "result", "seconds", "caller_frame"))
unload_scope = Pair("unload_scope", "``free_memory``, ``unload_all_models`` or ``unload_model_and_clones``: before "
                                    "it runs ``(mm, site, caller_frame)``, ``site`` its name; after it returned or "
                                    "raised ``(mm, site)``.  Stacked: the unloads inside serve the innermost scope.",
                    ("mm", "site", "caller_frame"), ("mm", "site"), stacked="frames")
collect = Pair("collect", "``cleanup_models_gc``: before it runs ``(mm,)``; after it returned or raised ``(mm,)``.",
               ("mm",), ("mm",))
model_management_patched = Signal("model_management_patched", "``comfy.model_management`` was just patched "
                                                              "(models it holds already are taken in): ``(mm,)``.")

# -- comfy.model_patcher ----------------------------------------------------------------------------------------------

patcher_built = Signal("patcher_built", "``ModelPatcher.__init__`` returned (a new patcher: ComfyUI's loaders "
                                        "build one around every model they make, a clone one around the same "
                                        "model): ``(patcher, caller_frame)``.")

# -- execution --------------------------------------------------------------------------------------------------------

prompt = Pair("prompt", "``PromptExecutor.execute_async`` (one prompt): before it begins ``(prompt_id, prompt)``; "
                        "after it returned or raised ``()``.  Stacked: the prompt running on this thread.",
              ("prompt_id", "prompt"), (), stacked="thread")
node = Pair("node", "``get_output_data`` (one node's run): before it begins ``(prompt_id, node_id, node)``; after it "
                    "returned or raised, the same.", ("prompt_id", "node_id", "node"), ("prompt_id", "node_id", "node"))
free_flag_set = Signal("free_flag_set", "``PromptQueue.set_flag(name, ...)`` is about to run: ``(queue, name, "
                                        "caller_frame)``.")
flags_reading = Signal("flags_reading", "``PromptQueue.get_flags`` is about to run, the queue's mutex not held: "
                                        "``(queue, reset)``.  ComfyUI's prompt worker calls it after every prompt and "
                                        "whenever it is woken: its point between prompts, with no node executing.")
flags_served = Signal("flags_served", "``PromptQueue.get_flags`` returned, the queue's mutex still held: ``(queue, "
                                      "flags, reset)``.")
cache_reset = Signal("cache_reset", "``PromptExecutor.reset`` returned: ``(executor,)``.")

# -- comfy.utils, server ----------------------------------------------------------------------------------------------

file_loaded = Signal("file_loaded", "``load_torch_file`` returned, with an event listener present: ``(utils, args, "
                                    "kwargs, result, seconds, caller_frame)``.")
routes_adding = Signal("routes_adding", "``PromptServer.add_routes`` is about to hand the routes to aiohttp: "
                                        "``(server,)``.")
server_patched = Signal("server_patched", "``server`` was just patched: ``(module,)``.")
server_unpatching = Signal("server_unpatching", "``server`` is about to be unpatched: ``(module,)``.")

# -- between wings (fired by a wing, never by a patch) ---------------------------------------------------------------

free_request_unload_ended = Signal("free_request_unload_ended", "The outermost ``free_request`` unload scope (ComfyUI's "
                                                                "worker serving free flags) ended: ``()``.")
unload_requester = Signal("unload_requester", "Asked (:meth:`Signal.ask`) who requested an unload of ``reason`` "
                                              "before the call stack is read: ``(reason,)`` -> a ``requested_by`` "
                                              "dict or None.")
worker_unload_offered = Signal("worker_unload_offered", "The server's routes are up and ``unload(queue, origin, "
                                                        "timeout)`` unloads through ComfyUI's worker: ``(unload,)``.")

CATALOGUE = tuple(value for value in list(globals().values()) if isinstance(value, (Signal, Pair)))
"""Every signal and pair above, in the order of this file."""
