"""The service's Slurm reader parses in a worker process (adapters/slurm/state.py,
``parse_apart``); a worker that dies must cost one read's parse here, not the read. The real
commands are compared with the in-process reader on the real Slurm (tests/slurm)."""

from __future__ import annotations

import os

from slurm_pal.adapters.slurm.state import CliStateReader

PARENT = "SLURM_PAL_TEST_PARENT_PID"


def lines_where_parsed(text: str) -> tuple[str, bool]:
    """The command's output, and whether it was parsed in this test's own process."""
    return text.strip(), str(os.getpid()) == os.environ[PARENT]


def dies_in_the_worker(text: str) -> tuple[str, bool]:
    if str(os.getpid()) != os.environ[PARENT]:
        os._exit(3)  # the worker process dies mid-parse
    return lines_where_parsed(text)


def test_reads_are_parsed_in_the_worker_and_a_dead_worker_is_replaced(monkeypatch) -> None:
    monkeypatch.setenv(PARENT, str(os.getpid()))  # spawned workers inherit the environment
    reader = CliStateReader(dict(os.environ), parse_apart=True)
    try:
        assert reader._parsed(["echo", "n01"], lines_where_parsed) == ("n01", False)
        # the worker dies: this read is parsed here, and the next one in a new worker
        assert reader._parsed(["echo", "n02"], dies_in_the_worker) == ("n02", True)
        assert reader._parsed(["echo", "n03"], lines_where_parsed) == ("n03", False)
    finally:
        reader.close()


def test_a_reader_with_its_own_runner_parses_in_process() -> None:
    """Tests and tools that feed the reader themselves: nothing to run in a worker."""
    reader = CliStateReader({}, runner=lambda args: "n01\n", parse_apart=True)
    assert not reader.parse_apart
