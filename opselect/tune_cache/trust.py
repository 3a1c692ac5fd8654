"""Whose files the tune cache uses: the rule ssh applies to ~/.ssh.

A directory or file that another user owns, or that group or others may write, may have been
planted or changed by someone else. The cache reads only text records and validates each, so a
planted row cannot run code, but it could still steer which kernels run or feed SQLite a crafted
file; such a cache is not used unless the user accepts that with OPSELECT_CACHE_TRUST_SHARED=1.
Root may own it (as ssh allows): root can change your files anyway.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

TRUST_SHARED_ENV = "OPSELECT_CACHE_TRUST_SHARED"


def trust_shared() -> bool:
    return os.environ.get(TRUST_SHARED_ENV, "").strip() == "1"


def untrusted_reason(path: Path) -> str | None:
    """Why `path` (which exists) may not be trusted, or None when it may."""
    if trust_shared() or not hasattr(os, "getuid"):  # Windows guards with ACLs, not modes
        return None
    info = os.stat(path)
    me = os.getuid()
    if info.st_uid not in (me, 0):
        return f"it is owned by uid {info.st_uid}, not by you (uid {me})"
    loose = info.st_mode & 0o022
    if loose:
        who = {0o022: "group and others", 0o020: "group", 0o002: "others"}[loose]
        return f"it is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def make_private_directory(path: Path) -> None:
    """Create `path` (and missing parents), the last part 0700; an existing one is left as is."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            return
    os.chmod(path, 0o700)  # a umask such as 0277 would leave it unusable


def create_private_file(path: Path) -> None:
    """Create an empty file readable and writable by its owner only, unless it exists already
    (SQLite gives the -wal and -shm files it creates next to it the same mode)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)
