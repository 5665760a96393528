"""The advisor's Unix socket: binding it, checking each peer, and one thread per connection that
reads request lines and sends the answers :class:`~slurm_pal.advisor.server.AdvisorServer`
makes.

Why apart from the server: this is transport only (bytes in, an answer function, bytes out);
what the requests mean, the rounds and the Slurm view live elsewhere. The TCP listener for the
compute nodes' records (:mod:`.transport`) reads its lines through :meth:`UnixTransport.next_line`
and refuses through :meth:`UnixTransport.refuse_busy` too, so both sides bound connections alike.

Peers are checked with ``SO_PEERCRED``: root, the service's own user and
``advisor.allowed_users`` are served, others get ``permission denied``.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from slurm_pal.advisor import protocol
from slurm_pal.advisor.bounded import BoundedThreadingMixIn, ConnectionSlots, LineReader
from slurm_pal.advisor.counters import Counters

__all__ = ["UnixTransport", "allowed_uids", "peer_uid"]

log = logging.getLogger("slurm_pal.advisor")

#: answer(line, after): the answer to one request line; work that can wait until the answer is
#: sent is appended to ``after``.
Answer = Callable[[bytes, list[Callable[[], object]]], dict[str, object]]


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def allowed_uids(users: Iterable[str]) -> frozenset[int]:
    """Root, this process's user and the named users that exist here."""
    uids = {0, os.geteuid()}
    for user in users:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(user).pw_uid)
    return frozenset(uids)


class _Handler(socketserver.BaseRequestHandler):
    server: _UnixServer

    def handle(self) -> None:
        self.server.transport.handle_connection(self.request, self.server.slots)


class _UnixServer(BoundedThreadingMixIn, socketserver.UnixStreamServer):
    """One thread per connection, at most ``advisor.max_connections`` at once (the rules of
    :mod:`.bounded`: a request deadline, room made by closing the longest-waiting one, past
    that a one-line refusal)."""

    allow_reuse_address = False

    def __init__(self, path: str, transport: UnixTransport) -> None:
        self.transport = transport
        self.slots = ConnectionSlots(transport.max_connections)
        super().__init__(path, _Handler)

    def refuse(self, request: socket.socket) -> None:
        self.transport.refuse_busy(request)

    def closed_for_room(self) -> None:
        self.transport.counters.add("connections_closed_for_room")


class UnixTransport:
    """The socket at ``path``: ``answer`` makes each answer, ``undelivered(answer, why)`` hears
    of one the peer did not get; ``allowed`` (uids) may change live (reload)."""

    def __init__(
        self,
        path: Path,
        *,
        answer: Answer,
        undelivered: Callable[[Mapping[str, object], str], None],
        counters: Counters,
        allowed: frozenset[int],
        group: str,
        max_connections: int,
        io_timeout_s: float,
        request_timeout_s: float,
        stopping: threading.Event,
    ) -> None:
        self.path = Path(path)
        self.answer = answer
        self.undelivered = undelivered
        self.counters = counters
        self.allowed = allowed
        self.group = group
        self.max_connections = max_connections
        self.io_timeout_s = io_timeout_s  # for sending an answer
        self.request_timeout_s = request_timeout_s
        self._stopping = stopping
        self._server: _UnixServer | None = None

    # -- the socket -------------------------------------------------------------------------------
    def bind(self) -> None:
        """Create the socket (mode 0660, group ``group``); a stale one of a dead service is
        replaced, a live one is an error."""
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(str(path))
            except OSError:
                path.unlink()  # stale socket of a dead service
            else:
                raise RuntimeError(f"another advisor already listens on {path}")
            finally:
                probe.close()
        old = os.umask(0o117)
        try:
            self._server = _UnixServer(str(path), self)
        finally:
            os.umask(old)
        os.chmod(path, 0o660)
        try:
            gid = grp.getgrnam(self.group).gr_gid
        except KeyError:
            log.warning("socket group %r does not exist: socket left in our group", self.group)
        else:
            with contextlib.suppress(PermissionError):
                os.chown(path, -1, gid)

    def serve_forever(self) -> None:
        """Accept connections until :meth:`close` (run it on a thread of its own)."""
        assert self._server is not None
        self._server.serve_forever(poll_interval=0.2)

    def close(self) -> None:
        """Stop accepting, close the socket and remove its file."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # -- connections ------------------------------------------------------------------------------
    def refuse_busy(self, conn: socket.socket) -> None:
        self.counters.add("connections_refused")
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            message = f"busy: {self.max_connections} connections open (advisor.max_connections)"
            conn.sendall(protocol.encode(protocol.error_answer(message)))
            conn.shutdown(socket.SHUT_WR)
            # Read what the peer already sent: closing over unread bytes resets the connection,
            # and the peer would lose the refusal. Non-blocking: this runs on the accept loop.
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                while conn.recv(65536):
                    pass

    def handle_connection(self, conn: socket.socket, slots: ConnectionSlots) -> None:
        try:
            uid = peer_uid(conn)
        except OSError:
            uid = -1
        if uid not in self.allowed:
            self.counters.add("peer_refused")
            log.warning("refused peer uid %d", uid)
            with contextlib.suppress(OSError):
                conn.sendall(protocol.encode(protocol.error_answer("permission denied")))
            return
        reader = LineReader(conn)
        while not self._stopping.is_set():
            line = self.next_line(conn, reader, slots)
            if line is None:
                return
            after: list[Callable[[], object]] = []
            answer = self.answer(line, after)
            sent = self.send(conn, answer)
            if not sent:
                self.undelivered(answer, "the peer was gone")
            for task in after:  # store writes, once the peer has its answer
                task()
            if not sent:
                return
            slots.waiting(conn)

    def next_line(
        self, conn: socket.socket, reader: LineReader, slots: ConnectionSlots
    ) -> bytes | None:
        """The next whole request line of a connection (Unix socket or TCP), or None when the
        connection is done: closed, given up for room, or a line cut short or over
        ``protocol.MAX_LINE`` (answered with an error first)."""
        line = self.read_request(conn, reader)
        if not line or not slots.answering(conn):
            return None
        conn.settimeout(self.io_timeout_s)
        if line.endswith(b"\n"):
            return line
        self.counters.add("bad_requests")
        if len(line) > protocol.MAX_LINE:
            message = f"request line longer than {protocol.MAX_LINE} bytes"
            if self.send(conn, protocol.error_answer(message)):
                reader.drain()
        else:
            log.info("connection closed mid-request (%d bytes)", len(line))
        return None

    def read_request(self, conn: socket.socket, reader: LineReader) -> bytes | None:
        """The next request line (b"" at the peer's end; an over-long or cut line as it came),
        or None when it did not arrive whole within ``request_timeout_s`` (the peer is told,
        unless it was answered before and sent nothing since: an idle kept connection) or the
        connection broke."""
        deadline = time.monotonic() + self.request_timeout_s
        try:
            return reader.readline(protocol.MAX_LINE + 2, deadline)
        except TimeoutError:
            if reader.lines and not reader.pending:
                # A kept connection (job_submit.lua keeps one between submissions) with no
                # request since its last answer: closed without a word, which the plugin reads
                # as closed and reconnects; an error line could be read as its next answer.
                return None
            self.counters.add("requests_timed_out")
            message = f"no whole request line within {self.request_timeout_s:g} s"
            with contextlib.suppress(OSError):
                conn.settimeout(1.0)
                conn.sendall(protocol.encode(protocol.error_answer(message)))
            return None
        except OSError:
            return None

    def send(self, conn: socket.socket, answer: Mapping[str, object]) -> bool:
        try:
            conn.sendall(protocol.encode(answer))
            return True
        except (OSError, ValueError) as exc:
            log.info("answer not sent: %s", exc)
            return False
