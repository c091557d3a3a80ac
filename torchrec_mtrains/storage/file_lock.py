"""Ownership locks: one open of a table file, one job per directory; a second is refused.

The locks are ``flock(2)`` locks on an open file. They belong to its open file description,
so they are released when that is closed -- or when the process dies, however it dies: a
killed job leaves no stale lock to clean up by hand. A second ``open()`` of the same file
conflicts with the first even inside one process. A forked child shares its parent's open
files, and so holds their locks until it exits or closes them. The pid of a holder is read
from ``/proc/locks`` (best effort: "another process" when it does not say). The block
store's C++ core takes the same locks on its table files (csrc/common/file_lock.h).
"""

from __future__ import annotations

import errno
import fcntl
import os
import weakref
from typing import Optional, Tuple

__all__ = ["LOCK_FILE_NAME", "FileLock", "lock_directory", "lock_file", "lock_holder"]

LOCK_FILE_NAME = ".lock"  # carries a directory's lock where the directory itself cannot


class FileLock:
    """A held lock: the open descriptor it is on, released by ``release()``, by garbage
    collection of this object, or by the process exiting."""

    def __init__(self, fd: int, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Frees the lock (closing its descriptor); a no-op when already released."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "FileLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"FileLock({self.path!r}, {'held' if self.held else 'released'})"


def lock_holder(fd: int) -> str:
    """Who holds a flock on the file open as ``fd``: ``"pid N"``, ``"this process (pid N)"``,
    or ``"another process"`` when ``/proc/locks`` does not say (another pid namespace)."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return "another process"
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    # "<id>: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<inode> <start> <end>"; a waiter's
    # line has "->" after the id and holds nothing.
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != want:
            continue
        pid = fields[4]
        if not pid.isdigit() or pid == "0":
            break  # not visible from this pid namespace
        return f"this process (pid {pid})" if int(pid) == os.getpid() else f"pid {pid}"
    return "another process"


def _flock(fd: int, path: str, what: str, shared: bool) -> None:
    """Takes the lock on ``fd`` without waiting; raises BlockingIOError (EWOULDBLOCK) naming
    ``path`` and the holder when another open of the file holds a conflicting one."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BlockingIOError(
            errno.EWOULDBLOCK,
            f"{what} {path} is in use: it is open (locked) by {lock_holder(fd)}; close it there first",
        ) from None
    except OSError as e:
        raise OSError(e.errno, f"cannot lock {what} {path}: {e.strerror}") from None


def lock_file(path: str, what: str, *, shared: bool = False, fd: Optional[int] = None) -> FileLock:
    """Locks the existing file ``path`` (exclusive unless ``shared``) for as long as the
    returned lock is held.

    Args:
        path: the file.
        what: what the file is, for messages ("SCM table file").
        shared: a reader's lock: any number together, none beside an exclusive one.
        fd: an open descriptor of ``path`` to lock and take over (closed by ``release``);
            by default the file is opened read-only for the lock alone.

    Raises:
        BlockingIOError: (EWOULDBLOCK) another open holds a conflicting lock; the message
            names ``path`` and the holder's pid where the system tells it. ``fd`` is closed.
        FileNotFoundError: ``path`` does not exist.
    """
    if fd is None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    lock = FileLock(fd, path)
    try:
        _flock(fd, path, what, shared)
    except OSError:
        lock.release()
        raise
    return lock


def lock_directory(directory: str, what: str) -> FileLock:
    """Locks the existing ``directory`` exclusively for as long as the returned lock (or
    another one returned for the same directory in this process) is held.

    The lock is on the directory itself, so nothing appears in it; where the filesystem
    does not lock directories (some NFS mounts), on a ``.lock`` file created inside. One
    process takes it once: a second call here returns the lock already held (the
    kernels of one rank share their storage directory), a second process is refused.

    Raises:
        BlockingIOError: (EWOULDBLOCK) another process holds it; the message names
            ``directory`` and the holder's pid where the system tells it.
        OSError: ``directory`` does not exist, or no lock can be taken on it.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise OSError(e.errno, f"cannot lock {what} {directory}: {e.strerror}") from None
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    held = _held_directories.get(key)
    if held is not None and held.held:
        os.close(fd)
        return held
    try:
        lock = lock_file(directory, what, fd=fd)  # closes fd if refused
    except BlockingIOError:
        raise
    except OSError:  # the filesystem does not lock directories
        lock = _lock_file_inside(directory, what)
    _held_directories[key] = lock
    return lock


def _lock_file_inside(directory: str, what: str) -> FileLock:
    """``lock_directory`` on a filesystem that refuses locks on directories."""
    where = os.path.join(directory, LOCK_FILE_NAME)
    try:
        fd = os.open(where, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise OSError(e.errno, f"cannot lock {what} {directory}: cannot open {where}: {e.strerror}") from None
    lock = FileLock(fd, where)
    try:
        _flock(fd, directory, what, False)
    except OSError:
        lock.release()
        raise
    return lock


# (st_dev, st_ino) of a directory -> its lock in this process, while anything holds it.
_held_directories: "weakref.WeakValueDictionary[Tuple[int, int], FileLock]" = weakref.WeakValueDictionary()
