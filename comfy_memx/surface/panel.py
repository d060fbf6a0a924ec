"""The memory panel's files: ComfyUI's frontend extension (``comfy_memx/web``) and the standalone page ``/memx/``.

As a node pack, ComfyUI serves the pack's ``WEB_DIRECTORY`` itself.  Activated by the launcher or
``COMFY_MEMX=1``, comfy_memx adds its own ``web`` folder to ComfyUI's ``nodes.EXTENSION_WEB_DIRS`` (which
``PromptServer`` reads in ``add_routes`` to serve ``/extensions/<name>/`` and in ``GET /extensions`` to list the
scripts the frontend imports), unless a folder holding :data:`MARKER` is there already: the panel is never loaded
twice.  ``/memx/`` is a page of its own that runs the same script for headless servers and older frontends; its
files come from ``/memx/web/<file>`` (only the files of :data:`PAGE_FILES`: the panel's ES modules, every ``.js`` of
the folder but the sidebar entry :data:`MARKER`, which imports ComfyUI's own scripts).  The modules import each
other by relative paths (``./memx_dom.js``), so they resolve under ``/extensions/<name>/`` in ComfyUI and under
``/memx/web/`` on the page alike; ComfyUI imports every ``.js`` of an extension folder, so each module only exports
and the sidebar tab is added by :data:`MARKER` alone.  Reads only, open like ComfyUI's.
"""

import logging
import os
import sys

log = logging.getLogger("comfy_memx")

WEB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "web")
MARKER = "memx_panel.js"
EXTENSION_NAME = "comfy_memx"
PAGE_FILES = {name: "text/javascript" for name in sorted(os.listdir(WEB_DIR))
              if name.endswith(".js") and name != MARKER} if os.path.isdir(WEB_DIR) else {}
PAGE = "page.html"


def web_dir_served(extension_dirs):
    """The name under which ``extension_dirs`` (ComfyUI's ``EXTENSION_WEB_DIRS``) already serves a comfy_memx
    panel (any folder holding :data:`MARKER`), or None."""
    for name, folder in list(extension_dirs.items()):
        if isinstance(folder, str) and os.path.isfile(os.path.join(folder, MARKER)):
            return name
    return None


def add_extension_dir(nodes_module=None):
    """Add comfy_memx's web folder to ``nodes.EXTENSION_WEB_DIRS`` unless a comfy_memx panel is there already;
    returns the name it is served under (``/extensions/<name>/``), or None when ComfyUI's ``nodes`` is not
    imported or the folder is missing."""
    nodes = nodes_module if nodes_module is not None else sys.modules.get("nodes")
    extension_dirs = getattr(nodes, "EXTENSION_WEB_DIRS", None)
    if not isinstance(extension_dirs, dict) or not os.path.isfile(os.path.join(WEB_DIR, MARKER)):
        return None
    served = web_dir_served(extension_dirs)
    if served is not None:
        return served
    name = EXTENSION_NAME if EXTENSION_NAME not in extension_dirs else EXTENSION_NAME + "_panel"
    extension_dirs[name] = WEB_DIR
    return name


def _read(name):
    with open(os.path.join(WEB_DIR, name), "rb") as handle:
        return handle.read()


async def page(request):
    """GET /memx/: the standalone memory page (the panel without ComfyUI's frontend)."""
    from aiohttp import web
    return web.Response(body=_read(PAGE), content_type="text/html", headers={"Cache-Control": "no-cache"})


async def page_redirect(request):
    """GET /memx: to /memx/, so that the page's relative links resolve."""
    from aiohttp import web
    raise web.HTTPFound(request.path + "/")


async def page_file(request):
    """GET /memx/web/{name}: one of :data:`PAGE_FILES`; 404 for any other name."""
    from aiohttp import web
    name = request.match_info["name"]
    content_type = PAGE_FILES.get(name)
    if content_type is None:
        return web.json_response({"error": "not_found", "message": f"no file {name[:80]!r}; the page's files are "
                                  f"{sorted(PAGE_FILES)}"}, status=404)
    return web.Response(body=_read(name), content_type=content_type, headers={"Cache-Control": "no-cache"})


def register(routes):
    """Add ``/memx/``, ``/memx`` and ``/memx/web/{name}`` to ``routes`` and comfy_memx's web folder to ComfyUI's
    extension folders; returns the paths served."""
    routes.get("/memx/")(page)
    routes.get("/memx")(page_redirect)
    routes.get("/memx/web/{name}")(page_file)
    served = add_extension_dir()
    if served is not None:
        log.debug("comfy_memx: memory panel served at /extensions/%s/", served)
    return ["/memx/", "/memx/web/{name}"]
