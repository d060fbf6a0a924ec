"""Files comfy_memx creates are private to this user: mode 0600, whatever the umask.

The events file carries client addresses, leak graphs and report timelines name packages and models: none of it is
for other users of the host, and a umask of 022 (the usual one) would make them 0644.  A file that comfy_memx
creates is made with ``O_EXCL`` (so it knows it made it) and then set to 0600 with ``fchmod`` (a umask can only
take bits away, so a ``0o600`` mode alone could leave it unwritable under a strange umask, never more open).  A file
that already exists keeps its mode: it is the user's, who may have opened it to a log shipper on purpose.
"""

import os

MODE = 0o600


def open_private(path, flags):
    """``os.open(path, flags)`` (``flags`` including ``O_CREAT``) where a file this call creates gets mode 0600;
    returns the descriptor."""
    created = flags | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, created, MODE)
    except FileExistsError:
        return os.open(path, flags, MODE)
    try:
        os.fchmod(fd, MODE)
    except (AttributeError, OSError):   # Windows has no fchmod; its files are private through the profile's ACLs
        pass
    return fd


def create_private(path, binary=False):
    """A file object writing ``path`` from its start (created 0600, or an existing file truncated, its mode kept)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = open_private(path, flags)
    return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")
