"""The ComfyUI events comfy_memx reacts to, as named signals: patches fire them, wings subscribe to them.

A patch wrapper fires exactly one signal per phase of one ComfyUI event (``load_starting`` before
``load_models_gpu`` runs, ``load_ended`` after it returned or raised) and knows nothing of who listens; each wing
subscribes its handlers at import, in its ``comfy_memx/<wing>/subscriptions.py`` (the bootstrap imports every such
module before it applies a patch).  So a patch reads as a site table, a wing's reactions are listed in one file, and
one guard, :meth:`Signal.fire`'s, applies the error policy to every handler:

* each subscriber runs in subscription order under its own guard: an ``Exception`` goes to
  ``errors.internal_error`` with the kind ``"<signal> -> <module>.<function>"`` (logged once per kind in
  production, re-raised under the test policy), and the next subscriber still runs;
* ``MemoryError`` and ``RecursionError`` propagate unchanged (swallowing them would hide a process that is dying or
  a stack that is exhausted, and ComfyUI's own code would meet them at its next step anyway), and so does every
  ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``);
* a subscriber's return value is ignored: what the "after" half of a call needs from its "before" half, the wing
  keeps itself (a thread-local stack of its own, matched to the call by an argument such as ComfyUI's models
  list), so a patch never decides anything from what a wing answered.

:meth:`Signal.ask` is the one query form: the first non-None answer of the subscribers (each guarded the same way),
used between wings (who asked for the unload running now), never by a patch.

Nothing here imports a wing, torch or ComfyUI; a signal holds its subscribers (functions defined at import), never
data, so :meth:`~comfy_memx.core.state.ProcessState.reset` leaves the subscriptions as they are.
"""

from comfy_memx.core.errors import internal_error

UNCHANGED = (MemoryError, RecursionError)
"""The ``Exception`` subclasses a guard lets through as they are (every non-``Exception`` passes anyway)."""


def _label(fn):
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}.{getattr(fn, '__qualname__', None) or repr(fn)}"


class Signal:
    """One named ComfyUI event phase; see the module docstring.  ``doc`` says when it fires and with what."""

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
            self._subscribers = (*self._subscribers, (fn, f"{self.name} -> {_label(fn)}"))
        return fn

    def unsubscribe(self, fn):
        """Stop calling ``fn`` (nothing happens when it was not subscribed)."""
        self._subscribers = tuple(entry for entry in self._subscribers if entry[0] is not fn)

    def subscribers(self):
        """The subscribed functions, in the order :meth:`fire` calls them."""
        return [fn for fn, _kind in self._subscribers]

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

load_starting = Signal("load_starting", "``load_models_gpu(models)`` is about to run: ``(mm, models, caller_frame)``, "
                                        "``models`` being ComfyUI's own list object.")
load_ended = Signal("load_ended", "The ``load_models_gpu`` call of ``load_starting`` returned or raised: "
                                  "``(mm, models)``, the same list object.")
model_loading = Signal("model_loading", "``LoadedModel.model_load`` is about to run: ``(entry,)``.")
model_loaded = Signal("model_loaded", "``LoadedModel.model_load`` returned: ``(entry, seconds, caller_frame)``.")
model_unloading = Signal("model_unloading", "``LoadedModel.model_unload`` is about to run: ``(entry,)``.")
model_unloaded = Signal("model_unloaded", "``LoadedModel.model_unload`` returned: ``(entry, result, seconds, "
                                          "caller_frame)``, ``result`` being ComfyUI's answer.")
unload_scope_entered = Signal("unload_scope_entered", "``free_memory``, ``unload_all_models`` or "
                                                      "``unload_model_and_clones`` is about to run: ``(mm, site, "
                                                      "caller_frame)``, ``site`` its name.")
unload_scope_exited = Signal("unload_scope_exited", "The call of ``unload_scope_entered`` returned or raised: "
                                                    "``(mm, site)``.")
collect_starting = Signal("collect_starting", "``cleanup_models_gc`` is about to run: ``(mm,)``.")
collect_ended = Signal("collect_ended", "``cleanup_models_gc`` returned or raised: ``(mm,)``.")
model_management_patched = Signal("model_management_patched", "``comfy.model_management`` was just patched "
                                                              "(models it holds already are taken in): ``(mm,)``.")

# -- comfy.model_patcher ----------------------------------------------------------------------------------------------

patcher_built = Signal("patcher_built", "``ModelPatcher.__init__`` returned (a new patcher: ComfyUI's loaders "
                                        "build one around every model they make, a clone one around the same "
                                        "model): ``(patcher, caller_frame)``.")

# -- execution --------------------------------------------------------------------------------------------------------

prompt_started = Signal("prompt_started", "``PromptExecutor.execute_async`` begins: ``(prompt_id, prompt)``.")
prompt_ended = Signal("prompt_ended", "The prompt of ``prompt_started`` ended on this thread: ``()``.")
node_starting = Signal("node_starting", "``get_output_data`` (one node's run) begins: ``(prompt_id, node_id, node)``.")
node_ended = Signal("node_ended", "The node of ``node_starting`` returned or raised: ``(prompt_id, node_id, node)``.")
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

CATALOGUE = tuple(value for value in list(globals().values()) if isinstance(value, Signal))
"""Every signal above, in the order of this file."""
