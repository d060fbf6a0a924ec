"""The lock rule, audited: every lock of the package is listed, with its reason, in the table of docs/architecture.md.

The rule: no lock that a garbage-collector or weakref callback can take is held while Python may allocate (a
collection can run inside any allocation, and its callbacks run on that thread, inside whatever it holds).  The
deadlock tests live next to the code they guard (test_ledger, test_freeing, test_pinbudget); this one keeps the
audit complete: a new lock fails here until its row is written.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK_FACTORIES = {"Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore"}


def lock_sites():
    """``{"path:name"}`` of every lock the package creates (``threading.Lock()`` and friends), by assigned name."""
    found = set()
    for folder in (ROOT / "comfy_memx", ROOT / "patches"):
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts or "demo_world" in path.parts:
                continue
            relative = path.relative_to(ROOT).as_posix().replace("comfy_memx/patches/", "patches/")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                    continue
                func = node.value.func
                if isinstance(func, ast.Attribute) and func.attr in LOCK_FACTORIES:
                    target = node.targets[0]
                    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "?")
                    found.add(f"{relative}:{name}")
    return found


def test_every_lock_of_the_package_is_in_the_architecture_audit():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("## Threads and locks", 1)[1].split("\n## ", 1)[0]
    audited = set(re.findall(r"^\| `([\w/.]+\.py:\w+)`", section, flags=re.M))
    sites = lock_sites()
    assert len(sites) >= 7
    assert sites == audited
