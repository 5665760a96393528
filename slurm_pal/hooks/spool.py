"""Spool-then-send delivery of job records (stdlib only).

Why spool first: the advisor may be down, restarting or slow; a record written atomically
(tmp file, fsync, rename) survives that and a node crash, and is deleted only once the advisor
answered ok (a duplicate is ok too: records are applied at most once by ``record_id``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from slurm_pal.advisor import munge
from slurm_pal.advisor.client import AdvisorClient, AdvisorUnavailable
from slurm_pal.advisor.logtext import about, reason
from slurm_pal.errors import SlurmPalError
from slurm_pal.hooks.records import spool_name


def warn(message: str) -> None:
    """Hooks report on stderr (slurmd's log) and carry on."""
    with contextlib.suppress(OSError):
        print(f"slurm-pal hook: {message}", file=sys.stderr, flush=True)


def write_spool(spool_dir: Path, record: Mapping[str, object]) -> Path | None:
    """Write ``record`` atomically into ``spool_dir``; None (and a warning) when it cannot."""
    path = spool_dir / spool_name(record)
    tmp = spool_dir / f".{path.name}.{os.getpid()}.tmp"
    try:
        spool_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(spool_dir)
        return path
    except OSError as exc:
        warn(f"cannot spool {about(record)} in {spool_dir}: {reason(exc)}")
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class DeliveryError(SlurmPalError):
    """The advisor could not be reached or did not take the record; the message says why."""


class RecordRefused(DeliveryError):
    """The advisor answered, but not ok (a record it cannot use)."""


def request(socket_path: str, message: Mapping[str, object], timeout_s: float) -> dict:
    """One request, one answer object, within ``timeout_s`` (the advisor's stdlib client)."""
    try:
        return AdvisorClient(socket_path).request(message, timeout_s)
    except AdvisorUnavailable as exc:
        raise DeliveryError(reason(exc)) from None


def tcp_request(address: str, message: Mapping[str, object], timeout_s: float) -> dict:
    """One request line to ``HOST:PORT`` and its answer line, within ``timeout_s`` in all."""
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") else host
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
            conn.sendall((json.dumps(message) + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                conn.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (OSError, ValueError) as exc:
        raise DeliveryError(f"advisor at {address}: {reason(exc)}") from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise DeliveryError(f"advisor at {address} gave no JSON answer: {data[:200]!r}") from None
    if not isinstance(answer, dict):
        raise DeliveryError(f"advisor at {address} gave no JSON object: {data[:200]!r}")
    return answer


def send_record(
    socket_path: str | None,
    record: Mapping[str, object],
    timeout_s: float,
    *,
    tcp: str | None = None,
    munge_socket: str = munge.DEFAULT_SOCKET,
) -> bool:
    """True when the advisor took the record (``ok``, also as a duplicate). With ``tcp``
    (``HOST:PORT``) the record goes there inside a fresh munge credential (PROTOCOL.md,
    "Records over TCP"), else over the Unix socket."""
    if tcp:
        payload = json.dumps(record, sort_keys=True).encode()
        try:
            cred = munge.encode(payload, munge_socket, timeout_s)
        except munge.MungeError as exc:
            raise DeliveryError(f"no munge credential: {exc}") from None
        answer = tcp_request(tcp, {"v": 1, "op": "record", "cred": cred}, timeout_s)
    elif socket_path:
        answer = request(socket_path, {"v": 1, "op": "record", "record": record}, timeout_s)
    else:
        raise DeliveryError("neither the advisor's socket nor its TCP address is set")
    if answer.get("ok") is not True:
        why = answer.get("error") or answer
        raise RecordRefused(f"advisor refused {about(record)}: {why}")
    return True


def deliver(
    spool_dir: Path,
    socket_path: str | None,
    record: Mapping[str, object],
    timeout_s: float,
    *,
    tcp: str | None = None,
    munge_socket: str = munge.DEFAULT_SOCKET,
) -> bool:
    """Spool ``record``, offer it to the advisor, delete the file on ok. True if delivered."""
    path = write_spool(spool_dir, record)
    try:
        send_record(socket_path, record, timeout_s, tcp=tcp, munge_socket=munge_socket)
    except DeliveryError as exc:
        where = f"left in {path}" if path else "NOT spooled (see above): lost"
        warn(f"{about(record)} not delivered ({reason(exc)}); {where}")
        return False
    if path is not None:
        try:
            path.unlink()
        except OSError as exc:
            warn(f"cannot remove delivered {path}: {reason(exc)}")
    return True


@dataclass
class FlushResult:
    delivered: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # advisor unreachable or refused
    unreadable: list[str] = field(default_factory=list)  # not a record: left for an admin


def spooled(spool_dir: Path) -> list[Path]:
    """The spooled record files, oldest first (temporary files of running hooks excluded)."""
    try:
        files = [p for p in spool_dir.glob("*.json") if not p.name.startswith(".")]
    except OSError:
        return []

    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(files, key=lambda p: (mtime(p), p.name))


def flush(
    spool_dir: Path,
    socket_path: str | None,
    timeout_s: float,
    *,
    tcp: str | None = None,
    munge_socket: str = munge.DEFAULT_SOCKET,
) -> FlushResult:
    """Resend every spooled record (over TCP each in a fresh credential: the first one may have
    expired or been used); once the advisor is unreachable the rest are left as is."""
    result = FlushResult()
    files = spooled(spool_dir)
    for n, path in enumerate(files):
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or "record_id" not in record:
                raise ValueError("not a record object")
        except (OSError, ValueError) as exc:
            warn(f"{path}: unreadable spooled record ({reason(exc)}); left in place")
            result.unreadable.append(path.name)
            continue
        try:
            send_record(socket_path, record, timeout_s, tcp=tcp, munge_socket=munge_socket)
        except RecordRefused as exc:
            warn(f"{path}: {exc}; left in place")
            result.left.append(path.name)
            continue
        except DeliveryError as exc:
            left = len(files) - n
            warn(f"{path}: {about(record)} not delivered ({reason(exc)}); {left} record(s) left")
            result.left.extend(p.name for p in files[n:])
            break
        try:
            path.unlink()
        except OSError as exc:
            warn(f"cannot remove delivered {path}: {reason(exc)}")
        result.delivered.append(path.name)
    return result
