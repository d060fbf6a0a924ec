"""Whose code is it: a pack's by the file it lies in, ComfyUI's by where ComfyUI's own modules live.

On the stand-ins: with ComfyUI's base directory elsewhere (``--base-directory``: Desktop, most Docker images),
ComfyUI's own modules are still ``core`` and its output cache is still ComfyUI's cache (not packages named
``folder_paths``, ``main``); a pack folder ComfyUI loaded through a symbolic link, whose modules the pack imports
under top-level names from the link's target, and a pack in a custom-node folder of another name (as
extra_model_paths.yaml configures) own their modules, their nodes and the models those nodes build.
"""

import asyncio
import os
import sys
from urllib.parse import quote

import pytest

from comfy_memx.core import comfyui
from comfy_memx.leaks.holders import find_holders, package_of
from comfy_memx.leaks.holders.packages import custom_node_package_of_module, is_custom_node_package
from comfy_memx.ledger import attribution
from memx_helpers import memx_on
from test_model_creation import CACHE_MODULE, PACK, install_keeper, keeper_cleanup, keeper_prompt  # noqa: F401
from test_routes import leaky, serve

VERSIONS = ["0.3.64", "0.27.0"]
LINKED = "memx_linked_pack"
HELPER = "memx_linked_helper"


class Model:
    """Stands in for a model a holder keeps."""


@pytest.mark.parametrize("version", VERSIONS)
def test_with_the_base_directory_elsewhere_comfyuis_own_modules_and_cache_are_core(version, tmp_path):
    async def scenario(comfy):
        import folder_paths
        folder_paths.base_path = str(tmp_path / "user")   # what --base-directory sets
        folder_paths.folder_names_and_paths["custom_nodes"][0][:] = [str(tmp_path / "user" / "custom_nodes")]
        await comfy.run(leaky("a"))                       # ComfyUI's output cache keeps the model
        _, rows = await comfy.get_json("/memx/models")
        response = await comfy.client.post(f"/memx/models/{quote(rows[0]['model_id'], safe='')}/search")
        found = await response.json()
        held = Model()
        folder_paths.folder_names_and_paths["memx_probe"] = ([held], set())
        chains = [(chain.path, chain.package) for chain in find_holders(held).chains]
        modules = {name: package_of(name) for name in ("folder_paths", "execution", "main", "comfy.model_management")}
        return found, chains, modules

    found, chains, modules = serve(version, tmp_path, scenario)
    assert modules == dict.fromkeys(modules, "core")
    assert ("folder_paths.folder_names_and_paths['memx_probe'][0][0]", "core") in chains
    cache = [chain for chain in found["holders"] if ".caches.outputs" in chain["path"]]
    assert cache and all(chain["package"] == "core" and chain["pattern"] == "comfyui_cache" for chain in cache), found


def write_linked_pack(store):
    """A pack that puts its folder's real path on ``sys.path`` and imports its helper under a top-level name."""
    folder = store / LINKED
    folder.mkdir(parents=True)
    (folder / f"{HELPER}.py").write_text("HELD = []\n\n\nclass HelperNode:\n    FUNCTION = 'run'\n\n"
                                          "    def run(self):\n        return ()\n")
    (folder / "__init__.py").write_text(
        "import os\nimport sys\n\nsys.path.append(os.path.dirname(os.path.realpath(__file__)))\n\n"
        f"import {HELPER}  # noqa: E402\n\nKEPT = {{}}\n"
        f"NODE_CLASS_MAPPINGS = {{'MemxLinkedNode': {HELPER}.HelperNode}}\n")
    return folder


@pytest.mark.parametrize("version", VERSIONS)
def test_a_linked_pack_owns_the_modules_it_imports_under_top_level_names(version, tmp_path):
    custom_nodes = tmp_path / "base" / "custom_nodes"
    custom_nodes.mkdir(parents=True)
    os.symlink(write_linked_pack(tmp_path / "store"), custom_nodes / LINKED, target_is_directory=True)
    with memx_on(version):
        import nodes
        try:
            path = str(custom_nodes / LINKED)
            assert asyncio.run(nodes.load_custom_node(path)) is not False
            helper, pack = sys.modules[HELPER], sys.modules[path]   # a top-level name; the folder's path
            assert "custom_nodes" not in helper.__file__          # imported from the link's target
            in_helper, in_pack = Model(), Model()
            helper.HELD.append(in_helper)
            pack.KEPT["model"] = in_pack
            assert [(c.path, c.package) for c in find_holders(in_helper).chains] == [(f"{HELPER}.HELD[0]", LINKED)]
            assert [(c.path, c.package) for c in find_holders(in_pack).chains] == [(f"{LINKED}.KEPT['model']",
                                                                                   LINKED)]
            assert custom_node_package_of_module(HELPER) == LINKED
            assert comfyui.package_of_file(helper.__file__) == LINKED
            assert attribution.package_of_node("MemxLinkedNode") == LINKED
            assert is_custom_node_package(LINKED) and not is_custom_node_package("core")
            assert not is_custom_node_package(HELPER) and not is_custom_node_package("folder_paths")
        finally:
            sys.modules.pop(HELPER, None)
            sys.path[:] = [entry for entry in sys.path if not str(entry).startswith(str(tmp_path))]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pack_in_a_custom_node_folder_of_another_name_owns_what_its_node_builds(version, tmp_path, keeper_cleanup):
    elsewhere = tmp_path / "node_packs"   # extra_model_paths.yaml: custom_nodes: /somewhere/node_packs
    elsewhere.mkdir()

    async def scenario(comfy):
        import folder_paths
        folder_paths.add_model_folder_path("custom_nodes", str(elsewhere))
        cache = await install_keeper(tmp_path, custom_nodes=elsewhere)
        await comfy.run(keeper_prompt())
        _, rows = await comfy.get_json("/memx/models")
        held = [(chain.path, chain.package) for chain in find_holders(cache.loaded_objects["ckpt"][0][1]).chains]
        node_package = attribution.package_of_node("KeeperCheckpointLoader")
        return rows, comfyui.package_of_file(cache.__file__), node_package, held

    rows, file_package, node_package, held = serve(version, tmp_path, scenario)
    assert file_package == node_package == PACK
    assert len(rows) == 3 and {row["created_by"]["package"] for row in rows} == {PACK}
    assert (f"{CACHE_MODULE}.loaded_objects['ckpt'][0][1]", PACK) in held
