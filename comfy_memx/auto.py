"""``import comfy_memx.auto``: the explicit opt-in for programs that embed ComfyUI.

Import it before ComfyUI's modules (patches then apply as they are imported) or after (they apply at once and
models already loaded are adopted into the ledger without an owner).
"""

from comfy_memx.core.bootstrap import bootstrap_quietly

bootstrap_quietly("auto")
