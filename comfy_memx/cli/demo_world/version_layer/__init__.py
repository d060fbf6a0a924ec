"""ComfyUI 0.27.0's version layer of the stand-in (see ``stand_in_version``).  This marker only makes the folder a
package of comfy_memx, so that wheels ship it; nothing imports it."""
