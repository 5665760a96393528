"""`slurm-pal tune`: a sweep whose best setting is known in advance."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from slurm_pal.cli.tune import merged_classes


def test_merged_classes_keep_the_most_sensitive() -> None:
    assert merged_classes(("A", "B", "C", "D"), 4) == ()
    assert merged_classes(("A", "B", "C", "D"), 2) == (("C", "B"), ("D", "B"))


def test_tune_json_lists_every_candidate_best_first(
    run_cli: Callable[..., object], tmp_path: Path
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,num_gpus,submit_time,duration,model\n"
        + "".join(f"{i},{(1, 2, 4, 6)[i % 4]},{i * 60},{2000 + 300 * i},vgg19\n" for i in range(24))
    )
    result = run_cli(
        "tune",
        "--trace",
        trace,
        "--cluster",
        "4x4",
        "--penalties",
        "1.0,2.0",
        "--class-counts",
        "4,2",
        "--workers",
        "1",
        "--json",
    )
    report = json.loads(result.output)
    candidates = report["candidates"]
    assert len(candidates) == 2 * 2 * 2  # placements x class counts x penalties
    jcts = [c["avg_jct"] for c in candidates]
    assert jcts == sorted(jcts)
    assert report["recommended"] == candidates[0]
    assert report["baseline"]["placement"] == "packed-sticky"


def test_tune_table(run_cli: Callable[..., object]) -> None:
    result = run_cli(
        "tune",
        "--poisson",
        "20",
        "--load",
        "30",
        "--cluster",
        "2x4",
        "--penalties",
        "1.5",
        "--placement",
        "pal",
        "--workers",
        "1",
    )
    assert "recommended: placement pal" in result.output


def test_tune_sweeps_the_default_class_of_unidentified_jobs(
    run_cli: Callable[..., object],
) -> None:
    result = run_cli(
        "tune",
        "--poisson",
        "20",
        "--load",
        "30",
        "--cluster",
        "2x4",
        "--penalties",
        "1.7",
        "--placement",
        "pal",
        "--default-classes",
        "A,D",
        "--unknown-share",
        "0.5",
        "--workers",
        "1",
        "--json",
    )
    report = json.loads(result.output)
    assert sorted(c["default_class"] for c in report["candidates"]) == ["A", "D"]
    bad = run_cli("tune", "--poisson", "5", "--default-classes", "Z", ok=False)
    assert bad.exit_code == 2 and "unknown default class" in bad.output
