"""Stand-in for ComfyUI's ``server.py`` (``PromptServer`` itself, with the devices ``GET /system_stats`` lists and
the tuple ``POST /prompt`` queues, comes from the version layer, at the end).

What is modelled (reference §11 "server.py", and the real file's structure): ``PromptServer(loop)`` sets
``PromptServer.instance``, owns the ``prompt_queue``, an aiohttp ``app`` and the ``routes`` table custom nodes add
their routes to while they load; ``add_routes()`` hands ``routes`` to the app, each route also under ``/api``;
``start_multi_address()`` serves the app on each address; ``send_sync()`` is how the worker thread talks to clients.
Routes: ``GET /system_stats``, ``POST /prompt`` (queues a prompt of known node classes; outputs are its OUTPUT_NODE
nodes), ``GET /history``, ``GET /history/{prompt_id}``, ``GET /queue``, ``POST /free`` (sets the queue flags and
answers at once; the prompt worker acts on them after its current prompt).
Left out: websockets (messages are dropped), the frontend and static files, user/model/subgraph managers,
middlewares, TLS, uploads, prompt validation beyond the node classes.
"""

import asyncio
import errno
import logging
import sys
import uuid

from aiohttp import web

import comfy.model_management
import comfyui_version
import execution
import nodes
import stand_in_version


class _SharedPromptServer:
    """What ``PromptServer`` is in every stand-in version (each version's class adds the rest)."""

    instance = None

    def __init__(self, loop):
        PromptServer.instance = self
        self.loop = loop
        self.prompt_queue = execution.PromptQueue(self)
        self.messages = asyncio.Queue()
        self.client_id = None
        self.last_node_id = None
        self.last_prompt_id = None
        self.number = 0
        self.on_prompt_handlers = []
        self.app = web.Application(client_max_size=100 * 1024 * 1024)
        self.routes = web.RouteTableDef()
        self._define_routes(self.routes)

    async def setup(self):
        """Per-run set-up before serving (the real one opens an HTTP client session for API nodes)."""

    def add_routes(self):
        """Hand ``self.routes`` (core and custom-node routes) to the app, each also under ``/api``."""
        api_routes = web.RouteTableDef()
        for route in self.routes:
            if isinstance(route, web.RouteDef):
                api_routes.route(route.method, "/api" + route.path)(route.handler, **route.kwargs)
        self.app.add_routes(api_routes)
        self.app.add_routes(self.routes)

    def send_sync(self, event, data, sid=None):
        """Queue a message for websocket clients (called from the worker thread); dropped if the loop is gone."""
        try:
            self.loop.call_soon_threadsafe(self.messages.put_nowait, (event, data, sid))
        except RuntimeError:
            pass

    def queue_updated(self):
        self.send_sync("status", {"status": {"exec_info": {"queue_remaining": self.prompt_queue.get_tasks_remaining()}}})

    async def publish_loop(self):
        """Drain the message queue (the stand-in has no websocket clients to send to)."""
        while True:
            await self.messages.get()

    async def start(self, address, port, verbose=True, call_on_start=None):
        await self.start_multi_address([(address, port)], call_on_start=call_on_start, verbose=verbose)

    async def start_multi_address(self, addresses, call_on_start=None, verbose=True):
        """Serve the app on every ``(address, port)``; exits 1 when a port is taken."""
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        if verbose:
            logging.info("Starting server\n")
        for address, port in addresses:
            try:
                await web.TCPSite(runner, address, port).start()
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    logging.error(f"Port {port} is already in use on address {address}. Please close the other "
                                  "application or use a different port with --port.")
                    raise SystemExit(1)
                raise
            if not hasattr(self, "address"):
                self.address, self.port = address, port
            if verbose:
                logging.info("To see the GUI go to: http://{}:{}".format(f"[{address}]" if ":" in address else address, port))
        if call_on_start is not None:
            call_on_start("http", self.address, self.port)

    def add_on_prompt_handler(self, handler):
        self.on_prompt_handlers.append(handler)

    def _define_routes(self, routes):
        @routes.get("/system_stats")
        async def system_stats(request):
            mm = comfy.model_management
            cpu = mm.torch.device("cpu")
            entries = [_device_entry(mm, device) for device in self._devices(mm)]
            return web.json_response({
                "system": {"os": SYSTEM_OS, "ram_total": mm.get_total_memory(cpu), "ram_free": mm.get_free_memory(cpu),
                           "comfyui_version": comfyui_version.__version__, "python_version": sys.version,
                           "pytorch_version": mm.torch.__version__, "embedded_python": False, "argv": sys.argv},
                "devices": entries})

        @routes.post("/prompt")
        async def post_prompt(request):
            logging.info("got prompt")
            data = await request.json()
            prompt = data.get("prompt")
            if not isinstance(prompt, dict):
                return _prompt_error("no_prompt", "No prompt provided")
            unknown = sorted({str(node.get("class_type")) for node in prompt.values()
                              if not isinstance(node, dict) or node.get("class_type") not in nodes.NODE_CLASS_MAPPINGS})
            if unknown:
                return _prompt_error("invalid_prompt", f"Cannot execute because node class(es) {unknown} do not exist")
            number = data.get("number")
            if number is None:
                number = -self.number if data.get("front") else self.number
                self.number += 1
            prompt_id = data.get("prompt_id") or str(uuid.uuid4())
            extra_data = dict(data.get("extra_data") or {})
            if "client_id" in data:
                extra_data["client_id"] = data["client_id"]
            outputs = [node_id for node_id, node in prompt.items()
                       if getattr(nodes.NODE_CLASS_MAPPINGS[node["class_type"]], "OUTPUT_NODE", False)] or list(prompt)
            self.prompt_queue.put(self._queue_item(number, prompt_id, prompt, extra_data, outputs))
            return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": {}})

        @routes.get("/history")
        async def get_history(request):
            with self.prompt_queue.mutex:
                return web.json_response(dict(self.prompt_queue.history))

        @routes.get("/history/{prompt_id}")
        async def get_history_entry(request):
            prompt_id = request.match_info["prompt_id"]
            with self.prompt_queue.mutex:
                entry = self.prompt_queue.history.get(prompt_id)
                return web.json_response({prompt_id: entry} if entry is not None else {})

        @routes.get("/queue")
        async def get_queue(request):
            q = self.prompt_queue
            with q.mutex:
                running = [item[:5] for item in q.currently_running.values()]
                pending = [item[:5] for item in q.queue]
            return web.json_response({"queue_running": running, "queue_pending": pending})

        @routes.post("/free")
        async def post_free(request):
            data = await request.json()
            if data.get("unload_models", False):
                self.prompt_queue.set_flag("unload_models", data["unload_models"])
            if data.get("free_memory", False):
                self.prompt_queue.set_flag("free_memory", data["free_memory"])
            return web.Response(status=200)


def _prompt_error(kind, message):
    error = {"type": kind, "message": message, "details": message, "extra_info": {}}
    return web.json_response({"error": error, "node_errors": {}}, status=400)


def _device_entry(mm, device):
    """One device of ``GET /system_stats``: its name, type, index and memory (ComfyUI's and torch's view)."""
    vram_total, torch_vram_total = mm.get_total_memory(device, torch_total_too=True)
    vram_free, torch_vram_free = mm.get_free_memory(device, torch_free_too=True)
    return {"name": mm.get_torch_device_name(device), "type": device.type, "index": device.index,
            "vram_total": vram_total, "vram_free": vram_free,
            "torch_vram_total": torch_vram_total, "torch_vram_free": torch_vram_free}


stand_in_version.apply_layer(globals())
