"""What every stand-in version's ``server`` shares (run in that module by ``extend``; the version's own file adds the rest).

Stand-in for ComfyUI 0.3.64 ``server.py``: the ``PromptServer`` shape that extensions (and comfy_memx) rely on.
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


def _prompt_error(kind, message):
    error = {"type": kind, "message": message, "details": message, "extra_info": {}}
    return web.json_response({"error": error, "node_errors": {}}, status=400)
