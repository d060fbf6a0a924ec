"""``python -m comfy_memx free [--url http://127.0.0.1:8188]``: free a running ComfyUI's models and print the receipt.

Calls ``POST /memx/free`` (comfy_memx must be active in that server), which sets ComfyUI's own ``/free`` flags,
waits until the prompt worker has unloaded the models, reset its caches and collected garbage, and answers what
was freed, what is still loaded, and the survivors: models still in memory although ComfyUI no longer holds
them, with the reference chains that keep them; with ``--release``, first what was cut to give the survivors'
memory back (``COMFY_MEMX_RELEASE``), then the survivors that are left.  Exit status (:data:`EXIT_CODES`, printed by
``--help``): 0 everything freed, 1 memory still held, 2 server unreachable or without comfy_memx, 3 not finished
within ``--timeout``, 4 refused before anything was unloaded.  Standard library only.
"""

import argparse
import json
import os
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request

from comfy_memx.core.errors import MemxError
from comfy_memx.core.units import format_bytes

DEFAULT_URL = "http://127.0.0.1:8188"
SEARCH_ALLOWANCE_S = 60.0   # added to --timeout for the server's holder searches and the transfer
FREED, HELD, UNREACHABLE, UNFINISHED, REFUSED = 0, 1, 2, 3, 4
EXIT_CODES = (
    (FREED, "everything was freed: the worker finished, no model is still loaded and no survivor is left alive "
            "(with --release: every survivor was released and died)"),
    (HELD, "memory is still held: survivors are left alive (not released, or released but kept by another holder) "
           "or models are still loaded (a prompt loaded them meanwhile)"),
    (UNREACHABLE, "the server cannot be reached, or it does not serve /memx/free (comfy_memx is not active there)"),
    (UNFINISHED, "not finished within --timeout: the prompt worker did not finish freeing, or --release's "
                 "releases waited for a running prompt and were withdrawn (nothing was cut); run it again"),
    (REFUSED, "refused before anything was unloaded: --release while the server runs with COMFY_MEMX_RELEASE=off, "
              "or from a caller that may not release (another machine without COMFY_MEMX_TOKEN)"),
)


class Unreachable(MemxError):
    """The server did not answer /memx/free usefully; the message says why."""


class Refused(MemxError):
    """The server refused the request before freeing anything (403); the message is the server's."""


def free_url(base_url, timeout):
    """The /memx/free URL of the server at ``base_url`` with the ``timeout`` query parameter."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url must look like {DEFAULT_URL}, got {base_url!r}")
    path = parts.path.rstrip("/") + "/memx/free"
    seconds = f"{timeout:.3f}".rstrip("0").rstrip(".")   # the route takes plain decimals, never 1e-05
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, f"timeout={seconds}", ""))


def request_free(base_url, timeout, free_memory=True, token=None, release=False):
    """POST /memx/free and return ``(http status, receipt dict)``; raises :class:`Unreachable`.

    ``token`` (default: ``COMFY_MEMX_TOKEN`` of this environment) is sent as ``X-Memx-Token``: a server reached
    from another host runs the survivors' holder searches only for a caller with its token (docs/security.md).
    ``release`` asks the server to cut the pack-cache entry that keeps each survivor alive (COMFY_MEMX_RELEASE)."""
    url = free_url(base_url, timeout)
    wanted = {"unload_models": True, "free_memory": free_memory, **({"release": True} if release else {})}
    body = json.dumps(wanted).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    token = os.environ.get("COMFY_MEMX_TOKEN") if token is None else token
    if token:
        headers["X-Memx-Token"] = token
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout + SEARCH_ALLOWANCE_S) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
        if status == 404:
            raise Unreachable(_no_memx_routes(url, "answered 404")) from None
        if status == 403:
            raise Refused(_refusal(raw)) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise Unreachable(f"cannot reach {url}: {reason}") from None
    try:
        receipt = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        raise Unreachable(_no_memx_routes(url, f"answered {status} with something that is not JSON")) from None
    if status not in (200, 202) or not isinstance(receipt, dict) or "survivors" not in receipt:
        message = receipt.get("message") if isinstance(receipt, dict) else None
        raise Unreachable(f"{url} answered {status}: {message or receipt}")
    return status, receipt


def _refusal(raw):
    """The message of a 403 answer (release off, or not allowed), or the raw text when it is not comfy_memx's JSON."""
    try:
        answer = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("message"):
        return f"refused ({answer.get('error') or 403}): {answer['message']}"
    return f"refused (403): {raw.decode('utf-8', 'replace')[:300]}"


def _no_memx_routes(url, said):
    """The error for a server that answered but not as comfy_memx does: what that means and how to check."""
    status_url = url.split("/memx/free")[0] + "/memx/status"
    return (f"{url} {said}: the server answered, but it has no comfy_memx routes, so comfy_memx is not installed "
            f"or not active in that ComfyUI. Check: {status_url} answers JSON with comfy_memx's version when it is "
            "active, and ComfyUI's start-up log has a 'comfy_memx ... active' line; activate it with python -m "
            "comfy_memx main.py, COMFY_MEMX=1 python main.py, or the node pack in custom_nodes/ (docs/install.md)")


def exit_status(receipt):
    """The exit status of a receipt (:data:`EXIT_CODES`): 3 when the worker did not finish or the releases were
    withdrawn, else 0 when no survivor is left alive (a survivor released and dead is gone) and nothing is still
    loaded, else 1."""
    if receipt.get("status") != "done" or _withdrawn(receipt):
        return UNFINISHED
    gone = {row.get("model_id") for row in receipt.get("releases") or () if row.get("died")}
    left = [row for row in receipt.get("survivors") or () if row.get("model_id") not in gone]
    return FREED if not left and not receipt.get("still_loaded") else HELD


def _withdrawn(receipt):
    return receipt.get("release_state") in ("withdrawn", "not_run")


def format_receipt(receipt):
    """The receipt as text lines: what was freed, what ``--release`` cut (and why not, naming the holder the receipt
    names), what is still loaded, then the survivors that are left alive, and the memory figures."""
    lines = []
    if receipt.get("status") != "done":
        lines.append(f"not finished: {receipt.get('note') or 'the prompt worker did not finish freeing in time'}")
    freed = receipt.get("freed") or []
    lines.append(_freed_headline(receipt))
    for row in freed:
        memory = "gone from memory" if row.get("released") else "still in RAM"   # (the panel's words)
        lines.append(f"  {row.get('model_id')} ({row.get('model')})  {format_bytes(row.get('unloaded_bytes'))} "
                     f"unloaded from {row.get('device')}, {memory}{_owner_text(row.get('owner'))}")
    lines += _release_lines(receipt)
    still = receipt.get("still_loaded") or []
    lines.append(f"still loaded: {len(still)} model(s)")
    for row in still:
        lines.append(f"  {row.get('model_id')} ({row.get('model')})  {format_bytes(row.get('loaded_bytes'))} "
                     f"on {row.get('device')}")
    gone = {row.get("model_id") for row in receipt.get("releases") or () if row.get("died")}
    survivors = [row for row in receipt.get("survivors") or [] if row.get("model_id") not in gone]
    left = " left" if receipt.get("releases") else ""
    if not survivors:
        lines.append(f"survivors{left}: none")
    else:
        alive = format_bytes(sum(row.get("bytes") or 0 for row in survivors))
        lines.append(f"survivors{left}: {len(survivors)} model(s), {alive} still alive although ComfyUI no longer "
                     "holds them")
    for row in survivors:
        lines += _survivor_lines(row)
    lines += _memory_lines(receipt.get("memory"))
    return lines


def _freed_headline(receipt):
    """What the free gave back: only models whose memory is gone count as freed; a model unloaded from its device
    that is still in RAM (every unload on ``--cpu``, or a survivor) counts as unloaded, never as freed."""
    unloaded = receipt.get("freed") or []
    gone = sum(1 for row in unloaded if row.get("released"))
    kept = f", {len(unloaded) - gone} of them still in RAM" if len(unloaded) > gone else ""
    return (f"freed {gone} model(s), {format_bytes(receipt.get('released_bytes'))} gone from memory; unloaded "
            f"{len(unloaded)} model(s), {format_bytes(receipt.get('freed_bytes'))}, from their devices{kept}")


# why a survivor is still in memory, as the receipt's ``reason`` says it, defined where a person reads it
SURVIVOR_REASONS = {
    "orphaned": "orphaned: no ModelPatcher refers to it any more, yet something keeps its weights in memory",
    "kept": "kept: a ModelPatcher of it outlived ComfyUI's emptied caches (a node's output or a pack holds the MODEL)",
}


def _survivor_lines(row):
    """One survivor: its size and why it survived (``orphaned`` and ``kept`` spelled out), its leak, then what holds
    it (or why nothing was found)."""
    reason = SURVIVOR_REASONS.get(row.get("reason"), row.get("reason"))
    lines = [f"  {row.get('model_id')} ({row.get('model')})  {format_bytes(row.get('bytes'))}, "
             f"{reason}{_built_text(row.get('created_by'), row.get('owner'))}{_owner_text(row.get('owner'))}"]
    lines += _leak_lines(row.get("leak"))
    search = row.get("search") or {}
    if search.get("error"):
        lines.append(f"    holder search failed: {search['error']}")
    elif row.get("holders") is None:
        lines.append(f"    holders not searched{': ' + str(search['note']) if search.get('note') else ''}")
    for chain in row.get("holders") or []:
        lines += _chain_lines(chain, "    held by")
    if row.get("holders") == [] and not search.get("error"):
        lines.append(f"    {_no_holder_text(search)}")
    return lines


def _release_lines(receipt):
    """What ``--release`` did, before the survivors: what came back, then one line per release receipt (what was
    cut, or why not, with the holder the receipt names and its fix)."""
    lines = [f"released: {receipt['release_note']}"] if receipt.get("release_note") else []
    rows = receipt.get("releases") or []
    if rows:
        lines.append(_release_headline(receipt, rows))
    for row in rows:
        lines += _release_row_lines(row)
    return lines


def _release_headline(receipt, rows):
    """``released D of N survivor(s) ...``: models, not receipts (one cut may free a checkpoint's three models)."""
    cut = [row for row in rows if row.get("outcome") in ("released", "survivor")]
    died = {model.get("model_id") for row in rows for model in (row.get("models") or [row]) if model.get("died")}
    tried = died | {row.get("model_id") for row in rows}   # a model that died with another's entry has no row
    return (f"released {len(died)} of {len(tried)} survivor(s) with a known holder: "
            f"{format_bytes(receipt.get('release_bytes'))} given back by cutting {len(cut)} cache "
            f"entr{'y' if len(cut) == 1 else 'ies'} of their packs")


def _release_row_lines(row):
    """One release receipt: the cut and what went with it, or why nothing was cut (holder and fix)."""
    name = f"{row.get('model_id')} ({row.get('model')})"
    if row.get("outcome") in ("released", "survivor"):
        next_holder = row.get("next_holder") or {}
        lines = [f"  released {name}: cut {row.get('cut')} of package {row.get('package')}, "
                 f"{format_bytes(row.get('bytes'))}; " + ("the model is gone" if row.get("died") else
                 f"still held by {next_holder.get('path') or next_holder.get('note') or '?'}")]
        return lines + [f"    with it {model.get('model_id')} ({model.get('model')}), "
                        f"{format_bytes(model.get('bytes'))}: gone" for model in row.get("models") or ()
                        if model.get("model_id") != row.get("model_id") and model.get("died")]
    lines = [f"  not released {name} ({row.get('outcome')}): {row.get('reason')}"]
    if row.get("path"):
        lines.append(f"      holder: {row['path']}  [package {row.get('package') or '?'}, "
                     f"{row.get('pattern') or '?'}]")
    if row.get("fix"):
        lines.append(f"      fix ({row.get('pattern')}): {row['fix']}")
    return lines


def _chain_lines(chain, lead):
    """One holder chain: its path, the package that holds the model and the root's kind, then its pattern and the
    usual fix (``comfy_memx.leaks.patterns``)."""
    package = chain.get("holder_package") or chain.get("package") or "?"
    lines = [f"{lead} {chain.get('path')}  [package {package}, {chain.get('root_kind') or '?'}]"]
    if chain.get("pattern"):
        lines.append(f"      fix ({chain['pattern']}): {chain.get('suggestion') or '?'}")
    return lines


def _leak_lines(leak):
    """What the leak report already knows about a survivor: its stage, sightings and the holder it named, with that
    holder's pattern and fix (the receipt's ``leak``; shown even when this free searched no holder)."""
    if not isinstance(leak, dict):
        return []
    seen = f", seen in {leak['sightings']} prompt(s)" if leak.get("sightings") else ""
    lines = [f"    leak report: {leak.get('stage') or '?'}{seen}"]
    if isinstance(leak.get("holder"), dict) and leak["holder"].get("path"):
        lines += _chain_lines(leak["holder"], "    reported holder")
    return lines


def _no_holder_text(search):
    """What a search that found nothing means: only a complete one may say the holder is out of its sight."""
    if search.get("result") == "incomplete" or search.get("complete") is False:
        return (f"no holder found within the budget (stopped by {search.get('stopped_by') or '?'}); run the search "
                "again with a larger COMFY_MEMX_LEAK_BUDGET")
    return f"no holder found{': ' + search['note'] if search.get('note') else ''}"


def _memory_lines(memory):
    """RSS before and after, what malloc_trim gave back (the allocator had kept it) and what live models hold."""
    if not isinstance(memory, dict):
        return []
    trim = memory.get("trim") or {}
    given = (f"malloc_trim gave {format_bytes(trim.get('returned_bytes'))} back to the kernel "
             f"(kept by the allocator, not by Python)" if "returned_bytes" in trim
             else f"malloc_trim skipped: {trim.get('skipped', '?')}")
    after = memory.get("rss_after_trim") or memory.get("rss_after")
    return [f"memory: process RSS {format_bytes(memory.get('rss_before'))} before, {format_bytes(after)} after; "
            f"{given}; live models hold {format_bytes(memory.get('held_bytes'))} of RAM"]


def _built_text(created_by, owner):
    """``; built by node N (Class), package P`` when another node than the loader built the model (a pack's loader
    built the checkpoint that ComfyUI's KSampler loaded), so that "loaded by ... core" does not read as the culprit."""
    if not isinstance(created_by, dict) or not created_by.get("package"):
        return ""
    if isinstance(owner, dict) and all(owner.get(key) == created_by.get(key) for key in ("node_id", "package")):
        return ""
    return _owner_text(created_by).replace("; loaded by ", "; built by ", 1)


def _owner_text(owner):
    if not isinstance(owner, dict):
        return ""
    parts = []
    if owner.get("node_id") is not None:
        parts.append(f"node {owner['node_id']} ({owner.get('class_type') or '?'})")
    parts.append(f"package {owner.get('package') or '?'}")
    return "; loaded by " + ", ".join(parts)


def main(argv):
    """Entry point of ``python -m comfy_memx free``; returns the exit status."""
    description = __doc__.splitlines()[0].replace("``", "")   # --help is plain text, not reStructuredText
    epilog = "exit status:\n" + "\n".join(textwrap.fill(text, 100, initial_indent=f"  {code}  ",
                                                         subsequent_indent="     ") for code, text in EXIT_CODES)
    parser = argparse.ArgumentParser(prog="python -m comfy_memx free", description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the ComfyUI server (default {DEFAULT_URL})")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds the server waits for the prompt worker (a running prompt delays it)")
    parser.add_argument("--unload-only", action="store_true",
                        help="only unload models (ComfyUI keeps its cached node outputs); default: also free_memory")
    parser.add_argument("--release", action="store_true",
                        help="also cut the pack-cache entry that keeps each survivor alive, on ComfyUI's prompt "
                             "worker between prompts (the server needs COMFY_MEMX_RELEASE=ask or auto, else nothing "
                             "is unloaded and the status is 4; the pack rebuilds the entry when it needs it again)")
    parser.add_argument("--json", action="store_true", help="print the receipt as JSON")
    args = parser.parse_args(argv)
    if not 0 <= args.timeout <= 3600:
        parser.error("--timeout must be between 0 and 3600 seconds")
    try:
        _, receipt = request_free(args.url, args.timeout, free_memory=not args.unload_only, release=args.release)
    except Refused as exc:
        print(f"comfy_memx free: {exc}", file=sys.stderr)
        return REFUSED
    except (Unreachable, ValueError) as exc:
        print(f"comfy_memx free: {exc}", file=sys.stderr)
        return UNREACHABLE
    print(json.dumps(receipt, indent=2) if args.json else "\n".join(format_receipt(receipt)))
    return exit_status(receipt)
