"""comfy_memx's build backend: setuptools' own (``setuptools.build_meta``), and ``comfy_memx.pth`` in every wheel.

pyproject.toml names this module as its in-tree backend (``backend-path``, PEP 517).  setuptools builds the wheel
and the editable wheel (PEP 660) from pyproject's ``[tool.setuptools]`` table; neither can place a file at the root
of site-packages in an editable install, and the interpreter only reads ``.pth`` files there.  So each wheel, once
built, is written again with ``comfy_memx.pth`` at its root and that file's line in its ``RECORD`` (the wheel
format's own list of files and hashes): pip then installs the start-up line with the package, editable or not, and
uninstalls it with it.  Every other hook (sdist, metadata, build requirements) is setuptools' unchanged.
"""

import base64
import hashlib
import os
import shutil
import zipfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - the PEP 517 and PEP 660 hooks not redefined below

STARTUP_LINE = "comfy_memx.pth"   # beside pyproject.toml; PEP 517 runs the backend in the source tree
# setuptools' default build folder, which it reuses between builds: a module moved or deleted in the source would
# otherwise still ship in the next wheel
BUILT_PACKAGE = os.path.join("build", "lib", "comfy_memx")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """setuptools' wheel, built from an empty package folder, with the start-up line added (``pip install .``,
    ``pip wheel .``)."""
    shutil.rmtree(BUILT_PACKAGE, ignore_errors=True)
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_file(os.path.join(wheel_directory, name), STARTUP_LINE)
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """setuptools' editable wheel, with the start-up line added (``pip install -e .``, either editable mode)."""
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_file(os.path.join(wheel_directory, name), STARTUP_LINE)
    return name


def record_line(name, data):
    """The wheel ``RECORD`` line of a file: its name, its urlsafe-base64 sha256 without padding, its size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"{name},sha256={digest},{len(data)}"


def add_file(wheel_path, source):
    """Write the wheel at ``wheel_path`` again with ``source`` at its root (replacing an earlier copy) and listed
    in its RECORD; the other entries keep their bytes, dates and permissions."""
    name = os.path.basename(source)
    with open(source, "rb") as handle:
        data = handle.read()
    rewritten = wheel_path + ".part"
    with zipfile.ZipFile(wheel_path) as old, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as new:
        entries = [info for info in old.infolist() if info.filename != name]
        [record] = [info for info in entries if info.filename.endswith(".dist-info/RECORD")]
        added = zipfile.ZipInfo(name, date_time=record.date_time)
        new.writestr(added, data, zipfile.ZIP_DEFLATED)
        for info in entries:
            content = old.read(info)
            if info is record:
                lines = [line for line in content.decode("utf-8").splitlines() if not line.startswith(name + ",")]
                content = ("\n".join([record_line(name, data), *lines]) + "\n").encode("utf-8")
            new.writestr(info, content)
    os.replace(rewritten, wheel_path)
