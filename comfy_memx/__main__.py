"""``python -m comfy_memx``: the launcher (``comfy_memx.cli.launcher``), which starts ComfyUI or a command."""

from comfy_memx.cli.launcher import main

main()
