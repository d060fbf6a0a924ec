"""The package's layers, as the README's Development section draws them: core at the bottom, the wings above it,
the patches and the command line on top, the entry modules above all; imports go down only, and none goes round
in a circle.

Every import in every module of ``comfy_memx/`` and ``patches/`` (and of the installed ``comfy_memx`` when the
suite runs against a wheel) is read with ``ast``, at the top level or inside a function.  An import that climbs,
or that goes sideways between two wings (or between the patches and the command line) without being listed in
:data:`ALLOWED`, fails the test with its file and line.
"""

import ast
from pathlib import Path

import comfy_memx

ROOT = Path(__file__).resolve().parents[2]

CORE = ("core", "_version")                                    # _version: a leaf holding the version string
WINGS = ("ledger", "pins", "leaks", "sharing", "surface", "fleet")
TOP = ("patches", "cli")
ENTRY = ("", "_startup", "auto", "__main__", "_layout", "nodepack")                 # "": the package's own __init__
RANK = {**{name: 0 for name in CORE}, **{name: 1 for name in WINGS}, **{name: 2 for name in TOP},
        **{name: 3 for name in ENTRY}}
# the unit of a module: its wing or top package; core (with _version) is one unit, and so are the entry modules
UNIT = {**{name: "core" for name in CORE}, **{name: "entry" for name in ENTRY}}

# the sideways imports between wings that are part of the design, each with why; everything else between wings fails
ALLOWED = {
    ("leaks", "comfy_memx.ledger"): "a leak report names who loaded the model and the prompt running now",
    ("surface", "comfy_memx.ledger"): "the read-model shows the ledger's records and reload causes",
    ("surface", "comfy_memx.leaks"): "the read-model, /memx/free and holder searches show leaks and their holders",
    ("surface", "comfy_memx.pins"): "the read-model shows the pin budget",
    ("sharing", "comfy_memx.surface.routes"): "the hand-off registers its own routes on the surface's terms",
    ("sharing", "comfy_memx.surface.access"): "... with the surface's access rules (peer secret, token)",
    ("sharing", "comfy_memx.surface.bodies"): "... and request bodies",
    ("sharing", "comfy_memx.surface.numbers"): "... and the numbers of its queries",
    ("sharing", "comfy_memx.surface.gate"): "... and its executor for blocking work",
}

# the patches fire core's signals and import only core; the per-layer pin path calls the pin budget directly
# (a dispatch there costs more than the budget allows: bench/wrappers.py), and nothing else of a wing
PATCH_DIRECT = {
    ("comfy_memx.patches.pinned_memory", "comfy_memx.pins.api"): "the pin budget decides each tensor pin",
    ("comfy_memx.patches.dynamic_pins", "comfy_memx.pins.api"): "... and each per-layer pin",
}


def module_files():
    """``{module name: path}`` of every module of the checkout's package and patches, and of the installed package
    when it is not the checkout (the wheel's ``comfy_memx/patches`` is a folder of its own there)."""
    folders = [(ROOT / "comfy_memx", "comfy_memx"), (ROOT / "patches", "comfy_memx.patches")]
    installed = Path(comfy_memx.__file__).resolve().parent
    if installed != (ROOT / "comfy_memx").resolve():
        folders.append((installed, "comfy_memx"))
    modules = {}
    for folder, prefix in folders:
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder)
            if "__pycache__" in relative.parts or (prefix == "comfy_memx" and relative.parts[0] == "patches"
                                                   and folder == ROOT / "comfy_memx"):
                continue   # the checkout's link to patches/ is read as patches/ itself
            parts = prefix.split(".") + list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules.setdefault(".".join(parts), []).append(path)
    return modules


def imports_of(name, path, source, known):
    """``(line, imported module)`` for every comfy_memx module that the source of module ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # ``from package import submodule`` imports the submodule; ``from module import name`` the module
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "comfy_memx" or target.startswith("comfy_memx."):
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                found.append((node.lineno, target))
    return found


def layer_of(module):
    """``(rank, unit)`` of a comfy_memx module name."""
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else ""
    if first not in RANK:
        raise AssertionError(f"{module} belongs to no layer: add its package to the layers of this test and the "
                             "README's Development section")
    return RANK[first], UNIT.get(first, first)


def violations(sources, known=None):
    """``file:line: ...`` for every import among ``sources`` (``{module name: (path, source text)}``) that climbs
    against the layers or goes sideways without being in :data:`ALLOWED`."""
    known = set(sources) | set(known or ())
    found = []
    for name, (path, source) in sorted(sources.items()):
        rank, unit = layer_of(name)
        for line, target in imports_of(name, Path(path), source, known):
            target_rank, target_unit = layer_of(target)
            if unit == "patches" and target_rank == 1 and (name, target) not in PATCH_DIRECT:
                found.append(f"{path}:{line}: {name} (patches) imports {target} ({target_unit}): patches import "
                             "only core (they fire core.signals)")
                continue
            if target_unit == unit or target_rank < rank:
                continue
            if target_rank == rank and any(unit == wing and (target == allowed or target.startswith(allowed + "."))
                                           for wing, allowed in ALLOWED):
                continue
            how = "climbs to" if target_rank > rank else "goes sideways to"
            found.append(f"{path}:{line}: {name} ({unit}) {how} {target} ({target_unit})")
    return found


def test_no_import_climbs_against_the_layers_or_goes_sideways_unlisted():
    files = module_files()
    assert {"comfy_memx.core.state", "comfy_memx.patches.model_management", "comfy_memx.sharing.idle"} <= set(files)
    problems = []
    for name, paths in files.items():
        for path in paths:
            problems += violations({name: (path, path.read_text(encoding="utf-8"))}, known=files)
    assert problems == []


def test_every_allowed_edge_is_still_used():
    files = module_files()
    used = set()
    for name, paths in files.items():
        for path in paths:
            unit = layer_of(name)[1]
            for _line, target in imports_of(name, path, path.read_text(encoding="utf-8"), set(files)):
                used.update((wing, allowed) for wing, allowed in ALLOWED
                            if wing == unit and (target == allowed or target.startswith(allowed + ".")))
    assert set(ALLOWED) - used == set(), "an allowed edge no module takes any more: drop it from ALLOWED"


KNOWN = {"comfy_memx.core", "comfy_memx.core.state", "comfy_memx.ledger", "comfy_memx.ledger.records",
         "comfy_memx.pins", "comfy_memx.pins.cap", "comfy_memx.sharing", "comfy_memx.sharing.handoff",
         "comfy_memx.surface", "comfy_memx.surface.freeing", "comfy_memx.surface.routes", "comfy_memx.cli",
         "comfy_memx.cli.launcher", "comfy_memx.patches", "comfy_memx.patches.server", "comfy_memx.leaks",
         "comfy_memx.leaks.watch"}


def test_a_planted_upward_import_fails_naming_its_file_and_line():
    source = '"""Planted."""\n\nimport os\n\n\ndef late():\n    from comfy_memx.ledger import records\n'
    assert violations({"comfy_memx.core.planted": ("comfy_memx/core/planted.py", source)}, KNOWN) == [
        "comfy_memx/core/planted.py:7: comfy_memx.core.planted (core) climbs to comfy_memx.ledger.records (ledger)"]


def test_planted_climbs_from_a_wing_and_from_the_patches_fail_too():
    assert violations({"comfy_memx.pins.planted": ("p.py", "import comfy_memx.patches.server\n")}, KNOWN) == [
        "p.py:1: comfy_memx.pins.planted (pins) climbs to comfy_memx.patches.server (patches)"]
    assert violations({"comfy_memx.patches.planted": ("q.py", "from ..cli import launcher\n")}, KNOWN) == [
        "q.py:1: comfy_memx.patches.planted (patches) goes sideways to comfy_memx.cli.launcher (cli)"]


def test_a_planted_sideways_import_between_wings_fails_unless_listed():
    unlisted = {"comfy_memx.sharing.planted": ("s.py", "from comfy_memx.surface import freeing\n")}
    assert violations(unlisted, KNOWN) == [
        "s.py:1: comfy_memx.sharing.planted (sharing) goes sideways to comfy_memx.surface.freeing (surface)"]
    back = {"comfy_memx.surface.planted": ("t.py", "from comfy_memx.sharing.handoff import give\n")}
    assert violations(back, KNOWN) == [
        "t.py:1: comfy_memx.surface.planted (surface) goes sideways to comfy_memx.sharing.handoff (sharing)"]
    listed = {"comfy_memx.sharing.planted": ("s.py", "from comfy_memx.surface.routes import guarded\n")}
    assert violations(listed, KNOWN) == []


def test_imports_down_and_within_a_unit_pass():
    sources = {"comfy_memx.patches.planted": ("a.py", "from comfy_memx.core import signals\nimport comfy_memx.core.state\n"),
               "comfy_memx.ledger.planted": ("b.py", "from . import records\nfrom comfy_memx.core.state import STATE\n"),
               "comfy_memx.__main__": ("c.py", "from comfy_memx.cli.launcher import main\n")}
    assert violations(sources, KNOWN) == []


def test_a_module_outside_every_layer_is_named():
    try:
        violations({"comfy_memx.newwing.x": ("n.py", "import os\n")}, KNOWN)
    except AssertionError as exc:
        assert "comfy_memx.newwing.x belongs to no layer" in str(exc)
    else:
        raise AssertionError("a module of an unknown package passed")


def test_the_patches_call_each_wing_through_its_front_only():
    files = module_files()
    reached = []
    for name, paths in files.items():
        if not name.startswith("comfy_memx.patches"):
            continue
        for path in paths:
            for line, target in imports_of(name, path, path.read_text(encoding="utf-8"), set(files)):
                rank, unit = layer_of(target)
                if rank == 1 and target != f"comfy_memx.{unit}.api":
                    reached.append(f"{path}:{line}: {name} imports {target}, not comfy_memx.{unit}.api")
    assert reached == []


def test_the_package_import_graph_has_no_circle():
    files = module_files()
    graph = {name: {target for path in paths for _line, target in imports_of(name, path, path.read_text(
        encoding="utf-8"), set(files)) if target != name} for name, paths in files.items()}
    assert "comfy_memx.core.state" in graph and "comfy_memx.patches.model_management" in graph
    state, stack, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                circles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert circles == []


def test_a_patch_importing_a_wing_fails():
    source = '"""Planted."""\n\nfrom comfy_memx.ledger import records\n'
    assert violations({"comfy_memx.patches.server": ("patches/server.py", source)}, KNOWN) == [
        "patches/server.py:3: comfy_memx.patches.server (patches) imports comfy_memx.ledger.records (ledger): "
        "patches import only core (they fire core.signals)"]
