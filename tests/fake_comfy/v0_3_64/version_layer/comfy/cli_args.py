"""ComfyUI 0.3.64's part of ``comfy/cli_args.py``: its own flags, then the parse.  Later versions' flags (e.g.
``--disable-pinned-memory``) are unknown here, so argparse exits with status 2 on them.

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

vram_group.add_argument("--normalvram", action="store_true")
parser.add_argument("--async-offload", action="store_true")

args = parse()
