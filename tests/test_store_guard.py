"""The advisor's store at start: private files, no silent fresh store over an empty or foreign
file, a lock held by another process waited out (real SQLite, real files)."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.adapters.store_guard import StoreGuardError, open_store_for_service


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_store_is_private_and_stays_so_after_writes(tmp_path: Path) -> None:
    path = tmp_path / "state" / "slurm-pal.db"
    open_store_for_service(path)
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    with Store(path) as store:  # a writer opened later, under a permissive umask
        old = os.umask(0o022)
        try:
            store.set_application_class("resnet", "A")
        finally:
            os.umask(old)
        wal = Path(f"{path}-wal")
        assert wal.exists() and mode(wal) == 0o600  # SQLite copies the database file's mode


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser"
)
def test_an_unprivileged_user_cannot_read_the_store(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # the folder above is open; the store's own folder and file are not
    path = tmp_path / "state" / "slurm-pal.db"
    open_store_for_service(path)
    for target in (path, path.parent):
        read = subprocess.run(
            ["runuser", "-u", "nobody", "--", "ls", "-l", str(target)]
            if target.is_dir()
            else ["runuser", "-u", "nobody", "--", "head", "-c", "16", str(target)],
            capture_output=True,
            text=True,
        )
        assert read.returncode != 0 and "Permission denied" in read.stderr, read


def test_an_existing_store_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "slurm-pal.db"
    Store(path).close()
    path.chmod(0o644)
    open_store_for_service(path)
    assert mode(path) == 0o600


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", r"is empty \(0 bytes\)"),
        (b"not a database at all, just text\n" * 4, "is not an SQLite database"),
    ],
)
def test_an_empty_or_foreign_file_is_refused_unless_told(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "slurm-pal.db"
    path.write_bytes(content)
    with pytest.raises(StoreGuardError, match=why):
        open_store_for_service(path)
    assert path.read_bytes() == content  # untouched
    open_store_for_service(path, init=True)
    with Store(path) as store:
        assert store.schema_version > 0


def test_another_programs_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "slurm-pal.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE accounts (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(StoreGuardError, match="SQLite database of something else"):
        open_store_for_service(path)


def test_a_locked_store_is_waited_out_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "slurm-pal.db"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process in the middle of a long write
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            holder.execute("COMMIT")  # the other writer finishes while we wait

    with caplog.at_level(logging.WARNING, logger="slurm_pal.advisor"):
        open_store_for_service(path, sleep=sleep)
    holder.close()
    assert slept == [1.0, 2.0]  # backoff
    assert sum("is locked by another process" in r.getMessage() for r in caplog.records) == 2


def test_a_lock_held_past_the_wait_gives_up_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "slurm-pal.db"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    try:
        with pytest.raises(Exception, match="locked"):
            open_store_for_service(path, wait_s=5.0, sleep=sleep, clock=lambda: now[0])
    finally:
        holder.close()


def test_serve_refuses_an_empty_store_before_starting(
    run_cli: Callable[..., object], tmp_path: Path
) -> None:
    path = tmp_path / "slurm-pal.db"
    path.write_bytes(b"")
    result = run_cli("--db", path, "serve", "--socket", tmp_path / "a.sock", ok=False)
    assert result.exit_code == 2
    assert "is empty (0 bytes)" in result.output and "--init-store" in result.output
    assert not (tmp_path / "a.sock").exists() and path.read_bytes() == b""
