"""The instrumented loader (patches/loader.py) on both stand-ins: transparency, file_load events, bytes per model."""

import importlib.util
import os
import weakref

import pytest
import torch
from safetensors.torch import save_file

from comfy_memx.core.state import STATE
from comfy_memx.core import wrapping
from comfy_memx.core.events import EventLog
from comfy_memx.ledger import fileloads as loader_patch
from fake_comfy.loader import make_patcher
from memx_helpers import memx_on, read_events

VERSIONS = ["0.3.64", "0.27.0"]
METADATA = {"format": "pt", "modelspec.title": "memx test"}


@pytest.fixture
def files(tmp_path):
    """A safetensors file with metadata (fp16 and bf16) and a torch.save file of the same state dict."""
    state = {f"blocks.{i}.weight": torch.arange(64 * (i + 1), dtype=torch.float32).reshape(-1, 8) / 7
             for i in range(5)}
    state["blocks.0.weight"] = state["blocks.0.weight"].half()
    state["blocks.1.weight"] = state["blocks.1.weight"].bfloat16()
    folder = tmp_path / "models"
    folder.mkdir()
    paths = {"safetensors": str(folder / "model.safetensors"), "pickle": str(folder / "model.ckpt")}
    save_file(state, paths["safetensors"], metadata=METADATA)
    torch.save({"state_dict": state}, paths["pickle"])
    return state, paths


def loaders():
    """(patched, original) load_torch_file of the imported stand-in."""
    import comfy.utils
    return comfy.utils.load_torch_file, wrapping.original_of(comfy.utils, "load_torch_file")


def assert_same_state(got, expected):
    assert list(got) == list(expected)
    for key, tensor in expected.items():
        assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), key


def file_loads(path):
    return [e for e in read_events(path) if e["event"] == "file_load"]


def outcome(call):
    try:
        call()
    except Exception as exc:  # the exact type and message are what is compared
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("version", VERSIONS)
def test_same_tensors_and_metadata_with_and_without_the_patch(version, files, tmp_path):
    state, paths = files
    with memx_on(version, events=tmp_path / "events.jsonl"):
        patched, original = loaders()
        assert patched is not original and patched.__wrapped__ is original
        for path in paths.values():
            assert_same_state(patched(path), original(path))
            assert_same_state(patched(path, safe_load=True, device=torch.device("cpu")), state)
        sd, metadata = patched(paths["safetensors"], False, None, True)
        expected_sd, expected_metadata = original(paths["safetensors"], return_metadata=True)
        assert metadata == expected_metadata == METADATA
        assert_same_state(sd, expected_sd)
        assert len(file_loads(tmp_path / "events.jsonl")) == 5


def truncate(path, keep):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep] if keep >= 0 else data[:len(data) + keep])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("damage", ["truncated data", "truncated header", "garbage header", "truncated pickle"])
def test_damaged_file_raises_the_same_exception(version, damage, files, tmp_path):
    _, paths = files
    path = paths["pickle" if damage == "truncated pickle" else "safetensors"]
    if damage == "garbage header":
        with open(path, "r+b") as f:
            f.write(b"\xff" * 16)
    else:
        truncate(path, {"truncated data": -40, "truncated header": 20, "truncated pickle": -300}[damage])
    events_path = tmp_path / "events.jsonl"
    with memx_on(version, events=events_path):
        patched, original = loaders()
        expected = outcome(lambda: original(path))
        assert expected is not None
        assert outcome(lambda: patched(path)) == expected
        assert outcome(lambda: patched(path, return_metadata=True)) == outcome(
            lambda: original(path, return_metadata=True))
        assert not os.path.exists(events_path) or file_loads(events_path) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_file_load_event_fields_and_byte_counts(version, files, tmp_path):
    state, paths = files
    events_path = tmp_path / "events.jsonl"
    with memx_on(version, events=events_path):
        patched, _ = loaders()
        patched(paths["safetensors"])
        patched(paths["pickle"], device=torch.device("cpu"))
        import comfy.utils
        comfy.utils.DISABLE_MMAP = True  # what --disable-mmap sets: tensors are copied out of the map
        patched(paths["safetensors"])
    mapped, pickled, copied = file_loads(events_path)
    for event, path in ((mapped, paths["safetensors"]), (pickled, paths["pickle"]), (copied, paths["safetensors"])):
        assert event["file"] == os.path.basename(path)
        assert event["bytes"] == os.path.getsize(path)
        assert event["tensors"] == len(state) and event["device"] == "cpu"
        assert event["seconds"] > 0
        assert event["gb_per_s"] == pytest.approx(event["bytes"] / event["seconds"] / 1e9, rel=0.01, abs=1e-3)
        assert event["owner"] == {"prompt_id": None, "node_id": None, "class_type": None, "package": "core",
                                  "via": None}
    assert (mapped["format"], pickled["format"], copied["format"]) == ("safetensors", "pickle", "safetensors")
    assert (mapped["lazy"], pickled["lazy"], copied["lazy"]) == (True, False, False)


@pytest.mark.parametrize("version", VERSIONS)
def test_owner_is_the_custom_node_package_that_called_the_loader(version, files, tmp_path):
    _, paths = files
    pack = tmp_path / "custom_nodes" / "my_loader_pack"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text("import comfy.utils\n\n\ndef load(path):\n"
                                      "    return comfy.utils.load_torch_file(path)\n")
    seen = []
    with memx_on(version):
        STATE.events.subscribe(seen.append)
        spec = importlib.util.spec_from_file_location("my_loader_pack", pack / "__init__.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.load(paths["safetensors"])
    assert [e["owner"]["package"] for e in seen if e["event"] == "file_load"] == ["my_loader_pack"]


@pytest.mark.parametrize("version", VERSIONS)
def test_no_event_work_without_a_listener(version, files, monkeypatch):
    _, paths = files
    with memx_on(version):
        monkeypatch.setattr(STATE, "events", EventLog())  # no file, no subscriber (metrics may subscribe otherwise)

        def must_not_run(*args, **kwargs):
            raise AssertionError("event fields computed without a listener")
        monkeypatch.setattr(loader_patch, "file_load_fields", must_not_run)
        patched, _ = loaders()
        assert hasattr(patched, "__wrapped__") and not STATE.events.wanted
        assert len(patched(paths["safetensors"])) == 5
        STATE.events.subscribe(lambda event: None)
        with pytest.raises(AssertionError, match="without a listener"):
            patched(paths["safetensors"])


@pytest.mark.parametrize("version", VERSIONS)
def test_the_loader_keeps_no_loaded_tensor_alive(version, files, tmp_path):
    _, paths = files
    with memx_on(version, events=tmp_path / "events.jsonl"):
        patched, _ = loaders()
        sd = patched(paths["pickle"])
        ref = weakref.ref(sd["blocks.2.weight"])
        del sd
        assert ref() is None


@pytest.mark.parametrize("version", VERSIONS)
def test_load_and_unload_events_carry_bytes_and_seconds_per_model(version, tmp_path):
    events_path = tmp_path / "events.jsonl"
    with memx_on(version, events=events_path) as mm:
        patcher = make_patcher(16, 4096)
        mm.load_models_gpu([patcher])
        mm.free_memory(1e30, mm.get_torch_device())
        model_bytes = patcher.model_size()
        del patcher
    events = read_events(events_path)
    load = [e for e in events if e["event"] == "load"]
    unload = [e for e in events if e["event"] == "unload"]
    assert len(load) == len(unload) == 1
    assert load[0]["bytes"] == unload[0]["bytes"] == model_bytes == 16 * 4096 * 4
    for event in load + unload:
        assert event["seconds"] > 0
        assert event["gb_per_s"] == pytest.approx(event["bytes"] / event["seconds"] / 1e9, rel=0.01, abs=1e-3)
