"""Stand-in for ComfyUI 0.3.64 ``comfy/cli_args.py`` (only the flags the memory code and main.py use).

Like the real module, ``sys.argv`` is parsed once, at first import, and only when
``comfy.options.args_parsing`` is already True; otherwise ``args`` holds the defaults for good.
Unknown options (e.g. ``--disable-pinned-memory``, new in later versions) make argparse exit with status 2.
"""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy/cli_args")

vram_group.add_argument("--normalvram", action="store_true")
parser.add_argument("--async-offload", action="store_true")

args = parse()
