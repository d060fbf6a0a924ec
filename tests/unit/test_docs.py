"""The docs tell the truth about the code: the configuration reference is the generator's output, and every file path,
``path:name``, dotted ``comfy_memx.<x>.<y>`` name and page link written in README.md, docs/*.md or a docstring of
comfy_memx/, patches/, bench/ or tests/ names something that exists; every pointer to a page's section (``(README,
Security)``-style, in a page, a docstring or a message) names a section that exists; the fields docs/operations.md
names for ``/memx/status``, ``/memx/releases``, ``/memx/timeline`` and the ``release`` event are the ones they have.

A path here is one that starts with ``comfy_memx/``, ``patches/``, ``tests/``, ``bench/``, ``docs/`` or ``.ci/``; a
path followed by ``<``, ``{`` or ``*``, or holding ``...``, is a pattern (``tests/real/<file>``), not a file, and is
not checked.
"""

import ast
import re
from functools import lru_cache
from pathlib import Path

from comfy_memx.cli import config_reference

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_FOLDERS = ("comfy_memx", "patches", "bench", "tests")
PATH = re.compile(r"(?<![\w./$-])((?:comfy_memx|patches|tests|bench|docs|\.ci)/[\w./-]*[\w/])(?::(\w+))?(?![<{*\w])")
DOTTED = re.compile(r"(?<![\w./-])((?:comfy_memx|bench)(?:\.\w+)+)(?::(\w+))?(?![<{*\w])")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MAX_README_LINES = 250
FILE_SUFFIXES = {"yml", "yaml", "json", "jsonl", "md", "txt", "png", "dot"}  # comfy_memx.yml: a file one writes


def test_configuration_reference_is_the_generators_output():
    checked_in = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert checked_in == config_reference.render(), (
        f"docs/configuration.md differs from the settings table; regenerate it: {config_reference.REGENERATE}")


def test_readme_is_short_and_keeps_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= MAX_README_LINES
    assert "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest -q tests\n" in readme
    assert "pip install torch==2.13.0 && pip install . && python -m comfy_memx demo\n" in readme


def docstrings(path):
    """The docstrings of the module, its classes and functions in ``path``, with their line numbers."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "lineno", 1), text


def texts():
    """``(where, text)`` of every page and every docstring that the path check reads."""
    for page in PAGES:
        yield page.relative_to(ROOT).as_posix(), page.read_text(encoding="utf-8")
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                for line, text in docstrings(path):
                    yield f"{path.relative_to(ROOT).as_posix()}:{line}", text


def file_of(path):
    """The file or folder that ``path`` (as written in the docs) names, or None."""
    candidates = [ROOT / path]
    if path.startswith("comfy_memx/patches"):  # the patch modules are packaged as comfy_memx.patches
        candidates.append(ROOT / path.replace("comfy_memx/patches", "patches", 1))
    return next((candidate for candidate in candidates if candidate.exists()), None)


@lru_cache(maxsize=None)
def defined_names(path):
    """Names a module defines at its top level, and ``Class.member`` for its classes' members (instance attributes
    assigned as ``self.x`` included)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        names.update(_bound(node))
        if isinstance(node, ast.ClassDef):
            for member in ast.walk(node):
                names.update(f"{node.name}.{name}" for name in _bound(member))
                if isinstance(member, ast.Attribute) and isinstance(member.ctx, ast.Store):
                    names.add(f"{node.name}.{member.attr}")
    return names


def _bound(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, (ast.If, ast.Try)):
        return {name for child in ast.iter_child_nodes(node) for name in _bound(child)}
    return set()


def module_file(parts):
    """The source file of the dotted module ``parts`` (a package's ``__init__.py``), or None."""
    if parts[:2] == ["comfy_memx", "patches"]:
        parts = ["patches", *parts[2:]]
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    if base.is_dir():
        return base
    return None


def dotted_exists(dotted):
    """True when the longest module prefix of ``dotted`` exists and the rest is a name it defines (``Class.member``
    checked one level deep)."""
    parts = dotted.split(".")
    if (ROOT / dotted).is_file():  # a file name such as comfy_memx.pth
        return True
    for cut in range(len(parts), 0, -1):
        found = module_file(parts[:cut])
        if found is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        if found.is_dir():
            return False
        names = defined_names(str(found))
        return rest[0] in names and (len(rest) == 1 or ".".join(rest[:2]) in names or rest[0] not in
                                     {n.split(".")[0] for n in names if "." in n})
    return False


def is_pattern(text, end):
    """True when the word that a match ending at ``end`` belongs to goes on into a placeholder (``bench-<time>``)."""
    rest = re.match(r"[^\s`'\"()\[\],;]*", text[end:]).group(0)
    return any(mark in rest for mark in "<{*")


def missing_paths(where, text):
    """What the paths and ``path:name`` mentions of ``text`` name that does not exist (``name``: defined at the top
    level of that file, or a member of one of its classes, ``self.name`` included)."""
    for match in PATH.finditer(text):
        path, name = match.group(1), match.group(2)
        if is_pattern(text, match.end()) or "..." in path:
            continue
        found = file_of(path.rstrip("/") if path.endswith("/") else path)
        if found is None:
            yield f"{where}: {path} does not exist"
        elif name and found.suffix == ".py" and name not in {n.rsplit(".", 1)[-1] for n in defined_names(str(found))}:
            yield f"{where}: {path} defines no {name}"


def missing_names(where, text):
    """What the dotted ``comfy_memx.<x>.<y>`` (and ``bench.<x>``) names of ``text`` name that does not exist."""
    for match in DOTTED.finditer(text):
        dotted, name = match.group(1).rstrip("."), match.group(2)
        if is_pattern(text, match.end()) or dotted.rsplit(".", 1)[-1] in FILE_SUFFIXES:
            continue
        if not dotted_exists(dotted if not name else f"{dotted}.{name}"):
            yield f"{where}: {match.group(0)} does not exist"


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page):
    """The anchors of ``page``'s headings (outside code blocks)."""
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def missing_links(page):
    """Links of ``page`` to a local page or anchor that does not exist."""
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            yield f"{page.name}: link to {target}: no such file"
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            yield f"{page.name}: link to {target}: no such heading"


def test_every_path_and_name_in_the_docs_and_docstrings_exists():
    missing = [problem for where, text in texts()
               for problem in (*missing_paths(where, text), *missing_names(where, text))]
    assert missing == [], "\n".join(missing)


def test_every_link_between_the_pages_leads_somewhere():
    missing = [problem for page in PAGES for problem in missing_links(page)]
    assert missing == [], "\n".join(missing)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The checks can fail: a moved file, a renamed function, a misspelt module and a dead anchor are all reported."""
    text = ("`comfy_memx/core/nowhere.py`, `comfy_memx/core/config.py:no_such_name`, "
            "``comfy_memx.core.config.no_such_name``, `comfy_memx.no_such_module`, `tests/real/<file>`, "
            "`bench/results/bench-<time>.json`")
    problems = [*missing_paths("planted", text), *missing_names("planted", text)]
    assert len(problems) == 4, problems
    assert not [*missing_paths("ok", "`comfy_memx/core/config.py:parse` `tests/unit/`"),
                *missing_names("ok", "``comfy_memx.core.config.Setting.flag`` `comfy_memx.pth`")]
    page = tmp_path / "page.md"
    page.write_text("# A heading\n\n[here](#a-heading) [there](#gone) [file](nowhere.md)\n", encoding="utf-8")
    assert len(list(missing_links(page))) == 2


ISSUE_REFERENCE = re.compile(r"\b(?:issues?|PRs?|pull requests?|tickets?)\s*#?\d+|(?<![\w&%#/'\"=`-])#[1-9]\d*\b",
                             re.IGNORECASE)
CODE_FOLDERS = ("comfy_memx", "patches", "tests", "bench", ".ci")
TEXT_SUFFIXES = {".py", ".yml", ".yaml", ".toml", ".txt", ".md", ".sh", ".cfg", ""}  # not .js/.html: CSS colours


def issue_references(text):
    """Mentions of an issue or pull request by its number (the word, then the number; or a hash sign and the number),
    which mean nothing to a reader of the repository."""
    return [match.group(0) for match in ISSUE_REFERENCE.finditer(text)]


def test_no_issue_numbers_in_the_code_tests_bench_or_ci():
    found = []
    for folder in CODE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
                for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                    found += [f"{path.relative_to(ROOT)}:{number}: {ref}" for ref in issue_references(line)]
    assert found == [], "say what the code is for instead of which issue asked for it:\n" + "\n".join(found)


def test_issue_references_are_recognised():
    planted = "(iss" "ue 21, fleets) Iss" "ue 18: see #" "12 and P" "R 4"   # split: this file is scanned too
    assert issue_references(planted) == ["iss" "ue 21", "Iss" "ue 18", "#" "12", "P" "R 4"]
    assert issue_references("SDXL#1, MemxTinyNet%231, ``#0``, # 1. a comment, issues with it, prs") == []


# -- pointers to a page's section, and the fields the routes answer --------------------------------------------------

#: "(README, Security)", '(README, "Threads and locks")', '(docs/architecture.md, "Threads and locks")' and "the
#: README's Development section": the page must exist and have a heading of that name
POINTER = re.compile(r"\((README|docs/[\w-]+\.md)(?:\.md)?,\s*\"?([^\")]+?)\"?\)|(README)'s ([A-Z][\w ]*?) section")
POINTER_FOLDERS = ("comfy_memx", "patches", "bench", "tests", ".ci")


def pointer_texts():
    """``(where, text)`` of every page and every source file (not only docstrings: a message a user reads, such as
    a receipt's note, points at a section too)."""
    for page in PAGES:
        yield page.relative_to(ROOT).as_posix(), page.read_text(encoding="utf-8")
    for folder in POINTER_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".js", ".sh", ".yml", "") and path.is_file() and "__pycache__" not in path.parts:
                yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8", errors="replace")


def broken_pointers(where, text):
    """The pointers of ``text`` to a page's section that name no page or no heading of that page."""
    for match in POINTER.finditer(text):
        page, section = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        target = ROOT / ("README.md" if page == "README" else page)
        if not target.is_file():
            yield f"{where}: {match.group(0)}: no page {page}"
        elif slug(section) not in anchors(target):
            yield f"{where}: {match.group(0)}: {target.name} has no section {section!r}"


def test_every_pointer_to_a_section_names_one_that_exists():
    broken = [problem for where, text in pointer_texts() if where != "tests/unit/test_docs.py"
              for problem in broken_pointers(where, text)]
    assert broken == [], "\n".join(broken)


def test_the_pointer_check_catches_a_moved_section():
    planted = ("(READ" "ME, Security) (READ" "ME, \"Threads and locks\") (docs/architecture.md, \"Threads and locks\") "
               "the READ" "ME's Development section (docs/security.md, Security) (docs/nowhere.md, X)")
    found = list(broken_pointers("planted", planted))
    assert len(found) == 4 and all("planted: " in line for line in found), found


def route_cell(route):
    """The answer cell of ``route``'s row in docs/operations.md's route table."""
    for line in (ROOT / "docs" / "operations.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"| `{route}"):
            return line.split(" | ", 1)[1].rstrip(" |")
    raise AssertionError(f"docs/operations.md has no row for {route}")


def event_cell(event):
    """The fields cell of ``event``'s row in docs/operations.md's events table."""
    for line in (ROOT / "docs" / "operations.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"| `{event}` | "):
            return line.split(" | ", 1)[1].rstrip(" |")
    raise AssertionError(f"docs/operations.md's events table has no row for {event}")


def documented_fields(cell):
    """``(top, nested)``: the backticked names of a docs cell's first clause (up to a ``.`` or ``;`` outside any
    parentheses) that stand outside parentheses (the answer's own fields), and every backticked name inside them
    (its parts' fields, and values)."""
    top, nested, depth, at = [], set(), 0, 0
    while at < len(cell):
        char = cell[at]
        if char == "`":
            end = cell.index("`", at + 1)
            (top.append if depth == 0 else nested.add)(cell[at + 1:end])
            at = end + 1
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and (cell.startswith(". ", at) or cell.startswith("; ", at)):
            break
        at += 1
    return top, nested


def answers_on_the_stand_in():
    """What ``GET /memx/status``, ``GET /memx/releases`` and ``GET /memx/timeline`` answer, and a timeline entry of
    each kind, on the stand-in with comfy_memx active (a release receipt of each outcome that cut something)."""
    import asyncio
    import json as json_module
    from comfy_memx.surface import routes, timeline
    from memx_helpers import memx_on
    with memx_on("0.27.0"):
        status = json_module.loads(asyncio.run(routes.Handlers(None).status(None)).body)
        releases = json_module.loads(routes._releases_body())
        ring = timeline.Timeline()
        owner = {"package": "p", "class_type": "C", "node_id": "1"}
        for event in ({"event": "load", "model_id": "M#1", "bytes": 1, "loaded_bytes": 1, "owner": owner},
                      {"event": "unload", "model_id": "M#1", "bytes": 1, "reason": "oom", "requested_by": owner},
                      {"event": "leak", "model_id": "M#1", "stage": "rooted", "holder_package": "p"},
                      {"event": "release", "model_id": "M#1", "outcome": "released", "died": True, "bytes": 1},
                      {"event": "free", "status": "done"}):
            ring.observe({"time": 1.0, "model": "M", **event})
        view = ring.view()
    return status, releases, view


def test_the_route_fields_named_in_the_docs_are_the_fields_the_routes_answer():
    status, releases, view = answers_on_the_stand_in()
    for route, answer in (("GET /memx/status", status), ("GET /memx/releases", releases),
                          ("GET /memx/timeline", view)):
        top, nested = documented_fields(route_cell(route))
        assert set(top) == set(answer), (route, set(top) ^ set(answer))
        for field, value in answer.items():   # the fields of the answer's parts are named in the cell too
            for part in (value if isinstance(value, list) else [value]):
                if isinstance(part, dict) and field not in ("sites",):
                    assert set(part) <= nested, (route, field, set(part) - nested)
    from comfy_memx.nodepack import inactive_status
    inactive = inactive_status(ValueError("x"))   # what the node pack answers while a bad setting keeps it off
    said = set(re.findall(r"`(\w+)`", route_cell("GET /memx/status").split("While a bad setting", 1)[1]))
    assert set(inactive) <= said, set(inactive) - said


def test_the_release_events_fields_are_named_in_the_events_table():
    from comfy_memx.leaks.release import engine
    record = type("Record", (), {"model": "M", "model_id": "M#1", "model_bytes": 1})()
    receipt = set(engine._blank(record, "auto")) - {"time"}   # every event has event, time and pid
    top, nested = documented_fields(event_cell("release"))
    assert receipt | {"models", "released_bytes"} == set(top), receipt ^ set(top)
    assert {"before", "after", "trim_returned_bytes", "rss", "vram", "pinned"} <= nested


def test_documented_fields_reads_the_first_sentence_outside_parentheses():
    top, nested = documented_fields("JSON: `a` (`x`, `y` (`z`). `w`; `v`), `b`. Then `c`.")
    assert top == ["a", "b"] and nested == {"x", "y", "z", "w", "v"}
    assert documented_fields("`a`, `b`; 400 for a bad `c`")[0] == ["a", "b"]


def test_the_changelog_opens_with_this_version_and_its_links_lead_somewhere():
    """The version moves with what ships: the newest section of CHANGELOG.md is the version pip and the startup
    line show."""
    from comfy_memx import __version__
    changelog = ROOT / "CHANGELOG.md"
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\s*$", changelog.read_text(encoding="utf-8"), re.MULTILINE)
    assert versions and versions[0] == __version__, (versions[:1], __version__)
    assert list(missing_links(changelog)) == []
