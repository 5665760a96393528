"""Jobs job_submit.lua let through without an answer (fail-open), counted by the advisor.

Why a file: a fail-open happens exactly when the advisor could not answer (down, busy, too
slow), so the plugin cannot tell the advisor then. It appends one line
(``<epoch>\t<uid>\t<user>\t<job name>\t<why>``; older plugins wrote ``<epoch> <why>``) to
``<advisor.socket>.failopen`` instead: an open, a write and a close inside slurmctld, no process
and no socket. The advisor creates the file next to its socket (mode 0660, group
``advisor.socket_group``, like the socket, so SlurmUser can append without write access to the
folder), counts the new lines on every refresh and on every metrics scrape, and logs one line
when there are new ones. Fail-opens while the advisor was down are counted when it is back.

Slurm gives a job its id only after job_submit.lua has returned (22.05 and 24.11 alike: the
plugin runs before the job record exists), so no line can carry it. The warning names what
finds the job instead: the user, the job name and the submit time, as an ``sacct`` command.

The file is replaced by an empty one once it passes ``rotate_bytes``; a line a plugin writes
into the old file after the advisor's last read of it (a few microseconds) is lost.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import shlex
import threading
import time
from pathlib import Path

__all__ = ["ROTATE_BYTES", "FailOpenLog", "describe_line", "fail_open_path"]

log = logging.getLogger("slurm_pal.advisor")

ROTATE_BYTES = 1 << 20


def fail_open_path(socket_path: str | Path) -> Path:
    """Where job_submit.lua appends its fail-open lines: next to the socket it talks to."""
    return Path(f"{socket_path}.failopen")


def describe_line(line: str) -> str:
    """One fail-open line as an admin can act on it: when, whose job, why, and the sacct
    command that finds it (its id did not exist yet when the line was written)."""
    fields = line.split("\t")
    if len(fields) == 5 and fields[0].isdigit():
        epoch, uid, user, name, why = fields
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(epoch)))
        find = f"sacct -X -u {uid} -S {when}" + (f" --name {shlex.quote(name)}" if name else "")
        return f"job {name!r} of {user} (uid {uid}) submitted {when}: {why} (find it: {find})"
    head, _, why = line.partition(" ")
    if head.isdigit():  # an older plugin's "<epoch> <why>"
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(head)))
        return f"a job submitted {when}: {why}"
    return line


class FailOpenLog:
    """Counts the lines appended to the fail-open file since this process started reading it
    (the whole file at the first read: fail-opens while the advisor was down count too)."""

    def __init__(
        self, path: Path, group: str | None = None, rotate_bytes: int = ROTATE_BYTES
    ) -> None:
        self.path = Path(path)
        self.group = group
        self.rotate_bytes = rotate_bytes
        self.total = 0
        self.last: str | None = None  # the latest line read, for the log
        self._inode: int | None = None
        self._offset = 0
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Create the file (kept if there) writable by the socket's group."""
        self._create(self.path, exclusive=False)

    def _create(self, path: Path, *, exclusive: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_EXCL if exclusive else 0)
        old = os.umask(0o117)
        try:
            os.close(os.open(path, flags, 0o660))
        finally:
            os.umask(old)
        if self.group:
            try:
                gid = grp.getgrnam(self.group).gr_gid
            except KeyError:
                return  # the socket's own warning already says so
            with contextlib.suppress(PermissionError):
                os.chown(path, -1, gid)

    def poll(self) -> int:
        """Read the lines added since the last poll; returns how many (0 without the file)."""
        with self._lock:
            try:
                fh = self.path.open("rb")
            except OSError:
                return 0
            with fh:
                info = os.fstat(fh.fileno())
                if info.st_ino != self._inode or info.st_size < self._offset:
                    self._inode, self._offset = info.st_ino, 0  # a new or truncated file
                new = self._read(fh)
                if self._offset >= self.rotate_bytes:
                    new += self._rotate(fh)
            self.total += new
        if new:
            log.warning(
                "job_submit.lua let %d GPU job(s) through as written, unanswered; the last: %s",
                new,
                describe_line(self.last or ""),
            )
        return new

    def _read(self, fh: object) -> int:
        fh.seek(self._offset)  # type: ignore[attr-defined]
        data = fh.read()  # type: ignore[attr-defined]
        end = data.rfind(b"\n") + 1  # whole lines only: a line being written waits
        if end == 0:
            return 0
        self._offset += end
        lines = data[:end].splitlines()
        self.last = lines[-1].decode(errors="replace").strip() if lines else self.last
        return len(lines)

    def _rotate(self, fh: object) -> int:
        """Swap in an empty file, then read what reached the old one meanwhile."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.unlink(missing_ok=True)
            self._create(tmp, exclusive=True)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot rotate %s: %s", self.path, exc)
            tmp.unlink(missing_ok=True)
            return 0
        late = self._read(fh)
        self._inode = os.stat(self.path).st_ino
        self._offset = 0
        return late
