"""A thread per connection, with a bound: what the Unix socket and the TCP record port share.

Past ``slots`` connections at once a new one gets a one-line refusal (the plugin fails open, a
hook spools its record) instead of a thread, so a flood of idle connections cannot exhaust the
service."""

from __future__ import annotations

import socket
import socketserver
import threading


class BoundedThreadingMixIn(socketserver.ThreadingMixIn):
    """``slots`` must be set before serving; ``refuse`` answers a connection past the bound."""

    daemon_threads = True
    request_queue_size = 128
    slots: threading.BoundedSemaphore

    def refuse(self, request: socket.socket) -> None:
        raise NotImplementedError

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        if not self.slots.acquire(blocking=False):
            self.refuse(request)
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
