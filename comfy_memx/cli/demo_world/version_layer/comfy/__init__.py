"""Part of ComfyUI 0.27.0's version layer (see ``stand_in_version``): the modules only 0.27.0 has, and its parts of
the base's ``comfy`` modules.  This marker only makes the folder a package of comfy_memx, so that wheels ship it;
the stand-in's ``comfy`` package reads the folder through its ``__path__``."""
