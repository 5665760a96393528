"""Reading campaign CSVs: format detection, the Longhorn files, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_pal.adapters.campaign_csv import CampaignFormatError, read_campaign_csv
from tests.helpers.data import LONGHORN_FILES

NATIVE = "uuid,node,gpu_index,gpu_model,job_class,duration_s\n"


def write(tmp_path: Path, text: str, name: str = "c.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_native_format(tmp_path: Path) -> None:
    path = write(tmp_path, NATIVE + "GPU-1,n01,0,A100,A,1.5\nGPU-1,n01,0,A100,A,1.6\n")
    f = read_campaign_csv(path)
    assert f.fmt == "slurm-pal"
    assert list(f.rows["duration"]) == [1.5, 1.6]
    assert list(f.rows["gpu_model"]) == ["a100", "a100"]
    assert list(f.rows["source_line"]) == [2, 3]
    assert len(f.sha256) == 64


def test_bom_crlf_and_spaces_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffuuid, duration_s\r\nGPU-1, 2.0\r\n".encode())
    assert read_campaign_csv(path, job_class="A").rows["duration"].tolist() == [2.0]


def test_longhorn_files_are_detected_and_located(longhorn: Path) -> None:
    resnet = read_campaign_csv(longhorn / LONGHORN_FILES["A"], job_class="A", gpu_model="V100")
    assert resnet.fmt == "longhorn"
    assert resnet.rows["uuid"].nunique() == 336
    first = resnet.rows.iloc[0]
    assert first["uuid"] == "c002-4-1" and first["node"] == "c002-4" and first["gpu_index"] == 1
    assert set(resnet.rows["gpu_model"]) == {"v100"}
    sgemm = read_campaign_csv(longhorn / LONGHORN_FILES["S"], job_class="S")
    # sgemm's dev_id is a CUDA ordinal (always 0), not a physical index: no index is claimed.
    assert sgemm.rows["gpu_index"].isna().all()
    assert (sgemm.rows["node"] == "").any() and (sgemm.rows["node"] != "").any()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("uuid,duration_s\n", "no data rows"),
        ("uuid,node,seconds\nGPU-1,n1,3\n", "no duration column.*duration_s.*perf"),
        ("uuid,duration_s\nGPU-1,1.0\nGPU-2,fast\n", "line 3.*'duration_s'.*'fast'"),
        ("uuid,duration_s\nGPU-1,\n", "line 2.*'duration_s'.*empty"),
        ("uuid,duration_s\nGPU-1,-2\n", "line 2.*positive"),
        ("uuid,duration_s,gpu_index\nGPU-1,1,0.5\n", "line 2.*whole numbers"),
        ("uuid,duration_s\n,1.0\n", "line 2.*empty 'uuid'"),
        ("duration_s\n1.0\n", "needs a 'uuid'"),
    ],
)
def test_bad_files_get_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(CampaignFormatError, match=message) as info:
        read_campaign_csv(path, job_class="A")
    assert str(path) in str(info.value)


def test_missing_class_and_class_clash(tmp_path: Path) -> None:
    path = write(tmp_path, "uuid,duration_s\nGPU-1,1.0\n")
    with pytest.raises(CampaignFormatError, match="pass --class"):
        read_campaign_csv(path)
    path = write(tmp_path, NATIVE + "GPU-1,n01,0,a100,B,1.5\n", "b.csv")
    with pytest.raises(CampaignFormatError, match="line 2.*'B'.*--class is 'A'"):
        read_campaign_csv(path, job_class="A")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(CampaignFormatError, match="cannot read"):
        read_campaign_csv(tmp_path / "missing.csv", job_class="A")
