"""ComfyUI 0.3.64's part of ``server.py``: ``GET /system_stats`` lists the current device only, ``POST /prompt``
queues a 5-tuple (no sensitive-data dict), the system's ``os`` is ``os.name``.

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

import os

SYSTEM_OS = os.name


class PromptServer(_SharedPromptServer):
    """The HTTP server of one ComfyUI process (one instance, in ``PromptServer.instance``)."""

    def _devices(self, mm):
        """The devices ``GET /system_stats`` lists: 0.3.64 reports the current one only."""
        return [mm.get_torch_device()]

    def _queue_item(self, number, prompt_id, prompt, extra_data, outputs):
        """The queue entry of a prompt."""
        return (number, prompt_id, prompt, extra_data, outputs)
