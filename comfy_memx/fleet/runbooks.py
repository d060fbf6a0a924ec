"""The runbook page every alert links to: ``runbooks.md`` (shipped beside the rules) as one HTML page.

The rules' default ``runbook_url`` is ``http://{{$labels.instance}}/memx/runbooks#<alert>``: the server that raised
the alert serves the runbooks of the comfy_memx version it runs, so the link works without a published copy of the
docs.  The page is rendered from the Markdown subset the file uses (headings, paragraphs, bullet lists, code
spans and fences, links shown as their text), escaped throughout, once per process.
"""

import functools
import html
import os
import re

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runbooks.md")

_CODE = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")
_STRONG = re.compile(r"\*\*([^*]+)\*\*")


def anchor(heading):
    """The id of a heading, as the rules' links and GitHub spell it: lower case, spaces to hyphens, no punctuation."""
    return re.sub(r"[^\w-]", "", heading.strip().lower().replace(" ", "-"))


def _inline(text):
    text = _LINK.sub(r"\1", text)
    parts = _CODE.split(text)   # odd parts are code spans
    out = []
    for index, part in enumerate(parts):
        escaped = html.escape(part)
        out.append(f"<code>{escaped}</code>" if index % 2 else _STRONG.sub(r"<strong>\1</strong>", escaped))
    return "".join(out)


def _blocks(lines):
    """``(kind, lines)`` of the file: ``heading``, ``fence``, ``list`` or ``paragraph``."""
    block, kind, fenced = [], None, False
    for line in lines:
        if fenced:
            if line.startswith("```"):
                yield "fence", block
                block, kind, fenced = [], None, False
            else:
                block.append(line)
            continue
        if line.startswith("```") or line.startswith("#") or not line.strip():
            if block:
                yield kind, block
            block, kind = [], None
            if line.startswith("```"):
                fenced = True
            elif line.startswith("#"):
                yield "heading", [line]
            continue
        if kind is None:
            kind = "list" if line.lstrip().startswith(("* ", "- ")) else "paragraph"
        block.append(line)
    if block:
        yield kind, block


def render(markdown):
    """The HTML page of ``markdown`` (the runbooks file's text)."""
    body = []
    for kind, lines in _blocks(markdown.splitlines()):
        if kind == "heading":
            level = min(len(lines[0]) - len(lines[0].lstrip("#")), 6)
            text = lines[0].lstrip("#").strip()
            body.append(f'<h{level} id="{anchor(text)}">{_inline(text)}</h{level}>')
        elif kind == "fence":
            body.append("<pre>" + html.escape("\n".join(lines)) + "</pre>")
        elif kind == "list":
            items, current = [], []
            for line in lines:
                if line.lstrip().startswith(("* ", "- ")) and current:
                    items.append(" ".join(current))
                    current = []
                current.append(line.strip().lstrip("*- ").strip() if not current else line.strip())
            items.append(" ".join(current))
            body.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in items) + "</ul>")
        else:
            body.append("<p>" + _inline(" ".join(line.strip() for line in lines)) + "</p>")
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>comfy_memx runbooks</title>"
            "<style>body{font-family:sans-serif;max-width:52em;margin:2em auto;line-height:1.45}"
            "code,pre{background:#f3f3f3}pre{padding:.6em;overflow-x:auto}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


@functools.lru_cache(maxsize=1)
def page():
    """The runbook page (HTML bytes), rendered once per process from :data:`SOURCE`."""
    with open(SOURCE, encoding="utf-8") as handle:
        return render(handle.read()).encode("utf-8")
