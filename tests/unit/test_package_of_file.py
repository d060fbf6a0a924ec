"""``core.comfyui.package_of_file``: the pack a file belongs to, and never comfy_memx itself, even when comfy_memx is
installed as a node pack under ``custom_nodes/`` (its frames between a node and a load are no ``via`` package)."""

import os

from comfy_memx.core import comfyui


def own_files_of(pack_dir):
    return (os.path.join(pack_dir, "comfy_memx", ""), os.path.join(pack_dir, "patches", ""),
            os.path.join(pack_dir, "__init__.py"))


def test_a_pack_file_is_named_by_its_folder_or_module(tmp_path):
    nodes = tmp_path / "ComfyUI" / "custom_nodes"
    assert comfyui.package_of_file(str(nodes / "leaky_pack" / "nodes" / "loader.py")) == "leaky_pack"
    assert comfyui.package_of_file(str(nodes / "single_file.py")) == "single_file"
    assert comfyui.package_of_file(str(tmp_path / "ComfyUI" / "comfy" / "sd.py")) is None


def test_comfy_memx_installed_as_a_node_pack_is_no_package(tmp_path, monkeypatch):
    pack = str(tmp_path / "ComfyUI" / "custom_nodes" / "comfy_memx")
    monkeypatch.setattr(comfyui, "OWN_FILES", own_files_of(pack))
    for own in ("comfy_memx/ledger/accounting.py", "patches/model_management.py", "__init__.py"):
        assert comfyui.package_of_file(os.path.join(pack, own)) is None, own
    assert comfyui.package_of_file(os.path.join(pack, "tools", "other.py")) == "comfy_memx"
    assert comfyui.package_of_file(str(tmp_path / "ComfyUI" / "custom_nodes" / "comfy_memx_extra" / "n.py")) \
        == "comfy_memx_extra"


def test_own_files_name_this_comfy_memx():
    here = os.path.dirname(os.path.abspath(comfyui.__file__))
    assert os.path.join(here, "comfyui.py").startswith(comfyui.OWN_FILES[0])
