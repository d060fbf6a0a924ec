"""Fault injection on real ComfyUI (opt-in, as ``test_real_comfyui.py``): with a fault planted in every subscriber of
every comfy_memx signal, ComfyUI's default text-to-image workflow still produces its image, ComfyUI's own
``POST /free`` still unloads (a prompt after it runs), and each fault is logged exactly once.

The faults are planted by a pack written into the test's own custom_nodes folder (nothing comfy_memx ships can plant
one): when ComfyUI loads it, it replaces every subscriber of ``comfy_memx.core.signals`` with one that raises.  The
events fired before custom nodes load (the patches being applied) keep their real subscribers.  One server per tree,
under the production error policy.
"""

import os
import re
import textwrap

import pytest

from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, real_checkpoint, real_trees, ready, run_session, where)

FAULT_PACK = textwrap.dedent('''\
    """Test-only pack: every subscriber of every comfy_memx signal raises from now on."""
    import logging

    from comfy_memx.core import signals


    class PlantedFault(Exception):
        """The planted fault."""


    def _planted(kind):
        def fault(*args):
            raise PlantedFault(kind)
        return fault


    for signal in signals.CATALOGUE:
        signal._subscribers = tuple((_planted(kind), kind) for _fn, kind in signal._subscribers)
    logging.getLogger("comfy_memx").warning("memx_fault_pack: planted %d faults",
                                            sum(len(signal._subscribers) for signal in signals.CATALOGUE))
    NODE_CLASS_MAPPINGS = {}
''')
MUST_FAIL = {"load_starting", "load_ended", "prompt_started", "prompt_ended", "node_starting", "node_ended",
             "free_flag_set", "flags_served", "unload_scope_entered", "unload_scope_exited"}
"""Signals that the workflow and ``POST /free`` fire on every tree after custom nodes load."""


def run_fault_session(session):
    session.prompt("t2i", drive.default_workflow(0))
    session.comfy_free("free", {"unload_models": True, "free_memory": True})
    # the worker acts on the flags in its turn after a prompt: this one runs once that turn (the unload) is over
    session.prompt("after_free", {"1": drive.loader_node("memx-faults"), "2": drive.sampler_node("1", 0)})


@pytest.fixture(scope="module")
def fault_session(tmp_path_factory, memx_importable_by_real_python, real_checkpoint):  # noqa: F811
    """``fault_session(tree)`` -> the stopped session on ``tree`` with the fault pack (run once per tree)."""
    done = {}

    def get(tree):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if tree not in done:
            out = tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-faults")
            pack = out / "memx_fault_pack"
            pack.mkdir()
            (pack / "__init__.py").write_text(FAULT_PACK, encoding="utf-8")
            session = drive.Session(tree, configured_python(), str(out / "run"), launcher="module",
                                    env={"COMFY_MEMX_RAISE_INTERNAL": "0"}, packs=(drive.NODE_PACK_NAME, str(pack)),
                                    checkpoint=real_checkpoint(tree))
            done[tree] = run_session(session, run_fault_session)
        return done[tree]

    return get


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_every_faulty_subscriber_leaves_the_image_and_is_logged_once(tree, fault_session):
    session = ready(fault_session(tree))
    log = "\n".join(drive.strip_ansi(line) for line in session.log_text().splitlines())
    assert "memx_fault_pack: planted" in log, where(session)
    step = session.step("t2i")
    assert step["ok"], (step.get("error_messages"), where(session))
    images = [image for output in step["outputs"].values() for image in output.get("images", [])]
    assert images and images[0]["filename"].startswith("memx_t2i"), (step["outputs"], where(session))
    assert os.path.isfile(os.path.join(session.base, "output", images[0]["filename"])), where(session)
    assert session.step("free")["http_status"] == 200, where(session)
    assert session.step("after_free")["ok"], (session.step("after_free").get("error_messages"), where(session))
    logged = re.findall(r"internal error in (\S+ -> \S+) \(ComfyUI continues", log)
    assert logged and len(logged) == len(set(logged)), (sorted(logged), where(session))
    assert MUST_FAIL <= {kind.split(" -> ")[0] for kind in logged}, (sorted(logged), where(session))
