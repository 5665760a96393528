"""Profiling campaigns through a real Slurm 22.05 (the testbed): plan -> submit -> collect ->
bins -> diff -> activate -> labels, plus a drained node and a failed task that is rerun.

Each node's GPUs are typed with the PM labels `site render` gives the example campaign, so
Slurm's GPU numbers differ from the device files on some nodes, as on a real site. There is
no NVML here: a "bring your own" benchmark stands in for the GPU. It checks that Slurm put it
where the runner says (node, array task = device minor, the whole node's GPUs), logs that,
and prints ``PAL_DURATION_S`` from a per-(node, GPU, class) table this test writes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurm_pal.adapters.store import Store
from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.testbed import LocalSlurm, NodeSpec
from tests.slurm.conftest import require_slurm
from tests.slurm.conftest import testbed_dir as fresh_testbed_dir

pytestmark = pytest.mark.slurm

NODES = ("n01", "n02", "n03", "n04")
GPUS = 4

# The GPU emulator: where am I (Slurm's variables), is that what the runner asked for, and
# how long does this GPU take for this class. Fails once where a `failonce-*` file says so.
EMU_BENCH = r"""#!/bin/sh
t="$EMU_TABLE"
here="$PAL_NODE-$PAL_GPU_INDEX-$PAL_CLASS"
echo "$here job=$SLURM_JOB_ID task=$SLURM_ARRAY_TASK_ID on=$SLURMD_NODENAME" \
  "gpus=$SLURM_JOB_GPUS cvd=$CUDA_VISIBLE_DEVICES" >> "$t/calls.log"
if [ "$SLURMD_NODENAME" != "$PAL_NODE" ] || [ "$SLURM_ARRAY_TASK_ID" != "$PAL_GPU_INDEX" ]; then
  echo "emulator: not pinned ($SLURMD_NODENAME task $SLURM_ARRAY_TASK_ID)" >&2; exit 9
fi
if [ -f "$t/failonce-$here" ]; then
  rm -f "$t/failonce-$here"; echo "emulated Xid 79 on $here" >&2; exit 5
fi
f="$t/$here"; [ -f "$f" ] || f="$t/default-$PAL_CLASS"
echo "PAL_DURATION_S=$(cat "$f")"
"""


@dataclass
class CampaignLab:
    tb: LocalSlurm
    db: Path
    root: Path  # campaign directories
    table: Path  # the emulator's durations
    bench: Path
    labels: dict  # labels.json of the render that typed the testbed's GPUs

    def cli(self, *args: object, ok: bool = True, db: Path | None = None):
        result = CliRunner().invoke(
            app,
            ["--db", str(db or self.db), *map(str, args)],
            env={
                "SLURM_PAL_CONFIG": None,
                "SLURM_CONF": str(self.tb.conf),
                "SLURM_PAL_CAMPAIGNS": str(self.root),
                "EMU_TABLE": str(self.table),
                "PATH": self.tb.env["PATH"],
            },
        )
        if ok and result.exit_code != 0:
            raise AssertionError(
                f"slurm-pal {' '.join(map(str, args))} exited {result.exit_code}:\n"
                f"{result.output}\n{result.exception!r}"
            )
        return result

    def durations(self, table: dict[str, float]) -> None:
        """``NODE-GPU-CLASS`` or ``default-CLASS`` -> seconds the emulated GPU reports."""
        for f in self.table.glob("*"):
            if f.name != "calls.log":
                f.unlink()
        for key, value in table.items():
            (self.table / key).write_text(f"{value}\n")

    def fail_once(self, key: str) -> None:
        (self.table / f"failonce-{key}").write_text("")

    def calls(self) -> list[dict[str, str]]:
        path = self.table / "calls.log"
        out = []
        for line in path.read_text().splitlines() if path.exists() else ():
            here, *fields = line.split()
            out.append({"here": here, **dict(f.split("=", 1) for f in fields)})
        return out

    def plan(self, cid: str, *extra: object, nodes: str = "n[01-04]", repeats: int = 2):
        return self.cli(
            "campaign", "plan", "--id", cid, "--nodes", nodes, "--gpus-per-node", GPUS,
            "--classes", "A,D", "--repeats", repeats, "--python", sys.executable,
            "--gpu-model", "v100", "--time", "00:05:00", "--run-timeout", 60,
            "--command", f"A=sh {self.bench}", "--command", f"D=sh {self.bench}", *extra,
        )  # fmt: skip


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CampaignLab]:
    require_slurm()
    work = tmp_path_factory.mktemp("campaign-slurm")
    render_db = work / "render.db"
    csv = work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=GPUS, node_prefix="n").to_csv(csv, index=False)
    runner = CliRunner()
    for args in (
        ["profile", "ingest", str(csv), "--campaign", "example"],
        ["site", "render", "--out", str(work / "site"), "--device-pattern", "/dev/tty{index}"],
    ):
        result = runner.invoke(app, ["--db", str(render_db), *args], env={"SLURM_PAL_CONFIG": None})
        assert result.exit_code == 0, result.output
    labels = json.loads((work / "site" / "labels.json").read_text())
    specs = []
    for node, gpus in labels["nodes"].items():
        by_index = {g["index"]: g["label"] for g in gpus}
        specs.append(NodeSpec(node, tuple(by_index[i] for i in sorted(by_index))))

    root = fresh_testbed_dir()  # the jobs run as root from slurmd: everything lives under it
    tb = LocalSlurm(root, specs)
    table = root / "table"
    table.mkdir()
    bench = root / "emu-bench.sh"
    bench.write_text(EMU_BENCH)
    try:
        tb.start()
        yield CampaignLab(tb, work / "store.db", root / "campaigns", table, bench, labels)
    finally:
        tb.stop()
        if not os.environ.get("SLURM_PAL_KEEP_TESTBED"):
            shutil.rmtree(root, ignore_errors=True)


def base_table(slow_a: set[str], slow_d: set[str] = frozenset()) -> dict[str, float]:
    """Class A 10 s (11 s on ``slow_a`` GPUs), class D 5 s (6 s on ``slow_d``)."""
    table = {"default-A": 10.0, "default-D": 5.0}
    table |= {f"{g}-A": 11.0 for g in slow_a}
    table |= {f"{g}-D": 6.0 for g in slow_d}
    return table


def as_json(result) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(result.stdout)


def text(result) -> str:  # type: ignore[no-untyped-def]
    return " ".join(result.output.split())


SLOW_A = {"n01-2", "n03-0", "n04-3"}
SLOW_D = {"n02-1"}


def test_full_cycle_pinned_tasks_bins_diff_activate_labels(lab: CampaignLab) -> None:
    lab.durations(base_table(SLOW_A, SLOW_D))
    planned = as_json(lab.plan("s1", "--json"))
    assert len(planned["plan"]["gpus"]) == 16
    out = lab.cli("campaign", "submit", "s1", "--wait", "--poll", "0.5", "--json")
    sub = as_json(out)
    assert [(s["node"], s["gpus"]) for s in sub["submitted"]] == [(n, [0, 1, 2, 3]) for n in NODES]
    assert sub["progress"]["done"] == 16, sub

    # Every task ran on its node, as its own array task, holding the whole node's GPUs.
    calls = lab.calls()
    assert len(calls) == 16 * 2 * 2
    jobs = {s["node"]: s["job_id"] for s in sub["submitted"]}
    for c in calls:
        node, gpu, _ = c["here"].split("-")
        assert (c["on"], c["task"], c["job"] != "") == (node, gpu, True)
        assert sorted(map(int, c["gpus"].split(","))) == list(range(GPUS))
    assert {c["here"].rsplit("-", 1)[0] for c in calls} == {
        f"{n}-{g}" for n in NODES for g in range(GPUS)
    }
    records = sorted((lab.root / "s1" / "results").glob("*.json"))
    assert len(records) == 64
    one = json.loads(records[0].read_text())
    assert one["slurm_job_id"].startswith(f"{jobs[one['node']]}_")
    # No NVML here: the GPU is named by its location, and that is flagged.
    assert (one["uuid"], one["uuid_source"]) == ("n01/gpu0", "assignment")
    assert any("NVML unavailable" in n for n in one["notes"])

    col = lab.cli("campaign", "collect", "s1", "--json")
    report = as_json(col)
    assert report["complete"] and report["ingested"]["rows"] == 64
    assert report["ingested"]["activated"]  # the first campaign of the store
    assert len(report["location_ids"]) == 16

    bins = as_json(lab.cli("profile", "bins", "--campaign", "s1", "--json"))
    with Store(lab.db) as store:
        scores = store.gpu_scores("s1")
    slow_in = {
        c: {f"{r.node}-{r.gpu_index}" for r in scores.itertuples() if r.job_class == c
            and r.pm_score > 1.0}
        for c in ("A", "D")
    }  # fmt: skip
    assert slow_in == {"A": SLOW_A, "D": SLOW_D}
    assert [(round(b["score"], 6), b["gpus"]) for b in bins["A"]["bins"]] == [(1.0, 13), (1.1, 3)]
    # One GPU 20 % slower among 16 is a > 3 sigma outlier: it keeps its own score.
    assert [(round(b["score"], 6), b["gpus"]) for b in bins["D"]["bins"]] == [(1.0, 15)]
    assert bins["D"]["outliers"] == [{"uuid": "n02/gpu1", "score": pytest.approx(1.2)}]

    # Second campaign: n03's GPU 1 got slower for class A. diff names it; activate switches.
    lab.durations(base_table(SLOW_A | {"n03-1"}, SLOW_D))
    lab.plan("s2")
    lab.cli("campaign", "submit", "s2", "--wait", "--poll", "0.5")
    lab.cli("campaign", "collect", "s2")
    diff = as_json(lab.cli("campaign", "diff", "s1", "s2", "--json"))
    assert [
        (c["uuid"], c["job_class"], c["old_bin"], c["new_bin"]) for c in diff["bin_changes"]
    ] == [("n03/gpu1", "A", "0", "1")]
    assert diff["restart_nodes"] == ["n03"]
    assert [(c["uuid"], c["old_label"], c["new_label"]) for c in diff["label_changes"]] == [
        ("n03/gpu1", "v100-a0d0", "v100-a1d0")
    ]
    out = lab.cli("campaign", "activate", "s2")
    assert "campaign s2 is now active (was s1)" in text(out)
    assert "restart needed on 1 node(s): n03" in text(out)

    # The labels Slurm would get now.
    site = lab.root / "site-s2"
    lab.cli("site", "render", "--out", site, "--device-pattern", "/dev/tty{index}")
    rendered = json.loads((site / "labels.json").read_text())
    slow = {
        f"{node}-{g['index']}"
        for node, gpus in rendered["nodes"].items()
        for g in gpus
        if g["label"].startswith("v100-a1")
    }
    assert slow == SLOW_A | {"n03-1"}


def test_drained_node_is_not_measured_and_a_failed_task_is_rerun(lab: CampaignLab) -> None:
    lab.durations(base_table(SLOW_A))
    lab.fail_once("n02-3-A")  # a GPU whose benchmark crashes once (an Xid, say)
    lab.tb.run(["scontrol", "update", "nodename=n04", "state=drain", "reason=test"])
    try:
        # Without --nodes/--gpus-per-node the plan asks Slurm, and says which node is drained.
        asked = as_json(lab.cli("campaign", "plan", "--id", "d0", "--partition", "debug",
                                "--classes", "A", "--json"))  # fmt: skip
        assert [(g["node"], g["gpu_index"]) for g in asked["plan"]["gpus"]] == [
            (n, g) for n in NODES for g in range(GPUS)
        ]
        [note] = [n for n in asked["notes"] if "n04" in n]
        assert "drain" in note and "(test)" in note and "--exclude" in note
        lab.plan("d1", repeats=1)
        out = lab.cli("campaign", "submit", "d1", "--wait", "--poll", "0.5")
        shown = text(out)
        assert "stopped waiting" in shown and "node(s) n04" in shown  # no hang
        status = as_json(lab.cli("campaign", "status", "d1", "--json"))
        states = {
            (t["node"], t["gpu_index"]): (t["state"], t["slurm_reason"]) for t in status["tasks"]
        }
        assert states[("n02", 3)] == ("failed", "")
        assert {states[("n04", g)][0] for g in range(GPUS)} == {"pending"}
        # The reason for a task pinned (--nodelist) to a drained node: 22.05 says
        # "ReqNodeNotAvail, UnavailableNodes:n04", 24.11 "ReqNodeNotAvail, May be reserved for
        # other job"; the campaign core goes by the first word (UNAVAILABLE_REASONS).
        (reason,) = {states[("n04", g)][1] for g in range(GPUS)}
        assert reason.startswith("ReqNodeNotAvail"), reason
        assert status["progress"] == dict(status["progress"], done=11, failed=1, pending=4)

        result = lab.cli("campaign", "collect", "d1", "--json", ok=False)
        assert result.exit_code == 1
        report = json.loads(result.stdout)
        assert report["missing_gpus"] == ["n02:3"] + [f"n04:{g}" for g in range(GPUS)]
        [failure] = report["failures"]
        assert (failure["node"], failure["gpu_index"], failure["exit_code"]) == ("n02", 3, 5)
        assert "emulated Xid 79" in failure["stderr_tail"]

        # Rerun while n04 is still drained: only the failed task goes to Slurm again.
        out = lab.cli("campaign", "submit", "d1", "--wait", "--poll", "0.5", "--json")
        sub = as_json(out)
        assert [(s["node"], s["gpus"]) for s in sub["submitted"]] == [("n02", [3])]
        assert sub["progress"] == dict(sub["progress"], done=12, failed=0, pending=4)
    finally:
        lab.tb.run(["scontrol", "update", "nodename=n04", "state=resume"])

    # The node is back: Slurm starts its queued tasks by itself; nothing is submitted twice.
    out = lab.cli("campaign", "submit", "d1", "--wait", "--poll", "0.5", "--json")
    sub = as_json(out)
    assert sub["submitted"] == [] and sub["progress"]["done"] == 16
    report = as_json(lab.cli("campaign", "collect", "d1", "--json"))
    assert report["complete"] and report["ingested"]["rows"] == 16 * 2
    with Store(lab.db) as store:
        rows = store.measurements("d1")
    assert len(rows) == 16 * 2 and not rows.duplicated(["uuid", "job_class"]).any()
    ran = [c["here"] for c in lab.calls() if c["here"].startswith("n02-3-A")]
    assert len(ran) >= 2  # failed, then rerun


def test_targeted_recheck_measures_one_gpu_while_holding_its_node(lab: CampaignLab) -> None:
    """What `campaign suggest` proposes: `plan --only`, one array task, the whole node held."""
    lab.durations(base_table(set()))
    before = len(lab.calls())
    lab.plan("r1", "--only", "n02:3", repeats=1)
    script = (lab.root / "r1" / "sbatch" / "n02.sbatch").read_text().splitlines()
    assert "#SBATCH --gres=gpu:4" in script and "#SBATCH --array=3" in script
    sub = as_json(lab.cli("campaign", "submit", "r1", "--wait", "--poll", "0.5", "--json"))
    assert [(s["node"], s["gpus"]) for s in sub["submitted"]] == [("n02", [3])]
    assert sub["progress"]["done"] == 1
    calls = lab.calls()[before:]
    assert [c["here"] for c in calls] == ["n02-3-A", "n02-3-D"]
    assert {c["gpus"] for c in calls} == {"0,1,2,3"} and {c["task"] for c in calls} == {"3"}
