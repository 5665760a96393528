"""A tiny client of the advisor's socket (stdlib only: the hooks import it and must start fast).

One request line out, one answer line back (PROTOCOL.md), all within one deadline. Anything
that is not a JSON object answer (no socket, refused, timeout, a closed connection, garbage)
raises :class:`AdvisorUnavailable`, so callers have one thing to catch and fail open on.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping

from slurm_pal.errors import SlurmPalError

__all__ = ["MAX_ANSWER", "AdvisorClient", "AdvisorUnavailable"]

MAX_ANSWER = 1 << 20


class AdvisorUnavailable(SlurmPalError):
    """The advisor could not be reached or gave no usable answer; the message says which."""


class AdvisorClient:
    """``AdvisorClient(path).request({"op": "health"}, 0.3)`` -> the answer object."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = str(socket_path)

    def request(self, message: Mapping[str, object], timeout_s: float = 1.0) -> dict:
        """Send ``message`` (``"v": 1`` added when missing) and return the decoded answer."""
        body = dict(message)
        body.setdefault("v", 1)
        deadline = time.monotonic() + timeout_s
        try:
            line = (json.dumps(body, separators=(",", ":")) + "\n").encode()
        except (TypeError, ValueError) as exc:
            raise AdvisorUnavailable(f"request is not JSON-able: {exc}") from None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(max(timeout_s, 0.001))
                sock.connect(self.socket_path)
                sock.sendall(line)
                data = b""
                while not data.endswith(b"\n"):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    sock.settimeout(left)
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                    if len(data) > MAX_ANSWER:
                        raise AdvisorUnavailable(f"answer longer than {MAX_ANSWER} bytes")
        except TimeoutError:
            raise AdvisorUnavailable(
                f"no answer from {self.socket_path} within {timeout_s * 1000:.0f} ms"
            ) from None
        except OSError as exc:
            raise AdvisorUnavailable(
                f"cannot reach the advisor at {self.socket_path}: {exc.strerror or exc}"
            ) from None
        if not data.endswith(b"\n"):
            raise AdvisorUnavailable(f"{self.socket_path} closed the connection mid-answer")
        try:
            answer = json.loads(data)
        except ValueError:
            raise AdvisorUnavailable(f"answer is not JSON: {data[:80]!r}") from None
        if not isinstance(answer, dict):
            raise AdvisorUnavailable(f"answer is not a JSON object: {data[:80]!r}")
        return answer
