"""Files comfy_memx writes belong to this user alone, and no other user of the host can make it write anywhere else.

The events file, leak graphs and ``report --png`` images are written through this module, and the host registries
(``core.hostshare``) check their files with :func:`check_file`.  Every rule is enforced on what was opened (a
descriptor), never on a name looked up again:

* The folder is reached one component at a time from ``/``, each opened relative to the one before without
  following a link (``openat`` with ``O_NOFOLLOW``); a symbolic link on the way is followed only when it belongs to
  this user or to root.  A link that another user planted (in /tmp, or in a folder of theirs that the path goes
  through) could otherwise send the file to anything this user may write, ``~/.bashrc`` included.
* The file is opened relative to that folder with ``O_NOFOLLOW``: a link in its place is refused.
* A new file is made with ``O_EXCL`` and set to 0600 with ``fchmod`` (a umask can only take bits away): the events
  file's ``free`` lines name callers' addresses, leak graphs and report timelines name packages and models.
* A file that already exists is opened without ``O_TRUNC``, checked with ``fstat``, and only then truncated when
  that was asked: it must be a regular file of this user that neither its group nor others may write (it keeps its
  mode: a 0640 log that a log shipper of its group reads is fine).  In a folder others can write (/tmp, a folder
  of another user, one writable by its group or by all) it must also be private (no access for group or others)
  and have a single name: there another user could have made it, or a hard link to a file of this user.
* Names nobody may guess (leak graphs: :func:`unguessable`) are created with ``O_EXCL`` only (:meth:`Folder.create`):
  never a file that already exists, never reopened by name.

Whatever is refused raises :class:`Refused`, an ``OSError`` whose message is the path and why.  Where there is no
``O_NOFOLLOW``, ``openat`` or uid (Windows) only ``O_EXCL`` and the regular-file check apply; files there are private
through the profile's ACLs.
"""

import errno
import os
import secrets
import stat

from comfy_memx.core.errors import MemxError

MODE = 0o600
MAX_LINKS = 40              # symbolic links followed on the way to one folder, as the kernel's own limit
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
BINARY = getattr(os, "O_BINARY", 0)
SAFE = bool(NOFOLLOW) and hasattr(os, "O_DIRECTORY") and hasattr(os, "geteuid") and \
    {os.open, os.stat, os.readlink} <= os.supports_dir_fd
DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | CLOEXEC
# an existing file is opened without blocking (a FIFO without reader) and without becoming a controlling terminal
EXISTING_FLAGS = NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
LINK = ("is a symbolic link: comfy_memx writes only a file it reaches without following a link (another user's "
        "link could point at any file of yours); name the file itself")
FILE_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


class Refused(MemxError, OSError):
    """comfy_memx will not write this path; ``str()`` is the path and why (``why`` alone is kept too)."""

    def __init__(self, path, why):
        super().__init__(errno.EPERM, f"{path} {why}")
        self.why = why

    def __str__(self):
        return self.strerror


def not_a_regular_file(mode):
    """What a file of ``st_mode`` ``mode`` is when it is not a regular file (``"a FIFO (named pipe)"``), else None."""
    return next((what for test, what in FILE_KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def others_can_write(info):
    """True when a folder of ``os.stat`` result ``info`` may be written by someone but this user and root: its group
    or all may write it, or it belongs to another user."""
    return bool(info.st_mode & 0o022) or info.st_uid not in (os.geteuid(), 0)


def check_file(info, path, shared=False, private=False):
    """Raise :class:`Refused` unless the ``fstat`` result ``info`` of ``path`` is a file comfy_memx may write: a
    regular file of this user that group and others cannot write; when ``shared`` (its folder is one others can
    write) or ``private`` (a host registry) also one that group and others cannot read, and (``shared``) with one
    name only."""
    what = not_a_regular_file(info.st_mode)
    if what is not None:
        raise Refused(path, f"is {what}, not a regular file")
    if not hasattr(os, "geteuid"):
        return
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid():
        raise Refused(path, f"belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): another user made "
                            "it, and could read what is written there")
    if mode & 0o022:
        raise Refused(path, f"can be written by group or others (mode {mode:04o}); make it private (chmod 600)")
    if private and mode & 0o077:
        raise Refused(path, f"is readable by group or others (mode {mode:04o})")
    if shared and mode & 0o077:
        raise Refused(path, f"is in a folder others can write and is not private (mode {mode:04o}): there only a "
                            "file of this user that nobody else can read is used (chmod 600, or another folder)")
    if shared and info.st_nlink != 1:
        raise Refused(path, f"has {info.st_nlink} names (hard links) in a folder others can write: one may be "
                            "another user's link to a file of yours")


def unguessable(stem):
    """``stem`` with a random part appended: a name that nobody can plant anything at in advance."""
    return f"{stem}-{secrets.token_hex(8)}"


class Folder:
    """A folder opened by :func:`open_folder`: ``path``, ``fd`` (None where the platform has no ``openat``) and
    ``shared`` (others can write in it).  Use it as a context manager, or :meth:`close` it."""

    def __init__(self, path, fd):
        self.path, self.fd = path, fd
        self.shared = fd is not None and others_can_write(os.fstat(fd))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Close the folder's descriptor."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def open(self, name, flags):
        """``os.open(name, flags)`` in this folder by the module's rules (a new file 0600, an existing one checked
        before ``O_TRUNC`` applies); returns the descriptor."""
        path = os.path.join(self.path, name)
        if self.fd is None:
            return _open_plain(path, flags)
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, MODE, dir_fd=self.fd)
        except FileExistsError:
            return self._open_existing(name, path, flags)
        _private_mode(fd)
        return fd

    def create(self, name, binary=False):
        """A new file ``name`` (``O_EXCL``: :class:`Refused` when anything is there already), mode 0600, as a file
        object open for writing."""
        path = os.path.join(self.path, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC | BINARY
        try:
            fd = os.open(name, flags, MODE, dir_fd=self.fd) if self.fd is not None else os.open(path, flags, MODE)
        except FileExistsError:
            raise Refused(path, "already exists (only a new file is written there)") from None
        _private_mode(fd)
        return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")

    def inspect(self, name):
        """The ``lstat`` of ``name`` in this folder when it is a file comfy_memx may write (:func:`check_file`),
        None when nothing is there; :class:`Refused` otherwise (a link included).  For start-up checks: the file
        is checked again when it is opened."""
        path = os.path.join(self.path, name)
        try:
            info = os.stat(name, dir_fd=self.fd, follow_symlinks=False) if self.fd is not None else os.stat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(info.st_mode):
            raise Refused(path, LINK)
        check_file(info, path, shared=self.shared)
        return info

    def _open_existing(self, name, path, flags):
        try:
            fd = os.open(name, (flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC)) | EXISTING_FLAGS, dir_fd=self.fd)
        except OSError:
            if _is_link(name, self.fd):
                raise Refused(path, LINK) from None
            raise
        try:
            check_file(os.fstat(fd), path, shared=self.shared)
            if flags & os.O_TRUNC:
                os.ftruncate(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd


def open_folder(path):
    """The :class:`Folder` ``path``, reached from ``/`` one component at a time with no symbolic link of another
    user followed (:class:`Refused` for one); ``FileNotFoundError`` when it does not exist."""
    path = os.path.abspath(path)
    return Folder(path, _walk(path) if SAFE else None)


def open_private(path, flags):
    """``os.open(path, flags)`` by the module's rules: a file this call creates gets mode 0600, an existing one is
    used only when it passes :func:`check_file` (``O_TRUNC`` applies after the check); returns the descriptor."""
    with open_folder(os.path.dirname(os.path.abspath(path))) as folder:
        return folder.open(os.path.basename(path), flags)


def create_private(path, binary=False):
    """A file object writing ``path`` from its start (created 0600, or an existing file of this user truncated, its
    mode kept), by the module's rules."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | BINARY)
    return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")


def inspect(path):
    """:meth:`Folder.inspect` of ``path`` (the ``lstat`` of a usable file, None when there is none yet)."""
    with open_folder(os.path.dirname(os.path.abspath(path))) as folder:
        return folder.inspect(os.path.basename(path))


def _walk(path):
    """A descriptor of folder ``path``; every component opened relative to the one before without following a
    link, a link followed (by reading it) only when it belongs to this user or root."""
    fd = os.open("/", DIR_FLAGS)
    where, pending, links = "/", [part for part in path.split("/") if part][::-1], 0
    try:
        while pending:
            name = pending.pop()
            if name == ".":
                continue
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            here = os.path.normpath(os.path.join(where, name))
            if not stat.S_ISLNK(info.st_mode):
                try:
                    inner = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise Refused(path, f"changed while it was opened ({here} became a link)") from None
                    raise
                os.close(fd)
                fd, where = inner, here
                continue
            links += 1
            if links > MAX_LINKS:
                raise Refused(path, "is reached through too many symbolic links")
            if info.st_uid not in (os.geteuid(), 0):
                raise Refused(path, f"is reached through the symbolic link {here} of uid {info.st_uid}, another "
                                    "user: a link another user made could send the file anywhere")
            target = os.readlink(name, dir_fd=fd)
            again = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if (again.st_dev, again.st_ino) != (info.st_dev, info.st_ino):
                raise Refused(path, f"changed while it was opened ({here} was replaced)")
            if target.startswith("/"):
                os.close(fd)
                fd, where = os.open("/", DIR_FLAGS), "/"
            pending.extend(part for part in target.split("/")[::-1] if part)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name, folder_fd):
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _private_mode(fd):
    try:
        os.fchmod(fd, MODE)
    except (AttributeError, OSError):   # Windows has no fchmod; its files are private through the profile's ACLs
        pass


def _open_plain(path, flags):
    """Where there is no ``openat``/``O_NOFOLLOW`` (Windows): ``O_EXCL`` to know a new file is ours, else the
    existing file, which must be a regular one."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, MODE)
    except FileExistsError:
        fd = os.open(path, flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC), MODE)
        try:
            check_file(os.fstat(fd), path)
            if flags & os.O_TRUNC:
                os.ftruncate(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd
    _private_mode(fd)
    return fd
