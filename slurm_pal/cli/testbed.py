"""`slurm-pal testbed ...`: a private Slurm on loopback (real daemons, fake GPUs) for trying
things out and for tests. Runs as root; see slurm_pal/testbed/cluster.py for the layout."""

from __future__ import annotations

from pathlib import Path

import typer

from slurm_pal.cli.common import console, fail
from slurm_pal.site.render import RenderError, load_labels
from slurm_pal.testbed.cluster import LocalSlurm, NodeSpec, TestbedError

app = typer.Typer(
    help="A private Slurm testbed on loopback: up, status, down.",
    no_args_is_help=True,
)

DIR_OPT = typer.Option(
    Path("/tmp/slurm-pal-testbed"), "--dir", help="Folder the testbed lives in (all of it)."
)


@app.command()
def up(
    root: Path = DIR_OPT,
    nodes: int = typer.Option(4, "--nodes", help="Nodes (ignored with --labels)."),
    gpus_per_node: int = typer.Option(4, "--gpus-per-node", help="Untyped GPUs per node."),
    node_prefix: str = typer.Option("n", "--node-prefix", help="Node names: PREFIX01, ..."),
    labels: Path | None = typer.Option(
        None, "--labels", help="labels.json from 'slurm-pal site render': nodes and GPU types."
    ),
    device_pattern: str = typer.Option(
        "/dev/tty{index}", "--device-pattern", help="Fake GPU device of index {index}."
    ),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for idle nodes."),
) -> None:
    """Start munged, slurmctld and one slurmd per node; wait until every node is idle."""
    if labels is not None:
        try:
            per_node = load_labels(labels)
        except RenderError as exc:
            fail(str(exc))
        specs = [
            NodeSpec(node, tuple(gpus.get(i) for i in range(max(gpus) + 1)))
            for node, gpus in per_node.items()
        ]
    else:
        width = max(2, len(str(nodes)))
        specs = [
            NodeSpec(f"{node_prefix}{i + 1:0{width}d}", (None,) * gpus_per_node)
            for i in range(nodes)
        ]
    try:
        tb = LocalSlurm(root, specs, device_pattern=device_pattern)
        tb.start(timeout_s=timeout)
    except TestbedError as exc:
        fail(str(exc))
    console.print(f"testbed up in {tb.root}: {len(specs)} nodes idle")
    typer.echo(f"export SLURM_CONF={tb.conf}")


@app.command()
def status(root: Path = DIR_OPT) -> None:
    """Which daemons run, and the node states. Exit 1 when slurmctld is not running."""
    try:
        tb = LocalSlurm.attach(root)
    except TestbedError as exc:
        fail(str(exc))
    running = tb.running()
    for name, pid in running.items():
        console.print(f"{name:>16}: {'pid ' + str(pid) if pid else 'not running'}")
    if running.get("slurmctld") is None:
        raise typer.Exit(1)
    try:
        for node, st in tb.node_states().items():
            console.print(f"{node:>16}: {st}")
    except TestbedError as exc:
        fail(str(exc))
    typer.echo(f"export SLURM_CONF={tb.conf}")


@app.command()
def down(root: Path = DIR_OPT) -> None:
    """Cancel jobs and stop the testbed's daemons (only its own, by pid file)."""
    try:
        stopped = LocalSlurm.attach(root).stop()
    except TestbedError as exc:
        fail(str(exc))
    console.print(
        f"stopped {len(stopped)} process(es)" + (": " + ", ".join(stopped) if stopped else "")
    )
