"""Opening the advisor's store safely: private, the right file, and patient with a lock.

The store holds every decision's job description (user, job name, partition, script hash) and
every job record: other local users must not read it. SQLite creates its ``-wal`` and ``-shm``
files with the database file's own mode, so a 0600 database keeps them private too. A store
that is empty (0 bytes: a failed copy, a full disk) or is not ours would otherwise become a
fresh empty store silently, and every job would pass unrouted ("no active campaign"); that is
refused unless the admin asks for a new store. A store locked by another process at start (a
long ``campaign collect``) is waited out, with a log line, instead of ending the service.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path

from slurm_pal.adapters.store import Store, StoreError

__all__ = ["StoreGuardError", "open_store_for_service"]

log = logging.getLogger("slurm_pal.advisor")

SQLITE_MAGIC = b"SQLite format 3\x00"
OURS = {"campaigns", "measurements"}  # tables every slurm-pal store has from migration 1


class StoreGuardError(StoreError):
    """The store cannot be used as it is; the message says why and what to do."""


def _check_file(path: Path, init: bool) -> None:
    if not path.exists() or init:
        return
    size = path.stat().st_size
    if size == 0:
        raise StoreGuardError(
            f"store {path} is empty (0 bytes): refusing to start on it (every job would pass "
            "unrouted); restore it, or start with --init-store to create a new store there"
        )
    with path.open("rb") as fh:
        head = fh.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise StoreGuardError(
            f"store {path} is not an SQLite database: refusing to start on it; point --db or "
            "store.path at the slurm-pal store, or start with --init-store to replace it"
        )
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):
            return  # another process writes to it: opening the store waits that out
        raise StoreGuardError(f"store {path} cannot be read: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise StoreGuardError(f"store {path} cannot be read: {exc}") from exc
    finally:
        db.close()
    if tables and not tables >= OURS:
        raise StoreGuardError(
            f"store {path} is an SQLite database of something else (tables "
            f"{', '.join(sorted(tables)[:5])}): refusing to start on it; point --db or "
            "store.path at the slurm-pal store, or start with --init-store to replace it"
        )


def _make_private(path: Path, created_folder: bool) -> None:
    for candidate in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if candidate.exists():
            candidate.chmod(0o600)
    folder = path.parent
    if created_folder:
        folder.chmod(0o700)
        return
    mode = stat.S_IMODE(folder.stat().st_mode)
    if mode & 0o077 and folder.stat().st_uid == os.geteuid():
        log.warning(
            "the store's folder %s is open to others (mode %04o): the store itself is 0600; "
            "chmod 700 the folder if nothing else needs it",
            folder,
            mode,
        )


def open_store_for_service(
    path: Path,
    *,
    init: bool = False,
    wait_s: float = 600.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Check, create if missing (``init``: also replace an empty or foreign file), migrate and
    make private the store at ``path``; a lock held by another process is retried with backoff
    for up to ``wait_s``. Raises StoreGuardError with a one-line reason."""
    path = Path(path)
    _check_file(path, init)
    if init and path.exists() and not _is_ours(path):
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            leftover.unlink(missing_ok=True)
    created_folder = not path.parent.exists()
    deadline = clock() + wait_s
    delay = 1.0
    old_umask = os.umask(0o077)  # files and folders created now are the service's alone
    try:
        while True:
            try:
                with Store(path, timeout_s=1.0):
                    break
            except StoreError as exc:
                if "locked" not in str(exc) or clock() + delay > deadline:
                    raise
                log.warning(
                    "store %s is locked by another process: retrying in %.0f s", path, delay
                )
                sleep(delay)
                delay = min(delay * 2, 30.0)
    finally:
        os.umask(old_umask)
    _make_private(path, created_folder)


def _is_ours(path: Path) -> bool:
    try:
        _check_file(path, init=False)
    except StoreGuardError:
        return False
    return True
