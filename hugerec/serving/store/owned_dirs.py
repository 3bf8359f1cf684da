"""Working folders owned by a live process: made beside shared data, removed with their owner, and removed
when left behind by a process that died (kill -9, power loss) without ever deleting one still in use.

    parent/
      <name>.lock    flock(2)ed for as long as the folder is in use; holds {"pid", "host", "created"} for people
      <name>/        the folder

The lock file is made (O_EXCL, a fresh random name) and locked before its folder exists, and is unlinked only
after its folder is gone, by whoever holds its lock. So:
  - a lock file nobody holds belongs to a dead owner (the kernel drops a process's flocks when it dies):
    its folder and then the lock file can go;
  - a folder without a lock file was never in use under this scheme or its removal was cut short: it can go;
  - a held lock file is skipped, whether its owner is another process or another object in this one
    (flock locks belong to open files, not to processes).
flock works on local file systems; on NFS it may be emulated by fcntl locks, which do not conflict inside one
process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

LOCK = ".lock"


class OwnedDir:
    """A new folder `parent/<prefix><random>`, owned (locked) until `close` removes it."""

    def __init__(self, parent: str | Path, prefix: str) -> None:
        while True:
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=LOCK, dir=parent)
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while a cleaner that saw the fresh file holds it
            try:
                same = os.stat(name).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # a cleaner took the file as stale and removed it: try another name
        self._fd: int | None = fd
        self.lock = Path(name)
        self.path = self.lock.with_name(self.lock.name[: -len(LOCK)])
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "created": time.time()}).encode())
        try:
            if self.path.exists():  # an ownerless leftover of the same name (a cut-short removal): ours now
                shutil.rmtree(self.path)
            self.path.mkdir()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Remove the folder, then the lock file, then let go of the lock (once; later calls do nothing)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            shutil.rmtree(self.path, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                self.lock.unlink()
        finally:
            os.close(fd)


def remove_stale(parent: str | Path, prefix: str) -> list[Path]:
    """Remove the folders `parent/<prefix>*` whose owner is gone (see the module doc); returns them."""
    root = Path(parent)
    if not root.is_dir():
        return []
    removed = []
    for lock in sorted(root.glob(f"{prefix}*{LOCK}")):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue  # its owner or another cleaner just removed it, or it is not ours to judge (permissions)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                continue  # removed meanwhile by its owner or another cleaner
            folder = lock.with_name(lock.name[: -len(LOCK)])
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)  # what stays has no lock file: the next call retries
                removed.append(folder)
            with contextlib.suppress(OSError):
                lock.unlink()
        finally:
            os.close(fd)
    for folder in sorted(root.glob(f"{prefix}*")):
        if folder.is_dir() and not folder.with_name(folder.name + LOCK).exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
