"""The connection bound's rules (advisor/bounded.py) on real sockets: a slot is taken from the
connection that has waited longest for its request, never from one being answered."""

from __future__ import annotations

import socket
import time

import pytest

from slurm_pal.advisor.bounded import ConnectionSlots, LineReader


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def test_a_full_bound_refuses_only_when_every_slot_is_being_answered() -> None:
    now = [0.0]
    slots = ConnectionSlots(2, clock=lambda: now[0])
    (a, peer_a), (b, peer_b), (c, peer_c) = _pair(), _pair(), _pair()
    try:
        assert slots.admit(a) == "free"
        now[0] = 1.0
        assert slots.admit(b) == "free"
        assert slots.answering(a) and slots.answering(b)
        assert slots.admit(c) == "full"
        slots.waiting(b)  # b was answered and waits for its next request
        assert slots.admit(c) == "made room"
        peer_b.settimeout(5)
        assert peer_b.recv(10) == b""  # b's side was shut down
        assert not slots.answering(b)  # its thread learns it lost the slot
        assert slots.answering(c)
        slots.release(b)
        slots.waiting(a)
        now[0] = 2.0
        slots.waiting(c)
        d, peer_d = _pair()
        assert slots.admit(d) == "made room"  # a has waited longest
        peer_a.settimeout(5)
        assert peer_a.recv(10) == b""
        d.close()
        peer_d.close()
    finally:
        for s in (a, peer_a, b, peer_b, c, peer_c):
            s.close()


def test_a_line_is_read_whole_or_not_at_all_by_its_deadline() -> None:
    ours, theirs = _pair()
    try:
        reader = LineReader(ours)
        theirs.sendall(b'{"a":1}\n{"b"')
        assert reader.readline(100, time.monotonic() + 5) == b'{"a":1}\n'
        with pytest.raises(TimeoutError):
            reader.readline(100, time.monotonic() + 0.2)  # the rest never comes
        theirs.sendall(b":2}\n" + b"x" * 50)
        assert reader.readline(100, time.monotonic() + 5) == b'{"b":2}\n'
        assert reader.readline(10, time.monotonic() + 5) == b"x" * 10  # over-long: cut
        theirs.close()
        assert reader.readline(100, time.monotonic() + 5) == b"x" * 40
        assert reader.readline(100, time.monotonic() + 5) == b""
    finally:
        ours.close()
        theirs.close()
