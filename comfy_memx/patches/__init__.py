"""``comfy_memx.patches`` in a checkout: the patch modules live in the repository's top-level ``patches/`` folder.

A checkout used without installing it (the repository cloned or unzipped into ComfyUI's ``custom_nodes/``, put on
``sys.path`` by the tests, or installed with ``pip install -e .``) imports this file as ``comfy_memx.patches``; it
appends that checkout's ``patches/`` to the package's ``__path__`` (Python's documented way for a package to span
folders, as ``pkgutil.extend_path`` does), so ``comfy_memx.patches.<name>`` is ``patches/<name>.py`` and
``patches`` never becomes a top-level package.  Built packages (a wheel, ``pip install .``) never ship this file:
pyproject.toml's ``package-dir`` builds ``comfy_memx/patches/`` from ``patches/`` itself.
"""

import os

_CHECKOUT_PATCHES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                 "patches")

if os.path.isfile(os.path.join(_CHECKOUT_PATCHES, "__init__.py")) and _CHECKOUT_PATCHES not in __path__:
    __path__.append(_CHECKOUT_PATCHES)
