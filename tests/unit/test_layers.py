"""The package's layers, as docs/architecture.md draws them: core at the bottom, the route kit above it,
the wings above both, the patches and the command line on top, the entry modules above all, and the benches above
the whole package; imports go down only, and none goes round in a circle.

Every import in every module of ``comfy_memx/``, ``patches/`` and ``bench/`` (and of the installed ``comfy_memx``
when the suite runs against a wheel) is read with ``ast``, at the top level or inside a function: ``import`` and
``from ... import`` statements, and the imports written as calls with a constant name (``importlib.import_module``,
``__import__``, ``sys.modules[...]``, ``sys.modules.get(...)``).  An import that climbs, that goes sideways between
two wings without being listed in :data:`ALLOWED` or past the other wing's ``api`` module (its one door), that goes
sideways between the patches and the command line, a command's import of a wing's inside that :data:`CLI_PARTS`
does not list, or a bench's import of a wing's inside that :data:`BENCH_PARTS` does not list, fails the test with its
file and line.
"""

import ast
import shutil
from pathlib import Path

import comfy_memx

ROOT = Path(__file__).resolve().parents[2]

CORE = ("core", "_version")                                    # _version: a leaf holding the version string
KIT = ("routekit",)                                            # what every wing's routes are built with
WINGS = ("ledger", "pins", "leaks", "sharing", "surface", "fleet")
TOP = ("patches", "cli")
ENTRY = ("", "_startup", "auto", "__main__", "nodepack")                 # "": the package's own __init__
RANK = {**{name: 0 for name in CORE}, **{name: 1 for name in KIT}, **{name: 2 for name in WINGS},
        **{name: 3 for name in TOP}, **{name: 4 for name in ENTRY}}
BENCH_RANK = 5                                                 # bench/: above the whole package, never imported by it
# the unit of a module: its wing or top package; core (with _version) is one unit, and so are the entry modules
UNIT = {**{name: "core" for name in CORE}, **{name: "entry" for name in ENTRY}}

# the sideways uses between wings that are part of the design, each with why, always through the used wing's
# ``api`` module; every other import between two wings fails
ALLOWED = {
    ("leaks", "ledger"): "a leak report names who loaded the model and the prompt running now",
    ("surface", "ledger"): "the read-model shows the ledger's records and reload causes",
    ("surface", "leaks"): "the read-model, /memx/free and holder searches show leaks and their holders",
    ("surface", "pins"): "the read-model shows the pin budget",
    ("surface", "fleet"): "serves the runbook page every alert links to (/memx/runbooks)",
}

# the patches fire core's signals and import only core; the per-layer pin path calls the pin budget directly
# (a dispatch there costs more than the budget allows: bench/wrappers.py), and nothing else of a wing
PATCH_DIRECT = {
    ("comfy_memx.patches.pinned_memory", "comfy_memx.pins.api"): "the pin budget decides each tensor pin",
    ("comfy_memx.patches.dynamic_pins", "comfy_memx.pins.api"): "... and each per-layer pin",
}

# the benches use core, the route kit, the patches, the command line, the entry modules and each wing's ``api``;
# a bench that measures one inner part of a wing on its own names it here, with why
BENCH_PARTS = {
    ("bench.features", "comfy_memx.leaks.patterns"): "times the classification of one referrer chain",
    ("bench.features", "comfy_memx.sharing.activity"): "sets the last prompt's end for the idle check it times",
    ("bench.features", "comfy_memx.sharing.idle"): "times one idle check, on a watch it does not start",
    ("bench.features", "comfy_memx.surface.retention"): "times malloc_trim and the bytes it returns",
    ("bench.leak", "comfy_memx.leaks.holders"): "times the holder search itself, with and without its probe",
    ("bench.pins", "comfy_memx.pins.budget"): "replays workflows against the pin budget's eviction policy alone",
}

# the command line uses each wing through its ``api`` module too; a command that needs an inner part of a wing that
# the door does not offer names it here, with why (``fleet`` has no door: its rules and dashboard are files the
# ``fleet`` command prints and renders)
CLI_PARTS = {
    ("comfy_memx.cli.demo", "comfy_memx.ledger.causes"): "prints an unload's cause as the ledger words it",
    ("comfy_memx.cli.doctor", "comfy_memx.pins.cap"): "shows the pin cap a setting would give, without a pin session",
    ("comfy_memx.cli.doctor", "comfy_memx.pins.host"): "reads the host's RAM, swap and cgroup limit for the report",
    ("comfy_memx.cli.fleet", "comfy_memx.fleet"): "prints where the shipped rules and dashboard files are",
    ("comfy_memx.cli.fleet", "comfy_memx.fleet.rules"): "renders the alert rules with the operator's thresholds",
    ("comfy_memx.cli.launcher", "comfy_memx.leaks.watch"): "--leak-fail: the rooted leaks found, at ComfyUI's exit",
}

DYNAMIC_IMPORTERS = {("importlib", "import_module"), ("builtins", "__import__")}


def module_files(root=ROOT, installed=True):
    """``{module name: [path]}`` of every module of the package, the patches and the benches under ``root``, and of
    the installed package when it is not the checkout (the wheel's ``comfy_memx/patches`` is a folder of its own
    there) and ``installed`` is true."""
    folders = [(root / "comfy_memx", "comfy_memx"), (root / "patches", "comfy_memx.patches"), (root / "bench", "bench")]
    package = Path(comfy_memx.__file__).resolve().parent
    if installed and package != (root / "comfy_memx").resolve():
        folders.append((package, "comfy_memx"))
    modules = {}
    for folder, prefix in folders:
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder)
            if "__pycache__" in relative.parts or (prefix == "comfy_memx" and relative.parts[0] == "patches"
                                                   and folder == root / "comfy_memx"):
                continue   # the checkout's pointer to patches/: patches/ itself is read instead
            parts = prefix.split(".") + list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules.setdefault(".".join(parts), []).append(path)
    return modules


def _aliases(tree):
    """The names a module binds to ``importlib``, ``sys``, ``sys.modules`` and the import functions:
    ``{local name: (module, attribute or "")}``, builtins' ``__import__`` included."""
    bound = {"__import__": ("builtins", "__import__")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("importlib", "sys", "builtins"):
                    bound[alias.asname or alias.name] = (alias.name, "")
        elif isinstance(node, ast.ImportFrom) and node.module in ("importlib", "sys", "builtins"):
            for alias in node.names:
                bound[alias.asname or alias.name] = (node.module, alias.name)
    return bound


def _named(node, bound):
    """``(module, attribute)`` that the expression ``node`` names (``importlib.import_module``, an alias of it,
    ``sys.modules``), or None."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = bound.get(node.value.id)
        if owner is not None and owner[1] == "":
            return owner[0], node.attr
    return None


def _constant(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dynamic_target(node, bound, package, lookups):
    """The module that a call or subscript imports by a constant name (``importlib.import_module("x")``,
    ``__import__("x")``, and with ``lookups`` ``sys.modules["x"]``, ``sys.modules.get("x")``), or None."""
    if isinstance(node, ast.Subscript):
        return _constant(node.slice) if lookups and _named(node.value, bound) == ("sys", "modules") else None
    if not isinstance(node, ast.Call) or not node.args:
        return None
    name = _constant(node.args[0])
    if name is None:
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "get" and _named(func.value, bound) == ("sys", "modules"):
        return name if lookups else None
    if _named(func, bound) not in DYNAMIC_IMPORTERS:
        return None
    return _relative(node, name, package) if name.startswith(".") else name


def _relative(call, name, package):
    """The module of ``import_module(".x", package)``: relative to a constant package or, with ``__package__``, to
    the calling module's own; None when the package is not known from the source."""
    anchor = call.args[1] if len(call.args) > 1 else next(
        (keyword.value for keyword in call.keywords if keyword.arg == "package"), None)
    base = _constant(anchor) if anchor is not None else None
    if base is None and isinstance(anchor, ast.Name) and anchor.id == "__package__":
        base = package
    if base is None:
        return None
    level = len(name) - len(name.lstrip("."))
    base = base.rsplit(".", level - 1)[0] if level > 1 else base
    return f"{base}.{name.lstrip('.')}" if name.lstrip(".") else base


def _statement_targets(node, package, known):
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        module = f"{base}.{node.module}" if node.module else base
    else:
        module = node.module or ""
    # ``from package import submodule`` imports the submodule; ``from module import name`` the module
    return [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module for alias in node.names]


def imports_of(name, path, source, known, lookups=True):
    """``(line, imported module)`` for every comfy_memx or bench module that the source of module ``name``
    imports, by statement or by a call with a constant name; with ``lookups``, also every one it takes from
    ``sys.modules`` (a module already imported: a dependency for the layers, but no step of the import order)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(source, str(path))
    bound = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = _statement_targets(node, package, known)
        else:
            target = _dynamic_target(node, bound, package, lookups)
            targets = [target] if target is not None else []
        for target in targets:
            if target.split(".")[0] in ("comfy_memx", "bench"):
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                found.append((node.lineno, target))
    return found


def layer_of(module):
    """``(rank, unit)`` of a comfy_memx or bench module name."""
    parts = module.split(".")
    if parts[0] == "bench":
        return BENCH_RANK, "bench"
    first = parts[1] if len(parts) > 1 else ""
    if first not in RANK:
        raise AssertionError(f"{module} belongs to no layer: add its package to the layers of this test and the "
                             "drawing in docs/architecture.md")
    return RANK[first], UNIT.get(first, first)


def _problem(name, unit, rank, target):
    """Why the import of ``target`` by module ``name`` (of ``unit`` at ``rank``) breaks the layers, or None."""
    target_rank, target_unit = layer_of(target)
    if target_unit == unit:
        return None
    if unit == "patches" and target_rank < rank and target_unit != "core" and (name, target) not in PATCH_DIRECT:
        return f"imports {target} ({target_unit}): patches import only core (they fire core.signals)"
    if target_rank > rank:
        return f"climbs to {target} ({target_unit})"
    door = f"comfy_memx.{target_unit}.api"
    if unit == "cli" and target_unit in WINGS and target != door and (name, target) not in CLI_PARTS:
        return f"reaches past {door} to {target} (list it in CLI_PARTS, with why, if the command needs that part)"
    if unit == "bench":
        if target_unit in WINGS and target != door and (name, target) not in BENCH_PARTS:
            return f"reaches past {door} to {target} (list it in BENCH_PARTS if the bench measures that part)"
        return None
    if target_rank < rank:
        return None
    if unit not in WINGS or (unit, target_unit) not in ALLOWED:
        return f"goes sideways to {target} ({target_unit})"
    if target != door:
        return f"reaches past {door} to {target}"
    return None


def violations(sources, known=None):
    """``file:line: ...`` for every import among ``sources`` (``{module name: (path, source text)}``) that climbs
    against the layers, goes sideways unlisted in :data:`ALLOWED` or past a wing's door, or is a bench's reach into
    a wing that :data:`BENCH_PARTS` does not list."""
    known = set(sources) | set(known or ())
    found = []
    for name, (path, source) in sorted(sources.items()):
        rank, unit = layer_of(name)
        for line, target in imports_of(name, Path(path), source, known):
            problem = _problem(name, unit, rank, target)
            if problem is not None:
                found.append(f"{path}:{line}: {name} ({unit}) {problem}")
    return found


def problems_in(root=ROOT, installed=True):
    """Every layer violation of the tree under ``root`` (its ``comfy_memx/``, ``patches/`` and ``bench/``)."""
    files = module_files(root, installed)
    found = []
    for name, paths in files.items():
        for path in paths:
            found += violations({name: (path, path.read_text(encoding="utf-8"))}, known=files)
    return found


def test_no_import_climbs_against_the_layers_or_goes_sideways_unlisted():
    files = module_files()
    assert {"comfy_memx.core.state", "comfy_memx.patches.model_management", "comfy_memx.sharing.idle",
            "comfy_memx.routekit.replies", "bench.features"} <= set(files)
    assert problems_in() == []


def test_every_allowed_edge_is_still_used():
    files = module_files()
    used = set()
    for name, paths in files.items():
        for path in paths:
            unit = layer_of(name)[1]
            for _line, target in imports_of(name, path, path.read_text(encoding="utf-8"), set(files)):
                used.add((unit, layer_of(target)[1]))
                used.add((name, target))
    assert set(ALLOWED) - used == set(), "an allowed edge no module takes any more: drop it from ALLOWED"
    assert set(BENCH_PARTS) - used == set(), "a bench no longer imports a part it lists: drop it from BENCH_PARTS"
    assert set(CLI_PARTS) - used == set(), "a command no longer imports a part it lists: drop it from CLI_PARTS"


def test_a_command_that_reaches_past_a_wings_door_is_caught():
    """The command line uses the wings through their doors: a new reach into a wing's inside fails until it is
    listed in CLI_PARTS (and the door itself, a listed part and core always pass)."""
    planted = {"comfy_memx.cli.newcmd": ("comfy_memx/cli/newcmd.py",
                                         "from comfy_memx.leaks import watch\nfrom comfy_memx.leaks import api\n"
                                         "from comfy_memx.core import state\n"),
               "comfy_memx.cli.demo": ("comfy_memx/cli/demo.py", "from comfy_memx.ledger.causes import cause_label\n")}
    known = {"comfy_memx.leaks.watch", "comfy_memx.leaks.api", "comfy_memx.core.state", "comfy_memx.ledger.causes"}
    assert violations(planted, known) == ["comfy_memx/cli/newcmd.py:1: comfy_memx.cli.newcmd (cli) reaches past "
                                          "comfy_memx.leaks.api to comfy_memx.leaks.watch (list it in CLI_PARTS, "
                                          "with why, if the command needs that part)"]


KNOWN = {"comfy_memx.core", "comfy_memx.core.state", "comfy_memx.ledger", "comfy_memx.ledger.records",
         "comfy_memx.ledger.api", "comfy_memx.pins", "comfy_memx.pins.cap", "comfy_memx.pins.api",
         "comfy_memx.sharing", "comfy_memx.sharing.handoff", "comfy_memx.surface", "comfy_memx.surface.freeing",
         "comfy_memx.surface.routes", "comfy_memx.routekit", "comfy_memx.routekit.replies", "comfy_memx.cli",
         "comfy_memx.cli.launcher", "comfy_memx.patches", "comfy_memx.patches.server", "comfy_memx.leaks",
         "comfy_memx.leaks.watch", "comfy_memx.leaks.api", "bench", "bench.common"}


def test_a_planted_upward_import_fails_naming_its_file_and_line():
    source = '"""Planted."""\n\nimport os\n\n\ndef late():\n    from comfy_memx.ledger import records\n'
    assert violations({"comfy_memx.core.planted": ("comfy_memx/core/planted.py", source)}, KNOWN) == [
        "comfy_memx/core/planted.py:7: comfy_memx.core.planted (core) climbs to comfy_memx.ledger.records (ledger)"]


def test_planted_climbs_from_a_wing_the_kit_and_the_patches_fail_too():
    assert violations({"comfy_memx.pins.planted": ("p.py", "import comfy_memx.patches.server\n")}, KNOWN) == [
        "p.py:1: comfy_memx.pins.planted (pins) climbs to comfy_memx.patches.server (patches)"]
    assert violations({"comfy_memx.patches.planted": ("q.py", "from ..cli import launcher\n")}, KNOWN) == [
        "q.py:1: comfy_memx.patches.planted (patches) goes sideways to comfy_memx.cli.launcher (cli)"]
    assert violations({"comfy_memx.routekit.planted": ("k.py", "from comfy_memx.surface import routes\n")},
                      KNOWN) == ["k.py:1: comfy_memx.routekit.planted (routekit) climbs to comfy_memx.surface.routes "
                                 "(surface)"]
    assert violations({"comfy_memx.core.planted": ("c.py", "from comfy_memx.routekit import replies\n")},
                      KNOWN) == ["c.py:1: comfy_memx.core.planted (core) climbs to comfy_memx.routekit.replies "
                                 "(routekit)"]


def test_a_planted_sideways_import_between_wings_fails_unless_listed_and_through_the_door():
    unlisted = {"comfy_memx.sharing.planted": ("s.py", "from comfy_memx.surface import routes\n")}
    assert violations(unlisted, KNOWN) == [
        "s.py:1: comfy_memx.sharing.planted (sharing) goes sideways to comfy_memx.surface.routes (surface)"]
    back = {"comfy_memx.surface.planted": ("t.py", "from comfy_memx.sharing.handoff import give\n")}
    assert violations(back, KNOWN) == [
        "t.py:1: comfy_memx.surface.planted (surface) goes sideways to comfy_memx.sharing.handoff (sharing)"]
    past = {"comfy_memx.surface.planted": ("u.py", "from comfy_memx.leaks import watch\n")}
    assert violations(past, KNOWN) == [
        "u.py:1: comfy_memx.surface.planted (surface) reaches past comfy_memx.leaks.api to comfy_memx.leaks.watch"]
    listed = {"comfy_memx.surface.planted": ("v.py", "from comfy_memx.leaks import api as leaks\n"
                                                     "from comfy_memx.routekit.replies import answer\n")}
    assert violations(listed, KNOWN) == []


def test_imports_down_and_within_a_unit_pass():
    sources = {"comfy_memx.patches.planted": ("a.py", "from comfy_memx.core import signals\nimport comfy_memx.core.state\n"),
               "comfy_memx.ledger.planted": ("b.py", "from . import records\nfrom comfy_memx.core.state import STATE\n"),
               "comfy_memx.__main__": ("c.py", "from comfy_memx.cli.launcher import main\n"),
               "comfy_memx.sharing.planted2": ("d.py", "from comfy_memx.routekit import replies\n")}
    assert violations(sources, KNOWN) == []


def test_imports_by_call_with_a_constant_name_are_read():
    cases = [
        ("import importlib\nimportlib.import_module('comfy_memx.ledger.records')\n", "comfy_memx.ledger.records"),
        ("from importlib import import_module as load\nload('comfy_memx.pins.cap')\n", "comfy_memx.pins.cap"),
        ("import builtins\nbuiltins.__import__('comfy_memx.leaks.watch')\n", "comfy_memx.leaks.watch"),
        ("\n__import__('comfy_memx.leaks.watch', fromlist=['search_now'])\n", "comfy_memx.leaks.watch"),
        ("import sys\nsys.modules['comfy_memx.surface.freeing']\n", "comfy_memx.surface.freeing"),
        ("import sys as system\nsystem.modules.get('comfy_memx.cli.launcher')\n", "comfy_memx.cli.launcher"),
        ("from sys import modules\nmodules.get('comfy_memx.sharing.handoff')\n", "comfy_memx.sharing.handoff"),
        ("import importlib\nimportlib.import_module('.records', 'comfy_memx.ledger')\n", "comfy_memx.ledger.records"),
        ("import importlib\nimportlib.import_module('..records', package=__package__)\n",
         "comfy_memx.ledger.records"),
    ]
    for source, target in cases:
        assert imports_of("comfy_memx.ledger.x.planted", Path("p.py"), source, KNOWN) == [(2, target)], source
    lookup = "import sys\nsys.modules['comfy_memx.surface.freeing']\nsys.modules.get('comfy_memx.pins.cap')\n"
    assert imports_of("comfy_memx.core.planted", Path("p.py"), lookup, KNOWN, lookups=False) == []
    not_constant = "import importlib, sys\nname = 'comfy_memx.pins.cap'\nimportlib.import_module(name)\nsys.modules[name]\n"
    assert imports_of("comfy_memx.core.planted", Path("p.py"), not_constant, KNOWN) == []
    other = "import sys\nsys.modules.get('comfy.model_management')\nsys.modules['torch']\n"
    assert imports_of("comfy_memx.core.planted", Path("p.py"), other, KNOWN) == []


def test_the_benches_use_the_wings_through_their_doors_or_a_listed_part():
    inside = {"bench.planted": ("b.py", "from comfy_memx.pins.cap import host_cap\n")}
    assert violations(inside, KNOWN) == [
        "b.py:1: bench.planted (bench) reaches past comfy_memx.pins.api to comfy_memx.pins.cap (list it in "
        "BENCH_PARTS if the bench measures that part)"]
    doors = {"bench.planted": ("c.py", "from comfy_memx.pins import api\nfrom comfy_memx.core import state\n"
                                       "from comfy_memx.patches import server\nfrom bench import common\n")}
    assert violations(doors, KNOWN) == []
    climb = {"comfy_memx.cli.planted": ("d.py", "from bench import common\n")}
    assert violations(climb, KNOWN) == ["d.py:1: comfy_memx.cli.planted (cli) climbs to bench.common (bench)"]


def test_a_module_outside_every_layer_is_named():
    try:
        violations({"comfy_memx.newwing.x": ("n.py", "import os\n")}, KNOWN)
    except AssertionError as exc:
        assert "comfy_memx.newwing.x belongs to no layer" in str(exc)
    else:
        raise AssertionError("a module of an unknown package passed")


# one planted module per kind of violation: (file under the scratch copy, source, what the guard must report)
PLANTED = [
    ("comfy_memx/core/planted_importlib.py", "import importlib\n\n\ndef late():\n"
     "    return importlib.import_module('comfy_memx.ledger.records')\n",
     "5: comfy_memx.core.planted_importlib (core) climbs to comfy_memx.ledger.records (ledger)"),
    ("patches/planted_dunder.py", "def late():\n    return __import__('comfy_memx.cli.launcher')\n",
     "2: comfy_memx.patches.planted_dunder (patches) goes sideways to comfy_memx.cli.launcher (cli)"),
    ("comfy_memx/sharing/planted_modules.py", "import sys\n\nROUTES = sys.modules['comfy_memx.surface.routes']\n",
     "3: comfy_memx.sharing.planted_modules (sharing) goes sideways to comfy_memx.surface.routes (surface)"),
    ("comfy_memx/surface/planted_get.py", "import sys\n\nWATCH = sys.modules.get('comfy_memx.leaks.watch')\n",
     "3: comfy_memx.surface.planted_get (surface) reaches past comfy_memx.leaks.api to comfy_memx.leaks.watch"),
    ("comfy_memx/routekit/planted_climb.py", "from comfy_memx.surface import readmodel\n",
     "1: comfy_memx.routekit.planted_climb (routekit) climbs to comfy_memx.surface.readmodel (surface)"),
    ("bench/planted_inside.py", "from importlib import import_module\n\nEVICTION = "
     "import_module('comfy_memx.pins.eviction')\n",
     "3: bench.planted_inside (bench) reaches past comfy_memx.pins.api to comfy_memx.pins.eviction (list it in "
     "BENCH_PARTS if the bench measures that part)"),
    ("comfy_memx/cli/planted_bench.py", "def late():\n    from bench import common\n",
     "2: comfy_memx.cli.planted_bench (cli) climbs to bench.common (bench)"),
]


def test_the_guard_reports_every_kind_of_violation_planted_in_a_scratch_copy(tmp_path):
    for folder in ("comfy_memx", "patches", "bench"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert problems_in(tmp_path, installed=False) == []      # the copy is clean before anything is planted
    for relative, source, _report in PLANTED:
        (tmp_path / relative).write_text(source, encoding="utf-8")
    assert sorted(problems_in(tmp_path, installed=False)) == sorted(
        f"{tmp_path / relative}:{report}" for relative, _source, report in PLANTED)


def test_the_patches_call_each_wing_through_its_front_only():
    files = module_files()
    reached = []
    for name, paths in files.items():
        if not name.startswith("comfy_memx.patches"):
            continue
        for path in paths:
            for line, target in imports_of(name, path, path.read_text(encoding="utf-8"), set(files)):
                rank, unit = layer_of(target)
                if unit in WINGS and target != f"comfy_memx.{unit}.api":
                    reached.append(f"{path}:{line}: {name} imports {target}, not comfy_memx.{unit}.api")
    assert reached == []


def test_the_package_import_graph_has_no_circle():
    files = module_files()
    graph = {name: {target for path in paths for _line, target in imports_of(name, path, path.read_text(
        encoding="utf-8"), set(files), lookups=False) if target != name} for name, paths in files.items()}
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
