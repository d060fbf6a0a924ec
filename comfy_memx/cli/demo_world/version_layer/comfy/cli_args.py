"""ComfyUI 0.27.0's part of ``comfy/cli_args.py``: its cache, DynamicVRAM and pinning flags, then the parse.

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

cache_group.add_argument("--cache-ram", nargs="*", type=float, default=[], metavar="GB")
cache_group.add_argument("--high-ram", action="store_true")
parser.add_argument("--disable-dynamic-vram", action="store_true")
parser.add_argument("--enable-dynamic-vram", action="store_true")
parser.add_argument("--fast-disk", action="store_true")
parser.add_argument("--disable-pinned-memory", action="store_true")

args = parse()

if args.cache_ram is not None and len(args.cache_ram) > 2:
    parser.error("--cache-ram accepts at most two values: active GB and inactive GB")

if args.high_ram:
    args.cache_classic = True


def enables_dynamic_vram():
    """Whether DynamicVRAM would be tried (it never initialises in this stand-in: there is no comfy-aimdo)."""
    if args.enable_dynamic_vram:
        return True
    return not (args.disable_dynamic_vram or args.highvram or args.gpu_only or args.novram or args.cpu)
