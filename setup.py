"""Packaging for comfy_memx.

One layout for every install kind: the patch modules live in the top-level ``patches/`` folder and
``comfy_memx/patches`` is a link to it, so a checkout, ``pip install .``, a built wheel and ``pip install -e .`` all
import the same ``comfy_memx.patches`` (never a top-level ``patches`` package).  Packages are found, not listed, so
no subpackage can be left out of a wheel (``tests/test_packaging.py`` compares the wheel with the source tree).
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


def _version():
    with open(os.path.join(HERE, "comfy_memx", "_version.py"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip('"')
    raise RuntimeError("no __version__ in comfy_memx/_version.py")


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
    name="comfy_memx",
    version=_version(),
    description="Make ComfyUI's model memory visible and controllable without editing ComfyUI",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    if os.path.exists(os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["comfy_memx", "comfy_memx.*"]),
    # the fleet files (Prometheus rules, Grafana dashboard) are data, not modules
    package_data={"comfy_memx.fleet": ["alerts.yml", "dashboard.json"], "comfy_memx": ["web/*.js", "web/*.html"]},
    install_requires=["torch>=2.1", "safetensors>=0.4", "psutil>=5.9"],
    extras_require={
        "metrics": ["prometheus_client>=0.17"],
        "plot": ["matplotlib>=3.5"],
        # numpy: safetensors.torch.save_file (checkpoints generated at run time) needs it
        "bench": ["objgraph>=3.5", "matplotlib>=3.5", "numpy>=1.23"],
        "test": ["pytest>=7", "aiohttp>=3.8", "prometheus_client>=0.17", "numpy>=1.23", "objgraph>=3.5",
                 "matplotlib>=3.5"],
    },
    cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth},
)
