"""A bad setting keeps comfy_memx off in a node-pack install, and the pack still says why: on the stand-in
PromptServer, ComfyUI loads the pack (``comfy_memx.nodepack.activate``, as the root ``__init__.py`` calls it) with
``COMFY_MEMX_RELEASE=auto`` and no package list; nothing is patched, no other /memx route exists, and ``GET
/memx/status`` (and ``/api/memx/status``) answers 503 with the error, the setting and its accepted values, which the
memory panel shows."""

import asyncio
import logging
import os

import pytest
from aiohttp.test_utils import TestClient, TestServer

from comfy_memx import __version__, nodepack
from comfy_memx.core import registry
from comfy_memx.core.state import STATE
from fake_comfy.loader import purge_fake_comfy, use_fake_comfy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BAD = {"COMFY_MEMX_RELEASE": ("auto", "COMFY_MEMX_RELEASE_PACKAGES",
                              "comma list of custom-node folder names, or * for every pack"),
       "COMFY_MEMX_LEAK_MODE": ("loud", "COMFY_MEMX_LEAK_MODE", "off, report, strict")}
# what to do: a bad value is set right or unset; auto without its packages is not mended by unsetting them
FIXES = {"COMFY_MEMX_RELEASE": "set COMFY_MEMX_RELEASE_PACKAGES to the packs whose caches auto may cut (or *), or set "
                               "COMFY_MEMX_RELEASE to ask or off, then restart ComfyUI",
         "COMFY_MEMX_LEAK_MODE": "set COMFY_MEMX_LEAK_MODE to an accepted value (off, report, strict) or unset it, "
                                 "then restart ComfyUI"}


@pytest.fixture
def stand_in(monkeypatch):
    """The 0.27.0 stand-in imported as ComfyUI imports it before its custom nodes, comfy_memx not active."""
    for name in [name for name in os.environ if name.startswith("COMFY_MEMX")]:
        monkeypatch.delenv(name)
    STATE.reset()
    use_fake_comfy("0.27.0")
    import server  # noqa: F401  (main.py imports it before the custom nodes)
    yield
    registry.remove_all()
    purge_fake_comfy()
    STATE.reset()


def serve_after_activation(paths):
    """Create the PromptServer, let the pack activate (it fails), add ComfyUI's routes, GET ``paths``."""
    async def main():
        import comfy.model_management as mm
        import server
        prompt_server = server.PromptServer(asyncio.get_running_loop())
        source = nodepack.activate(ROOT)
        prompt_server.add_routes()
        client = TestClient(TestServer(prompt_server.app, host="127.0.0.1"))
        await client.start_server()
        try:
            answers = {}
            for path in paths:
                response = await client.get(path)
                body = await response.json() if response.content_type == "application/json" else None
                answers[path] = (response.status, body)
        finally:
            await client.close()
        return source, answers, hasattr(mm.load_models_gpu, "__wrapped__")
    return asyncio.run(main())


@pytest.mark.parametrize("variable", sorted(BAD))
def test_a_bad_setting_leaves_comfyui_unpatched_and_the_status_route_says_why(variable, stand_in, monkeypatch, caplog):
    value, setting, accepted = BAD[variable]
    monkeypatch.setenv(variable, value)
    paths = ["/memx/status", "/api/memx/status", "/memx/models", "/memx/releases", "/memx/timeline", "/memx/"]
    with caplog.at_level(logging.ERROR, logger="comfy_memx"):
        source, answers, patched = serve_after_activation(paths)
    assert source is None and STATE.source is None and not patched
    assert any("comfy_memx is NOT active" in record.getMessage() for record in caplog.records)
    status, body = answers["/memx/status"]
    assert status == 503 and answers["/api/memx/status"] == answers["/memx/status"]
    assert body["active"] is False and body["error"] == "inactive" and body["version"] == __version__
    assert body["source"] == "node pack" and body["setting"] == setting and body["accepted"] == accepted
    assert body["message"].startswith("comfy_memx is NOT active in this ComfyUI: ") and setting in body["message"]
    assert body["fix"] == FIXES[variable]
    for path in paths[2:]:
        assert answers[path][0] == 404, (path, answers[path])


def test_a_good_setting_serves_the_real_status_and_no_inactive_one(stand_in, monkeypatch):
    monkeypatch.setenv("COMFY_MEMX_RELEASE", "ask")
    monkeypatch.setenv("COMFY_MEMX_RAISE_INTERNAL", "1")
    source, answers, patched = serve_after_activation(["/memx/status"])
    status, body = answers["/memx/status"]
    assert source == "node pack" and patched and status == 200
    assert body["source"] == "node pack" and body["release"] == "ask" and "active" not in body


def test_an_unexpected_failure_names_only_its_type_and_points_at_the_log():
    class Strange(RuntimeError):
        pass
    body = nodepack.inactive_status(Strange("/home/someone/secret/path"))
    assert body["message"] == ("comfy_memx is NOT active in this ComfyUI: start-up failed (Strange); the traceback "
                               "is in ComfyUI's log")
    assert body["setting"] is None and "secret" not in str(body)
    assert body["fix"] == "see the comfy_memx line in ComfyUI's log, then restart ComfyUI"
