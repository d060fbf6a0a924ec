import sys

from comfy_memx.core import importhook
from comfy_memx.core.state import STATE


def _write_module(tmp_path, name, body="VALUE = 1\n"):
    (tmp_path / f"{name}.py").write_text(body)
    sys.path.insert(0, str(tmp_path))


def test_callback_runs_after_the_module_body(tmp_path, monkeypatch):
    _write_module(tmp_path, "memx_target_a", "VALUE = 41\nVALUE += 1\n")
    seen = []
    importhook.when_imported("memx_target_a", lambda m: seen.append(m.VALUE))
    assert seen == [] and "memx_target_a" not in sys.modules
    import memx_target_a  # noqa: F401
    assert seen == [42]
    assert type(memx_target_a.__loader__).__name__ == "SourceFileLoader"
    assert importhook.pending() == []
    sys.modules.pop("memx_target_a")


def test_already_imported_module_fires_at_once():
    seen = []
    importhook.when_imported("json", seen.append)
    assert seen == [sys.modules["json"]]


def test_failing_callback_never_breaks_the_import(tmp_path, monkeypatch):
    from comfy_memx.core import errors
    monkeypatch.setattr(STATE.errors, "raise_internal", False)
    _write_module(tmp_path, "memx_target_b")

    def broken(module):
        raise RuntimeError("bookkeeping bug")
    later = []
    importhook.when_imported("memx_target_b", broken)
    importhook.when_imported("memx_target_b", later.append)
    import memx_target_b
    assert memx_target_b.VALUE == 1 and later == [memx_target_b]
    sys.modules.pop("memx_target_b")


def test_import_errors_of_the_target_propagate_and_skip_callbacks(tmp_path):
    _write_module(tmp_path, "memx_target_c", "raise ImportError('broken target')\n")
    seen = []
    importhook.when_imported("memx_target_c", seen.append)
    try:
        import memx_target_c  # noqa: F401
    except ImportError as exc:
        assert "broken target" in str(exc)
    else:
        raise AssertionError("the target's ImportError was swallowed")
    assert seen == []
