"""Opening the advisor's store safely: private, the right file, and patient with a lock.

The store holds every decision's job description (user, job name, partition, script hash) and
every job record: other local users must not read it. SQLite creates its ``-wal`` and ``-shm``
files with the database file's own mode, so a 0600 database keeps them private too. A store
that is empty (0 bytes: a failed copy, a full disk) or is not ours would otherwise become a
fresh empty store silently, and every job would pass unrouted ("no active campaign"); that is
refused unless the admin asks for a new store. A store locked by another process at start (a
long ``campaign collect``) does not end the service: ``serve`` starts without it and tries
again (:func:`try_open_store`) until it opens; :func:`open_store_for_service` waits it out.
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

__all__ = ["StoreGuardError", "open_store_for_service", "try_open_store"]

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


def try_open_store(path: Path, *, init: bool = False, wait_s: float = 1.0) -> bool:
    """Check, create if missing (``init``: also replace an empty or foreign file), migrate and
    make private the store at ``path``, waiting at most ``wait_s`` for another process's
    lock (SQLite retries every few ms meanwhile, so a release is seen at once). False when
    it stayed locked; StoreGuardError with a one-line reason when it cannot be used."""
    path = Path(path)
    _check_file(path, init)
    if init and path.exists() and not _is_ours(path):
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            leftover.unlink(missing_ok=True)
    created_folder = not path.parent.exists()
    creating = not path.exists()
    # Files and folders created now are the service's alone. The umask is the process's:
    # changed only when something is created (at start, before any other thread writes files).
    old_umask = os.umask(0o077) if creating else None
    try:
        with Store(path, timeout_s=wait_s) as store:
            # Reading needs no lock (WAL), but the service writes every decision: a store
            # another process holds locked is waited for here, as before.
            if not store.write_lock_free():
                return False
    except StoreError as exc:
        if "locked" not in str(exc):
            raise
        return False
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    _make_private(path, created_folder)
    return True


def open_store_for_service(
    path: Path,
    *,
    init: bool = False,
    wait_s: float = 600.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """:func:`try_open_store`, a lock held by another process retried with backoff for up to
    ``wait_s`` (for tools that need the store before anything else); raises StoreGuardError,
    or StoreError when the lock outlasts ``wait_s``."""
    deadline = clock() + wait_s
    delay = 1.0
    while not try_open_store(path, init=init):
        if clock() + delay > deadline:
            raise StoreError(f"store {path} is still locked by another process after {wait_s:g} s")
        log.warning("store %s is locked by another process: retrying in %.0f s", path, delay)
        sleep(delay)
        delay = min(delay * 2, 30.0)
        init = False  # what init replaced is gone; the store now there is ours


def _is_ours(path: Path) -> bool:
    try:
        _check_file(path, init=False)
    except StoreGuardError:
        return False
    return True
