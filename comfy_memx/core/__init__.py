"""The machinery every feature of comfy_memx stands on.

``config`` (settings from ``COMFY_MEMX_*``), ``errors`` (what we raise, and the guard that keeps our bugs away from
ComfyUI), ``signals`` and ``pairs`` (the events patches run and wings subscribe to), ``guard`` (a wing's functions a
patch calls directly, behind the same guard), ``state`` (the one process-state object), ``importhook`` and
``wrapping`` (the post-import hook and the wrap/unwrap primitive), ``patching`` (the base every patch module's class derives from), ``registry`` (discovering
and applying the patch modules), ``events`` (the event stream), ``hostshare`` (the registry file this user's
processes share: the host-scope pin cap and the GPU hand-off), ``private`` (how every file comfy_memx writes is
opened: no other user's link followed, no other user's file used), ``units`` (how bytes are shown) and ``bootstrap``
(the one start-up path).  Nothing here imports torch or ComfyUI.
"""
