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
