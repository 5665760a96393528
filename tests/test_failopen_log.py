"""The advisor's count of job_submit.lua's fail-open lines and its warning: a line names the job
by what finds it after the fact (Slurm numbers a job only after the plugin returns)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from slurm_pal.advisor.failopen import FailOpenLog, describe_line


def _local(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def test_a_line_becomes_the_job_its_user_and_an_sacct_command_that_finds_it() -> None:
    text = describe_line("1795819542\t1000\talice\ttrain run\tconnect /x.sock: No such file")
    when = _local(1795819542)
    assert text == (
        f"job 'train run' of alice (uid 1000) submitted {when}: connect /x.sock: No such file "
        f"(find it: sacct -X -u 1000 -S {when} --name 'train run')"
    )
    assert "1795819542" not in text  # an epoch is no id an admin can look up


def test_an_older_plugins_line_and_an_unreadable_one() -> None:
    assert describe_line("1795819542 receive: timeout") == (
        f"a job submitted {_local(1795819542)}: receive: timeout"
    )
    assert describe_line("something else") == "something else"
    assert describe_line("1795819542\t1000\talice\t\tno name").endswith(
        f"(find it: sacct -X -u 1000 -S {_local(1795819542)})"
    )


def test_new_lines_are_counted_and_the_warning_names_the_last_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "advisor.sock.failopen"
    counter = FailOpenLog(path)
    counter.prepare()
    with path.open("a") as fh:
        fh.write("1795819540\t1000\talice\tprep\tconnect: timeout\n")
        fh.write("1795819542\t1001\tbob\ttrain\treceive: closed\n")
    with caplog.at_level(logging.WARNING, logger="slurm_pal.advisor"):
        assert counter.poll() == 2
        assert counter.poll() == 0
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("job_submit.lua let 2 GPU job(s) through as written, unanswered")
    assert "job 'train' of bob (uid 1001)" in message and "sacct -X -u 1001" in message
