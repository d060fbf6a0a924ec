"""``core.private``: how every file comfy_memx writes is opened.  No link followed at the file, no link of another
user followed on the way to its folder, an existing file used only when ``fstat`` says it is this user's and not
writable by others (private, with one name, in a folder others can write), ``O_TRUNC`` only after that check, new
files 0600 with ``O_EXCL``, unguessable names never reopened; the events setting refused at start with the same
rules.  ``test_exposed_files.py`` plays the same attacks with a second user through the entry points."""

import os
import re
import stat

import pytest

from comfy_memx.core import config, private
from comfy_memx.core.errors import ConfigError
from comfy_memx.core.events import EventLog
from comfy_memx.core.private import Refused

OTHER_UID = 12345


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to make files and links owned by another uid")


@pytest.fixture
def sticky(tmp_path):
    """A folder others can write, as /tmp (1777)."""
    folder = tmp_path / "sticky"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    return folder


def victim(tmp_path, text="precious\n"):
    target = tmp_path / "victim"
    target.write_text(text)
    os.chmod(target, 0o600)
    return target, target.stat()


def unchanged(target, before, text="precious\n"):
    after = target.stat()
    return target.read_text() == text and (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_new_file_is_made_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        with private.create_private(tmp_path / "new.png", binary=True) as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.png").stat().st_mode) == 0o600


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_at_the_file_is_refused_even_this_users_own(tmp_path, dangling):
    target, before = victim(tmp_path)
    link = tmp_path / "events.jsonl"
    os.symlink(tmp_path / "nothing" if dangling else target, link)
    for opener in (lambda: private.open_private(link, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                   lambda: private.create_private(link)):
        with pytest.raises(Refused, match="is a symbolic link"):
            opener()
    assert unchanged(target, before) and not (tmp_path / "nothing").exists()


def test_an_existing_file_is_checked_before_it_is_truncated(tmp_path):
    path = tmp_path / "timeline.png"
    path.write_text("kept")
    os.chmod(path, 0o666)
    with pytest.raises(Refused, match=r"can be written by group or others \(mode 0666\)"):
        private.create_private(path)
    assert path.read_text() == "kept"
    os.chmod(path, 0o640)                           # this user's own, readable by a log shipper's group: used
    with private.create_private(path) as f:
        f.write("new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_another_users_file_is_refused(tmp_path):
    needs_root()
    path = tmp_path / "events.jsonl"
    path.write_text("")
    os.chown(path, OTHER_UID, OTHER_UID)
    os.chmod(path, 0o600)
    with pytest.raises(Refused, match=f"belongs to uid {OTHER_UID}"):
        private.open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    assert path.read_text() == ""


def test_in_a_folder_others_can_write_only_a_private_file_with_one_name_is_used(tmp_path, sticky):
    readable = sticky / "readable.jsonl"
    readable.write_text("")
    os.chmod(readable, 0o644)
    with pytest.raises(Refused, match="in a folder others can write and is not private"):
        private.open_private(readable, os.O_WRONLY | os.O_APPEND)
    target, before = victim(tmp_path)
    os.link(target, sticky / "linked.jsonl")         # a hard link to a file of this user, made in the shared folder
    with pytest.raises(Refused, match="has 2 names"):
        private.open_private(sticky / "linked.jsonl", os.O_WRONLY | os.O_APPEND)
    assert unchanged(target, before)
    own = sticky / "own.jsonl"
    os.close(private.open_private(own, os.O_WRONLY | os.O_CREAT))   # made here, 0600: used again
    os.close(private.open_private(own, os.O_WRONLY | os.O_APPEND))
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o755)
    (folder / "readable.jsonl").write_text("")
    os.chmod(folder / "readable.jsonl", 0o644)       # in a folder of this user's alone, 0644 is fine
    os.close(private.open_private(folder / "readable.jsonl", os.O_WRONLY | os.O_APPEND))


def test_a_folder_reached_through_this_users_links_is_fine_and_through_another_users_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "hop1")
    os.symlink("hop1", tmp_path / "hop2")            # relative, through another link
    os.close(private.open_private(tmp_path / "hop2" / "events.jsonl", os.O_WRONLY | os.O_CREAT))
    assert (real / "events.jsonl").exists()
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    with pytest.raises(Refused, match="too many symbolic links"):
        private.open_folder(tmp_path / "loop")
    needs_root()
    os.lchown(tmp_path / "hop1", OTHER_UID, OTHER_UID)
    with pytest.raises(Refused, match=f"reached through the symbolic link {tmp_path / 'hop1'} of uid {OTHER_UID}"):
        private.open_private(tmp_path / "hop2" / "other.jsonl", os.O_WRONLY | os.O_CREAT)
    assert not (real / "other.jsonl").exists()


def test_new_names_are_unguessable_and_created_only_new(tmp_path):
    first, second = private.unguessable("BaseModel-1-rooted-7"), private.unguessable("BaseModel-1-rooted-7")
    assert first != second and re.fullmatch(r"BaseModel-1-rooted-7-[0-9a-f]{16}", first)
    target, before = victim(tmp_path)
    os.symlink(target, tmp_path / "taken.dot")
    (tmp_path / "file.dot").write_text("x")
    with private.open_folder(tmp_path) as folder:
        for name in ("taken.dot", "file.dot"):
            with pytest.raises(Refused, match="already exists"):
                folder.create(name)
        with folder.create(first + ".dot") as f:
            f.write("digraph {}")
    assert unchanged(target, before) and (tmp_path / "file.dot").read_text() == "x"
    assert stat.S_IMODE((tmp_path / (first + ".dot")).stat().st_mode) == 0o600


def test_the_events_file_is_never_opened_again_by_name(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "cut sh')            # a partial last line, left by a crash
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    log = EventLog(str(path))
    log.emit("load", model="M")
    log.close()
    assert opened == [] and path.read_text().splitlines()[1].startswith('{"event":"load"')


def test_a_link_swapped_in_after_the_events_file_was_opened_is_refused(tmp_path, caplog):
    target, before = victim(tmp_path)
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path))
    log.emit("load", model="M")
    os.rename(path, tmp_path / "events.jsonl.1")     # rotated ...
    os.symlink(target, path)                         # ... and a link in its place
    log.emit("load", model="M")
    log.emit("load", model="M")
    assert not log.stats()["writing"] and unchanged(target, before)
    assert len([r for r in caplog.records if "is a symbolic link" in r.getMessage()]) == 1


@pytest.mark.parametrize("launcher", [True, False])
def test_the_events_setting_is_refused_at_start_naming_it(tmp_path, sticky, launcher):
    target, _ = victim(tmp_path)
    os.symlink(target, tmp_path / "link.jsonl")
    loose = sticky / "loose.jsonl"
    loose.write_text("")
    os.chmod(loose, 0o644)
    for path, words in ((tmp_path / "link.jsonl", "is a symbolic link"), (loose, "is not private")):
        with pytest.raises(ConfigError) as info:
            config.parse({"COMFY_MEMX_EVENTS": str(path)}, launcher=launcher)
        message = str(info.value)
        assert message.startswith("COMFY_MEMX_EVENTS=") and words in message
        assert ("--events" in message) == launcher
    assert config.parse({"COMFY_MEMX_EVENTS": str(sticky / "new.jsonl")}).events == str(sticky / "new.jsonl")
