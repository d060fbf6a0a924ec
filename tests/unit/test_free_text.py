"""``python -m comfy_memx free``'s text receipt shows what the JSON receipt knows about each survivor: the holder
chains with their pattern and fix, and, where this free searched nothing, the holder the leak report named."""

from comfy_memx.cli import free as free_cmd

HOLDER = {"path": "leaky_pack.LeakyLoader._cache['a']", "package": "leaky_pack", "holder_package": "leaky_pack",
          "root_kind": "class_attribute", "pattern": "class_cache",
          "suggestion": "cache per instance instead of on the class", "stage": "backward"}


def survivor(**changes):
    row = {"model": "BaseModel", "model_id": "BaseModel#1", "owner": None, "bytes": 2 ** 20, "resident_bytes": 0,
           "reason": "leaked", "leak": None, "holders": None, "search": None}
    row.update(changes)
    return row


def text(*survivors):
    receipt = {"status": "done", "freed": [], "still_loaded": [], "survivors": list(survivors),
               "survivor_bytes": sum(row["bytes"] for row in survivors)}
    return "\n".join(free_cmd.format_receipt(receipt))


def test_a_searched_chain_prints_its_holder_package_pattern_and_fix():
    out = text(survivor(holders=[HOLDER], search={"complete": True}))
    assert "    held by leaky_pack.LeakyLoader._cache['a']  [package leaky_pack, class_attribute]" in out
    assert "      fix (class_cache): cache per instance instead of on the class" in out


def test_an_unsearched_survivor_prints_the_leak_reports_holder_with_its_pattern_and_fix_and_why_not_searched():
    leak = {"stage": "rooted", "sightings": 3, "holder": HOLDER}
    note = "not searched: only 4 survivors are searched per request"
    out = text(survivor(leak=leak, search={"note": note}))
    assert "    leak report: rooted, seen in 3 prompt(s)" in out
    assert "    reported holder leaky_pack.LeakyLoader._cache['a']  [package leaky_pack, class_attribute]" in out
    assert "      fix (class_cache): cache per instance instead of on the class" in out
    assert f"    holders not searched: {note}" in out


def test_a_survivor_that_is_no_known_leak_prints_no_leak_lines():
    out = text(survivor(search={"note": None}))
    assert "leak report" not in out and "fix (" not in out and "    holders not searched" in out


def test_orphaned_and_kept_are_spelled_out_where_the_receipt_says_them():
    out = text(survivor(reason="orphaned", holders=[]), survivor(model_id="BaseModel#2", reason="kept", holders=[]),
               survivor(model_id="BaseModel#3", reason="leaked", holders=[]))
    assert ("BaseModel#1 (BaseModel)  1.0 MiB, orphaned: no ModelPatcher refers to it any more, yet something keeps "
            "its weights in memory") in out, out
    assert "kept: a ModelPatcher of it outlived ComfyUI's emptied caches (a node's output or a pack holds the MODEL)" \
        in out, out
    assert "BaseModel#3 (BaseModel)  1.0 MiB, leaked" in out, out
