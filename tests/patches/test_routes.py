"""The HTTP routes on the stand-in PromptServer: schemas, /memx/free waiting for the prompt worker, timeouts,
concurrent requests during a running prompt, bad requests, failures that must not take the server down, and
the metrics route (names, labels, the /metrics conflict, the 501 without prometheus_client)."""

import asyncio
import contextlib
import gc
import logging
import threading
import weakref

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.harness.waits import always, no_progress, wait_for_prompt_async, wait_until_async
from comfy_memx.routekit import replies
from comfy_memx.surface import freeing
from comfy_memx.surface import metrics
from comfy_memx.surface import readmodel, routes
from memx_helpers import install_pack, memx_on

VERSIONS = ["0.3.64", "0.27.0"]
MODEL_KEYS = {"model", "model_id", "state", "bytes", "loaded_bytes", "load_device", "bytes_by_device",
              "pinned_bytes", "owner", "created_by", "created_at", "loaded_at", "last_used", "loads", "unloads",
              "last_unload", "reloads", "reload_seconds", "reload_bytes", "reload_causes", "in_comfyui_loaded_list",
              "leak", "searched", "release"}
RECEIPT_KEYS = {"status", "worker", "waited_s", "request", "run", "freed", "freed_bytes", "released_bytes",
                "still_loaded", "survivors", "survivor_bytes", "memory", "prompt_running_at_request", "releases",
                "release_bytes"}
SURVIVOR_KEYS = {"model", "model_id", "owner", "created_by", "bytes", "resident_bytes", "reason", "leak", "holders",
                 "search", "holder"}
OWNER_KEYS = {"prompt_id", "node_id", "class_type", "package", "via"}


class Stop(BaseException):
    """Not an Exception, so the executor lets it end the prompt worker."""


class StopWorker:
    FUNCTION = "stop"
    OUTPUT_NODE = True

    def stop(self):
        raise Stop


class Gate:
    """A node that blocks its prompt until the test opens ``Gate.open``."""
    FUNCTION = "wait"
    OUTPUT_NODE = True
    open = threading.Event()
    entered = threading.Event()

    def wait(self, model=None):
        Gate.entered.set()
        assert Gate.open.wait(30), "the test never opened the gate"
        return (0,)


def leaky(name, leak=False):
    return {"1": {"class_type": "LeakyLoader", "inputs": {"name": name, "tensor_count": 4, "tensor_numel": 1024,
                                                         "leak": leak}},
            "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}


class Comfy:
    """A stand-in ComfyUI in this process: its PromptServer on a test port, its prompt worker thread."""

    def __init__(self, client, server):
        self.client, self.server = client, server

    async def run(self, prompt):
        """Queue ``prompt`` through POST /prompt and wait until the worker has executed it."""
        response = await self.client.post("/prompt", json={"prompt": prompt})
        assert response.status == 200, await response.text()
        prompt_id = (await response.json())["prompt_id"]
        entry = await wait_for_prompt_async(self.get_json, prompt_id)
        assert entry["status"]["status_str"] == "success", entry
        return prompt_id

    async def queue(self, prompt):
        response = await self.client.post("/prompt", json={"prompt": prompt})
        assert response.status == 200, await response.text()

    async def free(self, body=None, timeout=None, raw=None):
        """POST /memx/free; returns (status, JSON)."""
        url = "/memx/free" + (f"?timeout={timeout}" if timeout is not None else "")
        if raw is not None:
            response = await self.client.post(url, data=raw)
        else:
            response = await self.client.post(url, json=body if body is not None else routes.FREE_ALL)
        return response.status, await response.json()

    async def get_json(self, path):
        response = await self.client.get(path)
        return response.status, await response.json()


@contextlib.asynccontextmanager
async def comfy_server(version, before_routes=None):
    """Start the stand-in's PromptServer (with comfy_memx's server patch) and prompt worker in this process."""
    import main
    import server
    prompt_server = server.PromptServer(asyncio.get_running_loop())
    if before_routes is not None:
        before_routes(prompt_server)
    prompt_server.add_routes()
    client = TestClient(TestServer(prompt_server.app, host="127.0.0.1"))
    await client.start_server()

    def work():
        try:
            main.prompt_worker(prompt_server.prompt_queue, prompt_server)
        except Stop:
            pass

    worker = threading.Thread(target=work, daemon=True, name="prompt_worker")
    worker.start()
    try:
        yield Comfy(client, prompt_server)
    finally:
        Gate.open.set()
        stop = {"9": {"class_type": "StopWorker", "inputs": {}}}
        item = (10 ** 9, "stop", stop, {}, ["9"]) + (({},) if version == "0.27.0" else ())
        prompt_server.prompt_queue.put(item)
        await asyncio.get_running_loop().run_in_executor(None, worker.join, 30)
        await client.close()
        assert not worker.is_alive()
        assert freeing.waiting() == 0


def serve(version, tmp_path, scenario, before_routes=None, **settings):
    """Run ``scenario(comfy)`` against a stand-in server with comfy_memx ``settings``."""
    with memx_on(version, **settings):
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        import main  # noqa: F401  (the stand-in's main.py: its imports, including server, and prompt_worker)
        import nodes
        root.handlers[:], root.level = handlers, level
        install_pack(tmp_path)
        nodes.NODE_CLASS_MAPPINGS.update({"StopWorker": StopWorker, "Gate": Gate})
        Gate.open.clear()
        Gate.entered.clear()

        async def main():
            async with comfy_server(version, before_routes) as comfy:
                return await scenario(comfy)
        return asyncio.run(main())


# -- GET /memx/status -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_status_route_says_each_sites_state_and_a_replaced_one_as_rewrapped(version, tmp_path):
    async def scenario(comfy):
        import comfy.model_management as mm
        before = await comfy.get_json("/memx/status")
        original = mm.load_models_gpu.__wrapped__

        def replacement(*args, **kwargs):          # another pack's, calling ComfyUI's own around ours
            return original(*args, **kwargs)
        mm.load_models_gpu = replacement
        await comfy.run(leaky("a"))                 # the audit at the prompt's start notices it
        after = await comfy.get_json("/memx/status")
        return before, after

    (status, before), (_, after) = serve(version, tmp_path, scenario)
    assert status == 200 and set(before) == {"version", "source", "leak_mode", "release", "release_packages", "sites",
                                             "pins", "process"}
    assert before["process"]["rss_bytes"] > 0   # this process's own resident memory, shown beside the machine's RAM
    assert before["release"] == "off"   # opt-in: nothing is ever cut unless COMFY_MEMX_RELEASE says so
    states = {row["site"]: row["state"] for row in before["sites"]}
    assert states["load_models_gpu"] == "patched" and before["leak_mode"] == "report"
    [site] = [row for row in after["sites"] if row["site"] == "load_models_gpu"]
    assert site["state"] == "rewrapped" and "replacement" in site["reason"]


# -- GET /memx/models -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_models_route_lists_each_model_with_its_schema(version, tmp_path):
    async def scenario(comfy):
        status, empty = await comfy.get_json("/memx/models")
        assert status == 200 and empty == []
        prompt_id = await comfy.run(leaky("a"))
        status, rows = await comfy.get_json("/memx/models")
        api_status, api_rows = await comfy.get_json("/api/memx/models")
        return status, rows, prompt_id, api_status, api_rows

    status, rows, prompt_id, api_status, api_rows = serve(version, tmp_path, scenario)
    assert status == 200 and api_status == 200 and [r["model_id"] for r in api_rows] == ["BaseModel#1"]
    [row] = rows
    assert set(row) == MODEL_KEYS and set(row["owner"]) == OWNER_KEYS
    assert row["model"] == "BaseModel" and row["model_id"] == "BaseModel#1"
    assert row["owner"] == {"prompt_id": prompt_id, "node_id": "1", "class_type": "LeakyLoader",
                            "package": "leaky_pack", "via": None}
    assert row["state"] == "loaded" and row["in_comfyui_loaded_list"] is True and row["leak"] is None
    assert row["bytes"] == row["loaded_bytes"] == 4 * 1024 * 4
    assert sum(row["bytes_by_device"].values()) == row["bytes"] and row["load_device"] in row["bytes_by_device"]
    assert row["pinned_bytes"] == 0 and row["loads"] == 1 and row["unloads"] == 0 and row["last_unload"] is None
    assert row["loaded_at"] <= row["last_used"]
    assert row["created_by"] == row["owner"] and row["created_at"] <= row["loaded_at"]   # built and loaded by node 1


# -- POST /memx/free --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_free_waits_for_the_worker_and_names_the_survivor_with_its_chain(version, tmp_path):
    """Report mode (the default) still searches the survivors' holders."""
    long_name = "qwen_" + "x" * 1000

    async def scenario(comfy):
        await comfy.run(leaky(long_name, leak=True))   # LeakyLoader._cache keeps this module
        await comfy.run(leaky("b"))                    # ComfyUI drops the first patcher: leak warning
        status, rows = await comfy.get_json("/memx/models")
        leaked_before = [r for r in rows if r["state"] == "leaked"]
        cached = next(r for r in rows if r["state"] != "leaked")
        status, receipt = await comfy.free({"unload_models": True, "free_memory": True})
        _, after = await comfy.get_json("/memx/models")
        import nodes
        cache = nodes.NODE_CLASS_MAPPINGS["LeakyLoader"]._cache
        return status, receipt, leaked_before, cached, cache, weakref.ref(cache[long_name]), after

    status, receipt, leaked_before, cached, cache, module_ref, after = serve(version, tmp_path, scenario)
    assert status == 200 and set(receipt) == RECEIPT_KEYS
    assert receipt["status"] == receipt["worker"] == "done" and receipt["prompt_running_at_request"] is False
    assert receipt["request"] == {"unload_models": True, "free_memory": True}
    [freed] = receipt["freed"]
    assert freed["model_id"] == cached["model_id"] and freed["released"] is True
    assert freed["unloaded_bytes"] == freed["bytes"] == cached["bytes"] == receipt["freed_bytes"]
    assert receipt["released_bytes"] == cached["bytes"] and receipt["still_loaded"] == []
    [survivor] = receipt["survivors"]
    assert set(survivor) == SURVIVOR_KEYS and survivor["model_id"] == leaked_before[0]["model_id"]
    assert survivor["reason"] == "leaked" and survivor["leak"]["stage"] == "rooted"
    assert survivor["owner"]["package"] == "leaky_pack" and survivor["bytes"] == receipt["survivor_bytes"] > 0
    chain = survivor["holders"][0]
    assert chain["path"].startswith("leaky_pack.LeakyLoader._cache['qwen_xxx") and len(chain["path"]) <= 300
    assert chain["package"] == "leaky_pack" and chain["root_kind"] == "class_attribute"
    assert survivor["search"]["complete"] is True and survivor["holder"]["package"] == "leaky_pack"
    memory = receipt["memory"]
    assert memory["rss_before"] > 0 and memory["rss_after"] > 0 and memory["rss_after_trim"] > 0
    assert memory["trim"]["returned_bytes"] >= 0 and memory["trim"]["seconds"] >= 0
    # the leaked model is all that is left; on the stand-in its weights sit on the simulated GPU, not in RAM
    assert [row["model_id"] for row in after] == [survivor["model_id"]]
    searched = after[0]["searched"]   # the row carries the receipt's search: the panel names its holder
    assert searched["holder"] == survivor["holder"] and searched["result"] == survivor["search"]["result"]
    assert memory["held_bytes"] == sum(n for d, n in after[0]["bytes_by_device"].items() if d.startswith("cpu"))
    cache.clear()
    gc.collect()
    assert module_ref() is None   # neither the receipt nor the search kept the module


KEPT = []


class PatcherKeeper:
    """A node that keeps its MODEL input (the ModelPatcher) in a module-level list: ComfyUI's reset cannot free it."""
    FUNCTION = "keep"
    OUTPUT_NODE = True

    def keep(self, model):
        KEPT.append(model)
        return (0,)


@pytest.mark.parametrize("version", ["0.27.0"])
def test_unload_only_keeps_cached_models_and_free_memory_names_a_kept_one(version, tmp_path):
    async def scenario(comfy):
        import nodes
        nodes.NODE_CLASS_MAPPINGS["PatcherKeeper"] = PatcherKeeper
        await comfy.run({**leaky("a"), "3": {"class_type": "PatcherKeeper", "inputs": {"model": ["1", 0]}}})
        status, unload_only = await comfy.free({"unload_models": True})
        _, rows = await comfy.get_json("/memx/models")
        status2, full = await comfy.free({"free_memory": True})
        return status, unload_only, rows, status2, full

    try:
        status, unload_only, rows, status2, full = serve(version, tmp_path, scenario)
    finally:
        KEPT.clear()
    assert status == 200 and unload_only["survivors"] == [] and unload_only["still_loaded"] == []
    [freed] = unload_only["freed"]
    assert freed["unloaded_bytes"] == freed["bytes"] > 0 and freed["released"] is False
    assert [r["state"] for r in rows] == ["offloaded"]    # ComfyUI's output cache still holds it
    assert status2 == 200 and full["freed"] == []         # nothing left to unload, nothing released
    [survivor] = full["survivors"]
    assert survivor["reason"] == "kept" and survivor["model_id"] == rows[0]["model_id"]
    assert [(c["path"], c["root_kind"]) for c in survivor["holders"]] == [("test_routes.KEPT[0].model",
                                                                         "module_global")]


@pytest.mark.parametrize("version", ["0.3.64"])
def test_free_answers_202_with_what_is_known_when_the_worker_is_busy(version, tmp_path):
    async def scenario(comfy):
        await comfy.run(leaky("a", leak=True))
        await comfy.run(leaky("b"))
        await comfy.queue({"1": {"class_type": "Gate", "inputs": {}}})
        await asyncio.get_running_loop().run_in_executor(None, Gate.entered.wait, 30)
        status, receipt = await comfy.free(timeout=0.3)
        Gate.open.set()
        return status, receipt

    status, receipt = serve(version, tmp_path, scenario)
    assert status == 202 and receipt["status"] == "pending" and receipt["worker"] == "withdrawn"
    assert receipt["prompt_running_at_request"] is True and "running prompt" in receipt["note"]
    assert "withdrawn" in receipt["note"] and receipt["run"] is None
    assert receipt["freed"] == [] and receipt["waited_s"] >= 0.3
    [survivor] = receipt["survivors"]                    # only the leaked model is known so far, not searched
    assert survivor["reason"] == "leaked" and survivor["holders"] is None and survivor["search"] is None


@pytest.mark.parametrize("version", ["0.27.0"])
def test_concurrent_free_requests_wait_for_the_running_prompt_and_share_one_unload(version, tmp_path):
    async def scenario(comfy):
        await comfy.run(leaky("a"))
        await comfy.queue({"1": leaky("a")["1"], "3": {"class_type": "Gate", "inputs": {"model": ["1", 0]}}})
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, Gate.entered.wait, 30)
        requests = [asyncio.create_task(comfy.free(timeout=30)) for _ in range(2)]
        await wait_until_async(lambda: freeing.waiting() == 2, always, no_progress, "both requests at the handler")
        assert freeing.waiting() == 2
        assert not any(r.done() for r in requests), "a receipt came back while the prompt was still running"
        models_status, rows = await comfy.get_json("/memx/models")   # the event loop still serves
        Gate.open.set()
        return models_status, rows, [await r for r in requests]

    models_status, rows, answers = serve(version, tmp_path, scenario)
    assert models_status == 200 and len(rows) == 1
    assert [status for status, _ in answers] == [200, 200]
    first, second = (receipt for _, receipt in answers)
    assert first["prompt_running_at_request"] is second["prompt_running_at_request"] is True
    assert [f["model_id"] for f in first["freed"]] == [f["model_id"] for f in second["freed"]] == ["BaseModel#1"]
    assert first["freed"] == second["freed"] and first["freed_bytes"] == rows[0]["bytes"]   # one unload, shared


@pytest.mark.parametrize("body, query, kind", [
    (b"{not json", "", "bad_json"),
    (b"[1, 2]", "", "bad_body"),
    (b'{"unload_models": false, "free_memory": false}', "", "nothing_to_free"),
    (b"{}", "?timeout=soon", "bad_timeout"),
    (b"{}", "?timeout=-1", "bad_timeout"),
    (b"{}", "?timeout=nan", "bad_timeout"),
])
def test_bad_free_requests_get_an_error_json(body, query, kind, tmp_path):
    async def scenario(comfy):
        response = await comfy.client.post("/memx/free" + query, data=body)
        return response.status, await response.json(), comfy.server.prompt_queue.get_flags(reset=False)

    status, answer, flags = serve("0.27.0", tmp_path, scenario)
    assert status == 400 and answer["error"] == kind and answer["message"]
    assert flags == {}   # nothing was asked of ComfyUI


@pytest.mark.parametrize("raw", [b"", b"{}"], ids=["no body", "empty object"])
def test_empty_body_frees_everything(tmp_path, raw):
    async def scenario(comfy):
        await comfy.run(leaky("a"))
        return await comfy.free(raw=raw)

    status, receipt = serve("0.27.0", tmp_path, scenario)
    assert status == 200 and receipt["request"] == {"unload_models": True, "free_memory": True}
    assert receipt["freed"][0]["released"] is True


def test_routes_answer_an_error_json_when_the_search_or_the_metrics_fail(tmp_path, monkeypatch):
    from comfy_memx.leaks import holders

    def broken_search(*args, **kwargs):
        raise RuntimeError("search bug")

    def broken_rows(*args, **kwargs):
        raise RuntimeError("ledger view bug")

    async def scenario(comfy):
        await comfy.run(leaky("a", leak=True))
        await comfy.run(leaky("b"))
        monkeypatch.setattr(holders, "find_holders", broken_search)
        free_status, receipt = await comfy.free()
        monkeypatch.setattr(readmodel, "model_row", broken_rows)   # every row, as both routes build them
        models_status, models_error = await comfy.get_json("/memx/models")
        metrics_response = await comfy.client.get("/metrics")
        metrics_status, metrics_error = metrics_response.status, await metrics_response.json()
        monkeypatch.undo()
        status_after, rows_after = await comfy.get_json("/memx/models")
        return free_status, receipt, models_status, models_error, metrics_status, metrics_error, status_after

    free_status, receipt, models_status, models_error, metrics_status, metrics_error, status_after = serve(
        "0.27.0", tmp_path, scenario)
    assert free_status == 200 and receipt["survivors"][0]["search"] == {"error": "RuntimeError: search bug"}
    assert models_status == 500 and models_error == {"error": "internal", "message": "RuntimeError: ledger view bug"}
    assert metrics_status == 500 and metrics_error["error"] == "internal" and "ledger view bug" in metrics_error["message"]
    assert status_after == 200


# -- metrics ------------------------------------------------------------------------------------------------------------

def test_metrics_route_names_and_labels_through_the_patch(tmp_path):
    parser = pytest.importorskip("prometheus_client.parser")

    async def scenario(comfy):
        await comfy.run(leaky("a", leak=True))
        await comfy.run(leaky("b"))
        await comfy.free()
        texts = []
        for path in ("/metrics", "/memx/metrics", "/api/metrics"):
            response = await comfy.client.get(path)
            assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
            texts.append(await response.text())
        return texts

    texts = serve("0.27.0", tmp_path, scenario)
    assert texts[0].split("comfy_memx_load_seconds_sum")[0] == texts[1].split("comfy_memx_load_seconds_sum")[0]
    samples = [s for family in parser.text_string_to_metric_families(texts[0]) for s in family.samples]
    # the prefix on every name but the process collector's standard ones (process_start_time_seconds, ...)
    assert samples and all(s.name.startswith(("comfy_memx_", "process_")) for s in samples)
    assert any(s.name == "process_start_time_seconds" for s in samples)
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
    assert value[("comfy_memx_loads_total", (("package", "leaky_pack"),))] == 2
    assert value[("comfy_memx_unloads_total", (("package", "leaky_pack"), ("reason", "free_request")))] >= 1
    leaks = {labels: v for (name, labels), v in value.items() if name == "comfy_memx_leaks_total"}
    rooted = {dict(labels)["package"]: v for labels, v in leaks.items()
              if dict(labels)["loader_package"] == "leaky_pack" and dict(labels)["stage"] == "rooted"}
    assert list(rooted) == ["leaky_pack"] and rooted["leaky_pack"] >= 1  # package: the holder's, loader_package apart
    assert value[("comfy_memx_load_seconds_count", ())] == 2
    assert ("comfy_memx_offload_seconds_count", ()) in value
    leaked = [s for s in samples if s.name == "comfy_memx_model_bytes"]
    assert [(s.labels["model"], s.labels["package"], s.labels["state"]) for s in leaked] == [
        ("BaseModel", "leaky_pack", "leaked")]
    assert value[("comfy_memx_pinned_bytes", ())] == 0


def test_metrics_move_to_memx_metrics_when_another_pack_serves_metrics(tmp_path, caplog):
    from aiohttp import web

    def other_pack(server):
        @server.routes.get("/metrics")
        async def their_metrics(request):
            return web.Response(text="their_metric 1\n")

    async def scenario(comfy):
        theirs = await (await comfy.client.get("/metrics")).text()
        ours = await comfy.client.get("/memx/metrics")
        return theirs, ours.status, await ours.text()

    caplog.set_level(logging.INFO, logger="comfy_memx")
    theirs, status, ours = serve("0.3.64", tmp_path, scenario, before_routes=other_pack)
    assert theirs == "their_metric 1\n" and status == 200 and "comfy_memx_loaded_bytes" in ours
    assert "another extension already serves /metrics; comfy_memx's metrics are at /memx/metrics" in caplog.text


def test_metrics_answer_501_with_a_hint_without_prometheus_client(tmp_path, monkeypatch):
    def missing():
        raise metrics.MetricsUnavailable("prometheus_client is not installed; " + metrics.INSTALL_HINT)

    async def scenario(comfy):
        metrics.uninstall()
        monkeypatch.setattr(metrics, "_prometheus", missing)
        response = await comfy.client.get("/metrics")
        return response.status, await response.json()

    status, answer = serve("0.27.0", tmp_path, scenario)
    assert status == 501 and answer == {"error": "metrics_unavailable", "message": metrics.INSTALL_HINT}


# -- units --------------------------------------------------------------------------------------------------------------

def test_clip_cuts_strings_and_never_reprs_objects():
    class Loud:
        def __repr__(self):
            raise AssertionError("repr called")

    clipped = replies.clip({"k" * 400: ["v" * 400, Loud(), 1.5, float("inf"), None, True, (1, 2)]}, limit=10)
    [(key, value)] = clipped.items()
    assert key == "k" * 9 + "\u2026" and value == ["v" * 9 + "\u2026", "<Loud>", 1.5, None, None, True, [1, 2]]


def test_register_adds_routes_once_and_detects_a_taken_metrics_path():
    from aiohttp import web

    class Server:
        def __init__(self):
            self.routes, self.app, self.prompt_queue = web.RouteTableDef(), web.Application(), None

    plain = Server()
    served = ["/memx/models", "/memx/status", "/memx/timeline", "/memx/releases", "/memx/runbooks", "/memx/free",
              "/memx/models/{model_id}/search", "/memx/models/{model_id}/release", "/memx/metrics", "/memx/",
              "/memx/web/{name}", "/metrics"]
    assert routes.register(plain) == served
    assert routes.register(plain) == served
    assert len(list(plain.routes)) == 13   # and GET /memx, the redirect to /memx/
    taken = Server()

    async def handler(request):
        return web.Response()
    taken.app.router.add_get("/api/metrics", handler)
    assert routes.register(taken) == served[:-1]


def test_free_without_the_execution_patch_sets_the_flags_and_says_it_cannot_follow(tmp_path):
    async def scenario(comfy):
        return await comfy.free(timeout=30)

    status, receipt = serve("0.27.0", tmp_path, scenario, disable="execution")
    assert status == 202 and receipt["status"] == "pending" and "cannot be followed" in receipt["note"]


def pause_after_reading_flags(queue):
    """Make the prompt worker stop right after its ``get_flags`` read non-empty flags, until released."""
    read, release = threading.Event(), threading.Event()
    wrapped = type(queue).get_flags   # comfy_memx's wrapper around ComfyUI's method

    def get_flags(*args, **kwargs):
        flags = wrapped(queue, *args, **kwargs)
        if flags and not read.is_set():
            read.set()
            release.wait(30)
        return flags
    queue.get_flags = get_flags
    return read, release


@pytest.mark.parametrize("version", VERSIONS)
def test_a_free_read_by_the_worker_just_before_ours_is_not_our_receipt(version, tmp_path):
    """Another client's ComfyUI /free is read by the worker a moment before our /memx/free sets its flags: our
    receipt belongs to the next run, which reads ours; no flag of ours is left set afterwards."""
    async def scenario(comfy):
        await comfy.run(leaky("a"))
        queue = comfy.server.prompt_queue
        read, release = pause_after_reading_flags(queue)
        response = await comfy.client.post("/free", json={"unload_models": True})   # another client
        assert response.status == 200
        def read_or_nudge():   # ComfyUI's worker can miss the wake-up of a flag set while it finishes a turn
            with queue.mutex:
                queue.not_empty.notify()
            return read.is_set()
        await wait_until_async(read_or_nudge, always, no_progress, "the worker reading the other client's flags")
        assert read.is_set()
        ours = asyncio.create_task(comfy.free({"unload_models": True, "free_memory": True}, timeout=30))
        await wait_until_async(lambda: freeing.waiting() == 1, always, no_progress, "our request at the handler")
        release.set()
        status, receipt = await ours
        await asyncio.sleep(0.2)
        return status, receipt, dict(queue.flags)

    status, receipt, flags_left = serve(version, tmp_path, scenario)
    assert status == 200 and receipt["status"] == "done"
    assert flags_left == {}, "our flags were left set: an unrequested unload would follow the next prompt"
    assert receipt["run"] == {"unload_models": True, "free_memory": True, "requests": 1}
    [freed] = receipt["freed"]
    assert freed["unloaded_bytes"] == 0 and freed["released"] is True   # the other run unloaded it; ours released it


@pytest.mark.parametrize("version", ["0.27.0"])
def test_a_free_that_times_out_before_the_worker_reads_it_leaves_no_flag_behind(version, tmp_path):
    async def scenario(comfy):
        await comfy.run(leaky("a"))
        await comfy.queue({"1": leaky("a")["1"], "3": {"class_type": "Gate", "inputs": {"model": ["1", 0]}}})
        await asyncio.get_running_loop().run_in_executor(None, Gate.entered.wait, 30)
        status, receipt = await comfy.free(timeout=0.2)
        flags_after_timeout = dict(comfy.server.prompt_queue.flags)
        Gate.open.set()
        # the worker finishes the gated prompt and one more, reading the flags after each
        await comfy.run({"1": leaky("a")["1"], "3": {"class_type": "Gate", "inputs": {"model": ["1", 0]}}})
        _, rows = await comfy.get_json("/memx/models")
        return status, receipt, flags_after_timeout, rows

    status, receipt, flags_after_timeout, rows = serve(version, tmp_path, scenario)
    assert flags_after_timeout == {}, "our flags were left set after the request gave up"
    assert [r["state"] for r in rows] == ["loaded"]      # no unrequested unload after the next prompts
    assert status == 202 and receipt["worker"] == "withdrawn"
