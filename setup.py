"""Packaging for comfy_memx.

One layout for every install kind, with no symlink in the tree (a zip download or a ``core.symlinks=false`` clone
would turn one into a text file): the patch modules live in the top-level ``patches/`` folder and are packaged as
``comfy_memx.patches`` (``package_dir``), so ``pip install .``, a built wheel and ``pip install -e .`` (setuptools'
editable finder honours the mapping) all import the same ``comfy_memx.patches``, never a top-level ``patches``
package; a checkout used without installing it finds them through ``comfy_memx/_layout.py``.  Packages are found,
not listed, so no subpackage can be left out of a wheel (``tests/test_packaging.py`` compares the wheel with the
source tree).  The metadata (name, version, dependencies, extras) is in pyproject.toml's ``[project]`` table.
``comfy_memx.pth`` is placed at the root of site-packages so that ``COMFY_MEMX=1`` activates comfy_memx in any
ComfyUI start command; the .pth line only reads ``os.environ`` unless the flag is set.
"""

import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "comfy_memx.pth"
PATCHES = "comfy_memx.patches"


class BuildPyWithPth(build_py):
    """Copies comfy_memx.pth next to the packages so the wheel (and an editable wheel) installs it.

    Starts from an empty ``build/lib/comfy_memx``: setuptools reuses that folder between builds, so a module that
    was moved or deleted in the source would otherwise still ship in the next wheel.
    """

    def run(self):
        shutil.rmtree(os.path.join(self.build_lib, "comfy_memx"), ignore_errors=True)
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


class EditableWheelWithPth(editable_wheel):
    """``pip install -e .``: adds comfy_memx.pth to the editable wheel too.

    setuptools (>= 64) writes everything in the unpacked wheel directory into the editable wheel; its
    ``_install_namespaces`` step is the hook that receives that directory.
    """

    def _install_namespaces(self, installation_dir, pth_prefix):
        super()._install_namespaces(installation_dir, pth_prefix)
        self.copy_file(os.path.join(HERE, PTH), os.path.join(installation_dir, PTH))


setup(
    packages=find_packages(include=["comfy_memx", "comfy_memx.*"]) + [PATCHES],
    package_dir={PATCHES: "patches"},
    # the fleet files (Prometheus rules, Grafana dashboard) are data, not modules
    package_data={"comfy_memx.fleet": ["alerts.yml", "alerts.template.yml", "dashboard.json"], "comfy_memx": ["web/*.js", "web/*.html"]},
    cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth},
)
