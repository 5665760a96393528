"""The advisor's TCP listener for compute nodes' job records, each inside a munge credential.

Why: on a real cluster the Prolog/Epilog run on the compute nodes and cannot reach the
controller's Unix socket; without their records the job-end round never runs and the records
stay in each node's spool. TCP reaches the controller, and munge (already on every Slurm host,
with the cluster's key) says who made each record and where, so the listener can refuse what
the Unix socket refuses by peer uid.

What it serves: only ``{"v":1,"op":"record","cred":"MUNGE:..."}``, the record being the
credential's payload (so it cannot be changed on the way). Every other op is refused: decide,
replan, reload, health and stats stay on the Unix socket with its peer check. A record is
applied only when all of these hold (else an error answer, counted in ``records_rejected``):

1. munged decodes the credential: not invalid, not of another key, not expired, and not
   replayed (munged remembers what it decoded until the credential's TTL ends);
2. the credential's uid is root, the service's own user or one of ``advisor.record_users``;
3. the payload is a valid record (PROTOCOL.md, op ``record``);
4. the credential was encoded on the record's node: its ENCODE_HOST is one of the addresses the
   node's ``NodeAddr``/``NodeHostname`` (or name) resolve to;
5. the job ran on that node (the advisor's view of the job, else ``scontrol show job``). A job
   Slurm has forgotten (a record spooled for longer than MinJobAge) cannot be checked: its
   record is stored, but it starts no re-planning round.

Connections are bounded like the Unix side's (``advisor.max_connections``; a request must
arrive whole within ``advisor.request_timeout_s``; the longest-waiting connection is closed to
make room; then a one-line ``busy``: :mod:`.bounded`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurm_pal.adapters.config import split_host_port
from slurm_pal.advisor import munge, protocol
from slurm_pal.advisor.bounded import BoundedThreadingMixIn, ConnectionSlots, LineReader
from slurm_pal.errors import SlurmPalError

if TYPE_CHECKING:
    from slurm_pal.advisor.server import AdvisorServer

__all__ = ["RecordListener", "RecordRejected", "RecordVerifier", "VerifiedRecord"]

log = logging.getLogger("slurm_pal.advisor")

TCP_OPS = ("record",)
ADDRESS_RETRY_S = 5.0
"""A node's addresses are asked again at most this often when a record's host is not among
them (a re-addressed node), so forged records cannot make the advisor query Slurm freely."""


class RecordRejected(SlurmPalError):
    """A TCP record the advisor does not apply; the message says which check failed."""


@dataclass(frozen=True)
class VerifiedRecord:
    record: dict[str, object]
    uid: int
    host: str
    job_checked: bool  # False: Slurm no longer knows the job (applied, but no round)


def record_uids(users: Iterable[str]) -> frozenset[int]:
    """Root, this process's user and the named users that exist here."""
    uids = {0, os.geteuid()}
    for user in users:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(user).pw_uid)
    return frozenset(uids)


class RecordVerifier:
    """The five checks above, on one credential.

    ``addresses(node)`` and ``job_nodes(job_id)`` ask Slurm (``adapters/slurm/hosts.py``);
    ``view_job_nodes(job_id)`` answers from the advisor's view first (None: not in it)."""

    def __init__(
        self,
        *,
        munge_socket: str,
        uids: frozenset[int],
        addresses: Callable[[str], frozenset[str]],
        job_nodes: Callable[[int], tuple[str, ...] | None],
        view_job_nodes: Callable[[int], tuple[str, ...] | None] = lambda _job: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.munge_socket = munge_socket
        self.uids = uids
        self._addresses = addresses
        self._job_nodes = job_nodes
        self._view_job_nodes = view_job_nodes
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, tuple[frozenset[str], float]] = {}

    def verify(self, credential: object) -> VerifiedRecord:
        if not isinstance(credential, str) or not credential.startswith("MUNGE:"):
            raise RecordRejected("no munge credential ('cred')")
        try:
            cred = munge.decode(credential, self.munge_socket)
        except munge.MungeError as exc:
            raise RecordRejected(f"credential refused: {exc}") from None
        if cred.uid not in self.uids:
            raise RecordRejected(f"credential of uid {cred.uid}: only root and SlurmUser send")
        try:
            body = json.loads(cred.payload)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            # the payload is the record alone: built as a request here, never spliced in as
            # text (a payload could otherwise add keys such as "op" to the request)
            wrapped = json.dumps({"v": protocol.VERSION, "op": "record", "record": body})
            request = protocol.parse_request(wrapped.encode())
        except (ValueError, protocol.ProtocolError) as exc:
            raise RecordRejected(f"the credential's payload is not a record: {exc}") from None
        record = dict(request.body["record"])  # type: ignore[call-overload]
        node, job_id = str(record["node"]), int(record["job_id"])
        if not self._host_is(node, cred.host):
            raise RecordRejected(f"credential from {cred.host}, which is not node {node}")
        nodes = self._view_job_nodes(job_id)
        if not nodes or node not in nodes:
            nodes = self._job_nodes(job_id)  # the view may not have seen a short job
        if nodes is not None and node not in nodes:
            raise RecordRejected(f"job {job_id} did not run on {node}")
        return VerifiedRecord(record, cred.uid, cred.host, job_checked=nodes is not None)

    def _host_is(self, node: str, host: str) -> bool:
        now = self._clock()
        with self._lock:
            known = self._known.get(node)
        if known is not None and (host in known[0] or now - known[1] < ADDRESS_RETRY_S):
            return host in known[0]
        addresses = self._addresses(node)
        with self._lock:
            self._known[node] = (addresses, now)
        return host in addresses


class _Handler(socketserver.BaseRequestHandler):
    server: _TcpServer

    def handle(self) -> None:
        self.server.listener.handle_connection(self.request, self.server.slots)


class _TcpServer(BoundedThreadingMixIn, socketserver.TCPServer):
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], listener: RecordListener) -> None:
        self.listener = listener
        self.slots = ConnectionSlots(listener.advisor.max_connections)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def refuse(self, request: socket.socket) -> None:
        self.listener.advisor.connections.refuse_busy(request)

    def closed_for_room(self) -> None:
        self.listener.advisor.counters.add("connections_closed_for_room")


class RecordListener:
    """``advisor.listen``: accept credentialed records over TCP for ``advisor``."""

    def __init__(self, advisor: AdvisorServer, listen: str, verifier: RecordVerifier) -> None:
        self.advisor = advisor
        self.address = split_host_port(listen)
        self.verifier = verifier
        self._server: _TcpServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def for_advisor(cls, advisor: AdvisorServer, listen: str) -> RecordListener:
        """The listener with Slurm's view of nodes and jobs (scontrol, the service's env)."""
        from slurm_pal.adapters.slurm.hosts import SlurmHosts

        cfg = advisor.state.config.advisor
        hosts = SlurmHosts(env=getattr(advisor.state.reader, "env", None))
        verifier = RecordVerifier(
            munge_socket=cfg.munge_socket,
            uids=record_uids(cfg.record_users),
            addresses=hosts.node_addresses,
            job_nodes=hosts.job_nodes,
            view_job_nodes=lambda job_id: _view_job_nodes(advisor.state.view, job_id),
        )
        return cls(advisor, listen, verifier)

    @property
    def bound(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def bind(self) -> None:
        """Bind the port (OSError when it is taken); :meth:`start` serves it."""
        if self._server is None:
            self._server = _TcpServer(self.address, self)

    def start(self) -> None:
        self.bind()
        self._thread = threading.Thread(
            target=lambda: self._server.serve_forever(poll_interval=0.2),  # type: ignore[union-attr]
            name="tcp-records",
            daemon=True,
        )
        self._thread.start()
        log.info("records over TCP on %s:%d (munge-authenticated)", *self.bound)

    def stop(self) -> None:
        if self._server is not None:
            if self._thread is not None:  # shutdown() waits for a serve loop that never ran
                self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    def handle_connection(self, conn: socket.socket, slots: ConnectionSlots) -> None:
        advisor = self.advisor
        reader = LineReader(conn)
        while True:
            line = advisor.connections.next_line(conn, reader, slots)
            if line is None:
                return
            try:
                conn.sendall(protocol.encode(self.answer(line)))
            except OSError:
                return
            slots.waiting(conn)

    def answer(self, line: bytes) -> dict[str, object]:
        """The answer to one TCP request line (never raises)."""
        try:
            message = protocol.parse_message(line)
        except protocol.ProtocolError as exc:
            self.advisor.counters.add("bad_requests")
            return exc.answer()
        op = message.get("op")
        if op not in TCP_OPS:
            self.advisor.counters.add("bad_requests")
            return protocol.error_answer(
                f"op {op!r} is not served over TCP (use the advisor's Unix socket)", TCP_OPS
            )
        try:
            verified = self.verifier.verify(message.get("cred"))
        except RecordRejected as exc:
            self.advisor.counters.add("records_rejected")
            log.warning("record over TCP refused: %s", exc)
            return protocol.error_answer(f"record refused: {exc}")
        except Exception as exc:  # a bug or munged gone must not end the service
            self.advisor.counters.add("records_rejected")
            log.exception("record over TCP not checked")
            return protocol.error_answer(f"record not checked: {exc}")
        try:
            return self.advisor.apply_record(verified.record, replan=verified.job_checked)
        except Exception as exc:
            log.exception("record %s failed", verified.record.get("record_id"))
            return protocol.error_answer(f"record failed: {exc}")


def _view_job_nodes(view: Any, job_id: int) -> tuple[str, ...] | None:
    if view is None:
        return None
    job = view.job(job_id)
    return (tuple(job.nodes) or None) if job is not None else None
