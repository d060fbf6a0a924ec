"""Stand-in for ``folder_paths.py``: where custom node packs are looked up (stdlib only, imports cli_args like: the shared stand-in source (comfy_memx/cli/demo_world/base/folder_paths.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/folder_paths")
