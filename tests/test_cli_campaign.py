"""`slurm-pal campaign` end to end, with fake sbatch/squeue that run the tasks for real.

The fake ``sbatch`` reads the rendered batch script (``--nodelist``, ``--gres``, the
``--array`` it is given), then runs the script once per array task with the variables Slurm
sets (SLURM_ARRAY_TASK_ID, SLURMD_NODENAME, SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES), so the
real runner measures with a fake benchmark (a shell snippet per GPU and class). A node listed
in FAKE_DRAINED keeps its tasks PENDING in the fake queue, as Slurm does for a drained node,
until ``sbatch --fake-release`` runs them. Real Slurm is the testbed session's job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from slurm_pal.cli.campaign import RESTART_ADVICE
from tests.helpers.campaign_bench import FAKE_BENCH, write_bench_table

FAKE_SBATCH = r"""
import json, os, subprocess, sys
from pathlib import Path

state = Path(os.environ["FAKE_SLURM_DIR"])
queue_file = state / "queue.json"
queue = json.loads(queue_file.read_text()) if queue_file.exists() else []
drained = set(filter(None, os.environ.get("FAKE_DRAINED", "").split(",")))


def run(script, node, gpus, job, task):
    env = dict(os.environ, SLURM_JOB_ID=str(job), SLURM_ARRAY_JOB_ID=str(job),
               SLURM_ARRAY_TASK_ID=str(task), SLURMD_NODENAME=node,
               SLURM_JOB_GPUS=",".join(map(str, range(gpus))),
               CUDA_VISIBLE_DEVICES=",".join(map(str, range(gpus))))
    with open(state / "task-output.log", "a") as log:
        subprocess.run(["bash", script], env=env, stdout=log, stderr=log)


if sys.argv[1:] == ["--fake-release"]:
    for item in [q for q in queue if q["node"] not in drained]:
        run(item["script"], item["node"], item["gpus"], item["job"], item["task"])
        queue.remove(item)
    queue_file.write_text(json.dumps(queue))
    sys.exit(0)

args = sys.argv[1:]
array = next(a.split("=", 1)[1] for a in args if a.startswith("--array="))
script = args[-1]
opts = {}
for line in Path(script).read_text().splitlines():
    if line.startswith("#SBATCH --"):
        key, _, value = line[len("#SBATCH --"):].partition("=")
        opts[key] = value
node, name = opts["nodelist"], opts["job-name"]
gpus = int(opts["gres"].rsplit(":", 1)[1])
counter = state / "next_id"
job = int(counter.read_text()) if counter.exists() else 100
counter.write_text(str(job + 1))
with open(state / "calls.jsonl", "a") as fh:
    fh.write(json.dumps({"node": node, "array": array, "job": job, "args": args}) + "\n")
for task in array.split(","):
    if node in drained:
        queue.append({"id": f"{job}_{task}", "name": name, "node": node, "gpus": gpus,
                      "job": job, "task": int(task), "script": script, "state": "PENDING",
                      "reason": f"ReqNodeNotAvail, UnavailableNodes:{node}"})
    else:
        run(script, node, gpus, job, int(task))
queue_file.write_text(json.dumps(queue))
print(job)
"""

FAKE_SQUEUE = r"""
import json, os, sys
from pathlib import Path

queue_file = Path(os.environ["FAKE_SLURM_DIR"]) / "queue.json"
queue = json.loads(queue_file.read_text()) if queue_file.exists() else []
names = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--name=")).split(",")
for item in queue:
    if item["name"] in names:
        print(f"{item['id']}|{item['state']}|{item['reason']}")
"""

FAKE_SINFO = r"""
import os, sys
drained = set(filter(None, os.environ.get("FAKE_DRAINED", "").split(",")))
nodes = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--nodes=")).split(",")
for node in nodes:
    print(f"{node}|{'drained' if node in drained else 'idle'}")
"""


class FakeCluster:
    """Fake Slurm tools on PATH plus a fake benchmark whose durations the test sets."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state = root / "slurm"
        self.bench_dir = root / "bench-table"
        bin_dir = root / "bin"
        for d in (self.state, self.bench_dir, bin_dir):
            d.mkdir(parents=True)
        for name, code in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE), ("sinfo", FAKE_SINFO)):
            path = bin_dir / name
            path.write_text(f"#!{sys.executable} -S\n{code}")  # -S: stdlib only, starts faster
            path.chmod(0o755)
        self.bench = root / "fakebench.sh"
        self.bench.write_text(FAKE_BENCH)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_SLURM_DIR", str(self.state))
        monkeypatch.setenv("FAKE_BENCH_DIR", str(self.bench_dir))
        monkeypatch.setenv("SLURM_PAL_CAMPAIGNS", str(root / "campaigns"))
        self.monkeypatch = monkeypatch

    def durations(self, table: Mapping[str, list[float] | int]) -> None:
        """``NODE-GPU-CLASS`` or ``default-CLASS`` -> durations per repeat, or an exit code."""
        write_bench_table(self.bench_dir, dict(table))

    def drain(self, *nodes: str) -> None:
        self.monkeypatch.setenv("FAKE_DRAINED", ",".join(nodes))

    def release(self) -> None:
        """Undrain every node: Slurm starts the tasks that waited for it."""
        self.drain()
        subprocess.run(["sbatch", "--fake-release"], check=True)  # the fake on PATH

    def calls(self) -> list[dict]:
        path = self.state / "calls.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    return FakeCluster(tmp_path, monkeypatch)


def plan(run_cli: Callable, cluster: FakeCluster, cid: str, nodes: str, gpus: int, repeats: int):
    return run_cli(
        "campaign", "plan", "--id", cid, "--nodes", nodes, "--gpus-per-node", gpus,
        "--classes", "A,D", "--repeats", repeats, "--python", f"{sys.executable} -S",
        "--gpu-model", "v100", "--partition", "gpu",
        "--command", f"A=sh {cluster.bench}", "--command", f"D=sh {cluster.bench}",
    )  # fmt: skip


def as_json(result) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(result.stdout)


def text(result) -> str:  # type: ignore[no-untyped-def]
    """Output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def test_plan_renders_one_pinned_array_per_node(run_cli: Callable, tmp_path: Path) -> None:
    root = tmp_path / "camps"
    out = run_cli(
        "campaign", "plan", "--id", "p1", "--nodes", "gpu[01-02]", "--gpus-per-node", "4",
        "--partition", "batch", "--root", root, "--sbatch-arg", "--account=ops",
        "--command", "A=python3 /apps/train.py --steps 50", "--json",
    )  # fmt: skip
    data = as_json(out)
    assert data["directory"] == str(root / "p1")
    benches = data["plan"]["benchmarks"]
    assert benches["A"] == {
        "name": "custom:train.py",
        "command": "python3 /apps/train.py --steps 50",
    }
    assert benches["B"]["name"] == "gemm" and benches["D"]["name"] == "stream"
    assert data["notes"]  # B/C share a default benchmark with A/D: said so
    script = (root / "p1" / "sbatch" / "gpu02.sbatch").read_text()
    for line in (
        "#SBATCH --nodelist=gpu02",
        "#SBATCH --exclusive",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --array=0,1,2,3",
        "#SBATCH --partition=batch",
        "#SBATCH --account=ops",
        "#SBATCH --job-name=pal-p1-gpu02",
    ):
        assert line in script.splitlines()
    assert f"--plan {root / 'p1' / 'campaign.json'} --node gpu02" in script
    for name in ("runner.py", "bench/gemm.py", "bench/stream.py"):
        assert (root / "p1" / name).is_file()

    again = run_cli("campaign", "plan", "--id", "p1", "--nodes", "x", "--gpus-per-node", "1",
                    "--root", root, ok=False)  # fmt: skip
    assert again.exit_code == 2 and "already exists" in again.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "n1"], "cannot read the nodes from Slurm"),
        (["--nodes", "n1"], "give them with --nodes HOSTLIST --gpus-per-node N"),
        (["--gpus-per-node", "2"], "--gpus-per-node needs --nodes"),
        (["--nodes", "n1", "--gpus-per-node", "2", "--classes", "A,Q"], "unknown class(es) Q"),
        (["--nodes", "n1", "--gpus-per-node", "2", "--command", "A"], "CLASS=COMMAND"),
        (["--nodes", "n1", "--gpus-per-node", "2", "--classes", "A", "--command", "D=x"], "D"),
        (["--nodes", "n[1-", "--gpus-per-node", "2"], "hostlist"),
        (["--nodes", "n1", "--gpus-per-node", "2", "--id", "a/b"], "campaign id"),
    ],
)
def test_plan_errors_say_what_to_do(
    run_cli: Callable,
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # no Slurm to ask
    result = run_cli("campaign", "plan", *args, ok=False)
    assert result.exit_code == 2
    assert message in result.output


def fast_slow(cluster: FakeCluster, slow: set[str], outlier: str | None = None) -> None:
    """Class A: 10 s, 11 s on ``slow`` GPUs, 30 s on ``outlier``; class D: 5 s everywhere."""
    table: dict[str, list[float] | int] = {"default-A": [10.0, 10.0], "default-D": [5.0, 5.0]}
    table |= {f"{g}-A": [11.0, 11.0] for g in slow}
    if outlier:
        table[f"{outlier}-A"] = [30.0, 30.0]
    cluster.durations(table)


def test_campaigns_to_bins_diff_and_activate(
    run_cli: Callable, cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 GPUs keep the test fast; at 8 GPUs a 3-sigma outlier is impossible, so use 2 sigma.
    config = tmp_path / "site.toml"
    config.write_text("[binning]\noutlier_sigma = 2.0\n")
    monkeypatch.setenv("SLURM_PAL_CONFIG", str(config))
    fast_slow(cluster, {"n1-3", "n2-3"})
    plan(run_cli, cluster, "c1", "n[1-2]", 4, 2)
    sub = as_json(run_cli("campaign", "submit", "c1", "--json"))
    assert [(s["node"], s["gpus"]) for s in sub["submitted"]] == [
        ("n1", [0, 1, 2, 3]),
        ("n2", [0, 1, 2, 3]),
    ]
    assert sub["progress"]["done"] == 8
    out = run_cli("campaign", "collect", "c1")
    assert "ingested 32 runs into store campaign c1 (now active)" in text(out)
    # No NVML here: the GPUs are named by location, and collect says what that costs.
    assert "8 GPU(s) have no NVML UUID" in text(out) and "n1/gpu0, n1/gpu1" in text(out)
    # ... nor clock-event readings: whether the GPUs slowed down is unknown, not "none".
    assert "32 run(s) on 8 GPU(s) have no clock-event readings" in text(out)
    bins = as_json(run_cli("profile", "bins", "--campaign", "c1", "--json"))
    assert bins["A"]["k"] == 2
    assert [(round(b["score"], 6), b["gpus"]) for b in bins["A"]["bins"]] == [(1.0, 6), (1.1, 2)]
    assert bins["A"]["outliers"] == []
    assert [(b["score"], b["gpus"]) for b in bins["D"]["bins"]] == [(1.0, 8)]
    labels = as_json(run_cli("profile", "labels", "--campaign", "c1", "--json"))["labels"]
    assert {(r["label"], r["gpus"]) for r in labels} == {("v100-a0d0", 6), ("v100-a1d0", 2)}
    shown = as_json(run_cli("profile", "show", "n2/gpu3", "--campaign", "c1", "--json"))
    assert (shown["node"], shown["gpu_index"], shown["label"]) == ("n2", 3, "v100-a1d0")
    assert shown["classes"]["A"]["raw_median"] == 11.0

    # Second campaign: n1 GPU 0 throttles (outlier), n2 GPU 3 got fixed (now fast).
    fast_slow(cluster, {"n1-3"}, outlier="n1-0")
    plan(run_cli, cluster, "c2", "n[1-2]", 4, 2)
    run_cli("campaign", "submit", "c2")
    out = run_cli("campaign", "collect", "c2")
    assert "slurm-pal campaign diff c1 c2" in text(out)  # not activated by itself
    diff = as_json(run_cli("campaign", "diff", "c1", "c2", "--json"))
    assert [
        (c["uuid"], c["job_class"], c["old_bin"], c["new_bin"]) for c in diff["bin_changes"]
    ] == [
        ("n1/gpu0", "A", "0", "outlier"),
        ("n2/gpu3", "A", "1", "0"),
    ]
    assert [c["uuid"] for c in diff["new_outliers"]] == ["n1/gpu0"]
    assert [(c["uuid"], c["old_label"], c["new_label"]) for c in diff["label_changes"]] == [
        ("n1/gpu0", "v100-a0d0", "v100-ax0d0"),
        ("n2/gpu3", "v100-a1d0", "v100-a0d0"),
    ]
    assert diff["restart_nodes"] == ["n1", "n2"]
    assert [diff["clock_events"][c]["status"] for c in ("old", "new")] == ["unknown", "unknown"]
    assert diff["clock_events"]["new"]["unknown_runs"] == 32
    shown = text(run_cli("campaign", "diff", "c1", "c2"))
    assert "hardware-ticket candidates" in shown and "restart needed on 2 node(s): n1, n2" in shown
    assert "slowdowns in c2: unknown" in shown and "hit thermal" not in shown

    out = run_cli("campaign", "activate", "c2")
    assert "campaign c2 is now active (was c1)" in text(out)
    assert "n1, n2" in text(out) and RESTART_ADVICE in text(out)
    listed = as_json(run_cli("profile", "campaigns", "--json"))
    assert [(c["id"], c["active"]) for c in listed] == [("c1", False), ("c2", True)]


def test_failed_task_drained_node_and_rerun_without_duplicates(
    run_cli: Callable, cluster: FakeCluster
) -> None:
    table: dict[str, list[float] | int] = {
        "default-A": [10.0, 10.0],
        "default-D": [5.0, 5.0],
        "n1-1-A": 5,  # this GPU's class-A runs crash
        "n3-0-A": [10.0, 12.0],  # throttles in one of its two runs
    }
    cluster.durations(table)
    cluster.drain("n2")
    plan(run_cli, cluster, "f1", "n[1-3]", 2, 2)
    sub = as_json(run_cli("campaign", "submit", "f1", "--json"))
    states = {(t["node"], t["gpu_index"]): t["state"] for t in sub["tasks"]}
    assert states == {
        ("n1", 0): "done",
        ("n1", 1): "failed",
        ("n2", 0): "pending",
        ("n2", 1): "pending",
        ("n3", 0): "done",
        ("n3", 1): "done",
    }
    status = run_cli("campaign", "status", "f1")
    assert "3 done, 1 failed, 2 pending" in text(status)
    assert "ReqNodeNotAvail" in text(status)

    # Nothing is ingested while GPUs are missing.
    result = run_cli("campaign", "collect", "f1", "--json", ok=False)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["missing_gpus"] == ["n1:1", "n2:0", "n2:1"]
    assert [
        (f["node"], f["gpu_index"], f["job_class"], f["exit_code"]) for f in report["failures"]
    ] == [
        ("n1", 1, "A", 5),
        ("n1", 1, "A", 5),
    ]
    assert "Xid 79" in report["failures"][0]["stderr_tail"]
    [dis] = report["disagreements"]
    assert (dis["node"], dis["gpu_index"], dis["job_class"]) == ("n3", 0, "A")
    assert dis["ratio"] == pytest.approx(1.2)
    assert "ingested" not in report
    assert "--allow-missing" in result.output
    assert as_json(run_cli("profile", "campaigns", "--json")) == []

    # Resubmitting while n2 is still drained sends only the failed task, never n2 twice.
    run_cli("campaign", "submit", "f1")
    assert [(c["node"], c["array"]) for c in cluster.calls()][-1] == ("n1", "1")
    assert len(cluster.calls()) == 4

    # What there is can go in under another id, for a look.
    out = run_cli("campaign", "collect", "f1", "--allow-missing", "--as", "f1-partial")
    assert "ingested 14 runs" in text(out)  # n1:0, n3:0, n3:1 x 2 classes x 2, n1:1 D x 2

    # The admin fixes the GPU and resumes n2: Slurm runs the queued tasks; a rerun of the
    # failed task (which failed again above) finishes the campaign.
    table["n1-1-A"] = [10.0, 10.0]
    cluster.durations(table)
    cluster.release()
    out = run_cli("campaign", "submit", "f1")
    assert "submitted node n1 GPUs 1 as job 104" in text(out) and "all 6 tasks done" in text(out)
    assert "nothing to submit" in text(run_cli("campaign", "submit", "f1"))
    out = run_cli("campaign", "collect", "f1")
    assert "ingested 24 runs into store campaign f1" in text(out)
    assert "repeats disagree" in text(out)  # still a finding
    listed = {c["id"]: c for c in as_json(run_cli("profile", "campaigns", "--json"))}
    assert listed["f1"]["measurements"] == 24  # 6 GPUs x 2 classes x 2 runs, no duplicates

    # Collecting the same records again adds nothing.
    out = run_cli("campaign", "collect", "f1")
    assert "nothing to do" in text(out)
    # A task rerun with new results must go in as a new version, not on top of the old rows.
    table["n3-0-A"] = [10.0, 10.0]
    cluster.durations(table)
    (Path(os.environ["SLURM_PAL_CAMPAIGNS"]) / "f1" / "results" / "n3__gpu0__A__r1.json").unlink()
    run_cli("campaign", "submit", "f1")
    assert [(c["node"], c["array"]) for c in cluster.calls()][-1] == ("n3", "0")
    result = run_cli("campaign", "collect", "f1", ok=False)
    assert result.exit_code == 2 and "--as f1-v2" in result.output
    out = run_cli("campaign", "collect", "f1", "--as", "f1-v2")
    assert "ingested 24 runs" in text(out) and "disagree" not in text(out)
    listed = {c["id"]: c for c in as_json(run_cli("profile", "campaigns", "--json"))}
    assert (listed["f1"]["measurements"], listed["f1-v2"]["measurements"]) == (24, 24)
    results = list((Path(os.environ["SLURM_PAL_CAMPAIGNS"]) / "f1" / "results").glob("*.json"))
    assert len(results) == 24


def test_wait_stops_when_only_drained_nodes_are_left(
    run_cli: Callable, cluster: FakeCluster
) -> None:
    cluster.durations({"default": [1.0]})
    cluster.drain("n2")
    plan(run_cli, cluster, "w1", "n[1-2]", 1, 1)
    result = run_cli("campaign", "submit", "w1", "--wait", "--poll", "0")
    shown = text(result)
    assert "stopped waiting" in shown and "node(s) n2" in shown and "--allow-missing" in shown
    assert "1 done, 1 pending" in shown


def test_bad_record_files_block_collect_and_are_named(
    run_cli: Callable, cluster: FakeCluster
) -> None:
    cluster.durations({"default": [1.0]})
    plan(run_cli, cluster, "b1", "n[1-3]", 1, 1)
    run_cli("campaign", "submit", "b1")
    results = Path(os.environ["SLURM_PAL_CAMPAIGNS"]) / "b1" / "results"
    (results / "n2__gpu0__A__r0.json").write_text("{half a rec")
    other = json.loads((results / "n3__gpu0__D__r0.json").read_text()) | {"campaign": "zz"}
    (results / "n3__gpu0__D__r0.json").write_text(json.dumps(other))
    result = run_cli("campaign", "collect", "b1", "--json", ok=False)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["missing_gpus"] == ["n2:0", "n3:0"]
    assert [p.split(":")[0] for p in report["record_problems"]] == [
        "n2__gpu0__A__r0.json",
        "n3__gpu0__D__r0.json",
    ]
    assert "unreadable" in report["record_problems"][0]
    assert "belongs to campaign 'zz'" in report["record_problems"][1]
    assert "2 GPU(s) missing" in text(result)
    out = run_cli("campaign", "collect", "b1", "--allow-missing")
    assert "ingested 4 runs" in text(out)  # n1: A+D, n2: D, n3: A
    status = text(run_cli("campaign", "status", "b1"))
    assert "1 done, 2 incomplete" in status


def test_plan_exclude_leaves_nodes_out(run_cli: Callable, tmp_path: Path) -> None:
    root = tmp_path / "r"
    out = run_cli("campaign", "plan", "--id", "e1", "--nodes", "n[1-4]", "--gpus-per-node", "1",
                  "--exclude", "n[2-3]", "--root", root, "--json")  # fmt: skip
    assert [g["node"] for g in as_json(out)["plan"]["gpus"]] == ["n1", "n4"]
    assert sorted(p.name for p in (root / "e1" / "sbatch").iterdir()) == [
        "n1.sbatch",
        "n4.sbatch",
    ]
    result = run_cli("campaign", "plan", "--id", "e2", "--nodes", "n1", "--gpus-per-node", "1",
                     "--exclude", "n1", "--root", root, ok=False)  # fmt: skip
    assert result.exit_code == 2 and "leaves no node" in result.output


def test_unknown_campaign_and_missing_slurm(run_cli: Callable, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_PAL_CAMPAIGNS", str(tmp_path / "none"))
    result = run_cli("campaign", "collect", "nope", ok=False)
    assert result.exit_code == 2 and "no campaign 'nope'" in result.output
    run_cli("campaign", "plan", "--id", "s1", "--nodes", "n1", "--gpus-per-node", "1")
    result = run_cli("campaign", "submit", "s1", "--sbatch", str(tmp_path / "no-sbatch"), ok=False)
    assert result.exit_code == 2 and "not found" in result.output
    dry = as_json(run_cli("campaign", "submit", "s1", "--dry-run", "--json"))
    assert dry["submitted"] == [{"node": "n1", "job_id": "-", "gpus": [0]}]


def test_status_without_squeue_warns_but_submit_refuses(
    run_cli: Callable, cluster: FakeCluster, tmp_path: Path
) -> None:
    cluster.durations({"default": [1.0]})
    cluster.drain("n1")
    plan(run_cli, cluster, "q1", "n1", 1, 1)
    run_cli("campaign", "submit", "q1")
    missing = str(tmp_path / "no-squeue")
    status = run_cli("campaign", "status", "q1", "--squeue", missing)
    assert "Slurm queue unknown" in text(status) and "1 incomplete" in text(status)
    result = run_cli("campaign", "submit", "q1", "--squeue", missing, ok=False)
    assert result.exit_code == 2 and "not found" in result.output
    assert len(cluster.calls()) == 1  # the queued task was not submitted twice


# -- [campaign] settings ---------------------------------------------------------------------

SETTINGS_TOML = """
[campaign]
root = "ROOT"
partition = "maint"
repeats = 2
time_limit = "00:20:00"
run_timeout_s = 600
python = "/opt/py/bin/python3"
sbatch_args = ["--reservation=pal"]
tolerance = 0.1
drift_threshold = 0.04
drift_min_runs = 8

[campaign.commands]
A = "{python} /apps/resnet/bench.py"
"""


def test_campaign_settings_from_toml() -> None:
    import tomllib

    from slurm_pal.campaigns.settings import CampaignSettings, load_campaign_settings

    table = tomllib.loads(SETTINGS_TOML)["campaign"]
    got = load_campaign_settings(table, "site.toml", ("A", "B", "C", "D"))
    assert got == CampaignSettings(
        root="ROOT",
        partition="maint",
        repeats=2,
        time_limit="00:20:00",
        run_timeout_s=600.0,
        python="/opt/py/bin/python3",
        sbatch_args=("--reservation=pal",),
        commands=(("A", "{python} /apps/resnet/bench.py"),),
        tolerance=0.1,
        drift_threshold=0.04,
        drift_min_runs=8,
    )
    assert got.command_map == {"A": "{python} /apps/resnet/bench.py"}
    assert load_campaign_settings({}, "x", ("A",)) == CampaignSettings()
    hash(got)  # frozen and hashable, like the rest of the site config


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"repeat": 3}, "unknown key 'campaign.repeat'; valid keys here: commands, "),
        ({"repeats": 0}, "'campaign.repeats' must be a whole number >= 1, got 0"),
        ({"repeats": True}, "'campaign.repeats' must be a whole number"),
        ({"time_limit": "1h"}, "'campaign.time_limit' is '1h'; valid: a Slurm time limit"),
        ({"run_timeout_s": 0}, "'campaign.run_timeout_s' must be a number > 0"),
        ({"tolerance": -1}, "'campaign.tolerance' must be a number >= 0"),
        ({"partition": ""}, "'campaign.partition' must be a non-empty string"),
        ({"sbatch_args": "--x"}, "'campaign.sbatch_args' must be a list of non-empty strings"),
        ({"commands": {"Q": "x"}}, "'campaign.commands.Q': unknown class; valid classes: A, D"),
        ({"commands": {"A": " "}}, "'campaign.commands.A' must be a shell command printing"),
        ({"commands": "x"}, "'campaign.commands' must be a table"),
    ],
)
def test_campaign_settings_errors_name_file_key_and_valid_values(table: dict, message: str) -> None:
    from slurm_pal.campaigns.settings import CampaignSettingsError, load_campaign_settings

    with pytest.raises(CampaignSettingsError) as err:
        load_campaign_settings(table, "/etc/slurm-pal.toml", ("A", "D"))
    assert str(err.value).startswith("/etc/slurm-pal.toml: ")
    assert message in str(err.value)


@pytest.mark.parametrize("limit", ["30", "30:00", "01:00:00", "2-00", "1-12:00:00", "UNLIMITED"])
def test_campaign_settings_take_slurm_time_formats(limit: str) -> None:
    from slurm_pal.campaigns.settings import load_campaign_settings

    assert load_campaign_settings({"time_limit": limit}, "x", ("A",)).time_limit == limit


def test_plan_and_collect_use_the_campaign_settings(
    run_cli: Callable, cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What [campaign] gives (until config.py carries it, through the CLI's seam)."""
    import tomllib

    from slurm_pal.campaigns.settings import load_campaign_settings
    from slurm_pal.cli import campaign as campaign_cli

    root = tmp_path / "configured-root"
    text_ = SETTINGS_TOML.replace("ROOT", str(root))
    text_ = text_.replace("{python} /apps/resnet/bench.py", f"sh {cluster.bench}")
    settings = load_campaign_settings(tomllib.loads(text_)["campaign"], "t.toml", "ABCD")
    monkeypatch.setattr(campaign_cli, "site_campaign_settings", lambda st: settings)
    monkeypatch.delenv("SLURM_PAL_CAMPAIGNS")  # the env var would outrank campaign.root
    out = run_cli("campaign", "plan", "--id", "k1", "--nodes", "n1", "--gpus-per-node", "1",
                  "--classes", "A,D", "--command", f"D=sh {cluster.bench}",
                  "--sbatch-arg", "--account=ops", "--json")  # fmt: skip
    data = as_json(out)
    assert data["directory"] == str(root / "k1")
    p = data["plan"]
    assert (p["repeats"], p["partition"], p["time_limit"], p["run_timeout_s"], p["python"]) == (
        2, "maint", "00:20:00", 600.0, "/opt/py/bin/python3"
    )  # fmt: skip
    assert p["sbatch_args"] == ["--reservation=pal", "--account=ops"]
    assert p["benchmarks"]["A"]["command"] == f"sh {cluster.bench}"  # from [campaign.commands]
    script = (root / "k1" / "sbatch" / "n1.sbatch").read_text().splitlines()
    assert "#SBATCH --reservation=pal" in script and "#SBATCH --partition=maint" in script
    # The CLI outranks the config.
    out = run_cli("campaign", "plan", "--id", "k2", "--nodes", "n1", "--gpus-per-node", "1",
                  "--repeats", "1", "--time", "5", "--json")  # fmt: skip
    assert (as_json(out)["plan"]["repeats"], as_json(out)["plan"]["time_limit"]) == (1, "5")

    # collect's tolerance: 10 % from the config hides a 8 % disagreement.
    cluster.durations({"default-A": [10.0, 10.8], "default-D": [5.0, 5.0]})
    monkeypatch.setenv("SLURM_PAL_CAMPAIGNS", str(root))
    plan_ = run_cli("campaign", "plan", "--id", "k3", "--nodes", "n1", "--gpus-per-node", "1",
                    "--classes", "A,D", "--command", f"D=sh {cluster.bench}",
                    "--python", f"{sys.executable} -S")  # fmt: skip
    assert plan_.exit_code == 0
    run_cli("campaign", "submit", "k3")
    report = as_json(run_cli("campaign", "collect", "k3", "--json"))
    assert report["tolerance"] == 0.1 and report["disagreements"] == []


# -- suggest ---------------------------------------------------------------------------------


def production_jsonl(path: Path, gpus: list, drifted: str, jobs: int, seed: int = 0) -> None:
    """Prolog/Epilog records and advisor decisions of ``jobs`` one- and two-GPU jobs.

    ``gpus``: the site plan's GPUs (node, slurm_index, uuid) with their class-A/D scores;
    runtime = base x worst score (x 1.08 with ``drifted``) x 2 % noise. Half the Prolog
    records carry NVML UUIDs, half only Slurm's indices.
    """
    import math

    import numpy as np

    rng = np.random.default_rng(seed)
    apps = {f"app{a}": ("A" if a % 2 else "D", float(rng.uniform(100, 900))) for a in range(6)}
    by_node: dict[str, list] = {}
    for g in gpus:
        by_node.setdefault(g["node"], []).append(g)
    lines = []
    for j in range(jobs):
        app = f"app{rng.integers(len(apps))}"
        job_class, base = apps[app]
        node = sorted(by_node)[rng.integers(len(by_node))]
        size = int(rng.choice([1, 1, 2]))
        chosen = [by_node[node][i] for i in rng.choice(len(by_node[node]), size, replace=False)]
        worst = max(
            g["scores"][job_class] * (1.08 if g["uuid"] == drifted else 1.0) for g in chosen
        )
        runtime = base * worst * math.exp(rng.normal(0, 0.02))
        job_id = str(1000 + j)
        prolog = {"record_id": f"{job_id}:{node}:prolog", "kind": "prolog", "job_id": job_id,
                  "node": node, "time": 1e9 + j, "slurm_gpus": [g["slurm_index"] for g in chosen],
                  "user": "alice", "name": app}  # fmt: skip
        if j % 2:
            prolog["uuids"] = [g["uuid"] for g in chosen]
        epilog = {"record_id": f"{job_id}:{node}:epilog", "kind": "epilog", "job_id": job_id,
                  "node": node, "time": 1e9 + j + runtime, "exit_code": 0}  # fmt: skip
        decision = {"kind": "decision", "token": f"t{j}", "job_id": job_id,
                    "job": {"user": "alice", "name": app, "script": f"#!/bin/sh\nrun {app}\n"},
                    "answer": {"ok": True, "action": "route", "class": job_class}}  # fmt: skip
        lines += [json.dumps(x) for x in (decision, prolog, epilog)]
    lines.append(json.dumps({"kind": "decision", "job_id": "1", "job": {}, "answer": {}}))
    lines.append(
        json.dumps(
            {"record_id": "2:n01:prolog", "kind": "prolog", "job_id": "2", "node": "n01",
             "time": 1.0}
        )
    )  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def test_suggest_lists_the_drifting_gpu_and_plans_its_recheck(
    run_cli: Callable, example_csv: Path, tmp_path: Path
) -> None:
    from slurm_pal.adapters.store import Store
    from slurm_pal.site.render import plan_from_store

    run_cli("profile", "ingest", example_csv, "--campaign", "jan")
    with Store(os.environ["SLURM_PAL_DB"]) as store:
        site = plan_from_store(store)
        frame = store.gpu_scores("jan")
    scores: dict[str, dict[str, float]] = {}
    for r in frame.itertuples():
        scores.setdefault(r.uuid, {})[r.job_class] = float(r.pm_score)
    gpus = [
        {"node": g.node, "slurm_index": g.slurm_index, "uuid": g.uuid, "index": g.index,
         "scores": scores[g.uuid]}
        for g in site.gpus
        if g.node in ("node01", "node02", "node03", "node04")
    ]  # fmt: skip
    drifted = next(g for g in gpus if g["node"] == "node03" and g["index"] == 2)
    records = tmp_path / "records.jsonl"
    production_jsonl(records, gpus, drifted["uuid"], 1200)

    data = as_json(run_cli("campaign", "suggest", "--records", records, "--json"))
    assert [(d["gpu"], d["node"], d["gpu_index"]) for d in data["drifting"]] == [
        (drifted["uuid"], "node03", 2)
    ]
    (d,) = data["drifting"]
    assert d["median_residual"] == pytest.approx(0.08, abs=0.02) and d["runs"] >= 5
    assert data["campaign"] == "jan" and data["gpus_judged"] == 16
    assert data["jobs_skipped"] == {"the advisor gave it no class": 1, "no epilog record yet": 1}
    plan_cmd = data["suggested_plan"]
    assert plan_cmd.startswith("slurm-pal campaign plan --nodes node03 --gpus-per-node 4")
    assert "--only node03:2 --id jan-recheck" in plan_cmd
    shown = text(run_cli("campaign", "suggest", "--records", records))
    assert "1 GPU(s) slower than their PM-scores say" in shown
    assert f"{d['median_residual']:+.1%}" in shown and "1200 production job(s) compared" in shown

    # Records as the advisor service keeps them in the store: the same answer as from a file.
    small = tmp_path / "small.jsonl"
    production_jsonl(small, gpus, drifted["uuid"], 400, seed=1)
    with Store(os.environ["SLURM_PAL_DB"]) as store:
        for line in small.read_text().splitlines():
            item = json.loads(line)
            if item["kind"] == "decision":
                store.save_decision(
                    item.get("token", "t-none"), item["job"], item["answer"],
                    job_id=int(item["job_id"]),
                )  # fmt: skip
            else:
                assert store.add_job_record(item)
    from_store = as_json(run_cli("campaign", "suggest", "--json"))
    assert from_store == as_json(run_cli("campaign", "suggest", "--records", small, "--json"))
    assert [d["gpu"] for d in from_store["drifting"]] == [drifted["uuid"]]

    # Too few runs: nothing listed; the same GPU shows up with the evidence asked for.
    none = as_json(
        run_cli("campaign", "suggest", "--records", records, "--min-runs", 500, "--json")
    )
    assert none["drifting"] == [] and none["suggested_plan"] is None
    assert "nothing to re-measure" in text(
        run_cli("campaign", "suggest", "--records", records, "--threshold", 0.2)
    )

    # The suggested targeted campaign: only that GPU is measured, its task holds the node.
    args = [*plan_cmd.split()[1:], "--root", tmp_path / "camps", "--json"]
    planned = as_json(run_cli(*args))
    assert [(g["node"], g["gpu_index"]) for g in planned["plan"]["gpus"]] == [("node03", 2)]
    script = (tmp_path / "camps" / "jan-recheck" / "sbatch" / "node03.sbatch").read_text()
    assert "#SBATCH --gres=gpu:4" in script and "#SBATCH --array=2" in script


def test_suggest_errors_name_the_problem(run_cli: Callable, example_csv: Path, tmp_path: Path):
    run_cli("profile", "ingest", example_csv, "--campaign", "jan")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "prolog", "job_id": "1"}\n{"kind": "sbatch"}\n')
    result = run_cli("campaign", "suggest", "--records", bad, ok=False)
    assert result.exit_code == 2 and "bad.jsonl:2: 'kind' must be prolog, epilog or decision" in (
        text(result)
    )
    bad.write_text("{nope\n")
    result = run_cli("campaign", "suggest", "--records", bad, ok=False)
    assert result.exit_code == 2 and "bad.jsonl:1: not JSON" in text(result)
    result = run_cli("campaign", "suggest", "--records", bad, "--labels", tmp_path / "x", ok=False)
    assert result.exit_code == 2 and "cannot read labels" in text(result)
    result = run_cli("campaign", "plan", "--nodes", "n1", "--gpus-per-node", "2", "--only",
                     "n1:7", ok=False)  # fmt: skip
    assert result.exit_code == 2 and "--only names GPU(s) n1:7" in text(result)
    result = run_cli("campaign", "plan", "--nodes", "n1", "--gpus-per-node", "2", "--only",
                     "n1", ok=False)  # fmt: skip
    assert result.exit_code == 2 and "NODE:INDEX" in text(result)
