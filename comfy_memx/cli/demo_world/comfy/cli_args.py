"""Stand-in for ComfyUI's ``comfy/cli_args.py`` (only the flags the memory code and main.py use): the flags every
version has; the version layer adds its own and parses.

Like the real module, ``sys.argv`` is parsed once, at first import, and only when
``comfy.options.args_parsing`` is already True; otherwise ``args`` holds the defaults for good.
Unknown options make argparse exit with status 2.
"""

import argparse

import comfy.options
import stand_in_version

parser = argparse.ArgumentParser()
parser.add_argument("--listen", type=str, default="127.0.0.1", metavar="IP", nargs="?", const="0.0.0.0,::")
parser.add_argument("--port", type=int, default=8188)

cache_group = parser.add_mutually_exclusive_group()
cache_group.add_argument("--cache-classic", action="store_true")
cache_group.add_argument("--cache-lru", type=int, default=0)
cache_group.add_argument("--cache-none", action="store_true")

vram_group = parser.add_mutually_exclusive_group()
vram_group.add_argument("--gpu-only", action="store_true")
vram_group.add_argument("--highvram", action="store_true")
vram_group.add_argument("--lowvram", action="store_true")
vram_group.add_argument("--novram", action="store_true")
vram_group.add_argument("--cpu", action="store_true")

parser.add_argument("--reserve-vram", type=float, default=None)
parser.add_argument("--disable-smart-memory", action="store_true")
parser.add_argument("--mmap-torch-files", action="store_true")
parser.add_argument("--disable-mmap", action="store_true")
parser.add_argument("--quick-test-for-ci", action="store_true")
parser.add_argument("--disable-all-custom-nodes", action="store_true")
parser.add_argument("--whitelist-custom-nodes", type=str, nargs="+", default=[])
parser.add_argument("--disable-api-nodes", action="store_true")
parser.add_argument("--verbose", default="INFO", const="DEBUG", nargs="?",
                    choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
parser.add_argument("--log-stdout", action="store_true")


def parse():
    """``sys.argv`` parsed when ``comfy.options.args_parsing`` is True, else the defaults (as the real module)."""
    if comfy.options.args_parsing:
        return parser.parse_args()
    return parser.parse_args([])


stand_in_version.apply_layer(globals())
