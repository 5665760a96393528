"""munge credentials through the ``munge``/``unmunge`` commands (stdlib only: hooks import it).

Why munge: every Slurm host already runs munged with the cluster's shared key, so a record
wrapped in a credential proves who made it (uid, gid) and on which host (the address of the
munged that encoded it), when (encode time, TTL), and that it is not a copy (munged refuses a
credential it has decoded before). The record travels as the credential's payload, so it
cannot be changed on the way either. The commands, not libmunge through ctypes: their
interface is stable and documented, and a record costs one short process on each side.

What ``unmunge`` says (checked with munge 0.5.15): exit status = the munge error code (0
success, 15 expired, 16 rewound, 17 replayed, 6 invalid credential, ...), the metadata as
``KEY: value`` lines (``-N``: numbers, ENCODE_HOST as an address), a blank line, then the
payload; ``munged --origin=ADDR`` sets the address credentials carry.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from slurm_pal.errors import SlurmPalError

DEFAULT_SOCKET = "/run/munge/munge.socket.2"

# munge_err_t values (munge.h) the advisor tells apart in its answers and counters.
ERRORS = {
    1: "snafu",
    2: "bad argument",
    3: "bad length",
    4: "buffer overflow",
    5: "out of memory",
    6: "munged socket error",
    7: "munged timeout",
    8: "bad credential",
    9: "bad version",
    10: "bad cipher",
    11: "bad mac",
    12: "bad zip",
    13: "bad realm",
    14: "invalid credential",
    15: "expired credential",
    16: "rewound credential",
    17: "replayed credential",
    18: "unauthorized",
}


class MungeError(SlurmPalError):
    """munge could not encode, or the credential is not acceptable; ``code`` is munge's."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Credential:
    """What a decoded credential proves."""

    uid: int
    gid: int
    host: str  # the encoding munged's address (ENCODE_HOST, numeric)
    encode_time: int
    ttl: int
    payload: bytes


def encode(payload: bytes, socket: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> str:
    """A credential carrying ``payload`` (read from stdin: not visible in ``ps``)."""
    try:
        proc = subprocess.run(
            ["munge", "--socket", socket],
            input=payload,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MungeError(1, f"munge did not run: {exc}") from None
    if proc.returncode != 0:
        raise MungeError(proc.returncode, _message(proc.stderr, proc.returncode))
    return proc.stdout.decode("ascii", "replace").strip()


def decode(credential: str, socket: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> Credential:
    """Decode ``credential``; :class:`MungeError` when munged does not accept it (invalid,
    expired, replayed, another key) or the command fails."""
    try:
        proc = subprocess.run(
            ["unmunge", "--socket", socket, "--numeric"],
            input=credential.encode("ascii", "replace"),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MungeError(1, f"unmunge did not run: {exc}") from None
    if proc.returncode != 0:
        raise MungeError(proc.returncode, _message(proc.stderr, proc.returncode))
    head, sep, payload = proc.stdout.partition(b"\n\n")
    meta: dict[str, str] = {}
    for line in head.decode("ascii", "replace").splitlines():
        key, _, value = line.partition(":")
        meta[key.strip()] = value.strip()
    try:
        return Credential(
            uid=int(meta["UID"]),
            gid=int(meta["GID"]),
            host=meta["ENCODE_HOST"],
            encode_time=int(meta["ENCODE_TIME"]),
            ttl=int(meta["TTL"]),
            payload=payload if sep else b"",
        )
    except (KeyError, ValueError) as exc:
        raise MungeError(1, f"unmunge gave no {exc} in its metadata") from None


def _message(stderr: bytes, code: int) -> str:
    text = stderr.decode("utf-8", "replace").strip().splitlines()
    last = text[-1] if text else ""
    name = ERRORS.get(code, f"munge error {code}")
    return f"{name}: {last}" if last else name
