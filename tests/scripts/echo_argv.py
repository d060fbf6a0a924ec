"""Prints what a launched script sees, for comparing `python -m comfy_memx` with plain `python`."""
import json
import os
import sys

heavy = sorted(m for m in sys.modules if m == "torch" or m == "comfy" or m.startswith("comfy."))
print(json.dumps({"argv": sys.argv[1:], "argv0": os.path.basename(sys.argv[0]), "name": __name__,
                  "path0": sys.path[0], "file": os.path.basename(__file__), "heavy": heavy}))
sys.stderr.write("stderr line\n")
if "--exit" in sys.argv:
    sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]))
