"""What the memory panel says on the cards a person reads after a Free, in real Chromium (Debian's ``chromium``
driven by Playwright, as ``test_panel_browser.py``), on comfy_memx's own page files with its routes answered by the
test (``test_panel_release.StubServer``): needs Chromium only, no ComfyUI.

* the last unload of a model that ``POST /memx/free`` unloaded names that route, and every other requester the
  ledger writes reads as words, never "?";
* a card with the ``leaked`` badge but no leak record yet (a survivor of a free that ComfyUI never warned about)
  names the holder its last search found, never "ComfyUI (loaded list)";
* the timeline gives each model a lane of its own: two models of one size loaded and unloaded together are both
  seen;
* the Free receipt counts only models whose memory is gone as freed.
"""

import json
import time
from urllib.parse import urlsplit

import pytest

from test_panel_browser import NOT_SHOWN, WAIT_MS, needs_chromium
from test_panel_release import MIB, STUB_BASE, StubServer, chromium  # noqa: F401  (the module's one Chromium)

pytestmark = [pytest.mark.real, pytest.mark.browser]

NOW = time.time()
OWNER = {"package": "memx_utility_belt", "class_type": "MemxLoader", "node_id": "2", "prompt_id": "p", "via": None}
HTTP_FREE = {"kind": "http", "route": "/memx/free", "clients": 1}
#: requester (as the ledger writes it) -> what the card's "last unload" says after "free_request by "
REQUESTERS = {
    "Http#1": (HTTP_FREE, "POST /memx/free"),
    "Http#2": ({"kind": "http", "route": "/memx/free", "clients": 3}, "POST /memx/free (3 clients)"),
    "Idle#3": ({"kind": "comfy_memx", "via": "idle_unload", "idle_s": 300}, "comfy_memx via idle_unload"),
    "Peer#4": ({"kind": "comfy_memx", "via": "handoff", "peer": "b"}, "comfy_memx via handoff"),
    "Worker#5": ({"kind": "comfyui", "via": "prompt_worker", "prompt_id": None, "node_id": None, "class_type": None},
                 "ComfyUI via prompt_worker"),
    "Node#6": ({"kind": "node", "via": "PromptQueue.set_flag", "prompt_id": "p", "node_id": "7",
                "class_type": "UnloadAllModels", "package": "ComfyUI-Unload-Model"},
               "ComfyUI-Unload-Model · UnloadAllModels (node 7) via PromptQueue.set_flag"),
    "Load#7": ({"kind": "load", "models": [{"model": "SDXL", "model_id": "SDXL#9", "bytes": 5}],
                "node": {"package": "core", "class_type": "KSampler", "node_id": "3", "prompt_id": "p", "via": None}},
               "core · KSampler (node 3) loading SDXL"),
}
KEPT_PATH = "h1_leaky.KEPT[6]"


def row(model_id, state="offloaded", requested_by=None, **fields):
    """One ``/memx/models`` row as the contract shapes it."""
    base = {"model_id": model_id, "model": model_id.split("#")[0], "state": state, "bytes": 16 * MIB,
            "loaded_bytes": 0, "bytes_by_device": {"cpu": 16 * MIB}, "loads": 1, "reloads": 0, "owner": OWNER,
            "in_comfyui_loaded_list": False, "leak": None, "searched": None, "release": None,
            "last_unload": {"reason": "free_request", "requested_by": requested_by or HTTP_FREE,
                            "bytes": 16 * MIB, "time": NOW - 5}}
    return {**base, **fields}


class ViewServer(StubServer):
    """``StubServer`` with a timeline of ``entries`` and ``POST /memx/free`` answered by ``free_receipt``."""

    def __init__(self, page, rows, entries=(), free_receipt=None):
        self.entries, self.free_receipt = list(entries), free_receipt
        super().__init__(page, rows)

    def handle(self, route):
        path = urlsplit(route.request.url).path
        if path == "/memx/timeline":
            body = {"started": NOW - 100, "next": len(self.entries), "now": NOW, "entries": self.entries,
                    "dropped": 0}
            return route.fulfill(status=200, content_type="application/json", body=json.dumps(body))
        if path == "/memx/free" and route.request.method == "POST":
            return route.fulfill(status=200, content_type="application/json", body=json.dumps(self.free_receipt))
        return super().handle(route)


@pytest.fixture
def view_page(chromium):  # noqa: F811
    """``view_page(rows, entries=(), free_receipt=None)`` -> the page at /memx/ with every model card drawn."""
    context = chromium.new_context(viewport={"width": 900, "height": 900})
    errors = []

    def open_page(rows, entries=(), free_receipt=None):
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        ViewServer(page, rows, entries, free_receipt)
        page.goto(STUB_BASE + "/memx/", wait_until="load")
        for model in rows:
            page.locator(f"[data-memx=model][data-model-id='{model['model_id']}']").wait_for(timeout=WAIT_MS)
        return page

    yield open_page
    assert errors == []
    context.close()


def card(page, model_id):
    return page.locator(f"[data-memx=model][data-model-id='{model_id}']").inner_text()


def unload_entry(seq, model_id, requested_by, at, loaded=0):
    return {"seq": seq, "time": at, "kind": "unload", "model_id": model_id, "model": model_id.split("#")[0],
            "loaded_bytes": loaded, "bytes": 16 * MIB, "reason": "free_request", "requested_by": requested_by}


def load_entry(seq, model_id, at):
    return {"seq": seq, "time": at, "kind": "load", "model_id": model_id, "model": model_id.split("#")[0],
            "loaded_bytes": 16 * MIB, "bytes": 16 * MIB, "owner": {"package": "memx_utility_belt"}, "reload": False}


@needs_chromium
def test_the_last_unload_names_who_asked_for_every_kind_of_requester(view_page):
    page = view_page([row(model_id, requested_by=asker) for model_id, (asker, _) in REQUESTERS.items()])
    for model_id, (_, said) in REQUESTERS.items():
        shown = card(page, model_id)
        assert f"free_request by {said} at" in shown, (model_id, shown)
        assert "by ?" not in shown and not NOT_SHOWN.intersection(shown.split()), shown


@needs_chromium
def test_a_timeline_mark_of_a_free_by_http_names_the_route(view_page):
    """The timeline's own short form of the requester (``surface.timeline``) reads as the card does."""
    entries = [load_entry(1, "Http#1", NOW - 50), unload_entry(2, "Http#1", {"kind": "http", "route": "/memx/free"},
                                                                NOW - 5)]
    page = view_page([row("Http#1")], entries)
    title = page.locator("svg.memx-timeline .memx-mark-unload title").first.text_content()
    assert "(free_request by POST /memx/free)" in title, title


@needs_chromium
def test_a_leaked_card_without_a_leak_record_names_the_holder_its_search_found(view_page):
    searched = {"holder": {"package": "h1_leaky", "path": KEPT_PATH, "pattern": "appended_list"},
                "result": "found", "time": NOW - 2}
    page = view_page([row("Kept#1", state="leaked", in_comfyui_loaded_list=True, searched=searched),
                      row("Lost#2", state="leaked", in_comfyui_loaded_list=True),
                      row("Loaded#3", state="loaded", in_comfyui_loaded_list=True, last_unload=None)])
    kept = card(page, "Kept#1")
    assert f"held by\nh1_leaky ({KEPT_PATH}, searched" in kept, kept
    assert "ComfyUI (loaded list)" not in kept, kept
    lost = card(page, "Lost#2")
    assert "held by\nnot searched yet" in lost and "ComfyUI" not in lost.split("held by")[1].split("\n")[1], lost
    assert "held by\nComfyUI (loaded list)" in card(page, "Loaded#3")


@needs_chromium
def test_a_model_a_free_left_held_by_a_pack_shows_under_leaks_with_its_holder(view_page):
    """A leak ComfyUI never warned about (``found_by: after_free``: a free unloaded the model and a pack still holds
    it; the record is the one ``leaks.unwarned`` writes) is a leak card like a warned one, holder chain included, and
    says how it was found; a model a free left held by nothing is no leak card."""
    holder = {"package": "h1_leaky", "path": KEPT_PATH, "pattern": "appended_list", "suggestion": "drop the entry"}
    leak = {"stage": "rooted", "found_by": "after_free", "holder_package": "h1_leaky", "holder": holder,
            "referrers": [{**holder, "holder_package": "h1_leaky"}], "search": {"result": "found"}}
    page = view_page([row("Freed#1", state="leaked", leak=leak), row("Gone#2")])
    shown = page.locator("[data-memx=leak][data-model-id='Freed#1']")
    shown.wait_for(timeout=WAIT_MS)
    text = shown.inner_text()
    assert KEPT_PATH in text and "held by h1_leaky" in text and "found after a free" in text, text
    assert page.locator("[data-memx=leak][data-model-id='Gone#2']").count() == 0


@needs_chromium
def test_models_of_one_size_loaded_and_unloaded_together_each_have_a_lane_of_their_own(view_page):
    models = ["Same#1", "Same#2", "Same#3"]
    entries = [load_entry(i + 1, m, NOW - 60) for i, m in enumerate(models)]
    entries += [unload_entry(i + 4, m, HTTP_FREE, NOW - 10) for i, m in enumerate(models)]
    page = view_page([row(m) for m in models], entries)
    page.locator("svg.memx-timeline polyline.memx-line").nth(2).wait_for(state="attached", timeout=WAIT_MS)
    boxes = page.evaluate("""() => [...document.querySelectorAll('svg.memx-timeline polyline.memx-line')].map(
        (line) => { const box = line.getBBox(); return [line.dataset.modelId, box.y, box.y + box.height]; })""")
    assert [model for model, _, _ in boxes] == models, boxes
    spans = sorted((top, bottom) for _, top, bottom in boxes)
    for (_, bottom), (top, _) in zip(spans, spans[1:]):
        assert bottom < top, boxes           # no two lanes share a pixel row
    assert all(bottom - top >= 10 for _, top, bottom in boxes), boxes   # each line still shows its load and unload


@needs_chromium
def test_the_free_receipt_never_counts_a_model_still_in_ram_as_freed(view_page):
    """``--cpu``: the unload moved nothing out of RAM and the model survived; the headline says so."""
    kept = {"model_id": "Kept#1", "model": "Kept", "unloaded_bytes": 16 * MIB, "bytes": 16 * MIB, "device": "cpu",
            "released": False}
    survivor = {"model_id": "Kept#1", "model": "Kept", "reason": "leaked", "bytes": 16 * MIB,
                "holders": [{"path": KEPT_PATH, "package": "h1_leaky"}], "search": {"result": "found"}}
    receipt = {"status": "done", "waited_s": 0.3, "freed": [kept], "freed_bytes": 16 * MIB, "released_bytes": 0,
               "still_loaded": [], "survivors": [survivor], "survivor_bytes": 16 * MIB,
               "memory": {"rss_before": 900 * MIB, "rss_after": 900 * MIB}}
    page = view_page([row("Kept#1", state="leaked")], free_receipt=receipt)
    page.locator("[data-memx=free-button]").click()
    headline = page.locator("[data-memx=freed-headline]")
    headline.wait_for(timeout=WAIT_MS)
    assert headline.inner_text() == ("Freed 0 B (0 model(s) gone from memory); unloaded 16.0 MiB from 1 model(s), "
                                     "1 of them still in RAM"), headline.inner_text()
    assert page.locator("[data-memx=freed] li").inner_text() == "Kept#1: 16.0 MiB unloaded from cpu, still in RAM"
