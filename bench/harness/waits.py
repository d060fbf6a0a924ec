"""Waits for servers and prompts bounded by progress, not by a fixed time (standard library only).

On a busy machine a stand-in or a real ComfyUI can take minutes to import torch or to run a prompt, so a wait that
gives up after a fixed number of seconds fails runs that were only slow, and one that "goes on" when its time is up
lets the next step race the prompt it did not see finish.  Each wait here keeps going while the server process is
alive and something moves (the prompt's place in ``/queue``, its entry in ``/history``, the server's log growing) and
fails with :class:`WaitFailed` and a message saying why only when the server exited or nothing moved for a whole
stall window (:data:`STALL_S`, generous: a working server logs or moves its queue well within it).

Used by the tests (``tests/patches``, ``tests/real``) and by :mod:`bench.harness.drive`; one copy for all.
"""

import inspect
import json
import os
import time
import urllib.error
import urllib.request

STALL_S = 180.0        # no progress at all for this long: the server is stuck, not slow
POLL_S = 0.1


class WaitFailed(AssertionError):
    """A wait ended without what it waited for: the server exited or made no progress for the stall window."""


def get_json(url, timeout=10.0):
    """``GET url``: ``(status, parsed JSON or None)``; ``(None, None)`` when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read().decode() or "null")
    except urllib.error.HTTPError as error:
        return error.code, None
    except (OSError, ValueError):
        return None, None


def process_alive(process):
    """An ``alive`` check for :func:`wait_until` from a ``subprocess.Popen``: True while it has not exited."""
    return lambda: process.poll() is None


def log_size(path):
    """A ``progress`` token from a log file: its size (0 before it exists), which grows while the server works."""
    def size():
        try:
            return os.path.getsize(path)
        except OSError:
            return 0
    return size


def log_tail(path, chars=4000):
    """The end of a log file, for a failure message (empty when there is none)."""
    def tail():
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()[-chars:]
        except (OSError, TypeError):
            return ""
    return tail


class _Stall:
    """The progress token of one wait and since when it has not changed."""

    def __init__(self, token, what, stall_s, detail):
        self.token, self.since = token, time.monotonic()
        self.what, self.stall_s, self.detail = what, stall_s, detail

    def check(self, alive, token):
        """Fail when the server exited (``alive`` False) or ``token`` stayed the same for the whole stall window."""
        if not alive:
            self.fail("the server exited first")
        if token != self.token:
            self.token, self.since = token, time.monotonic()
        elif time.monotonic() - self.since > self.stall_s:
            self.fail(f"no progress for {self.stall_s:g} s (last seen: {self.token!r})")

    def fail(self, why):
        extra = self.detail() if self.detail is not None else ""
        raise WaitFailed(f"{self.what}: {why}" + (f"\n{extra}" if extra else ""))


def wait_until(ready, alive, progress, what, stall_s=STALL_S, poll_s=POLL_S, detail=None):
    """Call ``ready()`` until it returns something truthy and return that.

    Keeps waiting however long it takes while ``alive()`` is True and the token ``progress()`` returns keeps changing;
    raises :class:`WaitFailed` naming ``what`` (and ``detail()``, e.g. the server log's tail) when ``alive()`` turns
    False or the token stayed the same for ``stall_s`` seconds.
    """
    stall = _Stall(progress(), what, stall_s, detail)
    while True:
        value = ready()
        if value:
            return value
        stall.check(alive(), progress())
        time.sleep(poll_s)


async def wait_until_async(ready, alive, progress, what, stall_s=STALL_S, poll_s=POLL_S, detail=None):
    """:func:`wait_until` for a test's event loop: ``ready`` and ``progress`` may be plain or coroutine functions."""
    import asyncio
    stall = _Stall(await _result(progress), what, stall_s, detail)
    while True:
        value = await _result(ready)
        if value:
            return value
        stall.check(alive(), await _result(progress))
        await asyncio.sleep(poll_s)


async def _result(function):
    value = function()
    return await value if inspect.isawaitable(value) else value


def always():
    """An ``alive`` check for a wait inside the process that serves (it cannot have exited)."""
    return True


def no_progress():
    """A ``progress`` token for a condition nothing outside shows moving: the stall window alone bounds the wait."""
    return None


def wait_for_server(base_url, process, log_path=None, stall_s=STALL_S):
    """Wait until ``GET /system_stats`` answers 200 and return its JSON; the server's start-up log is its progress."""
    def ready():
        status, body = get_json(base_url + "/system_stats", timeout=5.0)
        return body if status == 200 and body is not None else None
    progress = log_size(log_path) if log_path is not None else (lambda: None)
    return wait_until(ready, process_alive(process), progress, f"{base_url} to answer /system_stats", stall_s,
                      poll_s=0.25, detail=log_tail(log_path) if log_path is not None else None)


def place_of(prompt_id, queue_answer, history_answer):
    """Where ``prompt_id`` is, from the answers ``(status, JSON)`` of ``GET /queue`` then ``GET /history/<id>`` (in
    that order, so a prompt that ends between them is seen done): ``("done", history entry)``, ``("running",)``,
    ``("queued", prompts ahead of it)``, ``("unknown",)`` (listed nowhere) or ``("no answer",)``."""
    status, history = history_answer
    if status == 200 and isinstance(history, dict) and prompt_id in history:
        return ("done", history[prompt_id])
    status, queue = queue_answer
    if status != 200 or not isinstance(queue, dict):
        return ("no answer",)
    if any(item[1] == prompt_id for item in queue.get("queue_running", [])):
        return ("running",)
    pending = queue.get("queue_pending", [])
    mine = [item[0] for item in pending if item[1] == prompt_id]
    if mine:
        return ("queued", sum(1 for item in pending if item[0] < mine[0]))
    return ("unknown",)


def wait_for_prompt(base_url, prompt_id, alive, log_path=None, stall_s=STALL_S):
    """Wait until ``prompt_id`` has its ``/history`` entry and return that entry.

    Progress is the prompt's place (queued with fewer ahead, running) and the server log's growth; a prompt the
    server lists nowhere, or a server that stops answering, makes none.
    """
    seen = {}
    size = log_size(log_path) if log_path is not None else no_progress

    def ready():
        seen["place"] = place_of(prompt_id, get_json(base_url + "/queue"), get_json(f"{base_url}/history/{prompt_id}"))
        return seen["place"][1] if seen["place"][0] == "done" else None

    return wait_until(ready, alive, lambda: (seen.get("place"), size()), f"prompt {prompt_id} to finish", stall_s,
                      detail=log_tail(log_path) if log_path is not None else None)


async def wait_for_prompt_async(get_json_async, prompt_id, alive=always, stall_s=STALL_S):
    """:func:`wait_for_prompt` for a server in the test's own process: ``get_json_async(path)`` returns
    ``(status, JSON)``."""
    seen = {}

    async def ready():
        seen["place"] = place_of(prompt_id, await get_json_async("/queue"),
                                 await get_json_async(f"/history/{prompt_id}"))
        return seen["place"][1] if seen["place"][0] == "done" else None

    return await wait_until_async(ready, alive, lambda: seen.get("place"), f"prompt {prompt_id} to finish", stall_s, poll_s=0.02)
