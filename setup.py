"""The stated layout's setup.py: everything is declared in pyproject.toml, so it passes setuptools nothing.

pip builds through pyproject's in-tree backend (``build_backend/comfy_memx_build.py``), which runs this file as
setuptools always runs a setup.py; tools and habits that look for a setup.py find one that agrees with the table.
"""

from setuptools import setup

setup()
