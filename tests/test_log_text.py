"""User text in the service's log: a job name cannot split, fake or reorder a log line."""

from __future__ import annotations

import io
import logging

import pytest

from slurm_pal.advisor.logtext import OneLineFormatter, escaped, quoted

FORGERIES = [
    "a\"b'c\nd\\e class=A token=x: forged",
    "line\rover",
    "\u202egnp.exe",  # right-to-left override
    "zero\u200bwidth\u2066isolate\u2069",
    "sep\u2028arator\u2029",
    "esc\x1b[31mred\x00nul\x7f\x85",
]


@pytest.mark.parametrize("name", FORGERIES)
def test_a_quoted_value_is_one_token_on_one_line(name: str) -> None:
    text = quoted(name)
    assert len(text.splitlines()) == 1 and text.isprintable()
    assert text.startswith('"') and text.endswith('"')
    assert '"' not in text[1:-1].replace('\\"', "")  # no quote ends the value early


def test_printable_text_is_kept_as_written() -> None:
    assert escaped("résumé-ü 日本 job_1") == "résumé-ü 日本 job_1"
    assert quoted("plain") == '"plain"'
    assert escaped("a\nb\u202e") == "a\\nb\\u202e"


def test_the_formatter_keeps_each_record_on_one_line_and_marks_traceback_lines() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("tests.log_text")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for name in FORGERIES:
            logger.warning("decide pass name=%s: %s", name, f"reason echoing {name}")
        try:
            raise ValueError("bad value\nWARNING slurm_pal.advisor: forged")
        except ValueError:
            logger.exception("op failed")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    records = [line for line in lines if not line.startswith("  | ")]
    assert len(records) == len(FORGERIES) + 1, lines
    assert all(
        line.startswith(("WARNING tests.log_text: ", "ERROR tests.log_text: ")) for line in records
    )
    assert all(line.isprintable() for line in lines)
    assert not any(line.startswith("WARNING slurm_pal") for line in lines)
