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
import os


class PromptServer(_SharedPromptServer):
    """The HTTP server of one ComfyUI process (one instance, in ``PromptServer.instance``)."""

    def _define_routes(self, routes):
        @routes.get("/system_stats")
        async def system_stats(request):
            mm = comfy.model_management
            cpu = mm.torch.device("cpu")
            device = mm.get_torch_device()
            vram_total, torch_vram_total = mm.get_total_memory(device, torch_total_too=True)
            vram_free, torch_vram_free = mm.get_free_memory(device, torch_free_too=True)
            return web.json_response({
                "system": {"os": os.name, "ram_total": mm.get_total_memory(cpu), "ram_free": mm.get_free_memory(cpu),
                           "comfyui_version": comfyui_version.__version__, "python_version": sys.version,
                           "pytorch_version": mm.torch.__version__, "embedded_python": False, "argv": sys.argv},
                "devices": [{"name": mm.get_torch_device_name(device), "type": device.type, "index": device.index,
                             "vram_total": vram_total, "vram_free": vram_free,
                             "torch_vram_total": torch_vram_total, "torch_vram_free": torch_vram_free}]})

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
            self.prompt_queue.put((number, prompt_id, prompt, extra_data, outputs))
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
