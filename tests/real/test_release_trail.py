"""Where a release shows, on real ComfyUI in real Chromium (opt-in, as ``test_panel_browser.py``): a release by the
panel's Release button, by ``python -m comfy_memx free --release`` and by ``COMFY_MEMX_RELEASE=auto`` each shows in
the panel's Released list and on its timeline, and ``python -m comfy_memx report`` on the events file lists each
model as released with the bytes given back.

One session per install kind on the newest tree named: the node pack (this repository in ``custom_nodes/``, ComfyUI's
plain ``python main.py``) and the launcher.  ComfyUI runs with ``COMFY_MEMX_RELEASE=auto`` and
``COMFY_MEMX_RELEASE_PACKAGES=memx_list_keeper``: the innocent ``memx_utility_belt`` loads three models,
``memx_list_keeper`` keeps one (released by ``auto`` when ComfyUI warns), ``memx_style_mixer`` one in a class-level
dict (released by the button), ``memx_lora_cache`` one behind an ``lru_cache`` (released by ``free --release``).
Screenshots (``released-*.png``) go to ``MEMX_SCREENSHOTS``.
"""

import json
import os
import subprocess
import sys

import pytest

from test_panel_browser import (NOT_SHOWN, TAB_BUTTON, WAIT_MS, _shot, browser_cases, first_run_done, needs_chromium,
                                node_pack_copy, screenshot_dir, scroll_to, set_palette, wait_until, watched)
from test_panel_release import chromium, culprit, keep_prompt  # noqa: F401  (the module's one Chromium)
from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, ready, run_session, where)

pytestmark = [pytest.mark.real, pytest.mark.browser]

BY_TRIGGER = {"http": "memx_style_mixer", "free": "memx_lora_cache", "auto": "memx_list_keeper"}
PACKS = [drive.NODE_PACK_NAME, culprit.pack_dir(culprit.LOADER)] + [culprit.pack_dir(p) for p in BY_TRIGGER.values()]
ENV = {"COMFY_MEMX_LEAK_MODE": "strict", "COMFY_MEMX_RELEASE": "auto",
       "COMFY_MEMX_RELEASE_PACKAGES": BY_TRIGGER["auto"]}
KINDS = {"launcher": ("module", False), "node_pack": ("plain", True)}


def leaks_named(session):
    """``{holder package: row}`` of the leaked rows whose holder is named, once both the button's and free's holders
    are (the list keeper's model is gone by then: auto released it when ComfyUI warned)."""
    rows = session.request("models", "GET", "/memx/models")["body"]
    found = {(row.get("leak") or {}).get("holder_package"): row for row in rows if isinstance(rows, list)
             and isinstance(row, dict) and row.get("release")}
    return found if {BY_TRIGGER["http"], BY_TRIGGER["free"]} <= set(found) else None


def released_cards(page):
    return page.evaluate("""() => [...document.querySelectorAll('[data-memx=released]')].map(
        (card) => ({trigger: card.dataset.trigger, model_id: card.dataset.modelId, text: card.innerText}))""")


def run_trail(session, browser, shots, label):
    """The three releases and what the panel, the server and report show of them."""
    seen = session.seen = {"console": [], "page_errors": [], "failed": [], "shots": {}}
    for index, holder in enumerate(BY_TRIGGER.values()):
        session.prompt(f"keep_{holder}", keep_prompt(f"memx-trail-{index}", holder))
    for index in range(2):   # new models: ComfyUI checks its loaded list; auto cuts the list keeper's entry
        session.prompt(f"after_{index}", {"1": drive.loader_node(f"memx-trail-after-{index}"),
                                          "2": drive.sampler_node("1", index)})
    seen["rows"] = wait_until(lambda: leaks_named(session), 120, "the button's and free's holders named")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = watched(context.new_page(), seen)
        page.goto(session.base_url + "/", wait_until="load")
        page.locator(TAB_BUTTON).first.click(timeout=WAIT_MS)
        for close in page.locator(".p-toast-close-button").all():   # ComfyUI's own notices, over the canvas
            close.click()
        set_palette(page, "light")
        cached = seen["rows"][BY_TRIGGER["http"]]["model_id"]
        button = page.locator(f"[data-memx=leak][data-model-id='{cached}'] [data-memx=release-button]")
        scroll_to(button)
        button.click(timeout=WAIT_MS)
        page.locator("[data-memx=release-receipt]").wait_for(timeout=WAIT_MS * 2)
        seen["free_cli"] = run_cli(["free", "--url", session.base_url, "--release", "--timeout", "120"], 300)
        wait_until(lambda: {card["trigger"] for card in released_cards(page)} >= set(BY_TRIGGER), 60,
                   "the Released list to show the button's, free's and auto's releases")
        page.locator("svg.memx-timeline .memx-mark-release").nth(2).wait_for(state="attached", timeout=WAIT_MS)
        seen["cards"] = released_cards(page)
        seen["summary"] = page.locator("[data-memx=released-summary]").inner_text()
        seen["marks"] = page.evaluate("""() => [...document.querySelectorAll('svg.memx-timeline .memx-mark-release')]
            .map((mark) => mark.querySelector('title').textContent)""")
        seen["legend"] = page.locator("[data-memx=timeline-legend]").inner_text()
        seen["head"] = page.locator("[data-memx=head-status]").inner_text()
        seen["memory"] = page.locator("[data-memx=memory]").inner_text()
        seen["server"] = session.request("releases", "GET", "/memx/releases")["body"]
        seen["panel_text"] = page.locator("[data-memx=panel]").inner_text()
        panel = page.locator("[data-memx=panel]")
        page.locator("[data-memx=released-list]").evaluate("(node) => node.previousElementSibling.scrollIntoView()")
        seen["shots"]["released"] = _shot(page, shots, f"{label}-released-light.png")
        seen["shots"]["released_panel"] = panel_shot(panel, shots, f"{label}-released-panel-light.png")
        page.locator("[data-memx=timeline]").evaluate("(node) => node.previousElementSibling.scrollIntoView()")
        seen["shots"]["timeline"] = _shot(page, shots, f"{label}-released-timeline-light.png")
        seen["shots"]["timeline_panel"] = panel_shot(panel, shots, f"{label}-released-timeline-panel-light.png")
    except Exception:
        for index, open_page in enumerate(context.pages):
            _shot(open_page, session.out, f"failure-{index}.png")
        raise
    finally:
        context.close()
    with open(os.path.join(session.out, "trail_seen.json"), "w", encoding="utf-8") as handle:
        json.dump(seen, handle, indent=2, default=str)


def panel_shot(panel, folder, name):
    """A screenshot of the Memory tab alone (what docs/panel.md shows), as it is scrolled now."""
    path = os.path.join(folder, name)
    panel.screenshot(path=path)
    return path


def run_cli(args, timeout):
    """``python -m comfy_memx <args>`` with this test's interpreter (the commands need the standard library only)."""
    done = subprocess.run([sys.executable, "-m", "comfy_memx", *args], capture_output=True, text=True,
                          timeout=timeout)
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


@pytest.fixture(scope="module")
def trail_session(tmp_path_factory, memx_importable_by_real_python, chromium):  # noqa: F811
    """``trail_session(tree, kind)`` -> the stopped session of ``kind`` on ``tree`` with ``seen`` (run once)."""
    done = {}
    shots = screenshot_dir(tmp_path_factory)

    def get(tree, kind):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if (tree, kind) not in done:
            launcher, as_node_pack = KINDS[kind]
            label = f"{os.path.basename(os.path.normpath(tree))}-{kind}"
            out = str(tmp_path_factory.mktemp(f"{label}-trail"))
            events = os.path.join(out, "trail-events.jsonl")
            packs = PACKS + [node_pack_copy(out)] if as_node_pack else PACKS
            session = drive.Session(tree, configured_python(), out, launcher=launcher, packs=packs,
                                    env={**ENV, "COMFY_MEMX_EVENTS": events})
            session.events_path = events   # the node pack reads it from the environment as well
            first_run_done(session.base)
            done[(tree, kind)] = run_session(session, lambda s: run_trail(s, chromium, shots, label))
        return ready(done[(tree, kind)])

    return get


def trail_cases():
    """The node pack and the launcher on the newest tree named (one session is about three minutes)."""
    newest = [case for case in browser_cases() if case.id.endswith("node_pack")][-1].values[0]
    return [pytest.param(newest, kind, id=f"{os.path.basename(os.path.normpath(newest))}-{kind}") for kind in KINDS]


def trail_test(test):
    for mark in (pytest.mark.parametrize(("tree", "kind"), trail_cases()), needs_real_comfyui, needs_chromium):
        test = mark(test)
    return test


@trail_test
def test_a_release_by_the_button_by_free_and_by_auto_each_shows_in_the_released_list(tree, kind, trail_session):
    session = trail_session(tree, kind)
    seen = session.seen
    cards = {card["trigger"]: card for card in seen["cards"]}
    assert set(cards) == set(BY_TRIGGER), (seen["cards"], where(session))
    words = {"http": "the Release button", "free": "free --release", "auto": "auto (COMFY_MEMX_RELEASE=auto)"}
    for trigger, holder in BY_TRIGGER.items():
        text = cards[trigger]["text"]
        assert f"pack\n{holder} · " in text and words[trigger] in text and "gone from memory" in text, text
        assert "RSS\n" in text and " before, " in text, text
    assert seen["summary"].startswith("3 release(s) gave back "), seen["summary"]
    server = {receipt["trigger"]: receipt for receipt in seen["server"]["releases"]
              if receipt["outcome"] in ("released", "survivor")}
    for trigger, holder in BY_TRIGGER.items():
        assert server[trigger]["package"] == holder and server[trigger]["released_bytes"] > 0, server[trigger]
        assert cards[trigger]["model_id"] == server[trigger]["model_id"]
    assert seen["free_cli"]["returncode"] in (0, 1), seen["free_cli"]
    assert f"released {server['free']['model_id']} (" in seen["free_cli"]["stdout"], seen["free_cli"]
    assert "release auto for memx_list_keeper" in seen["head"], seen["head"]
    assert "ComfyUI (RSS)" in seen["memory"] and "Leaked (" in seen["memory"], seen["memory"]
    assert seen["page_errors"] == [], seen["page_errors"]
    assert not NOT_SHOWN.intersection(seen["panel_text"].split()), seen["panel_text"]
    for path in seen["shots"].values():
        assert os.path.getsize(path) > 10000, path


@trail_test
def test_each_release_is_marked_on_the_timeline_where_the_models_lane_ends(tree, kind, trail_session):
    session = trail_session(tree, kind)
    seen = session.seen
    marks = seen["marks"]
    for trigger, words in (("http", "by the Release button"), ("free", "by free --release"),
                           ("auto", "by auto (COMFY_MEMX_RELEASE=auto)")):
        model_id = next(card["model_id"] for card in seen["cards"] if card["trigger"] == trigger)
        assert any(f"release {model_id} ({words}" in title and "the model is gone" in title for title in marks), \
            (trigger, marks)
        assert f"{model_id} ◆ released" in seen["legend"], seen["legend"]


@trail_test
def test_report_lists_each_model_as_released_with_the_bytes_given_back(tree, kind, trail_session):
    session = trail_session(tree, kind)
    server = {receipt["trigger"]: receipt for receipt in session.seen["server"]["releases"]
              if receipt["outcome"] == "released"}
    as_json = run_cli(["report", session.events_path, "--json"], 120)
    assert as_json["returncode"] == 0, as_json
    data = json.loads(as_json["stdout"])
    models = {row["model_id"]: row for row in data["models"]}
    for trigger, holder in BY_TRIGGER.items():
        row = models[server[trigger]["model_id"]]
        assert row["status"] == "released" and row["released_bytes"] == server[trigger]["released_bytes"] > 0, row
        assert [release["trigger"] for release in row["release_log"]] == [trigger], row["release_log"]
    by_pack = {row["package"]: row for row in data["released_by_package"]}
    for trigger, holder in BY_TRIGGER.items():
        assert by_pack[holder]["released_bytes"] >= server[trigger]["released_bytes"], by_pack
    text = run_cli(["report", session.events_path], 120)["stdout"]
    for trigger, holder in BY_TRIGGER.items():
        assert f"was held by package {holder}, released" in text, (holder, text[-3000:])
        assert f"{holder}: 1 release(s), 1 model(s) freed" in text, (holder, text[-3000:])
    with open(os.path.join(session.out, "report.txt"), "w", encoding="utf-8") as handle:
        handle.write(text)
