"""The memory panel in real Chromium on real ComfyUI (opt-in, as ``test_real_comfyui.py``; Debian's ``chromium``
driven by Playwright for Python, never a downloaded browser).

One session per install kind, on the newest tree: ComfyUI with comfy_memx (strict leak mode), the innocent
``memx_utility_belt`` loading a model that ``memx_list_keeper`` keeps, then Chromium opens ComfyUI's page, opens
the "Memory" sidebar tab and reads what a person sees: the leaked model with its holder package and fix, the
timeline drawn with its marks, the Free button's receipt listing the survivor, the panel again after 50 prompts,
and the standalone page ``/memx/``.  Screenshots, dark and light, go to ``MEMX_SCREENSHOTS`` (default: the test's
temporary folder).  The scenario runs once per session; the tests assert on what it recorded.
"""

import json
import os
import shutil
import time

import pytest

from memx_helpers import load_module
from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, newest_tree_only, ready, run_session, where)

pytestmark = [pytest.mark.real, pytest.mark.browser]

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
culprit = load_module("memx_real_culprit", os.path.join(HERE, "real_comfy", "culprit.py"))
HOLDER = "memx_list_keeper"
KEEPER_NODE, HOLDER_PATH, HOLDER_PATTERN = culprit.HOLDERS[HOLDER]
PACKS = [drive.NODE_PACK_NAME, culprit.pack_dir(culprit.LOADER), culprit.pack_dir(HOLDER)]
CHROMIUM = os.environ.get("COMFY_MEMX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
TAB_BUTTON = ".comfy-memx-memory-tab-button"
CHEAP_PROMPTS = 50
MODEL_EVERY = 10
QUIET_S = 5               # seconds of listening for the panel's requests: two polls and a half
#: install kinds: the launcher (``python -m comfy_memx main.py``), ComfyUI's plain ``python main.py`` with
#: ``COMFY_MEMX=1`` (the installed package's .pth line), and this repository cloned into custom_nodes/ started with
#: ComfyUI's plain ``python main.py`` (the node pack)
#: ``COMFY_MEMX_RELEASE=off`` (the default, named): no Release button, the leak says why
#: (``test_panel_release.py`` clicks the button under ``ask``)
SERVER_ENV = {"COMFY_MEMX_LEAK_MODE": "strict", "COMFY_MEMX_RELEASE": "off"}
KINDS = {"launcher": {"launcher": "module", "env": SERVER_ENV, "node_pack": False},
         "env": {"launcher": "env", "env": SERVER_ENV, "node_pack": False},
         "node_pack": {"launcher": "plain", "env": SERVER_ENV, "node_pack": True}}
REPO = os.path.dirname(HERE)
PACK_FILES = ("__init__.py", "pyproject.toml", "comfy_memx", "patches")
WAIT_MS = 60000
#: how many times an element is looked up again when the panel redrew it between finding it and scrolling to it
REDRAWS = 5


def scroll_to(locator, timeout=WAIT_MS):
    """Scroll ``locator``'s element into view.  The panel redraws its cards at every poll, so on a busy machine the
    element found may be replaced before the scroll: then the new one is looked up, at most ``REDRAWS`` times (each
    retry follows a redraw, which is progress)."""
    for attempt in range(REDRAWS):
        try:
            return locator.scroll_into_view_if_needed(timeout=timeout)
        except Exception as exc:   # playwright's Error; its module is imported only where Chromium is used
            if "not attached" not in str(exc) or attempt == REDRAWS - 1:
                raise
NOT_SHOWN = {"null", "undefined", "NaN", "[object"}   # words a person should never read in the panel


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    return sync_playwright


needs_chromium = pytest.mark.skipif(
    not (os.path.isfile(CHROMIUM) and _playwright()),
    reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium; or COMFY_MEMX_CHROMIUM) and Playwright for "
           "Python (pip install playwright; no browser download is needed)")


def screenshot_dir(tmp_path_factory):
    """MEMX_SCREENSHOTS, or a temporary folder of this test run."""
    named = os.environ.get("MEMX_SCREENSHOTS")
    if named:
        os.makedirs(named, exist_ok=True)
        return named
    return str(tmp_path_factory.mktemp("screenshots"))


def keeper_prompt():
    """The utility belt loads a model, the list keeper keeps it."""
    return {"1": drive.loader_node("memx-panel-kept"),
            "2": {"class_type": culprit.LOADER_NODE, "inputs": {"model": ["1", 0]}},
            "3": {"class_type": KEEPER_NODE, "inputs": {"model": ["2", 0]}}}


def cheap_prompt(index):
    """Every tenth prompt a new small model through one sampler step (a load, and ComfyUI's leak check, which
    collects garbage in full each time); the others a zero-second sleep that loads nothing."""
    if index % MODEL_EVERY == 0:
        return {"1": drive.loader_node(f"memx-panel-cheap-{index}", width=64, depth=2),
                "2": drive.sampler_node("1", index)}
    return {"1": {"class_type": "MemxSleep", "inputs": {"seconds": 0.0, "token": f"panel-{index}"}}}


def wait_until(check, timeout, what):
    """Poll ``check()`` until it returns something true; returns it, or fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def held_leak(session):
    """The /memx/models row of the kept model once its holder is named, else None."""
    rows = session.request("models", "GET", "/memx/models")["body"]
    for row in rows if isinstance(rows, list) else ():
        if (row.get("leak") or {}).get("holder_package") == HOLDER:
            return row
    return None


def panel_view(page):
    """What the panel shows now: the texts of its parts and the timeline's drawn elements."""
    return page.evaluate("""() => {
        const panel = document.querySelector('[data-memx=panel]');
        const text = (sel) => [...panel.querySelectorAll(sel)].map((node) => node.innerText);
        const byId = (sel) => Object.fromEntries([...panel.querySelectorAll(sel)].map(
            (node) => [node.dataset.modelId, node.innerText]));
        const svg = panel.querySelector('svg.memx-timeline');
        const style = getComputedStyle(panel);
        return {models: byId('[data-memx=model]'), leaks: byId('[data-memx=leak]'),
                fixes: text('[data-memx=leak] [data-memx=fix]'), release_why: text('[data-memx=release-why]'),
                release_buttons: panel.querySelectorAll('[data-memx=release-button]').length,
                memory: panel.querySelector('[data-memx=memory]').innerText,
                error: panel.querySelector('[data-memx=error]').innerText, all: panel.innerText,
                receipt: text('[data-memx=receipt]'), survivors: text('[data-memx=survivor]'),
                lines: svg ? svg.querySelectorAll('polyline.memx-line').length : 0,
                line_points: svg ? [...svg.querySelectorAll('polyline.memx-line')].map((l) => l.points.length) : [],
                unload_titles: svg ? [...svg.querySelectorAll('.memx-mark-unload title')].map((t) => t.textContent) : [],
                marks: svg ? Object.fromEntries(['load', 'unload', 'leak', 'free'].map(
                    (k) => [k, svg.querySelectorAll('.memx-mark-' + k).length])) : {},
                svg_box: svg ? [svg.getBoundingClientRect().width, svg.getBoundingClientRect().height] : [0, 0],
                colour: style.color, background: style.backgroundColor};
    }""")


def timeline_counts(session):
    entries = session.request("timeline", "GET", "/memx/timeline")["body"]["entries"]
    return {kind: sum(1 for e in entries if e["kind"] == kind) for kind in ("load", "unload", "leak", "free")}


def set_palette(page, palette):
    """Switch ComfyUI's colour palette the way its settings dialog does, and wait until the page shows it."""
    page.evaluate("(p) => window.comfyAPI.app.app.extensionManager.setting.set('Comfy.ColorPalette', p)", palette)
    page.wait_for_timeout(500)


def run_browser(session, shots, label):
    """The whole scenario; returns what the panel showed at each stage (``session.seen``)."""
    seen = session.seen = {"console": [], "page_errors": [], "failed": [], "shots": {}}
    session.prompt("keep", keeper_prompt())
    for index in range(2):   # new models: ComfyUI checks its loaded list and comfy_memx finds the kept one
        session.prompt(f"after_{index}", {"1": drive.loader_node(f"memx-panel-after-{index}"),
                                          "2": drive.sampler_node("1", index)})
    seen["leak_row"] = wait_until(lambda: held_leak(session), 60, f"{HOLDER} named as the holder in /memx/models")
    with _playwright()() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = watched(context.new_page(), seen)
            page.goto(session.base_url + "/", wait_until="load")
            page.locator(TAB_BUTTON).first.click(timeout=WAIT_MS)
            page.locator("[data-memx=leak]", has_text=HOLDER).first.wait_for(timeout=WAIT_MS)
            page.locator("svg.memx-timeline .memx-mark-leak").first.wait_for(state="attached", timeout=WAIT_MS)
            seen["tab_count"] = page.locator(TAB_BUTTON).count()
            for close in page.locator(".p-toast-close-button").all():   # ComfyUI's own notices, over the canvas
                close.click()
            seen["first"] = panel_view(page)
            seen["rows_first"] = [row["model_id"] for row in session.request("models", "GET", "/memx/models")["body"]]
            panel = page.locator("[data-memx=panel]")
            set_palette(page, "dark")
            seen["dark"] = panel_view(page)
            seen["shots"]["dark"] = _shot(page, shots, f"{label}-panel-dark.png")
            set_palette(page, "light")
            seen["light"] = panel_view(page)
            seen["shots"]["light"] = _shot(page, shots, f"{label}-panel-light.png")
            panel.locator("[data-memx=free-button]").click()
            page.locator("[data-memx=receipt]").first.wait_for(timeout=WAIT_MS * 2)
            scroll_to(page.locator("[data-memx=receipt]").first)
            page.locator("svg.memx-timeline .memx-mark-free").first.wait_for(state="attached", timeout=WAIT_MS)
            seen["freed"] = panel_view(page)
            seen["shots"]["receipt"] = _shot(page, shots, f"{label}-panel-receipt-light.png")
            # one after another: queued all at once, ComfyUI validates the rest on its event loop while the worker
            # collects garbage in full, and on a loaded machine a POST /prompt answered after the client's 10 s
            seen["cheap_ok"] = [session.prompt(f"cheap_{index}", cheap_prompt(index))["ok"]
                                for index in range(CHEAP_PROMPTS)]
            page.wait_for_timeout(500)
            seen["server_after"] = {"models": len(session.request("models", "GET", "/memx/models")["body"]),
                                    "timeline": timeline_counts(session)}
            seen["after"] = wait_until(lambda: _caught_up(page, seen["server_after"]), 30,
                                       "the panel to show the server's rows and timeline after the prompts")
            seen["shots"]["after"] = _shot(page, shots, f"{label}-panel-after-{CHEAP_PROMPTS}-light.png")
            seen["polls_open"] = memx_requests_during(page, QUIET_S)
            page.locator(TAB_BUTTON).first.click()          # close the tab: the panel must stop asking
            page.wait_for_timeout(500)
            seen["polls_closed"] = memx_requests_during(page, QUIET_S)
            standalone = watched(context.new_page(), seen)
            standalone.emulate_media(color_scheme="dark")
            standalone.goto(session.base_url + "/memx/", wait_until="load")
            standalone.locator("[data-memx=leak]", has_text=HOLDER).first.wait_for(timeout=WAIT_MS)
            seen["page"] = panel_view(standalone)
            seen["shots"]["page"] = _shot(standalone, shots, f"{label}-memx-page-dark.png")
        except Exception:
            for index, open_page in enumerate(browser.contexts[0].pages if browser.contexts else ()):
                _shot(open_page, session.out, f"failure-{index}.png")
            raise
        finally:
            browser.close()
    with open(os.path.join(session.out, "panel_seen.json"), "w", encoding="utf-8") as handle:
        json.dump(seen, handle, indent=2, default=str)


def node_pack_copy(out):
    """This repository as ComfyUI-Manager's clone would put it in custom_nodes/ (the files a clone has that the
    pack needs; no byte-code)."""
    folder = os.path.join(out, "pack_source", "comfy_memx")
    os.makedirs(folder)
    for name in PACK_FILES:
        source = os.path.join(REPO, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(folder, name), ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, folder)
    return folder


def first_run_done(base):
    """ComfyUI's user settings as after a first visit: no template browser over the canvas at start."""
    folder = os.path.join(base, "user", "default")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "comfy.settings.json"), "w", encoding="utf-8") as handle:
        json.dump({"Comfy.TutorialCompleted": True}, handle)


def watched(page, seen):
    """``page`` with its console errors, uncaught exceptions and failed requests recorded in ``seen``."""
    page.on("console", lambda message: message.type == "error" and seen["console"].append(
        {"text": message.text, "at": (message.location or {}).get("url"), "page": page.url}))
    page.on("pageerror", lambda error: seen["page_errors"].append(f"{page.url}: {error}"))
    page.on("response", lambda response: response.status >= 400 and seen["failed"].append(
        f"{response.status} {response.url}"))
    page.on("requestfailed", lambda request: seen["failed"].append(f"{request.failure} {request.url}"))
    return page


def memx_requests_during(page, seconds):
    """The comfy_memx requests the page makes in the next ``seconds``."""
    asked = []

    def note(request):
        if "/memx/" in request.url:
            asked.append(request.url)
    page.on("request", note)
    page.wait_for_timeout(seconds * 1000)
    page.remove_listener("request", note)
    return asked


def _caught_up(page, server):
    view = panel_view(page)
    drawn = {kind: view["marks"].get(kind, 0) for kind in server["timeline"]}
    return view if len(view["models"]) == server["models"] and drawn == server["timeline"] else None


def _shot(page, folder, name):
    path = os.path.join(folder, name)
    page.screenshot(path=path)
    return path


@pytest.fixture(scope="module")
def browser_session(tmp_path_factory, memx_importable_by_real_python):  # noqa: F811
    """``browser_session(tree, kind)`` -> the stopped session of KINDS[kind] on ``tree`` with ``seen`` (run once)."""
    done = {}
    shots = screenshot_dir(tmp_path_factory)

    def get(tree, kind):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        key = (tree, kind)
        if key not in done:
            spec = KINDS[kind]
            label = f"{os.path.basename(os.path.normpath(tree))}-{kind}"
            out = str(tmp_path_factory.mktemp(f"{label}-panel"))
            packs = PACKS + [node_pack_copy(out)] if spec["node_pack"] else PACKS
            session = drive.Session(tree, configured_python(), out, launcher=spec["launcher"], env=spec["env"],
                                    packs=packs)
            first_run_done(session.base)
            done[key] = run_session(session, lambda s: run_browser(s, shots, label))
        return done[key]

    return get


def seen_of(browser_session, tree, kind):
    session = ready(browser_session(tree, kind))
    return session, session.seen


def browser_cases():
    """``(tree, kind)`` of every browser session: each install kind on the newest tree (each session is two to three
    minutes of CI).  The page is the same on every tree: one frontend package (.ci/comfyui-env's, for all trees) and
    the same panel script; what differs per tree and kind is whether ComfyUI lists and serves the script, which
    test_real_comfyui.py (the launcher, COMFY_MEMX=1) and test_node_pack.py (the node pack) check on every tree."""
    [newest] = newest_tree_only
    return [pytest.param(newest.values[0], kind, id=f"{newest.id}-{kind}") for kind in ("node_pack", "launcher", "env")]


def browser_test(test):
    """The marks of every test below: Chromium and real ComfyUI needed, one case per browser session."""
    for mark in (pytest.mark.parametrize(("tree", "kind"), browser_cases()), needs_real_comfyui, needs_chromium):
        test = mark(test)
    return test


@browser_test
def test_the_panel_names_the_leaked_model_its_holder_package_and_fix(tree, kind, browser_session):
    session, seen = seen_of(browser_session, tree, kind)
    view = seen["first"]
    leak_row = seen["leak_row"]
    assert seen["tab_count"] == 1, where(session)   # one Memory tab, never two
    assert view["error"] == "", (view["error"], where(session))
    leak = view["leaks"].get(leak_row["model_id"], "")
    assert list(view["leaks"]) == [leak_row["model_id"]], (view["leaks"], where(session))
    assert f"held by {HOLDER}" in leak and HOLDER_PATH in leak, leak
    assert HOLDER_PATTERN in leak and f"loaded by {culprit.LOADER}" in leak, leak
    suggestion = leak_row["leak"]["holder"]["suggestion"]
    assert suggestion and any(suggestion in fix for fix in view["fixes"]), (suggestion, view["fixes"])
    card = view["models"].get(leak_row["model_id"], "")
    assert "leaked" in card and HOLDER in card and culprit.LOADER_NODE in card, view["models"]
    assert set(view["models"]) == set(seen["rows_first"]), (view["models"], seen["rows_first"])
    assert "RAM" in view["memory"] and "Pinned" in view["memory"], view["memory"]
    assert not NOT_SHOWN.intersection(view["all"].split()), view["all"]


@browser_test
def test_with_release_off_the_leak_has_no_release_button_and_says_release_is_off(tree, kind, browser_session):
    session, seen = seen_of(browser_session, tree, kind)
    view = seen["first"]
    assert seen["leak_row"]["release"]["policy"] == "off", (seen["leak_row"], where(session))
    assert view["release_buttons"] == 0, view
    assert len(view["release_why"]) == 1 and view["release_why"][0].startswith("Release is off (COMFY_MEMX_RELEASE)")
    assert view["release_why"][0] in view["leaks"][seen["leak_row"]["model_id"]], view["leaks"]


@browser_test
def test_the_timeline_draws_a_line_per_model_with_load_and_leak_marks(tree, kind, browser_session):
    session, seen = seen_of(browser_session, tree, kind)
    view = seen["first"]
    assert view["svg_box"][0] > 100 and view["svg_box"][1] > 100, view["svg_box"]
    assert view["lines"] >= 3 and min(view["line_points"]) >= 3, (view["lines"], view["line_points"])
    assert view["marks"]["load"] >= 3 and view["marks"]["leak"] >= 1, view["marks"]


@browser_test
def test_free_shows_a_receipt_listing_the_survivor_and_its_holder(tree, kind, browser_session):
    session, seen = seen_of(browser_session, tree, kind)
    view = seen["freed"]
    model = seen["leak_row"]["model_id"]
    assert len(view["receipt"]) == 1 and "Receipt: done" in view["receipt"][0], (view["receipt"], where(session))
    assert "Freed" in view["receipt"][0] and "Process memory" in view["receipt"][0], view["receipt"]
    survivors = [text for text in view["survivors"] if model in text]
    assert len(survivors) == 1 and f"held by {HOLDER}" in survivors[0], view["survivors"]
    assert HOLDER_PATH in survivors[0], survivors[0]
    assert view["marks"]["free"] >= 1, view["marks"]
    # the Free's unloads name who asked: the route, never "by ?"
    assert any("(free_request by POST /memx/free)" in title for title in view["unload_titles"]), view["unload_titles"]
    assert not any("by ?)" in title for title in view["unload_titles"]), view["unload_titles"]
    assert not NOT_SHOWN.intersection(view["all"].split()), view["all"]


@browser_test
def test_the_panel_is_still_right_after_fifty_prompts(tree, kind, browser_session):
    session, seen = seen_of(browser_session, tree, kind)
    assert seen["cheap_ok"] == [True] * CHEAP_PROMPTS, where(session)
    view, server = seen["after"], seen["server_after"]
    assert len(view["models"]) == server["models"], (view["models"], server)
    new_loads = server["timeline"]["load"] - seen["freed"]["marks"]["load"]
    assert new_loads >= CHEAP_PROMPTS // MODEL_EVERY, (server, seen["freed"]["marks"])
    assert f"held by {HOLDER}" in view["leaks"].get(seen["leak_row"]["model_id"], ""), view["leaks"]
    assert view["error"] == "", view["error"]


@browser_test
def test_light_and_dark_follow_comfyuis_palette_and_the_page_shows_the_same(tree, kind, browser_session):
    session, seen = seen_of(browser_session, tree, kind)
    assert seen["dark"]["background"] != seen["light"]["background"], (seen["dark"], seen["light"])
    assert seen["dark"]["colour"] != seen["light"]["colour"]
    for name, path in seen["shots"].items():
        assert os.path.getsize(path) > 10000, (name, path)
    page = seen["page"]
    assert f"held by {HOLDER}" in page["leaks"].get(seen["leak_row"]["model_id"], "") and page["lines"] >= 3, page
    assert page["error"] == "", page["error"]


@browser_test
def test_no_error_in_the_browser_console(tree, kind, browser_session):
    """Nothing of comfy_memx errs: no uncaught exception anywhere, no console error on /memx/, no failed request
    to a comfy_memx URL, and on ComfyUI's page only ComfyUI's own offline and first-run noise (its bundle's
    messages, 404s of a fresh user folder, its internet look-ups failing)."""
    session, seen = seen_of(browser_session, tree, kind)
    assert seen["page_errors"] == [], seen["page_errors"]
    assert [f for f in seen["failed"] if "memx" in f] == [], seen["failed"]
    on_page = [c for c in seen["console"] if "/memx/" in c["page"]]
    assert on_page == [], on_page
    ours = [c for c in seen["console"] if "memx" in (c["at"] or "") or "memx" in c["text"]]
    assert ours == [], ours
    theirs = [c for c in seen["console"] if not comfyuis_own(c, session.base_url)]
    assert theirs == [], theirs


def comfyuis_own(message, base_url):
    """True for a console error that ComfyUI's frontend logs without comfy_memx on an offline, fresh install."""
    at = message["at"] or ""
    if message["text"].startswith("Failed to load resource"):
        return "memx" not in at
    return at.startswith(base_url + "/assets/")


@browser_test
def test_the_loader_is_named_with_no_comfy_memx_in_between(tree, kind, browser_session):
    session, seen = seen_of(browser_session, tree, kind)
    leak = seen["first"]["leaks"].get(seen["leak_row"]["model_id"], "")
    assert f"loaded by {culprit.LOADER} · {culprit.LOADER_NODE} (node 2)" in leak, leak
    assert "via comfy_memx" not in leak, leak


@browser_test
def test_the_panel_asks_only_while_its_tab_is_open(tree, kind, browser_session):
    session, seen = seen_of(browser_session, tree, kind)
    models_polls = [url for url in seen["polls_open"] if "/memx/models" in url]
    assert len(models_polls) >= 2, seen["polls_open"]
    assert any("since=" in url and not url.endswith("since=0") for url in seen["polls_open"]), seen["polls_open"]
    assert seen["polls_closed"] == [], seen["polls_closed"]
