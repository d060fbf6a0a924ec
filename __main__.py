"""``python -m comfy_memx`` run from the folder that holds this checkout: hand over to the real package.

Python then finds the checkout itself (its node-pack ``__init__.py``) as ``comfy_memx``, ahead of the package
installed in the environment.  This file forgets that, takes the checkout's folder off ``sys.path`` and runs the
installed ``comfy_memx`` (or, when none is installed, the package inside this checkout) as ``python -m`` would.
"""

import importlib.util
import os
import runpy
import sys

CHECKOUT = os.path.dirname(os.path.abspath(__file__))


def _hand_over():
    """Run the real ``comfy_memx.__main__`` with the checkout's parent folder off ``sys.path``."""
    parent = os.path.dirname(CHECKOUT)
    for name in [name for name in sys.modules if name == "comfy_memx" or name.startswith("comfy_memx.")]:
        del sys.modules[name]
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != parent]
    if importlib.util.find_spec("comfy_memx") is None:
        sys.path.insert(0, CHECKOUT)
    runpy.run_module("comfy_memx", run_name="__main__", alter_sys=True)


_hand_over()
