"""`site render` on a campaign with many PM signatures: it suggests [site] max_labels, and the
cap it prints takes effect in gres.conf."""

from __future__ import annotations

from pathlib import Path

from slurm_pal.example_campaign import generate_example_campaign


def test_render_suggests_a_cap_above_16_labels(run_cli, tmp_path: Path) -> None:
    csv = tmp_path / "big.csv"
    # 256 GPUs with 8 throttled ones: more signatures than the hint's 16.
    generate_example_campaign(nodes=64, throttled_gpus=8, node_prefix="n").to_csv(csv, index=False)
    run_cli("profile", "ingest", csv, "--campaign", "big")
    out = " ".join(run_cli("site", "render", "--out", tmp_path / "full").output.split())
    assert "labels (one per PM signature): set [site] max_labels" in out
    config = tmp_path / "site.toml"
    config.write_text("[site]\nmax_labels = 12\n")
    capped = " ".join(
        run_cli("--config", config, "site", "render", "--out", tmp_path / "capped").output.split()
    )
    assert "12 Type= labels" in capped and "set [site] max_labels" not in capped
    assert "[site] max_labels = 12: 20 PM signatures merged into 12 labels" in capped
    gres = (tmp_path / "capped" / "gres.conf").read_text()
    types = {ln.split("Type=")[1].split()[0] for ln in gres.splitlines() if ln.startswith("Node")}
    assert len(types) == 12


def test_usage_reads_sacct_from_stdin(run_cli, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from slurm_pal.cli.main import app

    text = "JobID|ElapsedRaw|AllocTRES\n7|7200|cpu=1,gres/gpu:h100-pm0=2,gres/gpu=2\n"
    result = CliRunner().invoke(app, ["site", "usage", "--sacct", "-", "--json"], input=text)
    assert result.exit_code == 0, result.output
    assert '"model": "h100"' in result.output and '"gpu_hours": 4.0' in result.output
