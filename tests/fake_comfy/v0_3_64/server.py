"""Stand-in for ComfyUI 0.3.64 ``server.py`` (the ``PromptServer`` of
comfy_memx/cli/demo_world/standin/shared/server.py): ``GET /system_stats`` lists one device, ``POST /prompt``
queues a 5-tuple (no sensitive-data dict)."""
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
