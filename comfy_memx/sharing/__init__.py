"""Handing the GPU over: unload when idle, and ask idle peers on the same device to unload before a load.

``activity`` (when this instance last ran a prompt), ``idle`` (``COMFY_MEMX_IDLE_UNLOAD``: unload through ComfyUI's
own worker once the queue has been empty long enough) and ``handoff`` (``COMFY_MEMX_HANDOFF=host``: instances on
one host find each other in a registry file and ask idle peers on the same device to unload first).
"""
