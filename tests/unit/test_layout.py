"""``comfy_memx._layout``: a checkout's comfy_memx finds ``patches/`` as ``comfy_memx.patches``, and only its own."""

import sys
import types

from comfy_memx import _layout


def make_checkout(root, with_patches=True, installed_style=False):
    package = root / "comfy_memx"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if with_patches:
        patches = package / "patches" if installed_style else root / "patches"
        patches.mkdir()
        (patches / "__init__.py").write_text("")
    return package


def test_the_patches_folder_is_found_next_to_the_package_only_where_the_package_lacks_one(tmp_path):
    assert _layout.checkout_patches_dir(str(make_checkout(tmp_path / "a"))) == str(tmp_path / "a" / "patches")
    assert _layout.checkout_patches_dir(str(make_checkout(tmp_path / "b", installed_style=True))) is None
    assert _layout.checkout_patches_dir(str(make_checkout(tmp_path / "c", with_patches=False))) is None


def test_the_finder_answers_for_comfy_memx_patches_of_its_own_package_only(tmp_path, monkeypatch):
    package = make_checkout(tmp_path / "checkout")
    finder = _layout.CheckoutPatchesFinder(str(package), str(tmp_path / "checkout" / "patches"))
    other = types.ModuleType("comfy_memx")
    other.__path__ = [str(tmp_path / "elsewhere" / "comfy_memx")]
    monkeypatch.setitem(sys.modules, "comfy_memx", other)
    assert finder.find_spec("comfy_memx.patches") is None       # another comfy_memx is imported: not ours
    other.__path__ = [str(package)]
    spec = finder.find_spec("comfy_memx.patches")
    assert spec.origin == str(tmp_path / "checkout" / "patches" / "__init__.py")
    assert spec.submodule_search_locations == [str(tmp_path / "checkout" / "patches")]
    assert finder.find_spec("patches") is None and finder.find_spec("comfy_memx.core") is None


def test_linking_twice_installs_one_finder(tmp_path, monkeypatch):
    package = make_checkout(tmp_path / "checkout")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    first = _layout.link_patches(str(package))
    assert _layout.link_patches(str(package)) is first
    assert sum(isinstance(f, _layout.CheckoutPatchesFinder) and f.package_dir == str(package)
               for f in sys.meta_path) == 1
