"""The patch/unpatch primitive on a synthetic module (the stand-in contract tests reuse the same rules)."""

import types

import pytest

from comfy_memx.core import wrapping
from comfy_memx.core.errors import PatchSkipped


def make_module():
    module = types.ModuleType("memx_fake_target")

    def compute(a, b=2, **extra):
        """Original docstring."""
        if a == "boom":
            raise KeyError("boom")
        return (a, b, extra)

    class Base:
        def method(self, x):
            return ("base", x)

    class Child(Base):
        pass

    module.compute, module.Base, module.Child = compute, Base, Child
    return module


def counting_wrapper(calls):
    def factory(original, switch):
        def wrapper(*args, **kwargs):
            if switch.on:
                calls.append(args)
            return original(*args, **kwargs)
        return wrapper
    return factory


def test_wrap_is_transparent_and_idempotent():
    module, calls = make_module(), []
    original = module.compute
    assert wrapping.wrap(module, "compute", counting_wrapper(calls)) == "patched"
    wrapper = module.compute
    assert wrapping.wrap(module, "compute", counting_wrapper(calls)) == "already patched"
    assert module.compute is wrapper and wrapper.__wrapped__ is original
    assert module.compute(1, b=3, new_kwarg=4) == (1, 3, {"new_kwarg": 4})
    with pytest.raises(KeyError):
        module.compute("boom")
    assert len(calls) == 2 and wrapper.__doc__ == "Original docstring."


def test_unwrap_restores_identity_and_is_idempotent():
    module = make_module()
    original = module.compute
    wrapping.wrap(module, "compute", counting_wrapper([]))
    assert wrapping.unwrap(module, "compute") == "restored"
    assert module.compute is original
    assert wrapping.unwrap(module, "compute") == "not patched"
    assert wrapping.wrap(module, "compute", counting_wrapper([])) == "patched"
    assert module.compute is not original and module.compute.__wrapped__ is original
    wrapping.unwrap(module, "compute")


def test_inherited_method_is_shadowed_then_removed():
    module, calls = make_module(), []
    base_method = vars(module.Base)["method"]
    wrapping.wrap(module, "Child.method", counting_wrapper(calls))
    assert module.Child().method(5) == ("base", 5) and len(calls) == 1
    assert vars(module.Base)["method"] is base_method
    wrapping.unwrap(module, "Child.method")
    assert "method" not in vars(module.Child)


def test_foreign_wrapper_on_top_is_never_clobbered():
    module, calls = make_module(), []
    original = module.compute
    wrapping.wrap(module, "compute", counting_wrapper(calls))
    ours = module.compute

    def foreign(*args, **kwargs):
        return ours(*args, **kwargs)
    module.compute = foreign
    assert wrapping.unwrap(module, "compute") == "disabled under a foreign wrapper"
    assert module.compute is foreign
    module.compute(1)
    assert calls == []  # ours is now a pass-through
    assert wrapping.unwrap(module, "compute") == "disabled under a foreign wrapper"
    assert wrapping.wrap(module, "compute", counting_wrapper(calls)) == "patched"
    assert module.compute is foreign
    module.compute(2)
    assert calls == [(2,)]
    assert wrapping.original_of(module, "compute") is original


def test_missing_site_is_skipped_with_reason():
    module = make_module()
    with pytest.raises(PatchSkipped, match="absent"):
        wrapping.wrap(module, "pin_memory", counting_wrapper([]))
    with pytest.raises(PatchSkipped, match="Missing absent"):
        wrapping.wrap(module, "Missing.method", counting_wrapper([]))


def test_stale_alias_to_the_wrapper_passes_through_after_unpatch():
    module, calls = make_module(), []
    wrapping.wrap(module, "compute", counting_wrapper(calls))
    alias = module.compute               # like `from comfy.utils import load_torch_file` in another module
    wrapping.unwrap(module, "compute")
    assert alias(1) == (1, 2, {}) and calls == []


def test_a_foreign_wrapper_that_calls_ours_is_left_alone_by_the_audit():
    module, calls = make_module(), []
    wrapping.wrap(module, "compute", counting_wrapper(calls))
    ours = module.compute

    def foreign(*args, **kwargs):          # wraps ours the usual way: it calls what it found
        return ours(*args, **kwargs)
    module.compute = foreign
    try:
        assert wrapping.audit() == []
        assert module.compute is foreign and module.compute(1) == (1, 2, {}) and calls == [(1,)]
    finally:
        module.compute = ours
        wrapping.unwrap(module, "compute")


def test_a_replacement_that_bypasses_ours_is_wrapped_on_top_once_and_counted_once():
    module, calls = make_module(), []
    wrapping.wrap(module, "compute", counting_wrapper(calls), site=("fake", "compute"))
    ours = module.compute
    original = ours.__wrapped__

    def replacement(*args, **kwargs):      # reaches the original around us (inspect.unwrap), as some packs do
        return original(*args, **kwargs)
    module.compute = replacement
    [(site, owner, attr, found)] = wrapping.audit()
    assert (site, owner, attr, found) == (("fake", "compute"), "memx_fake_target", "compute", replacement)
    assert wrapping.audit() == []                          # said once
    assert module.compute.__wrapped__ is replacement
    assert module.compute(3) == (3, 2, {}) and calls == [(3,)]
    assert ours(4) == (4, 2, {}) and calls == [(3,)]       # the old wrapper now passes through
    assert wrapping.unwrap(module, "compute") == "restored"
    assert module.compute is replacement                   # the replacement stays: that pack chose it
