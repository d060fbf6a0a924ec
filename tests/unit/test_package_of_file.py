"""``core.comfyui.package_of_file``: the pack a file belongs to, and never comfy_memx itself, even when comfy_memx is
installed as a node pack under ``custom_nodes/`` (its frames between a node and a load are no ``via`` package)."""

import os
import sys

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


def test_a_file_belongs_to_a_pack_by_ComfyUIs_custom_node_folders_whatever_their_name(tmp_path, monkeypatch):
    import types
    folder_paths = types.ModuleType("folder_paths")
    elsewhere = tmp_path / "node_packs"   # extra_model_paths.yaml: custom_nodes: .../node_packs
    folder_paths.folder_names_and_paths = {"custom_nodes": ([str(tmp_path / "base" / "custom_nodes"), str(elsewhere)],
                                                            set())}
    monkeypatch.setitem(sys.modules, "folder_paths", folder_paths)
    assert comfyui.package_of_file(str(elsewhere / "some_pack" / "helper.py")) == "some_pack"
    assert comfyui.package_of_file(str(elsewhere / "single.py")) == "single"
    assert comfyui.package_of_file(str(elsewhere / "README.md")) is None
    assert comfyui.package_of_file(str(tmp_path / "other" / "helper.py")) is None
    # a pack that bundles a folder named custom_nodes is still that pack
    nested = tmp_path / "base" / "custom_nodes" / "big_pack" / "custom_nodes" / "sub.py"
    assert comfyui.package_of_file(str(nested)) == "big_pack"


def test_comfyuis_own_code_is_the_tree_of_its_comfy_package_not_the_base_directory(tmp_path, monkeypatch):
    import types
    tree = tmp_path / "app" / "ComfyUI"
    model_management = types.ModuleType("comfy.model_management")
    model_management.__file__ = str(tree / "comfy" / "model_management.py")
    folder_paths = types.ModuleType("folder_paths")
    folder_paths.base_path = str(tmp_path / "data")   # --base-directory
    monkeypatch.setitem(sys.modules, "comfy.model_management", model_management)
    monkeypatch.setitem(sys.modules, "folder_paths", folder_paths)
    assert comfyui.comfy_root() == str(tree)
    monkeypatch.delitem(sys.modules, "comfy.model_management")
    main = types.ModuleType("__main__")
    main.__file__ = str(tree / "main.py")
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert comfyui.comfy_root() == str(tree)
