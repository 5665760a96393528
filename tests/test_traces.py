"""Trace readers: Sia-Philly CSV (PAL's reading) and sacct --parsable2 history."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_pal.adapters.traces import (
    TraceFormatError,
    load_trace,
    read_sacct,
    read_sia_trace,
    read_trace,
    sacct_gpus,
)
from slurm_pal.core.workload import PAL_ITERATION_TIME
from tests.helpers.data import SHARED_DATA, need_shared

SIA = SHARED_DATA / "traces" / "sia-philly"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_sia_duration_is_an_iteration_count(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "w.csv",
        "job_id,num_gpus,submit_time,duration,model\n0,1,98,1481.0,vgg19\n1,12,115,4037.0,DCGAN\n",
    )
    jobs = read_sia_trace(path)
    assert [j.job_id for j in jobs] == ["0", "1"]
    assert jobs[0].work == pytest.approx(1481.0 * 0.300610341)
    assert jobs[1].work == pytest.approx(4037.0 * 0.0469266931)
    assert [j.job_class for j in jobs] == ["C", "B"]
    assert jobs[1].gpus == 12 and jobs[1].submit_time == 115.0


def test_sia_tables_are_configurable(tmp_path: Path) -> None:
    path = write(tmp_path, "w.csv", "job_id,num_gpus,submit_time,duration,model\n0,1,0,10,yolo\n")
    with pytest.raises(TraceFormatError, match="line 2.*yolo"):
        read_sia_trace(path)
    jobs = read_sia_trace(
        path, iteration_time={"yolo": 2.0}, model_class={"yolo": "D"}, track=(1, 5)
    )
    assert (jobs[0].work, jobs[0].job_class, jobs[0].tracked) == (20.0, "D", False)
    assert jobs[0].known
    guessed = read_sia_trace(path, default_iteration_time=1.0, default_class="B")
    assert (guessed[0].job_class, guessed[0].known) == ("B", False)


def test_sia_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, "w.csv", "job_id,num_gpus,submit_time\n0,1,0\n")
    with pytest.raises(TraceFormatError, match="duration"):
        read_sia_trace(path)


def test_real_sia_workloads() -> None:
    need_shared(SIA / "workload-1.csv")
    jobs = read_sia_trace(SIA / "workload-1.csv")
    assert len(jobs) == 160
    assert max(j.gpus for j in jobs) == 24
    assert {j.model.lower() for j in jobs} <= set(PAL_ITERATION_TIME)


SACCT = """JobID|Submit|Start|End|AllocTRES|NNodes|JobName|User|State
101|2024-03-01T10:00:00|2024-03-01T10:05:00|2024-03-01T11:05:00|billing=8,cpu=8,gres/gpu=4,node=1|1|resnet|alice|COMPLETED
101.batch|2024-03-01T10:05:00|2024-03-01T10:05:00|2024-03-01T11:05:00|cpu=8,gres/gpu=4|1|batch||COMPLETED
102|2024-03-01T09:00:00|2024-03-01T09:00:00|2024-03-01T09:30:00|cpu=2,gres/gpu:v100=2,gres/gpu=2|1|bert|bob|COMPLETED
103|2024-03-01T09:10:00|2024-03-01T09:10:00|2024-03-01T09:20:00|cpu=2,mem=4G|1|cpu-only|bob|COMPLETED
104|2024-03-01T09:15:00|Unknown|Unknown||0|queued|bob|PENDING
105|2024-03-01T09:20:00|2024-03-01T09:25:00|Unknown|cpu=1,gres/gpu=1|1|running|bob|RUNNING
"""


def test_sacct_history(tmp_path: Path) -> None:
    path = write(tmp_path, "sacct.txt", SACCT)
    jobs = read_sacct(path, class_of={"resnet": "A"}, default_class="C")
    assert [j.job_id for j in jobs] == ["102", "101"]
    bert, resnet = jobs
    assert (bert.submit_time, bert.gpus, bert.work, bert.job_class) == (0.0, 2, 1800.0, "C")
    assert (resnet.submit_time, resnet.gpus, resnet.work, resnet.job_class) == (
        3600.0,
        4,
        3600.0,
        "A",
    )
    assert resnet.user == "alice" and resnet.name == "resnet"
    assert resnet.known and not bert.known  # bert's class is the reader's default
    assert read_trace(path)[0].job_id == "102"  # detected by the '|' header


def test_sacct_multi_node_history_already_paid_the_penalty(tmp_path: Path) -> None:
    text = (
        "JobID|Submit|Start|End|AllocTRES|NNodes|JobName|User\n"
        "7|2024-03-01T00:00:00|2024-03-01T00:00:00|2024-03-01T01:42:00|gres/gpu=8|2|big|bob\n"
        "8|2024-03-01T00:00:00|2024-03-01T00:00:00|2024-03-01T01:42:00|gres/gpu=4|1|one|bob\n"
    )
    path = write(tmp_path, "sacct.txt", text)
    big, one = read_sacct(path, spanned_penalty=1.7)
    assert big.work == pytest.approx(6120 / 1.7) and one.work == pytest.approx(6120)
    with pytest.raises(ValueError, match="spanned_penalty"):
        read_sacct(path, spanned_penalty=0.5)


def test_sacct_class_function_and_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "sacct.txt", SACCT)
    jobs = read_sacct(path, class_of=lambda name, user: "B" if user == "bob" else None)
    assert [j.job_class for j in jobs] == ["B", "A"]
    with pytest.raises(TraceFormatError, match="JobID"):
        read_sacct(write(tmp_path, "bad.txt", "a|b\n1|2\n"))
    empty = "JobID|Submit|Start|End|AllocTRES\n1|2024-01-01T00:00:00|Unknown|Unknown|cpu=1\n"
    with pytest.raises(TraceFormatError, match="no finished GPU jobs"):
        read_sacct(write(tmp_path, "none.txt", empty))


@pytest.mark.parametrize(
    ("tres", "gres", "gpus"),
    [
        ("cpu=8,gres/gpu=4,node=1", "", 4),
        ("gres/gpu:a100=2,gres/gpu:v100=1", "", 3),
        ("gres/gpu:v100=2,gres/gpu=2", "", 2),
        ("cpu=1", "gpu:v100:4(IDX:0-3)", 4),
        ("cpu=1", "gpu:2", 2),
        ("cpu=1", "", 0),
    ],
)
def test_sacct_gpu_counts(tres: str, gres: str, gpus: int) -> None:
    assert sacct_gpus(tres, gres) == gpus


def test_sacct_rows_left_out_are_counted_by_reason(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "sacct.txt", SACCT))
    assert [j.job_id for j in trace.jobs] == ["102", "101"]
    dropped = sum(trace.left_out.values())
    assert dropped > 0 and trace.left_out_text() == (
        f"left out {dropped} of {dropped + 2} jobs: "
        + ", ".join(f"{n} {why}" for why, n in trace.left_out.items())
    )
    assert trace.left_out.get("still running (no end time)") == 1
    need_shared(SIA / "workload-1.csv")
    assert load_trace(SIA / "workload-1.csv").left_out == {}


def test_sia_rows_that_cannot_be_replayed_name_their_line(tmp_path: Path) -> None:
    header = "job_id,num_gpus,submit_time,duration,model\n"
    path = write(tmp_path, "neg.csv", header + "1,1,0,10,bert\n2,1,0,0,bert\n")
    with pytest.raises(TraceFormatError, match=r"line 3: job 2: duration must be > 0"):
        read_sia_trace(path)
    with pytest.raises(ValueError, match="iteration times must be > 0"):
        read_sia_trace(path, iteration_time={"bert": -1.0})
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(TraceFormatError, match="not a text trace"):
        read_trace(binary)
