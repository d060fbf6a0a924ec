"""``COMFY_MEMX_IDLE_UNLOAD=<seconds>``: once ComfyUI's queue has been empty that long, unload its models.

Two ComfyUI services that share one GPU each keep their models loaded after a prompt, so the other one runs out of
memory; users submit an "empty workflow" to force an unload.  Instead, a daemon thread of comfy_memx checks once a
second whether the queue has been empty for the configured time since the last prompt and models are loaded; then
it asks ComfyUI's own worker to unload them, exactly as ``POST /memx/free`` with ``unload_models`` does (the flags
and the worker's run, never an unload from another thread behind the worker's back), waits for the worker's run,
and writes an ``idle_unload`` event with the receipt (and one INFO line).  It does so once per idle period: the
next one starts with the next prompt.  Off by default (0).
"""

import logging
import sys
import threading
import time

from comfy_memx.core.comfyui import queue_busy
from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.sharing import activity as activity_module, worker

log = logging.getLogger("comfy_memx")
CHECK_EVERY_S = 1.0


class IdleWatch:
    """The idle-unload thread of one PromptServer (a part of the process state; stopped by its ``close``)."""

    def __init__(self):
        self.thread = None
        self.stop = threading.Event()
        self.queue = None
        self.unloaded_after = None   # the Activity.last of the idle period already handled
        self.checks = 0

    def start(self, queue):
        """Start watching ``queue`` (ComfyUI's PromptQueue); a second start does nothing."""
        if self.thread is not None:
            return
        self.queue = queue
        self.thread = threading.Thread(target=self._run, name="comfy_memx idle unload", daemon=True)
        self.thread.start()

    def close(self):
        """Stop the thread (reset of the process state)."""
        self.stop.set()

    def _run(self):
        while not self.stop.wait(CHECK_EVERY_S):
            try:
                self.check()
            except Exception as exc:
                internal_error("idle unload", exc)

    def check(self, now=None):
        """One check: unload when the queue has been idle long enough; returns the receipt when it unloaded."""
        self.checks += 1
        seconds = STATE.config.idle_unload
        busy = queue_busy(self.queue)
        current = activity_module.activity()
        now = time.monotonic() if now is None else now
        if seconds <= 0 or busy or current.running or self.unloaded_after == current.last:
            return None
        if now - current.last < seconds or not _models_loaded():
            return None
        self.unloaded_after = current.last
        origin = {"kind": "comfy_memx", "via": "idle_unload", "idle_s": seconds}
        receipt = worker.unload(self.queue, origin)
        STATE.events.emit("idle_unload", status=receipt["status"], worker=receipt["worker"],
                          freed_bytes=receipt["freed_bytes"], freed=[row["model_id"] for row in receipt["freed"]],
                          idle_s=seconds, memory=receipt["memory"])
        log.info("comfy_memx: the queue was idle for %g s: the worker unloaded %d model(s), %d bytes (%s)",
                 seconds, len(receipt["freed"]), receipt["freed_bytes"], receipt["worker"])
        return receipt


def _models_loaded():
    mm = sys.modules.get("comfy.model_management")
    return bool(mm is not None and any(entry.model is not None for entry in list(mm.current_loaded_models)))


def start(queue):
    """Start the idle watch for ComfyUI's prompt ``queue`` when ``COMFY_MEMX_IDLE_UNLOAD`` is set."""
    if STATE.config.idle_unload > 0:
        STATE.part(IdleWatch).start(queue)
