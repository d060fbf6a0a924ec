"""ComfyUI 0.27.0's part of ``server.py``: ``GET /system_stats`` lists every device, ``POST /prompt`` queues a
6-tuple (with an empty sensitive-data dict).

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

SYSTEM_OS = sys.platform


class PromptServer(_SharedPromptServer):
    """The HTTP server of one ComfyUI process (one instance, in ``PromptServer.instance``)."""

    def _devices(self, mm):
        """The devices ``GET /system_stats`` lists: the current one first, then every other."""
        primary = mm.get_torch_device()
        return [primary] + [d for d in mm.get_all_torch_devices() if d != primary]

    def _queue_item(self, number, prompt_id, prompt, extra_data, outputs):
        """The queue entry of a prompt: 0.27.0 adds its sensitive extra data (none here)."""
        return (number, prompt_id, prompt, extra_data, outputs, {})
