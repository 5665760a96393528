"""Opening the store: only writers create it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_pal.adapters.store import Store, StoreError


def test_open_without_create_refuses_a_missing_store_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "not" / "there" / "x.db"
    with pytest.raises(StoreError, match=r"no store at .*x\.db .*profile ingest"):
        Store(path, create=False)
    assert not (tmp_path / "not").exists()
    with Store(path) as store:  # a writer creates it, folders included
        assert store.campaigns() == []
    with Store(path, create=False) as store:  # and then readers open it
        assert store.schema_version > 0


@pytest.mark.parametrize(
    "command",
    [
        ["site", "render", "--out", "{tmp}/render"],
        ["site", "check"],
        ["campaign", "diff", "a", "b"],
        ["campaign", "activate", "x"],
        ["campaign", "suggest"],
    ],
)
def test_site_and_campaign_reads_leave_no_store_behind(run_cli, tmp_path: Path, command) -> None:
    """Commands that only read (or fail on an empty store) say so and create nothing."""
    db = tmp_path / "no" / "such" / "dir" / "x.db"
    args = [part.format(tmp=tmp_path) for part in command]
    result = run_cli("--db", str(db), *args, ok=False)
    assert result.exit_code != 0
    assert "no campaign" in result.output or "no active campaign" in result.output
    assert not (tmp_path / "no").exists()
