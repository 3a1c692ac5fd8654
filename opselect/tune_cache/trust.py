"""Whose files the tune cache uses: the rule ssh applies to ~/.ssh, applied to the whole path.

A directory or file that another user owns, or that group or others may write, may have been
planted or changed by someone else. The cache reads only text records and validates each, so a
planted row cannot run code, but it could still steer which kernels run or feed SQLite a crafted
file; such a cache is not used unless the user accepts that with OPSELECT_CACHE_TRUST_SHARED=1.
Root may own it (as ssh allows): root can change your files anyway.

The path is resolved here, one component at a time, as the kernel would resolve it, and checked on
the way (trusted_directory):
- every directory on the way must be one nobody else can rename entries of: owned by you or root
  and not writable by group or others, or (like /tmp) sticky, with the entry in it yours or
  root's. Otherwise its owner or writers could swap the cache directory, or a parent, for another
  one after the check;
- a symbolic link on the way is followed only if you or root own it, whatever
  OPSELECT_CACHE_TRUST_SHARED says: a link owned by someone else lets them choose where this
  process creates and writes files (as root: any directory of the system);
- the caller then opens the resolved path, never the given one again, so nothing can be swapped
  between the check and the open: every component of the resolved path is one only you or root
  can change.

The database file and SQLite's companions (-wal, -shm, -journal) must be plain files with one
link, whatever the shared-directory setting: through a symbolic or hard link SQLite would write
into someone else's file (check_file).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import UntrustedPath as Untrusted

TRUST_SHARED_ENV = "OPSELECT_CACHE_TRUST_SHARED"
#: as the kernel's own limit on links followed in one lookup
MAX_LINKS = 40


def trust_shared() -> bool:
    return os.environ.get(TRUST_SHARED_ENV, "").strip() == "1"


def _checks_owners() -> bool:
    return hasattr(os, "getuid")  # Windows guards with ACLs, not modes


def _who_may_write(mode: int) -> str:
    return {0o022: "group and others", 0o020: "group", 0o002: "others"}[mode & 0o022]


def untrusted_reason(info: os.stat_result) -> str | None:
    """Why a directory or file with this lstat may not be trusted by its owner and mode, or None
    when it may (the rule of the cache directory itself and of its files)."""
    if not _checks_owners():
        return None
    me = os.getuid()
    if info.st_uid not in (me, 0):
        return f"it is owned by uid {info.st_uid}, not by you (uid {me})"
    if info.st_mode & 0o022:
        return (f"it is writable by {_who_may_write(info.st_mode)} "
                f"(mode {stat.S_IMODE(info.st_mode):04o})")
    return None


def _replaceable(directory: Path, info: os.stat_result, entry: os.stat_result) -> str | None:
    """Why someone else could rename or replace `entry` in `directory` (lstat `info`), or None."""
    me = os.getuid()
    if info.st_uid not in (me, 0):
        return f"its parent {directory} is owned by uid {info.st_uid}, not by you (uid {me})"
    if info.st_mode & 0o022 and not (info.st_mode & stat.S_ISVTX and entry.st_uid in (me, 0)):
        # A sticky directory lets only an entry's owner (and the directory's, and root) rename
        # or delete it: /tmp/yours is safe in /tmp; /tmp/theirs is not.
        return (f"its parent {directory} is writable by {_who_may_write(info.st_mode)} "
                f"(mode {stat.S_IMODE(info.st_mode):04o})")
    return None


def resolve(path: Path) -> tuple[Path, list[str]]:
    """(the real path of the longest existing prefix of `path`, the components below it that do
    not exist yet), resolving links one at a time and checking every step (see the module's
    page). Raises Untrusted, or OSError when a component cannot be looked up."""
    checks = _checks_owners()
    strict = checks and not trust_shared()
    me = os.getuid() if checks else 0
    parts = list(Path(os.getcwd(), path).parts)  # (the working directory is a real path)
    current = Path(parts[0])
    current_info = os.lstat(current)
    pending = parts[1:]
    links = 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            current_info = os.lstat(current)
            continue
        entry = current / name
        try:
            info = os.lstat(entry)
        except FileNotFoundError:
            return current, [name, *pending]
        is_link = stat.S_ISLNK(info.st_mode)
        if is_link and checks and info.st_uid not in (me, 0):
            raise Untrusted(entry, f"it is a symbolic link owned by uid {info.st_uid}, not by "
                                   f"you (uid {me}) or root", shareable=False)
        if strict:
            reason = _replaceable(current, current_info, info)
            if reason:
                raise Untrusted(entry, reason, shareable=True)
        if is_link:
            links += 1
            if links > MAX_LINKS:
                raise Untrusted(entry, f"more than {MAX_LINKS} symbolic links", shareable=False)
            target = Path(os.readlink(entry))
            if target.is_absolute():
                current = Path(target.parts[0])
                current_info = os.lstat(current)
                pending = list(target.parts[1:]) + pending
            else:
                pending = list(target.parts) + pending
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise Untrusted(entry, "it is not a directory", shareable=False)
        current, current_info = entry, info
    return current, []


def trusted_directory(path: Path, *, create: bool) -> Path | None:
    """The real path of the cache directory `path`, checked (see the module's page); with create,
    missing directories are made (the last one 0700, the ones above it 0755 less the umask),
    otherwise None when it does not exist. Raises Untrusted, or OSError."""
    for _ in range(8):  # another process may be creating the same directories: look again
        real, missing = resolve(path)
        if not missing:
            if _checks_owners() and not trust_shared():
                reason = untrusted_reason(os.lstat(real))
                if reason:
                    raise Untrusted(real, reason, shareable=True)
            return real
        if not create:
            return None
        try:
            os.mkdir(real / missing[0], 0o700 if len(missing) == 1 else 0o755)
            if len(missing) == 1:
                os.chmod(real / missing[0], 0o700)  # a umask such as 0277 would leave it unusable
        except FileExistsError:
            pass
    raise OSError(f"{path} kept changing while it was created")


def check_file(path: Path) -> os.stat_result | None:
    """The lstat of one of the cache's files (None when it does not exist), after checking it is
    a plain file with one link and, unless shared directories are trusted, yours or root's and
    not writable by others. Raises Untrusted."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise Untrusted(path, "it is a symbolic link", shareable=False)
    if not stat.S_ISREG(info.st_mode):
        raise Untrusted(path, "it is not a regular file", shareable=False)
    if info.st_nlink > 1:
        raise Untrusted(path, f"it has {info.st_nlink} hard links: it may be someone else's file",
                        shareable=False)
    if not trust_shared():
        reason = untrusted_reason(info)
        if reason:
            raise Untrusted(path, reason, shareable=True)
    return info


def create_private_file(path: Path) -> None:
    """Create an empty file readable and writable by its owner only, unless it exists already
    (SQLite gives the -wal and -shm files it creates next to it the same mode). A link in its
    place is never followed."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
    except FileExistsError:
        return
    os.close(fd)


def open_descriptors() -> dict[int, tuple[int, int]] | None:
    """{fd: (device, inode)} of this process's open files, or None where that cannot be listed
    (no /proc): how the caller sees which file SQLite really opened."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    out = {}
    for name in names:
        try:
            info = os.fstat(int(name))
        except (OSError, ValueError):
            continue  # closed meanwhile (the listing's own descriptor among them)
        out[int(name)] = (info.st_dev, info.st_ino)
    return out
