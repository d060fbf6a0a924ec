"""What the memory panel says about releases, the release setting, an inactive comfy_memx, the process's own memory
and who built a model, in real Chromium (Debian's ``chromium`` driven by Playwright, as ``test_panel_browser.py``),
on comfy_memx's own page files with its routes answered by the test (``test_panel_release.StubServer``): needs
Chromium only, no ComfyUI.

* the Released list shows every release that cut an entry, whatever started it (the Release button, ``free
  --release``, ``auto``): the models, the bytes given back, the cut, the pack, when, RSS before and after;
* with no leak left after automatic releases, the Leaks section says how many were released, never only "no leaked
  model";
* the timeline marks each release (◆, in the legend) on the model's lane, and the lane of a model it freed ends
  there;
* the header says the release setting and its packages; a comfy_memx kept off by a bad setting says why;
* the Memory section shows ComfyUI's own RSS and the bytes its leaked models hold beside the machine's RAM;
* a card says "created by" the pack that built a model when another package loaded it;
* a long holder path wraps inside its card in a sidebar-wide panel;
* the Free receipt defines "orphaned" and "kept" where a survivor has that reason.
"""

import json
import time
from urllib.parse import urlsplit

import pytest

from test_panel_browser import NOT_SHOWN, WAIT_MS, needs_chromium
from test_panel_release import MIB, STUB_BASE, StubServer, chromium  # noqa: F401  (the module's one Chromium)

pytestmark = [pytest.mark.real, pytest.mark.browser]

NOW = time.time()
LOADER = {"package": "core", "class_type": "KSampler", "node_id": "4", "prompt_id": "p", "via": None}
BUILDER = {"package": "my_unet_pack", "class_type": "MyUNetLoader", "node_id": "2", "prompt_id": "p", "via": None}
STATUS = {"version": "0.3.0", "source": "node pack", "leak_mode": "strict", "release": "auto",
          "release_packages": ["my_unet_pack", "memx_style_mixer"], "sites": {},
          "pins": {"pinned_bytes": 0, "cap_bytes": None, "comfyui_cap_bytes": -1},
          "process": {"rss_bytes": 9 * 1024 * MIB}}
STATS = {"system": {"ram_total": 32 * 1024 * MIB, "ram_free": 12 * 1024 * MIB}, "devices": []}
CUT_PATH = "my_unet_pack.MyUNetLoader._unets[('sd15_a.safetensors', 'fp16')]"
LONG_PATH = ("my_unet_pack.nodes.MyUNetLoader._unets_by_checkpoint_and_dtype_and_device_and_a_very_long_key_name"
             "['some/really/long/path/to/a/checkpoint/file/that/never/ends/sd15_pruned_emaonly_fp16.safetensors']")


def row(model_id, state="offloaded", **fields):
    """One ``/memx/models`` row as the contract shapes it."""
    base = {"model_id": model_id, "model": model_id.split("#")[0], "state": state, "bytes": 1638 * MIB,
            "loaded_bytes": 0, "bytes_by_device": {"cpu": 1638 * MIB}, "loads": 1, "reloads": 0, "owner": LOADER,
            "created_by": None, "in_comfyui_loaded_list": False, "leak": None, "searched": None, "release": None,
            "last_unload": None}
    return {**base, **fields}


def receipt(model_id, trigger, at, outcome="released", died=True, **fields):
    """One release receipt (``leaks.release``) as ``GET /memx/releases`` answers it."""
    base = {"model": "UNetModel", "model_id": model_id, "trigger": trigger, "outcome": outcome,
            "package": "my_unet_pack", "pattern": "class_cache", "path": CUT_PATH,
            "cut": CUT_PATH if outcome in ("released", "survivor") else None, "method": "dict_entry",
            "other_entries_dropped": 0, "bytes": 1638 * MIB, "died": died, "next_holder": None, "reason": None,
            "fix": None, "time": at,
            "memory": {"before": {"rss": 11 * 1024 * MIB}, "after": {"rss": 9 * 1024 * MIB + 400 * MIB},
                       "trim_returned_bytes": 12 * MIB}}
    base["models"] = [{"model": "UNetModel", "model_id": model_id, "bytes": 1638 * MIB, "died": died}]
    base["released_bytes"] = 1638 * MIB if died and outcome in ("released", "survivor") else 0
    return {**base, **fields}


RECEIPTS = [receipt("UNetModel#1", "http", NOW - 50), receipt("UNetModel#2", "free", NOW - 40),
            receipt("UNetModel#3", "auto", NOW - 30), receipt("UNetModel#4", "auto", NOW - 20),
            receipt("UNetModel#5", "auto", NOW - 10, outcome="in_use", died=False,
                    reason="prompt 7f3c, which loaded it, is still running")]
RELEASES = {"capacity": 64, "releases": RECEIPTS, "released_bytes": 4 * 1638 * MIB, "cut": 4}


def load_entry(seq, model_id, at):
    return {"seq": seq, "time": at, "kind": "load", "model_id": model_id, "model": "UNetModel",
            "loaded_bytes": 1638 * MIB, "bytes": 1638 * MIB, "owner": {"package": "core"}, "reload": False}


def leak_entry(seq, model_id, at):
    return {"seq": seq, "time": at, "kind": "leak", "model_id": model_id, "model": "UNetModel", "stage": "rooted",
            "holder_package": "my_unet_pack", "loaded_bytes": 1638 * MIB}


def release_entry(seq, model_id, at, trigger):
    return {"seq": seq, "time": at, "kind": "release", "model_id": model_id, "model": "UNetModel",
            "trigger": trigger, "outcome": "released", "package": "my_unet_pack", "cut": CUT_PATH,
            "bytes": 1638 * MIB, "died": True, "loaded_bytes": 0}


class ReleasedServer(StubServer):
    """``StubServer`` with ``/memx/status``, ``/memx/releases``, ``/memx/timeline``, ``/system_stats`` and a free
    receipt of the test's; ``status_code`` 503 answers ``status`` as the node pack's inactive status."""

    def __init__(self, page, rows, status=STATUS, releases=RELEASES, entries=(), free_receipt=None,
                 status_code=200):
        self.status, self.releases_answer, self.entries = status, releases, list(entries)
        self.free_receipt, self.status_code, self.asked = free_receipt, status_code, []
        super().__init__(page, rows)

    def handle(self, route):
        path = urlsplit(route.request.url).path
        self.asked.append(path)
        answers = {"/memx/status": (self.status_code, self.status), "/memx/releases": (200, self.releases_answer),
                   "/system_stats": (200, STATS),
                   "/memx/timeline": (200, {"started": NOW - 100, "next": len(self.entries), "now": NOW,
                                            "entries": self.entries, "dropped": 0})}
        if path == "/memx/free" and route.request.method == "POST":
            answers["/memx/free"] = (200, self.free_receipt)
        if path in answers and (self.status_code == 200 or path == "/memx/status"):
            status, body = answers[path]
            return route.fulfill(status=status, content_type="application/json", body=json.dumps(body))
        if self.status_code != 200 and path.startswith("/memx/") and not path.startswith("/memx/web/") \
                and path != "/memx/":
            return route.fulfill(status=404, content_type="text/plain", body="404: Not Found")
        return super().handle(route)


@pytest.fixture
def open_panel(chromium):  # noqa: F811
    """``open_panel(rows, width=900, **server)`` -> (page, its server) at /memx/ once the panel has drawn."""
    contexts, errors = [], []

    def open_page(rows, width=900, wait_for="[data-memx=released-summary]", **server):
        context = chromium.new_context(viewport={"width": width, "height": 1400})
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        stub = ReleasedServer(page, rows, **server)
        page.goto(STUB_BASE + "/memx/", wait_until="load")
        page.locator(wait_for).first.wait_for(timeout=WAIT_MS)
        return page, stub

    yield open_page
    assert errors == []
    for context in contexts:
        context.close()


def texts(page, selector):
    return page.locator(selector).all_inner_texts()


@needs_chromium
def test_the_released_list_shows_a_release_by_the_button_by_free_and_by_auto(open_panel):
    page, _ = open_panel([])
    cards = page.locator("[data-memx=released]")
    assert [cards.nth(i).get_attribute("data-trigger") for i in range(cards.count())] == ["auto", "auto", "free",
                                                                                         "http"]
    shown = {cards.nth(i).get_attribute("data-model-id"): cards.nth(i).inner_text() for i in range(cards.count())}
    assert "UNetModel#5" not in shown   # in use: nothing was cut
    for model_id, trigger in (("UNetModel#1", "the Release button"), ("UNetModel#2", "free --release"),
                              ("UNetModel#3", "auto (COMFY_MEMX_RELEASE=auto)")):
        text = shown[model_id]
        assert "1.60 GiB" in text and f"{model_id} gone from memory" in text, text
        assert CUT_PATH in text and "my_unet_pack · class_cache" in text and trigger in text, text
        assert "11.0 GiB before, 9.39 GiB after (malloc_trim returned 12.0 MiB)" in text, text
        assert not NOT_SHOWN.intersection(text.split()), text
    summary = page.locator("[data-memx=released-summary]").inner_text()
    assert summary == ("4 release(s) gave back 6.40 GiB (2 by auto (COMFY_MEMX_RELEASE=auto), 1 by free --release, "
                       "1 by the Release button)"), summary
    not_cut = page.locator("[data-memx=released-not-cut]").inner_text()
    assert "1 release(s) cut nothing" in not_cut and "UNetModel#5 in_use" in not_cut and "7f3c" in not_cut


@needs_chromium
def test_a_receipt_without_models_or_released_bytes_still_reads_right(open_panel):
    """A receipt of a release engine that writes neither ``models`` nor ``released_bytes`` (the panel falls back to
    ``model_id``, ``bytes`` and ``died``)."""
    old = {key: value for key, value in receipt("UNetModel#7", "auto", NOW - 5).items()
           if key not in ("models", "released_bytes")}
    survivor = {key: value for key, value in receipt("UNetModel#8", "http", NOW - 4, outcome="survivor",
                                                      died=False).items() if key not in ("models", "released_bytes")}
    survivor["next_holder"] = {"path": "other_pack.KEEP[0]", "package": "other_pack"}
    page, _ = open_panel([], releases={"capacity": 64, "releases": [old, survivor]})
    first = page.locator("[data-memx=released][data-model-id='UNetModel#7']").inner_text()
    assert "1.60 GiB (UNetModel#7 gone from memory)" in first, first
    second = page.locator("[data-memx=released][data-model-id='UNetModel#8']").inner_text()
    assert "given back\n0 B" in second and "UNetModel#8 by other_pack.KEEP[0] (other_pack)" in second, second


@needs_chromium
def test_with_every_leak_released_the_leaks_section_says_how_many_and_how_much(open_panel):
    page, _ = open_panel([row("UNetModel#9", state="loaded", loaded_bytes=1638 * MIB)])
    said = page.locator("[data-memx=no-leak]").inner_text()
    assert said == "no leaked model now · 4 released (6.40 GiB given back): see Released", said
    only_cut = {**RELEASES, "releases": RECEIPTS[:4]}     # no try that cut nothing: no line for them, no "null"
    page, _ = open_panel([], releases=only_cut)
    shown = page.locator("[data-memx=panel]").inner_text()
    assert not NOT_SHOWN.intersection(shown.split()), shown
    assert page.locator("[data-memx=released-not-cut]").count() == 0


@needs_chromium
def test_the_timeline_marks_each_release_and_the_freed_models_lane_ends_there(open_panel):
    entries = []
    for index, (model_id, trigger) in enumerate((("UNetModel#1", "http"), ("UNetModel#2", "free"),
                                                 ("UNetModel#3", "auto"))):
        entries += [load_entry(3 * index + 1, model_id, NOW - 90 + index),
                    leak_entry(3 * index + 2, model_id, NOW - 70 + index),
                    release_entry(3 * index + 3, model_id, NOW - 50 + 10 * index, trigger)]
    page, _ = open_panel([], entries=entries, wait_for="svg.memx-timeline .memx-mark-release")
    marks = page.locator("svg.memx-timeline .memx-mark-release")
    assert marks.count() == 3
    titles = [marks.nth(i).locator("title").text_content() for i in range(3)]
    assert "by the Release button: cut " in titles[0] and "by free --release" in titles[1], titles
    assert "by auto (COMFY_MEMX_RELEASE=auto)" in titles[2] and "1.60 GiB given back, the model is gone" in titles[2]
    ends = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('svg.memx-timeline .memx-line')]
        .map((line) => [line.dataset.modelId, [...line.points].map((p) => p.x)]))""")
    mark_x = page.evaluate("""() => [...document.querySelectorAll('svg.memx-timeline .memx-mark-release')]
        .map((mark) => { const box = mark.getBBox(); return box.x + box.width / 2; })""")
    for model_id, at in zip(("UNetModel#1", "UNetModel#2", "UNetModel#3"), mark_x):
        assert abs(max(ends[model_id]) - at) < 1.5, (model_id, ends[model_id], at)   # the lane ends at its release
    legend = page.locator("[data-memx=timeline-legend]").inner_text()
    assert legend.count("◆ released") == 3, legend
    key = page.locator("[data-memx=timeline-key]").inner_text()
    assert "◆ release (the lane of a model it freed ends there)" in key and "3 release" in key, key


@needs_chromium
def test_the_header_says_the_release_setting_and_its_packages(open_panel):
    page, _ = open_panel([])
    head = page.locator("[data-memx=head-status]").inner_text()
    assert "v0.3.0 · node pack · leak mode strict · release auto for my_unet_pack, memx_style_mixer" in head, head
    page, _ = open_panel([], status={**STATUS, "release": "auto", "release_packages": ["*"]})
    assert "release auto for every pack" in page.locator("[data-memx=head-status]").inner_text()
    page, _ = open_panel([], status={**STATUS, "release": "off", "release_packages": []})
    assert page.locator("[data-memx=head-status]").inner_text().split(" · ")[3].startswith("release off")


@needs_chromium
def test_a_comfy_memx_kept_off_by_a_bad_setting_says_why_and_shows_nothing_else(open_panel):
    """The node pack's inactive ``/memx/status`` (503): every other /memx route is 404 there."""
    inactive = {"active": False, "error": "inactive", "version": "0.3.0", "source": "node pack",
                "message": "comfy_memx is NOT active in this ComfyUI: COMFY_MEMX_RELEASE=auto needs "
                           "COMFY_MEMX_RELEASE_PACKAGES: the custom-node packages whose caches may be cut "
                           "automatically",
                "setting": "COMFY_MEMX_RELEASE_PACKAGES",
                "accepted": "comma list of custom-node folder names, or * for every pack",
                "fix": "set COMFY_MEMX_RELEASE_PACKAGES to the packs whose caches auto may cut (or *), or set "
                       "COMFY_MEMX_RELEASE to ask or off, then restart ComfyUI"}
    page, stub = open_panel([], status=inactive, status_code=503, wait_for="[data-memx=off]")
    off = page.locator("[data-memx=off]").inner_text()
    assert "comfy_memx is off in this ComfyUI" in off and "COMFY_MEMX_RELEASE=auto needs" in off, off
    assert "setting\nCOMFY_MEMX_RELEASE_PACKAGES" in off and "comma list of custom-node folder names" in off, off
    assert "Fix: set COMFY_MEMX_RELEASE_PACKAGES" in off, off
    assert page.locator("[data-memx=error]").inner_text() == ""
    assert not page.locator("[data-memx=memory]").is_visible()
    assert "v0.3.0 · off" in page.locator("[data-memx=head-status]").inner_text()
    assert {path for path in stub.asked if path.startswith("/memx/") and "/web/" not in path} == {"/memx/",
                                                                                                    "/memx/status"}


@needs_chromium
def test_the_memory_section_shows_comfyuis_own_rss_and_what_leaks_hold_beside_the_machine(open_panel):
    rows = [row("UNetModel#1", state="leaked", bytes=1638 * MIB), row("VAE#2", state="leaked", bytes=160 * MIB),
            row("CLIP#3", state="loaded", bytes=235 * MIB)]
    page, _ = open_panel(rows)
    ram = page.locator("[data-memx=memory] [data-memx=ram]").inner_text()
    rss = page.locator("[data-memx=memory] [data-memx=rss]").inner_text()
    leaked = page.locator("[data-memx=memory] [data-memx=leaked]").inner_text()
    assert ram.split("\n") == ["RAM (machine)", "20.0 GiB / 32.0 GiB"], ram
    assert rss.split("\n") == ["ComfyUI (RSS)", "9.00 GiB / 32.0 GiB"], rss
    assert leaked.split("\n") == ["Leaked (2)", "1.76 GiB / 32.0 GiB"], leaked


@needs_chromium
def test_a_card_says_which_pack_created_a_model_another_package_loaded(open_panel):
    holder = {"package": "my_unet_pack", "path": CUT_PATH, "pattern": "class_cache", "suggestion": "cache per node"}
    leak = {"stage": "rooted", "holder_package": "my_unet_pack", "holder": holder,
            "referrers": [{**holder, "holder_package": "my_unet_pack"}], "search": {"result": "found"}}
    rows = [row("UNetModel#1", state="leaked", created_by=BUILDER, leak=leak),
            row("UNetModel#2", created_by={**BUILDER, "package": "core"}),
            row("UNetModel#3", created_by=None)]
    page, _ = open_panel(rows)
    card = page.locator("[data-memx=model][data-model-id='UNetModel#1']").inner_text()
    assert "created by\nmy_unet_pack · MyUNetLoader (node 2)" in card, card
    assert "loaded by\ncore · KSampler (node 4)" in card, card
    leak_card = page.locator("[data-memx=leak][data-model-id='UNetModel#1']").inner_text()
    assert "created by my_unet_pack · MyUNetLoader (node 2) · loaded by core · KSampler (node 4)" in leak_card
    for same in ("UNetModel#2", "UNetModel#3"):   # built by the loader's own package, or not known
        assert "created by" not in page.locator(f"[data-memx=model][data-model-id='{same}']").inner_text()


@needs_chromium
def test_a_long_holder_path_wraps_inside_its_card_in_a_sidebar_wide_panel(open_panel):
    holder = {"package": "my_unet_pack", "path": LONG_PATH, "pattern": "class_cache", "suggestion": "cache per node"}
    leak = {"stage": "rooted", "holder_package": "my_unet_pack", "holder": holder,
            "referrers": [{**holder, "holder_package": "my_unet_pack"}], "search": {"result": "found"}}
    searched = {"holder": holder, "result": "found", "time": NOW - 3}
    rows = [row("UNetModel#1", state="leaked", leak=leak), row("UNetModel#2", state="leaked", searched=searched)]
    long_receipt = receipt("UNetModel#3", "auto", NOW - 2, cut=LONG_PATH)
    page, _ = open_panel(rows, width=360, releases={"capacity": 64, "releases": [long_receipt]})
    overflowing = page.evaluate("""() => [...document.querySelectorAll('.memx-card')].filter(
        (card) => card.scrollWidth > card.clientWidth + 1 || card.getBoundingClientRect().right >
                  document.querySelector('[data-memx=panel]').getBoundingClientRect().right + 1)
        .map((card) => card.dataset.memx + ' ' + card.dataset.modelId)""")
    assert overflowing == [], overflowing
    assert page.locator("[data-memx=model]").count() == 2 and page.locator("[data-memx=released]").count() == 1


@needs_chromium
def test_the_free_receipt_defines_orphaned_and_kept_where_a_survivor_has_that_reason(open_panel):
    survivors = [{"model_id": "Orphan#1", "model": "Orphan", "reason": "orphaned", "bytes": 16 * MIB, "holders": [],
                  "search": {"result": "not_found"}},
                 {"model_id": "Kept#2", "model": "Kept", "reason": "kept", "bytes": 16 * MIB, "holders": [],
                  "search": {"result": "not_found"}}]
    free_receipt = {"status": "done", "waited_s": 0.3, "freed": [], "freed_bytes": 0, "released_bytes": 0,
                    "still_loaded": [], "survivors": survivors, "survivor_bytes": 32 * MIB,
                    "memory": {"rss_before": 900 * MIB, "rss_after": 900 * MIB}}
    page, _ = open_panel([], free_receipt=free_receipt)
    page.locator("[data-memx=free-button]").click()
    terms = page.locator("[data-memx=survivor-terms]")
    terms.wait_for(timeout=WAIT_MS)
    said = terms.inner_text()
    assert "orphaned: no ModelPatcher refers to it any more" in said, said
    assert "kept: a ModelPatcher of it outlived ComfyUI's emptied caches" in said, said
    assert "leaked:" not in said, said
