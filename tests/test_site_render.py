"""Site rendering (no Slurm): gres.conf Type= lines, NodeName Gres=, snippet, labels.json."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from slurm_pal.adapters.slurm.parse import parse_gres
from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.site.render import (
    RenderError,
    compare_gres,
    load_labels,
    lua_string,
    plan_site,
    render_files,
)


def _scores(rows: list[tuple[str, str, int | None]], model: str = "v100") -> pd.DataFrame:
    """A gpu_scores-like frame: (uuid, node, index) per GPU, two classes each."""
    frame = pd.DataFrame(
        [
            {"job_class": c, "uuid": u, "node": n, "gpu_index": i, "gpu_model": model}
            for c in ("A", "B")
            for u, n, i in rows
        ]
    )
    frame["gpu_index"] = frame["gpu_index"].astype("Int64")
    return frame


def test_slurm_order_groups_types_and_numbers_them() -> None:
    rows = [("u0", "n1", 0), ("u1", "n1", 1), ("u2", "n1", 2), ("u3", "n1", 3), ("u4", "n2", 0)]
    labels = {"u0": "t-a", "u1": "t-a", "u2": "t-b", "u3": "t-a", "u4": "t-b"}
    plan = plan_site("c1", _scores(rows), labels, device_pattern="/dev/tty{index}")
    n1 = [(g.index, g.slurm_index, g.label, g.file) for g in plan.gpus if g.node == "n1"]
    assert n1 == [
        (0, 0, "t-a", "/dev/tty0"),
        (1, 1, "t-a", "/dev/tty1"),
        (3, 2, "t-a", "/dev/tty3"),
        (2, 3, "t-b", "/dev/tty2"),  # Slurm numbers it 3: lines are merged by Type
    ]
    assert plan.node_labels()["n1"] == {0: "t-a", 1: "t-a", 2: "t-b", 3: "t-a"}
    assert plan.slurm_labels()["n1"] == {0: "t-a", 1: "t-a", 2: "t-a", 3: "t-b"}
    assert plan.node_gres() == {"n1": "gpu:t-a:3,gpu:t-b:1", "n2": "gpu:t-b:1"}
    files = render_files(plan)
    lines = [ln for ln in files["gres.conf"].splitlines() if not ln.startswith("#")]
    assert lines[:4] == [
        "NodeName=n1 Name=gpu Type=t-a File=/dev/tty0",
        "NodeName=n1 Name=gpu Type=t-a File=/dev/tty1",
        "NodeName=n1 Name=gpu Type=t-a File=/dev/tty3",
        "NodeName=n1 Name=gpu Type=t-b File=/dev/tty2",
    ]
    assert "NodeName=n1 Gres=gpu:t-a:3,gpu:t-b:1" in files["slurm.conf.nodes"]
    snippet = files["slurm.conf.snippet"]
    for setting in ("GresTypes=gpu", "JobSubmitPlugins=lua", "PrologFlags=Alloc", "Prolog=/"):
        assert setting in snippet
    data = json.loads(files["labels.json"])
    assert data["nodes"]["n1"][3] == {
        "index": 2,
        "slurm_index": 3,
        "label": "t-b",
        "uuid": "u2",
        "file": "/dev/tty2",
        "model": "t",
        "signature": "t-b",
    }


def test_gpus_without_location_are_skipped_with_a_reason() -> None:
    rows = [("u0", "n1", 0), ("u1", "", None), ("u2", "n1", None), ("u3", "n1", 0), ("u4", "n2", 0)]
    labels = {"u0": "t-a", "u1": "t-a", "u2": "t-a", "u3": "t-b", "u5": "t-x"}
    plan = plan_site("c1", _scores(rows), labels)
    assert [g.uuid for g in plan.gpus] == []
    reasons = {s.uuid: s.reason for s in plan.skipped}
    assert reasons["u1"] == "no node name in the campaign"
    assert reasons["u2"] == "no GPU index in the campaign"
    assert "claimed by 2 GPUs" in reasons["u0"] and "claimed by 2 GPUs" in reasons["u3"]
    assert reasons["u4"] == "no label in this campaign"
    with pytest.raises(RenderError, match="no GPU with a node and index"):
        render_files(plan)


def test_node_filter_and_bad_input() -> None:
    rows = [("u0", "n1", 0), ("u1", "n2", 0)]
    labels = {"u0": "t-a", "u1": "t-b"}
    plan = plan_site("c1", _scores(rows), labels, nodes=["n2"])
    assert [g.node for g in plan.gpus] == ["n2"] and plan.skipped == ()
    with pytest.raises(RenderError, match="n7 have no GPUs"):
        plan_site("c1", _scores(rows), labels, nodes=["n7"])
    with pytest.raises(RenderError, match="must contain"):
        plan_site("c1", _scores(rows), labels, device_pattern="/dev/nvidia0")
    bad = plan_site("c1", _scores(rows), {"u0": "t:a", "u1": "t-b"})
    assert [s.reason for s in bad.skipped] == ["label is not a valid gres Type (:,=() or blanks)"]


def test_compare_gres() -> None:
    expected = {"n1": {"t-a": 3, "t-b": 1}, "n2": {"t-a": 4}, "n3": {"t-a": 1}}
    live = {"n1": {"t-a": 3, "t-b": 1}, "n2": {None: 4}}
    same, diffs = compare_gres(expected, live)
    assert same == ["n1"]
    assert [(d.node, d.live) for d in diffs] == [("n2", {"(untyped)": 4}), ("n3", None)]


def test_cli_render_from_the_example_campaign(run_cli, tmp_path: Path) -> None:
    csv = tmp_path / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    run_cli("profile", "ingest", csv, "--campaign", "ex")
    out = tmp_path / "site"
    result = run_cli("site", "render", "--out", out, "--nodes", "n[01-03]")
    assert "12 GPUs on 3 nodes" in " ".join(result.output.split())
    gres = (out / "gres.conf").read_text()
    assert "File=/dev/nvidia0" in gres and "n04" not in gres
    labels = load_labels(out / "labels.json")
    assert sorted(labels) == ["n01", "n02", "n03"]
    assert all(sorted(gpus) == [0, 1, 2, 3] for gpus in labels.values())
    # Every Type= is one of the store's labels, and the NodeName Gres= counts add up.
    listed = json.loads(run_cli("profile", "labels", "--json").output)["labels"]
    store_labels = {r["label"] for r in listed}
    rendered = {
        ln.split("Type=")[1].split()[0] for ln in gres.splitlines() if ln.startswith("Node")
    }
    assert rendered and rendered <= store_labels
    for line in (out / "slurm.conf.nodes").read_text().splitlines():
        if line.startswith("NodeName="):
            assert sum(g.count for g in parse_gres(line.split("Gres=")[1])) == 4
    bad = run_cli("site", "render", "--out", out, "--nodes", "n[01-", ok=False)
    assert bad.exit_code == 2 and "--nodes" in bad.output


def test_cli_render_without_campaign_fails_clearly(run_cli, tmp_path: Path) -> None:
    result = run_cli("site", "render", "--out", tmp_path / "x", ok=False)
    assert result.exit_code == 2
    assert "no active campaign" in result.output
    # a new admin is told how to get one to try, and what it says works as written
    text = " ".join(result.output.split())
    assert "'slurm-pal profile example -o example.csv'" in text
    assert "'slurm-pal profile ingest example.csv'" in text
    run_cli("profile", "example", "-o", tmp_path / "example.csv")
    run_cli("profile", "ingest", tmp_path / "example.csv")
    run_cli("site", "render", "--out", tmp_path / "x")
    assert (tmp_path / "x" / "labels.json").exists()


def test_longhorn_gpus_without_a_location_are_listed_as_skipped(
    longhorn: Path, tmp_path: Path
) -> None:
    """The sgemm file has no node/index (cabinet=-1): those GPUs cannot get a gres.conf line."""
    config = tmp_path / "lh.toml"
    config.write_text('[classes]\nnames = ["A", "B", "C", "D", "S"]\n')
    env = {"SLURM_PAL_DB": str(tmp_path / "lh.db"), "SLURM_PAL_CONFIG": str(config)}
    runner = CliRunner()
    for cls, name in (("A", "resnet-longhorn-agg.csv"), ("S", "sgemm-longhorn-agg.csv")):
        args = ["profile", "ingest", str(longhorn / name), "--class", cls, "--campaign", "lh"]
        result = runner.invoke(app, [*args, "--gpu-model", "v100"], env=env)
        assert result.exit_code == 0, result.output
    out = tmp_path / "site"
    result = runner.invoke(app, ["site", "render", "--out", str(out)], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "labels.json").read_text())
    rendered = [g for gpus in data["nodes"].values() for g in gpus]
    assert len(rendered) >= 300  # the resnet file's GPUs have cabinet-node and device
    assert data["skipped"], "sgemm-only GPUs have no location"
    assert {s["reason"] for s in data["skipped"]} <= {
        "no node name in the campaign",
        "no GPU index in the campaign",
    }
    gres_lines = [ln for ln in (out / "gres.conf").read_text().splitlines() if ln.startswith("N")]
    assert len(gres_lines) == len(rendered)
    assert f"{len(data['skipped'])} GPUs skipped" in " ".join(result.output.split())


def test_cli_check_against_captured_slurm_output(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`site check` on sinfo --json captured from the testbed (types v100-a0b0, ...): the example
    campaign's labels differ on n01..n04, and its n05 is unknown to that Slurm."""
    from slurm_pal.adapters.slurm.state import CliStateReader
    from slurm_pal.cli import site

    captured = (Path(__file__).parent / "fixtures" / "slurm" / "sinfo.json").read_text()
    monkeypatch.setattr(
        site, "CliStateReader", lambda env: CliStateReader(runner=lambda a: captured)
    )
    csv = tmp_path / "example.csv"
    generate_example_campaign(nodes=5, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    run_cli("profile", "ingest", csv, "--campaign", "ex")
    result = run_cli("site", "check", ok=False)
    text = " ".join(result.output.split())
    assert result.exit_code == 1
    assert "0 node(s) match, 5 differ" in text
    assert "n01: Slurm has gpu:v100-a0b0:2,gpu:v100-a1b0:1,gpu:v100-ax0b1:1" in text
    assert "n05: not known to Slurm" in text
    assert "restart of slurmctld and of every slurmd" in text
    data = json.loads(run_cli("site", "check", "--json", ok=False).output)
    last = data["differing"][-1]
    assert (last["node"], last["live"], sum(last["expected"].values())) == ("n05", None, 4)


def test_cli_render_writes_job_submit_lua_and_hooks_from_the_config(
    run_cli, tmp_path: Path
) -> None:
    """Socket, timeout and models go into job_submit.lua; the hook scripts call this install's
    Python with the socket and spool dir of the config, and every Lua line parses."""
    csv = tmp_path / "example.csv"
    generate_example_campaign(nodes=2, gpus_per_node=2, node_prefix="n").to_csv(csv, index=False)
    run_cli("profile", "ingest", csv, "--campaign", "ex")
    config = tmp_path / "site.toml"
    config.write_text(
        '[advisor]\nsocket = "/run/my advisor/a.sock"\nsubmit_timeout_ms = 150\n'
        'allowed_users = ["root", "nosuchuser"]\n'
        '[hooks]\nspool_dir = "/var/spool/my spool"\ndeliver_timeout_ms = 80\n'
        "epilog_timeout_ms = 1500\ntelemetry = false\n"
    )
    out = tmp_path / "site"
    run_cli("--config", config, "site", "render", "--out", out, "--python", "/opt/py/bin/python")
    lua = (out / "job_submit.lua").read_text()
    assert 'local SOCKET_PATH = "/run/my advisor/a.sock"' in lua
    assert "local TIMEOUT_S = 0.150" in lua
    assert 'local MODELS = { ["v100"] = true, }' in lua
    assert "local PRIVILEGED_UIDS = { [0] = true, }" in lua  # nosuchuser does not exist here
    for kind in ("prolog", "epilog"):
        path = out / f"{kind}.sh"
        text = path.read_text()
        assert path.stat().st_mode & 0o111 == 0o111
        assert "PYTHON=/opt/py/bin/python" in text
        assert f"-m slurm_pal.hooks {kind}" in text
        assert "--socket '/run/my advisor/a.sock'" in text
        assert "--spool-dir '/var/spool/my spool'" in text
        timeout = {"prolog": 80, "epilog": 1500}[kind]  # the Epilog waits for a re-plan
        assert f"--timeout-ms {timeout}" in text and "--no-telemetry" in text
        assert f"--labels {out.resolve() / 'labels.json'}" in text
    bad = run_cli("site", "render", "--out", out, "--python", "python3", ok=False)
    assert bad.exit_code == 2 and "absolute path" in bad.output
    luac = shutil.which("luac5.1")
    if luac:
        subprocess.run([luac, "-p", str(out / "job_submit.lua")], check=True)
    for kind in ("prolog", "epilog"):
        subprocess.run(["sh", "-n", str(out / f"{kind}.sh")], check=True)


def test_the_unit_serves_the_store_chosen_by_env_or_option_and_warns_what_it_cannot_see(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SLURM_PAL_DB and --db mean the same store; the unit gets it as an absolute path, and a
    venv the unit's sandbox hides is said on stderr with what to pass."""
    csv = tmp_path / "example.csv"
    generate_example_campaign(nodes=2, gpus_per_node=2, node_prefix="n").to_csv(csv, index=False)
    env_store = tmp_path / "env-store.db"
    monkeypatch.setenv("SLURM_PAL_DB", str(env_store))
    run_cli("profile", "ingest", csv, "--campaign", "ex")
    result = run_cli(
        "site", "render", "--out", tmp_path / "a", "--python", "/home/alice/venv/bin/python"
    )
    exec_start = _exec_start(tmp_path / "a")
    assert f" --db {env_store} serve " in exec_start
    note = next(line for line in result.stderr.splitlines() if "Python /home/alice" in line)
    assert note.startswith("note: slurm-pal.service cannot reach")
    assert "ProtectHome=yes" in note and "--python /opt/slurm-pal/bin/python" in note
    # The option wins over the variable, and a relative path is made absolute for systemd.
    monkeypatch.chdir(tmp_path)
    shutil.copy(env_store, tmp_path / "opt-store.db")
    run_cli("--db", "opt-store.db", "site", "render", "--out", tmp_path / "b")
    assert f" --db {tmp_path / 'opt-store.db'} serve " in _exec_start(tmp_path / "b")


def _exec_start(site: Path) -> str:
    lines = (site / "slurm-pal.service").read_text().splitlines()
    return next(line for line in lines if line.startswith("ExecStart="))


def test_lua_string_escapes_every_unsafe_byte() -> None:
    assert lua_string('a"b\\c') == '"a\\"b\\\\c"'
    assert lua_string("x\ny\x00é") == '"x\\010y\\000\\195\\169"'


def test_labels_slurm_would_confuse_get_distinct_type_ids():
    # Slurm keeps a gres Type as a 32-bit sum of its bytes shifted by position mod 4: these two
    # labels sum alike, so slurmd would merge them and drain the node.
    from slurm_pal.core.gres import distinct_type_ids, slurm_type_id

    assert slurm_type_id("gpu") == 7696487  # GRES_PLUGIN_GPU in Slurm's sources
    assert slurm_type_id("gpu-a1b3c2d0") == slurm_type_id("gpu-a2b2c1d1")
    labels = ["gpu-a2b2c1d1", "gpu-a1b3c2d0", "gpu-a1b0c4d1"]
    renamed = distinct_type_ids(labels)
    assert renamed["gpu-a1b3c2d0"] == "gpu-a1b3c2d0"  # the first in sorted order keeps its name
    assert renamed["gpu-a1b0c4d1"] == "gpu-a1b0c4d1"
    assert renamed["gpu-a2b2c1d1"] != "gpu-a2b2c1d1"
    assert len({slurm_type_id(name) for name in renamed.values()}) == 3
    assert distinct_type_ids(list(reversed(labels))) == renamed


def test_plan_site_renders_colliding_labels_apart_and_keeps_signatures():
    import pandas as pd

    from slurm_pal.core.gres import slurm_type_id
    from slurm_pal.site.render import plan_site

    labels = {"u0": "gpu-a1b3c2d0", "u1": "gpu-a2b2c1d1", "u2": "gpu-a1b3c2d0"}
    scores = pd.DataFrame(
        {
            "uuid": ["u0", "u1", "u2"],
            "node": ["n1", "n1", "n2"],
            "gpu_index": [0, 1, 0],
            "gpu_model": ["gpu"] * 3,
            "job_class": ["A"] * 3,
            "pm_score": [1.0, 2.2, 1.0],
        }
    )
    plan = plan_site("c1", scores, labels)
    by_uuid = {g.uuid: g for g in plan.gpus}
    assert by_uuid["u0"].label == by_uuid["u2"].label == "gpu-a1b3c2d0"
    assert slurm_type_id(by_uuid["u1"].label) != slurm_type_id(by_uuid["u0"].label)
    assert by_uuid["u1"].signature == "gpu-a2b2c1d1"
    nodes = plan.to_dict()["nodes"]
    assert {g["signature"] for g in nodes["n1"]} == {"gpu-a1b3c2d0", "gpu-a2b2c1d1"}
