"""Real ComfyUI and a real Prometheus, driven from outside: shared by the bench tools and the real-ComfyUI tests.

``drive`` starts, drives and stops a real ComfyUI server (:class:`drive.Session`), ``prom`` runs a Prometheus on
loopback, ``make_checkpoint.py`` builds the random-weight SD1.5 checkpoint or a small one of its family (run with a
ComfyUI environment's interpreter), ``workflows/`` holds ComfyUI's default text-to-image workflow, and the ``memx_*_nodes`` folders are the
node packs copied into a server's ``custom_nodes``. Standard library only; the tests import it as ``bench.harness``.
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def pack_source(name):
    """The folder of the node pack ``name`` (``memx_test_nodes``, ``memx_unload_nodes``, ``memx_soak_nodes``,
    ``memx_release_nodes``, ``memx_keeps_nodes``), to copy into a ComfyUI ``custom_nodes`` folder or to load outside
    ComfyUI."""
    return os.path.join(HERE, name)


def workflow_path(name="default_t2i"):
    """The API-format workflow ``workflows/<name>.json``."""
    return os.path.join(HERE, "workflows", name + ".json")
