"""Exposed surface: another local user cannot make comfy_memx write anywhere but its own files.

The test runs as root and creates a second user, the attacker (``useradd``, a unique name, removed again whatever
happens); it skips when it is not root or there is no ``useradd``/``userdel``.  The victim is this process (root),
the entry points are the real ones: the launcher and ``COMFY_MEMX=1`` for the events file (subprocesses), strict
mode on the stand-in ComfyUI for leak graphs, ``python -m comfy_memx report --png`` for report images.

Where the attacker plants: in a sticky world-writable folder (a fresh ``mkdtemp`` made 1777, as /tmp is), and, so
that the kernel's own ``fs.protected_symlinks`` never decides the outcome (it is 0 on many hosts and containers,
and cannot be changed on a shared machine), mostly in a folder of the attacker's inside it: the kernel protects
only links that lie in a sticky folder, so a link there is followed by every process whatever the sysctl says, and
comfy_memx's own checks are what refuses it.  The victim's files (a shell rc file and a folder) lie in a root-only
folder the attacker cannot read; each attack must leave them as they were (content, mtime, listing).
"""

import contextlib
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from comfy_memx.core.events import EventLog
from memx_helpers import memx_on
from test_strict_leaks import import_pack, leak_into, write_pack

RC_TEXT = "# the victim's shell rc file\nexport PS1='$ '\n"


class Attacker:
    """The second user: ``name``, ``uid``, ``gid``; :meth:`run` runs a shell command as that user."""

    def __init__(self, name):
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid

    def run(self, script):
        """Run ``script`` with /bin/sh as the attacker (no group of root's), failing the test when it fails."""
        done = subprocess.run(["/bin/sh", "-c", script], user=self.uid, group=self.gid, extra_groups=[], cwd="/",
                              env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (script, done.stderr)


@pytest.fixture
def attacker():
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root: it creates a second user to play the attacker")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if not useradd or not userdel:
        pytest.skip("needs useradd and userdel to create and remove the attacker's user")
    name = "memxatk" + secrets.token_hex(4)
    subprocess.run([useradd, "--no-create-home", "--no-user-group", "--shell", "/bin/sh", name], check=True,
                   capture_output=True, timeout=60)
    try:
        yield Attacker(name)
    finally:
        subprocess.run([userdel, name], check=False, capture_output=True, timeout=60)


@pytest.fixture
def place(attacker):
    """``sticky`` (a fresh 1777 folder, as /tmp), ``lair`` (a folder of the attacker's in it, writable by all:
    no kernel protection applies to links there), ``victim`` (a root-only folder with ``rc`` and ``dir``)."""
    sticky = tempfile.mkdtemp(prefix="memx-sticky-")
    victim = tempfile.mkdtemp(prefix="memx-victim-")   # 0700, root's
    try:
        os.chmod(sticky, 0o1777)
        lair = os.path.join(sticky, "lair")
        attacker.run(f"mkdir {lair} && chmod 777 {lair}")
        rc = os.path.join(victim, "rc")
        with open(rc, "w", encoding="utf-8") as f:
            f.write(RC_TEXT)
        os.chmod(rc, 0o600)
        os.mkdir(os.path.join(victim, "dir"), 0o700)
        yield {"sticky": sticky, "lair": lair, "victim": victim, "rc": rc, "dir": os.path.join(victim, "dir")}
    finally:
        shutil.rmtree(sticky, ignore_errors=True)
        shutil.rmtree(victim, ignore_errors=True)


def snapshot(place):
    """What must not change: the rc file's bytes and mtime, and what the victim's folders hold."""
    info = os.stat(place["rc"])
    with open(place["rc"], "rb") as f:
        return {"rc": f.read(), "mtime": info.st_mtime_ns, "size": info.st_size,
                "victim": sorted(os.listdir(place["victim"])), "dir": sorted(os.listdir(place["dir"]))}


def comfyui_main(folder):
    main = os.path.join(folder, "main.py")
    with open(main, "w", encoding="utf-8") as f:
        f.write("print('ComfyUI ran')\n")
    return main


def start(args, env=None):
    """Start ``python args`` the way a user does, with no COMFY_MEMX_* of the test's own."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
    full.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full, timeout=120,
                          cwd=tempfile.gettempdir())


def plant_events(attacker, place, kind):
    """The attacker's preparation for one events attack; returns the path the victim is pointed at and the words
    its refusal must say."""
    lair, sticky = place["lair"], place["sticky"]
    if kind == "link":            # a link at the events path to a root-only file (its rc file)
        path = os.path.join(lair, "memx.jsonl")
        attacker.run(f"ln -s {place['rc']} {path}")
        return path, "is a symbolic link"
    if kind == "open_file":       # a 0666 file pre-created by the attacker, to read what root writes there
        path = os.path.join(sticky, "memx.jsonl")
        attacker.run(f"umask 0 && : > {path} && chmod 666 {path}")
        return path, f"belongs to uid {attacker.uid}"
    path = os.path.join(sticky, "logs", "memx.jsonl")   # "linked_folder": the folder is the attacker's link
    attacker.run(f"ln -s {place['dir']} {os.path.join(sticky, 'logs')}")
    return path, "reached through the symbolic link"


@pytest.mark.parametrize("kind", ["link", "open_file", "linked_folder"])
def test_an_events_file_planted_by_another_user_is_refused_at_start_and_when_written(attacker, place, kind, tmp_path,
                                                                                     caplog):
    path, words = plant_events(attacker, place, kind)
    before = snapshot(place)
    planted = os.lstat(path) if os.path.lexists(path) else None
    main = comfyui_main(str(tmp_path))

    launched = start(["-m", "comfy_memx", "--events", path, main])
    assert launched.returncode == 2, launched.stderr
    assert "--events" in launched.stderr and "COMFY_MEMX_EVENTS" in launched.stderr and words in launched.stderr
    assert "ComfyUI ran" not in launched.stdout

    hooked = start([main], {"COMFY_MEMX": "1", "COMFY_MEMX_EVENTS": path})   # ComfyUI runs, unpatched
    assert "ComfyUI ran" in hooked.stdout, hooked.stderr
    assert "COMFY_MEMX_EVENTS" in hooked.stderr and words in hooked.stderr and "--events" not in hooked.stderr

    log = EventLog(path)           # planted after start: the write itself refuses, once, and ComfyUI runs on
    for _ in range(3):
        log.emit("free", origin={"client": "198.51.100.7"}, cache_key="$(touch /tmp/owned)")
    log.close()
    assert not log.stats()["writing"]
    refusals = [r.getMessage() for r in caplog.records if "cannot write events" in r.getMessage()]
    assert len(refusals) == 1 and words in refusals[0], refusals

    assert snapshot(place) == before
    if planted is not None:       # the attacker's file got nothing: no line, no client address
        after = os.lstat(path)
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (planted.st_ino, planted.st_size,
                                                                    planted.st_mtime_ns)


def fake_dot(folder):
    """A ``dot`` on PATH that writes "PNG " and the graph it reads on stdin to stdout."""
    tools = os.path.join(folder, "bin")
    os.mkdir(tools)
    with open(os.path.join(tools, "dot"), "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\nprintf 'PNG '; cat\n")
    os.chmod(os.path.join(tools, "dot"), 0o755)
    return tools


@contextlib.contextmanager
def strict_leaks(tmp_path, folder):
    with memx_on("0.27.0", leak_mode="strict", leak_graph=folder, leak_budget=20) as mm:
        pack = import_pack(write_pack(tmp_path))
        try:
            yield lambda key: (leak_into(mm, pack, lambda model: pack.REGISTRY.__setitem__(key, model)),
                               mm.cleanup_models_gc())
        finally:
            pack.REGISTRY.clear()
            sys.modules.pop("holder_pack", None)


def test_leak_graphs_never_write_through_links_planted_at_the_names_they_used_to_have(attacker, place, tmp_path,
                                                                                     monkeypatch):
    lair = place["lair"]
    guessed = [f"BaseModel-{n}-{stage}-{os.getpid()}.{ext}" for n in (1, 2) for stage in ("rooted", "cycle")
               for ext in ("dot", "png")]
    attacker.run(" && ".join(f"ln -s {place['rc']} {os.path.join(lair, name)}" for name in guessed))
    before = snapshot(place)
    monkeypatch.setenv("PATH", fake_dot(str(tmp_path)) + os.pathsep + os.environ.get("PATH", ""))
    with strict_leaks(tmp_path, lair) as leak:
        leak("unet")
    assert snapshot(place) == before
    assert all(os.readlink(os.path.join(lair, name)) == place["rc"] for name in guessed)   # untouched
    written = sorted(set(os.listdir(lair)) - set(guessed))
    assert [re.sub("-[0-9a-f]{16}", "-<random>", name) for name in written] == [
        f"BaseModel-1-rooted-{os.getpid()}-<random>.dot", f"BaseModel-1-rooted-{os.getpid()}-<random>.png"]
    for name in written:
        info = os.lstat(os.path.join(lair, name))
        assert stat.S_ISREG(info.st_mode) and info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o600
    dot, png = (open(os.path.join(lair, name), encoding="utf-8").read() for name in written)
    assert png == "PNG " + dot and dot.startswith("digraph")


def test_a_leak_graph_folder_swapped_for_another_users_link_is_refused_and_logged_once(attacker, place, tmp_path,
                                                                                     caplog):
    graphs = os.path.join(place["lair"], "graphs")
    attacker.run(f"mkdir {graphs} && chmod 777 {graphs}")
    before = snapshot(place)
    caplog.set_level(logging.WARNING, logger="comfy_memx")
    with strict_leaks(tmp_path, graphs) as leak:
        attacker.run(f"mv {graphs} {graphs}.old && ln -s {place['dir']} {graphs}")   # after the start-up check
        leak("unet")
        leak("vae")
    refusals = [r.getMessage() for r in caplog.records if "cannot write the leak graph" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert "reached through the symbolic link" in refusals[0] and "COMFY_MEMX_LEAK_GRAPH" in refusals[0]
    assert snapshot(place) == before and os.listdir(graphs + ".old") == []


def test_a_leak_graph_folder_reached_through_another_users_link_is_refused_at_start(attacker, place, tmp_path):
    graphs = os.path.join(place["sticky"], "graphs")
    attacker.run(f"ln -s {place['dir']} {graphs}")
    launched = start(["-m", "comfy_memx", "--leak-graph", graphs, comfyui_main(str(tmp_path))])
    assert launched.returncode == 2, launched.stderr
    assert "--leak-graph" in launched.stderr and "reached through the symbolic link" in launched.stderr


@pytest.mark.parametrize("kind", ["link", "open_file"])
def test_report_refuses_an_image_path_another_user_planted(attacker, place, tmp_path, kind):
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"event": "load", "time": 1.0, "pid": 7, "model": "M", "model_id": "M#1",
                                  "bytes": 10, "loaded_bytes": 10, "seconds": 0.1, "owner": {"package": "core"}})
                      + "\n")
    if kind == "link":
        png, words = os.path.join(place["lair"], "timeline.png"), "is a symbolic link"
        attacker.run(f"ln -s {place['rc']} {png}")
    else:
        png, words = os.path.join(place["sticky"], "timeline.png"), f"belongs to uid {attacker.uid}"
        attacker.run(f"umask 0 && : > {png} && chmod 666 {png}")
    before, planted = snapshot(place), os.lstat(png)
    done = start(["-m", "comfy_memx", "report", str(events), "--png", png])
    assert done.returncode == 1, done.stderr
    assert "--png refused" in done.stderr and words in done.stderr and "per model" in done.stdout
    assert snapshot(place) == before
    after = os.lstat(png)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (planted.st_ino, planted.st_size, planted.st_mtime_ns)
