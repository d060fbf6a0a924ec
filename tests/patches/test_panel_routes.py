"""The memory panel's routes on the stand-in PromptServer, through the server patch: GET /memx/timeline (what the
prompts did, incremental reads, a bad ``since``), the timeline keeping no model alive, the standalone page and its
files, the runbook page of the alerts, and comfy_memx's web folder in ComfyUI's extension folders exactly once."""

import gc
import os
import types
import weakref

import pytest

from comfy_memx.core.state import STATE
from comfy_memx.surface import panel, routes, timeline
from test_routes import VERSIONS, leaky, serve


@pytest.mark.parametrize("version", VERSIONS)
def test_timeline_route_shows_loads_and_unloads_and_reads_on_from_next(version, tmp_path):
    async def scenario(comfy):
        await comfy.run(leaky("a"))
        await comfy.free()
        first = await comfy.get_json("/memx/timeline")
        later = await comfy.get_json(f"/memx/timeline?since={first[1]['next']}")
        api = await comfy.get_json("/api/memx/timeline?since=0")
        bad = await comfy.get_json("/memx/timeline?since=-1")
        rows = await comfy.get_json("/memx/models")
        return first, later, api, bad, rows

    (status, first), (_, later), (api_status, api), (bad_status, bad), (_, rows) = serve(version, tmp_path, scenario)
    assert status == 200 and api_status == 200 and api["entries"] == first["entries"]
    kinds = [(e["kind"], e["model_id"]) for e in first["entries"]]
    assert ("load", "BaseModel#1") in kinds and ("unload", "BaseModel#1") in kinds and ("free", None) in kinds
    loaded = next(e for e in first["entries"] if e["kind"] == "load")
    assert loaded["loaded_bytes"] == 4 * 1024 * 4 and loaded["owner"]["package"] == "leaky_pack"
    unloaded = next(e for e in first["entries"] if e["kind"] == "unload")
    assert unloaded["loaded_bytes"] == 0 and unloaded["bytes"] == 4 * 1024 * 4
    assert first["started"] <= loaded["time"] <= first["now"] and first["dropped"] == 0
    assert later["entries"] == [] and later["next"] == first["next"]
    assert bad_status == 400 and bad["error"] == "bad_since" and "since" in bad["message"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_timeline_keeps_no_model_alive(version, tmp_path):
    async def scenario(comfy):
        await comfy.run(leaky("a"))
        [record] = STATE.ledger.records()
        module = weakref.ref(record.module_ref())
        del record
        await comfy.free()
        await comfy.run(leaky("b"))
        await comfy.free()
        gc.collect()
        return module() is None, [e["model_id"] for e in timeline.installed().since()]

    released, recorded = serve(version, tmp_path, scenario)
    assert released and "BaseModel#1" in recorded


def test_the_page_and_its_files_are_served_and_nothing_else(tmp_path):
    async def scenario(comfy):
        answers = {}
        for path in ("/memx/", "/api/memx/", "/memx/web/memx_core.js", "/memx/web/page.html",
                     "/memx/web/memx_panel.js"):
            response = await comfy.client.get(path)
            answers[path] = (response.status, response.content_type, await response.text())
        redirect = await comfy.client.get("/memx", allow_redirects=False)
        answers["/memx"] = (redirect.status, redirect.headers.get("Location"), "")
        return answers

    answers = serve("0.27.0", tmp_path, scenario)
    status, kind, html = answers["/memx/"]
    assert status == 200 and kind == "text/html" and 'from "./web/memx_core.js"' in html
    assert answers["/api/memx/"][0] == 200
    status, kind, script = answers["/memx/web/memx_core.js"]
    assert status == 200 and kind == "text/javascript" and "export function mountPanel" in script
    for path in ("/memx/web/page.html", "/memx/web/memx_panel.js"):
        assert answers[path][0] == 404 and "memx_core.js" in answers[path][2], answers[path]
    assert answers["/memx"][:2] == (302, "/memx/")


@pytest.mark.parametrize("already", [None, "ComfyUI-memx"])
def test_the_web_folder_joins_comfyuis_extension_folders_once(tmp_path, already):
    served = {}

    def before_routes(server):
        import nodes
        nodes.EXTENSION_WEB_DIRS = {"other_pack": str(tmp_path)}
        if already:
            nodes.EXTENSION_WEB_DIRS[already] = panel.WEB_DIR
        served["dirs"] = nodes.EXTENSION_WEB_DIRS

    async def scenario(comfy):
        routes.register(comfy.server)    # a second registration adds nothing
        return dict(served["dirs"])

    dirs = serve("0.27.0", tmp_path, scenario, before_routes=before_routes)
    expected = {"other_pack": str(tmp_path), already or "comfy_memx": panel.WEB_DIR}
    assert dirs == expected


def test_add_extension_dir_without_comfyui_nodes_or_with_the_name_taken(tmp_path):
    assert panel.add_extension_dir(types.SimpleNamespace()) is None
    taken = types.SimpleNamespace(EXTENSION_WEB_DIRS={"comfy_memx": str(tmp_path)})
    assert panel.add_extension_dir(taken) == "comfy_memx_panel"
    assert taken.EXTENSION_WEB_DIRS["comfy_memx_panel"] == panel.WEB_DIR
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / panel.MARKER).write_text("// another comfy_memx's panel")
    elsewhere = types.SimpleNamespace(EXTENSION_WEB_DIRS={"custom_memx": str(copy)})
    assert panel.add_extension_dir(elsewhere) == "custom_memx" and len(elsewhere.EXTENSION_WEB_DIRS) == 1
    assert os.path.isfile(os.path.join(panel.WEB_DIR, "memx_core.js"))


def test_every_module_the_panel_imports_is_served_on_the_page_and_only_the_sidebar_entry_touches_comfyui(tmp_path):
    """The panel is a folder of ES modules that import each other by relative paths: each one the page needs is
    served under /memx/web/ (and, as ComfyUI imports every .js of the folder, only memx_panel.js imports ComfyUI's
    scripts and registers anything)."""
    import re
    sources = {name: open(os.path.join(panel.WEB_DIR, name), encoding="utf-8").read()
               for name in os.listdir(panel.WEB_DIR) if name.endswith(".js")}
    imported = {target for text in sources.values() for target in re.findall(r'from "\./([\w.]+)"', text)}
    assert imported and imported <= set(panel.PAGE_FILES) and "memx_panel.js" not in panel.PAGE_FILES
    assert set(panel.PAGE_FILES) == set(sources) - {"memx_panel.js"}
    for name, text in sources.items():
        touches = "../../scripts/" in text or "registerExtension" in text
        assert touches == (name == "memx_panel.js"), name

    async def scenario(comfy):
        answers = {}
        for name in sorted(panel.PAGE_FILES):
            response = await comfy.client.get(f"/memx/web/{name}")
            answers[name] = (response.status, response.content_type)
        return answers

    answers = serve("0.27.0", tmp_path, scenario)
    assert answers == {name: (200, "text/javascript") for name in panel.PAGE_FILES}


def test_the_runbook_page_every_alert_links_to_is_served_with_a_heading_per_alert(tmp_path):
    from fleet_queries import alert_names

    async def scenario(comfy):
        response = await comfy.client.get("/memx/runbooks")
        return response.status, response.content_type, await response.text()

    status, kind, page = serve("0.27.0", tmp_path, scenario)
    assert status == 200 and kind == "text/html"
    for name in alert_names():
        assert f'<h2 id="{name.lower()}">{name}</h2>' in page, name
