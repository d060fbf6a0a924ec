"""Stand-in for ``folder_paths.py``: where custom node packs and checkpoints are looked up (stdlib only, imports
cli_args like the real one).  Simulation knob: ``FAKE_COMFY_CUSTOM_NODE_DIRS`` (os.pathsep-separated) adds
directories of node packs, so subprocess tests can load packs such as tests/fake_comfy/packs without copying them."""
import os

from comfy.cli_args import args  # noqa: F401  (the real module reads paths from args)

base_path = os.path.dirname(os.path.realpath(__file__))
models_dir = os.path.join(base_path, "models")
folder_names_and_paths = {"custom_nodes": ([os.path.join(base_path, "custom_nodes")], set()),
                          "checkpoints": ([os.path.join(models_dir, "checkpoints")], {".ckpt", ".pt", ".safetensors"})}
for _extra in os.environ.get("FAKE_COMFY_CUSTOM_NODE_DIRS", "").split(os.pathsep):
    if _extra:
        folder_names_and_paths["custom_nodes"][0].append(os.path.abspath(_extra))


def get_folder_paths(folder_name):
    """A copy of the directories registered for ``folder_name``."""
    return folder_names_and_paths[folder_name][0][:]


def add_model_folder_path(folder_name, full_folder_path, is_default=False):
    """Register another directory for ``folder_name`` (first when ``is_default``)."""
    paths = folder_names_and_paths.setdefault(folder_name, ([], set()))[0]
    if full_folder_path not in paths:
        paths.insert(0, full_folder_path) if is_default else paths.append(full_folder_path)


def get_full_path(folder_name, filename):
    """The path of ``filename`` in the first directory registered for ``folder_name`` that has it, or None."""
    for directory in get_folder_paths(folder_name):
        path = os.path.join(directory, os.path.relpath(os.path.join("/", filename), "/"))
        if os.path.isfile(path):
            return path
    return None


def get_full_path_or_raise(folder_name, filename):
    """:func:`get_full_path`, raising ``FileNotFoundError`` when no directory has the file."""
    path = get_full_path(folder_name, filename)
    if path is None:
        raise FileNotFoundError(f"Model in folder '{folder_name}' with filename '{filename}' not found.")
    return path
