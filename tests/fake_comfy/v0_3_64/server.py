"""Stand-in for ComfyUI 0.3.64 ``server.py``: the ``PromptServer`` shape that extensions (and comfy_memx) rely on.

What is modelled (reference §11 "server.py", and the real file's structure): ``PromptServer(loop)`` sets
``PromptServer.instance``, owns the ``prompt_queue``, an aiohttp ``app`` and the ``routes`` table custom nodes add
their routes to while they load; ``add_routes()`` hands ``routes`` to the app, each route also under ``/api``;
``start_multi_address()`` serves the app on each address; ``send_sync()`` is how the worker thread talks to clients.
Routes: ``GET /system_stats`` (one device), ``POST /prompt`` (queues a 5-tuple, no sensitive-data dict, for a
prompt of known node classes; outputs are its OUTPUT_NODE nodes), ``GET /history``, ``GET /history/{prompt_id}``,
``GET /queue``, ``POST /free`` (sets the queue flags and answers at once; the prompt worker acts on them after its
current prompt).
Left out: websockets (messages are dropped), the frontend and static files, user/model/subgraph managers,
middlewares, TLS, uploads, prompt validation beyond the node classes.
"""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/server")

import os  # noqa: E402

SYSTEM_OS = os.name


class PromptServer(_SharedPromptServer):
    """The HTTP server of one ComfyUI process (one instance, in ``PromptServer.instance``)."""

    def _devices(self, mm):
        """The devices ``GET /system_stats`` lists: 0.3.64 reports the current one only."""
        return [mm.get_torch_device()]

    def _queue_item(self, number, prompt_id, prompt, extra_data, outputs):
        """The queue entry of a prompt."""
        return (number, prompt_id, prompt, extra_data, outputs)
