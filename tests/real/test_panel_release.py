"""The memory panel's Release button in real Chromium (Debian's ``chromium`` driven by Playwright, as
``test_panel_browser.py``).

Two parts.  First the panel alone, on comfy_memx's own page files (the installed package's ``web/`` folder) with
comfy_memx's routes answered by Playwright: every answer of ``POST /memx/models/{id}/release`` that a real server is
hard to lead into (a survivor, the cache changed, in use, not releasable, refused) must read right, and the button
must wait for its answer.  Needs Chromium only, no ComfyUI.

Then real ComfyUI with ``COMFY_MEMX_RELEASE=ask``, on the newest tree named, installed as a node pack (the button is
the same page code on every tree and install kind; ``test_panel_browser.py`` shows that page on each of them): the
innocent ``memx_utility_belt`` loads two models, ``memx_style_mixer`` keeps one in a class-level dict,
``memx_hook_hub`` the other in a callback's closure.  Chromium opens ComfyUI's Memory tab: the class cache has a
Release button, the callback registry has none and says why; a click cuts the dict entry, the panel shows the
receipt naming the cut, the model leaves the panel and ``/memx/models``.  Screenshots go to ``MEMX_SCREENSHOTS``.
"""

import json
import os
import time
from urllib.parse import unquote, urlsplit

import pytest

from memx_helpers import load_module
from test_panel_browser import (CHROMIUM, NOT_SHOWN, TAB_BUTTON, WAIT_MS, _playwright, _shot, scroll_to,  # noqa: F401
                                browser_cases, comfyuis_own, first_run_done, needs_chromium, node_pack_copy,
                                screenshot_dir, set_palette, wait_until, watched)
from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, ready, run_session, where)

pytestmark = [pytest.mark.real, pytest.mark.browser]

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
culprit = load_module("memx_real_culprit", os.path.join(HERE, "real_comfy", "culprit.py"))

# -- the panel alone, comfy_memx's routes answered by the test ---------------------------------------------------

STUB_BASE = "http://127.0.0.1:19517"
MIB = 1024 * 1024
CUT = "memx_style_mixer.StyleMixer._cache[(1328, 1328)]"
KEPT_ID = "MemxTinyNet#3"
HOOKED_ID = "MemxTinyNet#4"
NEXT_HOLDER = {"path": "memx_list_keeper.MODELS[0]", "package": "memx_list_keeper", "pattern": "appended_list",
               "suggestion": "remove the model from MODELS once the node is done with it"}
CALLBACK_WHY = "a callback registry: the pack must unregister its callback"


def leak_row(model_id, package, path, pattern, release):
    """One leaked row of ``/memx/models`` as the contract shapes it."""
    holder = {"path": path, "package": package, "pattern": pattern, "suggestion": f"let {package} drop it"}
    return {"model_id": model_id, "name": "MemxTinyNet", "state": "leaked", "bytes": 3 * MIB, "loaded_bytes": 0,
            "bytes_by_device": {}, "loads": 1, "reloads": 0,
            "owner": {"package": culprit.LOADER, "class_type": culprit.LOADER_NODE, "node_id": "2"},
            "leak": {"stage": "rooted", "holder_package": package, "holder": holder, "referrers": [holder]},
            "release": release}


def stub_rows(policy="ask"):
    """A class-cache leak that can be released (unless ``policy`` is off) and a callback registry that cannot."""
    off = policy == "off"
    return [leak_row(KEPT_ID, "memx_style_mixer", CUT, "class_cache",
                     {"policy": policy, "possible": not off, "why": "release is off" if off else None, "path": CUT}),
            leak_row(HOOKED_ID, "memx_hook_hub", "memx_hook_hub.CALLBACKS[0] -> closure 'model'", "callback_registry",
                     {"policy": policy, "possible": False, "why": CALLBACK_WHY, "path": None})]


def receipt(outcome, **fields):
    """A release receipt of the kept model with ``fields`` over the defaults."""
    base = {"model": "MemxTinyNet", "model_id": KEPT_ID, "trigger": "http", "outcome": outcome,
            "package": "memx_style_mixer", "pattern": "class_cache", "path": CUT, "cut": None, "method": None,
            "other_entries_dropped": 0, "bytes": 3 * MIB, "died": False, "next_holder": None, "reason": None,
            "fix": None, "time": time.time(),
            "memory": {"before": {"rss": 900 * MIB, "vram": 0, "pinned": 0},
                       "after": {"rss": 897 * MIB, "vram": 0, "pinned": 0}}}
    return {**base, **fields}


#: answer name -> (HTTP status, body, whether the row leaves /memx/models, texts the receipt must show)
ANSWERS = {
    "released": (200, {"model": "MemxTinyNet", "model_id": KEPT_ID,
                       "release": receipt("released", cut=CUT, method="dict_entry", died=True)}, True,
                 [f"Released 3.00 MiB held by memx_style_mixer ({CUT}); the pack will rebuild it when it needs it "
                  "again.", "The model is gone from memory.", "900.0 MiB before, 897.0 MiB after"]),
    "survivor_unnamed": (200, {"model": "MemxTinyNet", "model_id": KEPT_ID,
                               "release": receipt("survivor", cut=CUT, method="dict_entry")}, False,
                         [f"Cut {CUT}, but the model is still in memory (no other holder found yet)"]),
    "survivor": (200, {"model": "MemxTinyNet", "model_id": KEPT_ID,
                       "release": receipt("survivor", cut=CUT, method="dict_entry", next_holder=NEXT_HOLDER)}, False,
                 [f"Cut {CUT}, but the model is still held by memx_list_keeper.MODELS[0] (memx_list_keeper)",
                  f"Fix: {NEXT_HOLDER['suggestion']}"]),
    "changed": (409, {"error": "changed", "message": "the cache changed since the search",
                      "release": receipt("changed", reason="the entry is not in the dict any more")}, False,
                ["The cache changed since the search; nothing was cut. Search again."]),
    "in_use": (409, {"error": "in_use", "message": "prompt 7f3c, which loaded it, is still running",
                     "release": receipt("in_use", reason="prompt 7f3c, which loaded it, is still running")}, False,
               ["In use by a running prompt or by ComfyUI; nothing was cut. Try after it finishes.",
                "prompt 7f3c, which loaded it, is still running"]),
    "cut_failed": (409, {"error": "cut_failed", "message": "the dict refused the deletion; nothing was cut",
                         "release": receipt("failed", reason="the dict refused the deletion; nothing was cut")}, False,
                   ["Release failed (409): the dict refused the deletion; nothing was cut"]),
    "gone": (404, {"error": "unknown_model", "message": "the model was freed before the release",
                   "release": receipt("gone", reason="the model was freed before the release")}, True,
             ["The model is no longer in memory; there is nothing to release."]),
    "busy": (429, {"error": "busy", "message": "another holder search is running; retry in 2 s"}, False,
             ["Release failed (429): another holder search is running; retry in 2 s"]),
    "release_off": (403, {"error": "release_off", "message": "release is off in this server: start it with "
                                                             "COMFY_MEMX_RELEASE=ask"}, False,
                    ["release is off in this server: start it with COMFY_MEMX_RELEASE=ask"]),
    "not_releasable": (422, {"error": "not_releasable", "message": "ComfyUI's own cache holds the model",
                             "release": receipt("refused", fix="let ComfyUI's cache drop it: run another prompt")},
                       False, ["ComfyUI's own cache holds the model",
                               "Fix: let ComfyUI's cache drop it: run another prompt"]),
    "forbidden": (403, {"error": "forbidden", "message": "loopback or COMFY_MEMX_TOKEN only"}, False,
                  ["loopback or COMFY_MEMX_TOKEN only", "enter the server's COMFY_MEMX_TOKEN below"]),
}


class StubServer:
    """comfy_memx's page files from the installed package and its routes answered from ``rows``; the release
    route answers ``answer`` (HTTP status, body, whether the row goes), or is held in ``held`` when ``hold``."""

    def __init__(self, page, rows, answer=None, hold=False):
        from comfy_memx.surface.panel import WEB_DIR
        self.web_dir, self.rows, self.answer, self.hold = WEB_DIR, rows, answer, hold
        self.releases, self.searches, self.held = [], [], []
        page.route(STUB_BASE + "/**", self.handle)

    def handle(self, route):
        request = route.request
        path = urlsplit(request.url).path
        if path == "/memx/":
            return self.file(route, "page.html", "text/html")
        if path.startswith("/memx/web/"):
            return self.file(route, os.path.basename(path), "text/javascript")
        if path.endswith("/release") and request.method == "POST":
            self.releases.append({"model_id": unquote(path.split("/")[3]), "raw_path": path,
                                  "body": json.loads(request.post_data or "{}"), "headers": request.headers})
            return self.held.append(route) if self.hold else self.give(route)
        if path.endswith("/search") and request.method == "POST":
            self.searches.append(path)
            return route.fulfill(status=200, content_type="application/json", body=json.dumps(
                {"model_id": KEPT_ID, "holders": [self.rows[0]["leak"]["holder"]], "search": {"result": "found"}}))
        answers = {"/memx/models": self.rows, "/memx/status": {"version": "test", "source": "stub", "leak_mode": "strict"},
                   "/memx/timeline": {"started": 1.0, "next": 0, "now": time.time(), "entries": [], "dropped": 0},
                   "/system_stats": {"system": {"ram_total": 16 << 30, "ram_free": 8 << 30}, "devices": []}}
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers.get(path, {})))

    def give(self, route):
        status, body, goes, _ = self.answer
        if goes:
            self.rows[:] = [row for row in self.rows if row["model_id"] != KEPT_ID]
        route.fulfill(status=status, content_type="application/json", body=json.dumps(body))

    def file(self, route, name, kind):
        with open(os.path.join(self.web_dir, name), "rb") as handle:
            route.fulfill(status=200, content_type=kind, body=handle.read())


@pytest.fixture(scope="module")
def chromium():
    """One Chromium for this module's tests (Playwright's sync API runs one at a time in a thread)."""
    with _playwright()() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def stub_page(chromium):
    """``stub_page(rows, answer=None, hold=False, token=None)`` -> (page, its StubServer, what it logged), the page
    at /memx/ (with ``token`` in the browser's storage, as the token field keeps it) with both leak cards drawn."""
    context = chromium.new_context(viewport={"width": 900, "height": 900})
    seen = {"console": [], "page_errors": [], "failed": []}

    def open_page(rows, answer=None, hold=False, token=None):
        page = watched(context.new_page(), seen)
        if token:
            page.add_init_script(f"localStorage.setItem('comfy_memx.token', {json.dumps(token)})")
        server = StubServer(page, rows, answer, hold)
        page.goto(STUB_BASE + "/memx/", wait_until="load")
        page.locator(f"[data-memx=leak][data-model-id='{HOOKED_ID}']").wait_for(timeout=WAIT_MS)
        return page, server, seen

    yield open_page
    context.close()


def pump_until(page, check, timeout, what):
    """Wait until ``check()`` is true while Playwright runs this page's route handlers (its sync API runs them only
    while one of its calls waits, never during a plain ``time.sleep``: on a busy machine the request may be routed
    after ``click`` returned)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        page.wait_for_timeout(100)


def leak_card(page, model_id):
    return page.locator(f"[data-memx=leak][data-model-id='{model_id}']")


def receipt_text(page):
    found = page.locator("[data-memx=release-receipt]")
    found.wait_for(timeout=WAIT_MS)
    return found.inner_text()


@needs_chromium
def test_only_a_releasable_holder_has_a_release_button_and_the_other_says_why(stub_page):
    page, _, seen = stub_page(stub_rows("ask"))
    assert leak_card(page, KEPT_ID).locator("[data-memx=release-button]").inner_text() == "Release"
    assert leak_card(page, KEPT_ID).locator("[data-memx=release-why]").count() == 0
    hooked = leak_card(page, HOOKED_ID)
    assert hooked.locator("[data-memx=release-button]").count() == 0
    assert hooked.locator("[data-memx=release-why]").inner_text() == f"Release is not possible: {CALLBACK_WHY}"
    assert seen["page_errors"] == [] and seen["console"] == [], seen


@needs_chromium
def test_with_release_off_no_card_has_a_button_and_each_says_release_is_off(stub_page):
    page, _, _ = stub_page(stub_rows("off"))
    assert page.locator("[data-memx=release-button]").count() == 0
    lines = page.locator("[data-memx=release-why]").all_inner_texts()
    assert len(lines) == 2 and all(line.startswith("Release is off (COMFY_MEMX_RELEASE)") for line in lines), lines
    assert "COMFY_MEMX_RELEASE=ask" in lines[0], lines


@needs_chromium
def test_the_button_waits_for_its_answer_and_asks_for_the_quoted_model_and_its_holder_with_the_token(stub_page):
    page, server, _ = stub_page(stub_rows("ask"), ANSWERS["released"], hold=True, token="s3cret")
    button = leak_card(page, KEPT_ID).locator("[data-memx=release-button]")
    button.click()
    pump_until(page, lambda: server.held, 30, "the release request")
    assert button.is_disabled() and button.inner_text() == "Releasing…"
    [asked] = server.releases
    assert asked["raw_path"] == "/memx/models/MemxTinyNet%233/release" and asked["model_id"] == KEPT_ID, asked
    assert asked["body"] == {"path": CUT} and asked["headers"].get("x-memx-token") == "s3cret", asked
    server.give(server.held.pop())
    assert "Released 3.00 MiB" in receipt_text(page)


@needs_chromium
def test_after_the_cache_changed_search_again_searches_the_model_and_release_can_be_tried_again(stub_page):
    page, server, _ = stub_page(stub_rows("ask"), ANSWERS["changed"])
    leak_card(page, KEPT_ID).locator("[data-memx=release-button]").click()
    page.locator("[data-memx=release-receipt] [data-memx=search-again]").click(timeout=WAIT_MS)
    page.locator("[data-memx=release-receipt]", has_text="Searched again").wait_for(timeout=WAIT_MS)
    assert server.searches == ["/memx/models/MemxTinyNet%233/search"], server.searches
    assert page.locator("[data-memx=search-again]").count() == 0
    assert leak_card(page, KEPT_ID).locator("[data-memx=release-button]").is_enabled()


@needs_chromium
@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_each_answer_reads_right_and_the_list_is_read_again(name, stub_page):
    answer = ANSWERS[name]
    status, _, goes, texts = answer
    page, server, seen = stub_page(stub_rows("ask"), answer)
    leak_card(page, KEPT_ID).locator("[data-memx=release-button]").click()
    shown = receipt_text(page)
    for text in texts:
        assert text in shown, (text, shown)
    assert KEPT_ID in shown and not NOT_SHOWN.intersection(shown.split()), shown
    if goes:   # read again: the row went from the panel, the receipt stays
        leak_card(page, KEPT_ID).wait_for(state="detached", timeout=WAIT_MS)
        assert page.locator(f"[data-memx=model][data-model-id='{KEPT_ID}']").count() == 0
    else:      # the card stays with its button, ready for another try
        assert leak_card(page, KEPT_ID).locator("[data-memx=release-button]").is_enabled()
    assert len(server.releases) == 1 and seen["page_errors"] == [], (server.releases, seen)
    failed = [c for c in seen["console"] if not c["text"].startswith("Failed to load resource")]
    assert failed == [] and len(seen["console"]) == (status >= 400), seen["console"]


# -- real ComfyUI, COMFY_MEMX_RELEASE=ask ------------------------------------------------------------------------

CACHE_HOLDER, CALLBACK_HOLDER = "memx_style_mixer", "memx_hook_hub"
RELEASE_PACKS = [drive.NODE_PACK_NAME, culprit.pack_dir(culprit.LOADER), culprit.pack_dir(CACHE_HOLDER),
                 culprit.pack_dir(CALLBACK_HOLDER)]
RELEASE_ENV = {"COMFY_MEMX_LEAK_MODE": "strict", "COMFY_MEMX_RELEASE": "ask"}
#: install kind -> launcher and whether this checkout goes into custom_nodes/ (as test_panel_browser.KINDS)
LAUNCHERS = {"launcher": ("module", False), "env": ("env", False), "node_pack": ("plain", True)}


def keep_prompt(name, holder):
    """The utility belt loads a new model, ``holder``'s keeper node keeps it."""
    return {"1": drive.loader_node(name),
            "2": {"class_type": culprit.LOADER_NODE, "inputs": {"model": ["1", 0]}},
            "3": {"class_type": culprit.HOLDERS[holder][0], "inputs": {"model": ["2", 0]}}}


def named_leaks(session):
    """The /memx/models rows of both kept models keyed by holder package, once both holders are named and their
    release rows written; else None."""
    rows = session.request("models", "GET", "/memx/models")["body"]
    found = {(row.get("leak") or {}).get("holder_package"): row for row in rows if isinstance(rows, list)
             and isinstance(row, dict) and row.get("release")}
    return found if {CACHE_HOLDER, CALLBACK_HOLDER} <= set(found) else None


def model_ids(session):
    return [row["model_id"] for row in session.request("models", "GET", "/memx/models")["body"]]


def card_texts(page, kind):
    """``{model id: text}`` of the panel's cards of ``kind`` (leak, model)."""
    return page.evaluate("""(kind) => Object.fromEntries([...document.querySelectorAll(`[data-memx=${kind}]`)]
        .map((node) => [node.dataset.modelId, node.innerText]))""", kind)


def run_release(session, browser, shots, label):
    """Both leaks, then the panel in ``browser``: what the cards show, the click, the receipt, the lists after."""
    seen = session.seen = {"console": [], "page_errors": [], "failed": [], "shots": {}}
    session.prompt("keep_cache", keep_prompt("memx-release-cached", CACHE_HOLDER))
    session.prompt("keep_callback", keep_prompt("memx-release-hooked", CALLBACK_HOLDER))
    for index in range(2):   # new models: ComfyUI checks its loaded list and comfy_memx searches the kept ones
        session.prompt(f"after_{index}", {"1": drive.loader_node(f"memx-release-after-{index}"),
                                          "2": drive.sampler_node("1", index)})
    seen["rows"] = wait_until(lambda: named_leaks(session), 90, "both holders named in /memx/models")
    cached = seen["rows"][CACHE_HOLDER]["model_id"]
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = watched(context.new_page(), seen)
        page.goto(session.base_url + "/", wait_until="load")
        page.locator(TAB_BUTTON).first.click(timeout=WAIT_MS)
        for holder in (CACHE_HOLDER, CALLBACK_HOLDER):
            page.locator("[data-memx=leak]", has_text=holder).first.wait_for(timeout=WAIT_MS)
        for close in page.locator(".p-toast-close-button").all():   # ComfyUI's own notices, over the canvas
            close.click()
        set_palette(page, "light")
        card = page.locator(f"[data-memx=leak][data-model-id='{cached}']")
        seen["before"] = {"leaks": card_texts(page, "leak"),
                          "buttons": page.evaluate("""() => [...document.querySelectorAll(
                              '[data-memx=leak] [data-memx=release-button]')].map(
                              (b) => b.closest('[data-memx=leak]').dataset.modelId)""")}
        button = card.locator("[data-memx=release-button]")
        scroll_to(button)
        seen["shots"]["before"] = _shot(page, shots, f"{label}-panel-release-button-light.png")
        button.click(timeout=WAIT_MS)
        shown = page.locator("[data-memx=release-receipt]")
        shown.wait_for(timeout=WAIT_MS * 2)
        card.wait_for(state="detached", timeout=WAIT_MS)
        page.locator(f"[data-memx=model][data-model-id='{cached}']").wait_for(state="detached", timeout=WAIT_MS)
        scroll_to(shown)
        seen["receipt"] = shown.inner_text()
        seen["after"] = {"leaks": card_texts(page, "leak"), "models": card_texts(page, "model"),
                         "server": model_ids(session)}
        seen["shots"]["receipt"] = _shot(page, shots, f"{label}-panel-release-light.png")
        set_palette(page, "dark")
        seen["shots"]["receipt_dark"] = _shot(page, shots, f"{label}-panel-release-dark.png")
    except Exception:
        for index, open_page in enumerate(context.pages):
            _shot(open_page, session.out, f"failure-{index}.png")
        raise
    finally:
        context.close()
    with open(os.path.join(session.out, "release_seen.json"), "w", encoding="utf-8") as handle:
        json.dump(seen, handle, indent=2, default=str)


@pytest.fixture(scope="module")
def release_session(tmp_path_factory, memx_importable_by_real_python, chromium):  # noqa: F811
    """``release_session(tree, kind)`` -> the stopped session of ``kind`` on ``tree`` with ``seen`` (run once)."""
    done = {}
    shots = screenshot_dir(tmp_path_factory)

    def get(tree, kind):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if (tree, kind) not in done:
            launcher, as_node_pack = LAUNCHERS[kind]
            label = f"{os.path.basename(os.path.normpath(tree))}-{kind}"
            out = str(tmp_path_factory.mktemp(f"{label}-release"))
            packs = RELEASE_PACKS + [node_pack_copy(out)] if as_node_pack else RELEASE_PACKS
            session = drive.Session(tree, configured_python(), out, launcher=launcher, env=RELEASE_ENV, packs=packs)
            first_run_done(session.base)
            done[(tree, kind)] = run_session(session, lambda s: run_release(s, chromium, shots, label))
        return ready(done[(tree, kind)])

    return get


def release_cases():
    """``(tree, kind)`` of the release session: the node pack on the newest tree named (one session is about two
    minutes of CI; the panel's page is the same on every tree and install kind, which test_panel_browser covers)."""
    return [case for case in browser_cases() if case.id.endswith("node_pack")][-1:]


def release_test(test):
    """Chromium and real ComfyUI needed, one release session (see :func:`release_cases`)."""
    for mark in (pytest.mark.parametrize(("tree", "kind"), release_cases()), needs_real_comfyui, needs_chromium):
        test = mark(test)
    return test


@release_test
def test_the_class_cache_has_a_release_button_and_the_callback_registry_says_why_not(tree, kind, release_session):
    session = release_session(tree, kind)
    seen = session.seen
    cached, hooked = (seen["rows"][holder] for holder in (CACHE_HOLDER, CALLBACK_HOLDER))
    assert cached["release"]["possible"] and not hooked["release"]["possible"], seen["rows"]
    assert seen["before"]["buttons"] == [cached["model_id"]], (seen["before"], where(session))
    hooked_card = seen["before"]["leaks"][hooked["model_id"]]
    why = hooked["release"]["why"]
    assert why and f"Release is not possible: {why}" in hooked_card, hooked_card
    assert "Release is not possible" not in seen["before"]["leaks"][cached["model_id"]]


@release_test
def test_release_cuts_the_cache_entry_and_the_model_leaves_the_panel_and_the_server(tree, kind, release_session):
    session = release_session(tree, kind)
    seen = session.seen
    cached, hooked = (seen["rows"][holder]["model_id"] for holder in (CACHE_HOLDER, CALLBACK_HOLDER))
    shown = seen["receipt"]
    assert "Released " in shown and f"held by {CACHE_HOLDER} ({culprit.HOLDERS[CACHE_HOLDER][1]})" in shown, shown
    assert "the pack will rebuild it when it needs it again" in shown and "The model is gone from memory." in shown
    assert not NOT_SHOWN.intersection(shown.split()), shown
    assert cached not in seen["after"]["leaks"] and cached not in seen["after"]["models"], seen["after"]
    assert cached not in seen["after"]["server"], (seen["after"]["server"], where(session))
    assert hooked in seen["after"]["leaks"] and hooked in seen["after"]["server"], seen["after"]
    if session.events_path:   # under comfy_memx's own start (no event log for a node pack's plain main.py)
        released = [e for e in session.events() if e["event"] == "release"]
        assert [(e["model_id"], e["trigger"], e["outcome"], e["died"]) for e in released] == [
            (cached, "http", "released", True)], (released, where(session))


@release_test
def test_no_error_in_the_browser_console_around_a_release(tree, kind, release_session):
    session = release_session(tree, kind)
    seen = session.seen
    assert seen["page_errors"] == [], seen["page_errors"]
    assert [f for f in seen["failed"] if "memx" in f] == [], seen["failed"]
    theirs = [c for c in seen["console"] if not comfyuis_own(c, session.base_url)]
    assert theirs == [], theirs
    for name, path in seen["shots"].items():
        assert os.path.getsize(path) > 10000, (name, path)
