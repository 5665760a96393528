"""A thread per connection, with a bound: what the Unix socket and the TCP record port share.

Past ``max_connections`` connections at once a new one gets a one-line refusal (the plugin
fails open, a hook spools its record) instead of a thread, so a flood of connections cannot
exhaust the service. Two rules keep slow or idle peers from holding the slots:

- a request must arrive whole within the request deadline (``advisor.request_timeout_s``),
  counted from the connection's start or the previous answer, not per read: a peer that
  sends a byte now and then would otherwise hold its slot for as long as it trickles;
- when every slot is taken, the connection that has waited longest for its request is closed
  to make room for the new one: job_submit.lua and the hooks send their line as soon as they
  connect, so the peers that lose their slot are those that hold it without asking anything.
  A connection being answered (an Epilog's round, say) is never closed this way.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from typing import Literal

Admission = Literal["free", "made room", "full"]

__all__ = ["Admission", "BoundedThreadingMixIn", "ConnectionSlots", "LineReader"]


class ConnectionSlots:
    """Who holds the ``limit`` slots, and which of them are still waiting for a request."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._open = 0  # admitted and not yet released, the closed-for-room ones included
        self._waiting: dict[socket.socket, float] = {}  # -> since when
        self._closing: set[socket.socket] = set()  # closed for room, thread not yet done

    def admit(self, conn: socket.socket) -> Admission:
        """Take a slot for ``conn``: "free", "made room" (the longest-waiting connection was
        closed for it; its thread ends on its own) or "full" (every slot is being answered)."""
        with self._lock:
            victim: socket.socket | None = None
            if self._open - len(self._closing) >= self.limit:
                if not self._waiting or len(self._closing) >= self.limit:
                    return "full"
                victim = min(self._waiting, key=self._waiting.__getitem__)
                del self._waiting[victim]
                self._closing.add(victim)
            self._open += 1
            self._waiting[conn] = self._clock()
        if victim is None:
            return "free"
        with contextlib.suppress(OSError):
            victim.shutdown(socket.SHUT_RDWR)  # its blocked read returns at once
        return "made room"

    def answering(self, conn: socket.socket) -> bool:
        """``conn`` sent a whole request: it keeps its slot until it waits again. False when
        it was already closed to make room."""
        with self._lock:
            if conn in self._closing:
                return False
            self._waiting.pop(conn, None)
            return True

    def waiting(self, conn: socket.socket) -> None:
        """``conn`` was answered and may send another request."""
        with self._lock:
            if conn not in self._closing:
                self._waiting[conn] = self._clock()

    def release(self, conn: socket.socket) -> None:
        with self._lock:
            self._open -= 1
            self._waiting.pop(conn, None)
            self._closing.discard(conn)


class LineReader:
    """Request lines from a socket, each of which must arrive whole by a deadline."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self._buffer = bytearray()
        self.lines = 0  # whole lines returned so far

    @property
    def pending(self) -> int:
        """Bytes received of the next line."""
        return len(self._buffer)

    def readline(self, limit: int, deadline: float) -> bytes:
        """The next line with its newline; at most ``limit`` bytes without one (the caller
        refuses an over-long line); what came before the peer closed (b"" when nothing).
        Raises TimeoutError past ``deadline`` (``time.monotonic``), OSError as recv does."""
        while True:
            end = self._buffer.find(b"\n", 0, limit)
            if end >= 0:
                self.lines += 1
                return self._take(end + 1)
            if len(self._buffer) >= limit:
                return self._take(limit)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request not whole by its deadline")
            self.conn.settimeout(left)
            chunk = self.conn.recv(65536)
            if not chunk:
                return self._take(len(self._buffer))
            self._buffer += chunk

    def _take(self, n: int) -> bytes:
        line = bytes(self._buffer[:n])
        del self._buffer[:n]
        return line

    def drain(self, limit: int = 8 << 20) -> None:
        """After answering an over-long line: close our side and read (a bounded amount of)
        what the peer still sends, so closing does not reset the connection before it reads
        the error."""
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_WR)
            self.conn.settimeout(2.0)
            while limit > 0:
                chunk = self.conn.recv(65536)
                if not chunk:
                    return
                limit -= len(chunk)


class BoundedThreadingMixIn(socketserver.ThreadingMixIn):
    """``slots`` must be set before serving; ``refuse`` answers a connection past the bound,
    ``closed_for_room`` is told of a waiting connection closed to make room."""

    daemon_threads = True
    request_queue_size = 128
    slots: ConnectionSlots

    def refuse(self, request: socket.socket) -> None:
        raise NotImplementedError

    def closed_for_room(self) -> None:
        """A hook for counting; nothing by default."""

    def process_request(self, request, client_address) -> None:
        admission = self.slots.admit(request)
        if admission == "full":
            self.refuse(request)
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        if admission == "made room":
            self.closed_for_room()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release(request)
