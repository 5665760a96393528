"""`slurm-pal testbed ...`: a private Slurm on loopback (real daemons, fake GPUs) for trying
things out and for tests, and `run`: the advisor against a packing control (and stock Slurm)
on an emulated-variability trace (slurm_pal/testbed/run.py). Runs as root; see
slurm_pal/testbed/cluster.py for the layout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from slurm_pal.cli.common import console, err_console, fail, print_json, reported_errors, state
from slurm_pal.site.render import RenderError, load_labels
from slurm_pal.testbed.cluster import LocalSlurm, NodeSpec, TestbedError
from slurm_pal.testbed.emulate import PROFILES, TRACES, EmulationError
from slurm_pal.testbed.hosts import NS_PREFIX, HostsError, namespaces, remove_namespaces, tag_for
from slurm_pal.testbed.multihost import MultiHostSlurm

app = typer.Typer(
    rich_markup_mode=None,
    help="A private Slurm testbed on loopback: up, status, down; run: advisor vs packing.",
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
    hosts: int = typer.Option(
        0,
        "--hosts",
        help="Run each node on its own compute host (network, UTS and mount namespaces on a "
        "private bridge) beside a controller host: N compute hosts, one per node. 0: every "
        "daemon on this host, on loopback.",
    ),
) -> None:
    """Start munged, slurmctld and one slurmd per node; wait until every node is idle."""
    if hosts < 0:
        fail(f"--hosts must be >= 0, got {hosts}")
    if labels is not None:
        try:
            per_node = load_labels(labels)
        except RenderError as exc:
            fail(str(exc))
        specs = [
            NodeSpec(node, tuple(gpus.get(i) for i in range(max(gpus) + 1)))
            for node, gpus in per_node.items()
        ]
        if hosts and hosts != len(specs):
            fail(f"--hosts {hosts} but {labels} describes {len(specs)} nodes (one host each)")
    else:
        nodes = hosts or nodes
        width = max(2, len(str(nodes)))
        specs = [
            NodeSpec(f"{node_prefix}{i + 1:0{width}d}", (None,) * gpus_per_node)
            for i in range(nodes)
        ]
    try:
        if hosts:
            tb: LocalSlurm = MultiHostSlurm(root, specs, device_pattern=device_pattern)
        else:
            tb = LocalSlurm(root, specs, device_pattern=device_pattern)
        tb.start(timeout_s=timeout)
    except TestbedError as exc:
        fail(str(exc))
    if isinstance(tb, MultiHostSlurm):
        where = ", ".join(f"{h.name} {h.address}" for h in tb.network.hosts)
        console.print(f"testbed up in {tb.root}: {len(specs)} nodes idle on hosts {where}")
        typer.echo(
            f"slurm-pal testbed exec --dir {tb.root} -- sinfo   # commands on the controller"
        )
        return
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
    if isinstance(tb, MultiHostSlurm):
        typer.echo(
            f"slurm-pal testbed exec --dir {tb.root} -- sinfo   # commands on the controller"
        )
    else:
        typer.echo(f"export SLURM_CONF={tb.conf}")


@app.command()
def down(
    root: Path = DIR_OPT,
    all_leftovers: bool = typer.Option(
        False,
        "--all",
        help=f"Also remove every network namespace named {NS_PREFIX}* (multi-host testbeds of "
        "any folder) and the processes in them.",
    ),
) -> None:
    """Cancel jobs and stop the testbed's daemons (only its own, by pid file); a multi-host
    testbed's namespaces go too, found by the folder's name even without testbed.json."""
    stopped: list[str] = []
    try:
        if (root / "testbed.json").exists():
            stopped = LocalSlurm.attach(root).stop()
        leftovers = namespaces(f"{NS_PREFIX}{tag_for(root)}-")
        if all_leftovers:
            leftovers = namespaces(NS_PREFIX)
        stopped += remove_namespaces(leftovers)
    except (TestbedError, HostsError) as exc:
        fail(str(exc))
    gone = [s for s in stopped if s.startswith(NS_PREFIX)]
    procs = [s for s in stopped if not s.startswith(NS_PREFIX)]
    console.print(
        f"stopped {len(procs)} process(es)"
        + (": " + ", ".join(procs) if procs else "")
        + (f"; removed namespaces {', '.join(gone)}" if gone else "")
    )


@app.command(
    name="exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def exec_(
    ctx: typer.Context,
    root: Path = DIR_OPT,
    host: str | None = typer.Option(
        None, "--host", help="Host to run on (default: the controller, the login node)."
    ),
) -> None:
    """Run a command on a host of a multi-host testbed with the testbed's SLURM_CONF:
    `slurm-pal testbed exec -- sbatch --gres=gpu:1 --wrap hostname`."""
    import subprocess

    if not ctx.args:
        fail("no command given: slurm-pal testbed exec [--host H] -- COMMAND ...")
    try:
        tb = LocalSlurm.attach(root)
        if not isinstance(tb, MultiHostSlurm):
            fail(f"the testbed in {root} runs on this host: export SLURM_CONF={tb.conf}")
        args = tb.on_host(host or tb.controller, ctx.args)
    except TestbedError as exc:
        fail(str(exc))
    raise typer.Exit(subprocess.run(args, env=tb.env, check=False).returncode)


# The options of `testbed run`, named once here so that its signature reads as a list of them.
RunDirOption = Annotated[Path, typer.Option("--dir", help="Folder of this run (all of it).")]
RunNodesOption = Annotated[int, typer.Option("--nodes", help="Nodes of the emulated cluster.")]
RunGpusOption = Annotated[int, typer.Option("--gpus-per-node", help="Fake GPUs per node.")]
ProfileOption = Annotated[
    str,
    typer.Option("--profile", help=f"Variability drawn onto the GPUs: {', '.join(PROFILES)}."),
]
ProfileSeedOption = Annotated[int, typer.Option("--profile-seed", help="Seed of the GPU draw.")]
LonghornOption = Annotated[
    Path | None,
    typer.Option("--longhorn-dir", help="Folder of the Longhorn *-longhorn-agg.csv files."),
]
TraceOption = Annotated[
    str,
    typer.Option("--trace", help="Trace: " + "; ".join(f"{k}: {v}" for k, v in TRACES.items())),
]
TraceSeedOption = Annotated[int, typer.Option("--trace-seed", help="Seed of the trace.")]
ScaleOption = Annotated[
    float,
    typer.Option(
        "--scale",
        help="Stretch arrivals and durations (2 = twice as long): Slurm's scheduling latency "
        "(up to a second per start, not simulated) then weighs less against the jobs.",
    ),
]
ArmsOption = Annotated[
    str,
    typer.Option(
        "--arms",
        help="Arms to run: control (the same plugin, hooks and service serving plain packing), "
        "advisor, stock (no plugin, hooks or service). The advisor is compared with the "
        "control when it runs, else with stock.",
    ),
]
RepeatsOption = Annotated[
    int,
    typer.Option(
        "--repeats",
        help="Runs of every arm, alternating which arm goes first; the report gives each "
        "repeat's ratios, their median and range.",
    ),
]
PolicyOption = Annotated[
    str | None,
    typer.Option(
        "--policy",
        help="The advisor's policy: packed-pm, pal, pm-first, packed, random (default: the "
        "config's advisor.policy; shipped: packed-pm). pal reproduces the paper's policy.",
        show_default=False,
    ),
]
ReplanOption = Annotated[
    float,
    typer.Option(
        "--replan-s",
        help="The advisor's periodic re-planning (0 = off: with second-long jobs a period is too "
        "coarse; the Epilog's re-planning is what counts).",
    ),
]
ReplanOnEpilogOption = Annotated[
    bool | None,
    typer.Option(
        "--replan-on-epilog/--no-replan-on-epilog",
        help="The advisor re-plans pending jobs at every job's end, from its Epilog (default: "
        "the config's advisor.replan_on_epilog; shipped: on).",
        show_default=False,
    ),
]
HostsOption = Annotated[
    bool,
    typer.Option(
        "--hosts/--single-host",
        help="Each node on its own compute host beside a controller host (network namespaces; "
        "the hooks send records to the advisor over TCP with munge, as on a cluster), or every "
        "daemon on this host (loopback; records on the Unix socket).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")]


@app.command()
def run(
    ctx: typer.Context,
    root: RunDirOption = Path("/tmp/slurm-pal-testbed-run"),
    nodes: RunNodesOption = 4,
    gpus_per_node: RunGpusOption = 4,
    profile: ProfileOption = "example",
    profile_seed: ProfileSeedOption = 0,
    longhorn_dir: LonghornOption = None,
    trace: TraceOption = "mixed48",
    trace_seed: TraceSeedOption = 0,
    scale: ScaleOption = 1.0,
    arms: ArmsOption = "control,advisor",
    repeats: RepeatsOption = 1,
    policy: PolicyOption = None,
    replan_s: ReplanOption = 0.0,
    replan_on_epilog: ReplanOnEpilogOption = None,
    multihost: HostsOption = True,
    as_json: JsonOption = False,
) -> None:
    """Bring a testbed up with emulated GPU variability, run the trace with the advisor and with
    a control that runs the same plugin, hooks and service serving plain packing (the arms
    differ only in the policy), report JCTs and ratios (advisor / control; with --arms
    ...,stock also against stock Slurm) next to the simulator's prediction of the same pair,
    and take down everything it started. The advisor runs as the site config (the global
    --config) sets it up, with the testbed's socket, refresh and re-planning; the prediction
    simulates that advisor and the control, as `slurm-pal sim run --config` does."""
    from slurm_pal.testbed.run import RunSettings, public_report, run_testbed

    cfg = state(ctx).config
    with reported_errors():
        try:
            settings = RunSettings(
                root=root,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                profile=profile,
                profile_seed=profile_seed,
                longhorn_dir=longhorn_dir,
                trace=trace,
                trace_seed=trace_seed,
                scale=scale,
                arms=tuple(a.strip() for a in arms.split(",") if a.strip()),
                repeats=repeats,
                policy=policy,
                replan_s=replan_s,
                replan_on_epilog=replan_on_epilog,
                config=cfg,
                multihost=multihost,
            )
            progress = (
                (lambda m: err_console.print(m, highlight=False))
                if as_json
                else (lambda m: console.print(m, highlight=False))
            )
            report = run_testbed(settings, progress)
        except (EmulationError, TestbedError) as exc:
            fail(str(exc))
    public = public_report(report)
    if as_json:
        print_json(public)
    else:
        print_report(public)
    unavailable = public.get("unavailable") or {}
    if unavailable:
        for arm, reason in unavailable.items():  # type: ignore[attr-defined]
            err_console.print(f"[bold red]arm {arm} not run:[/] {reason}", highlight=False)
        raise typer.Exit(1)


def print_report(report: dict) -> None:
    """Per-arm figures (the last repeat) beside the simulator's, then each pair's ratios per
    repeat with their median and range beside the simulator's prediction of the same pair."""
    arms = report.get("arms", {})
    sim = report.get("sim", {})
    table = Table(
        title=f"trace {report['trace']} ({report['jobs']} jobs, scale {report['scale']}), "
        f"profile {report['profile']} (seed {report['profile_seed']}), {report['cluster']} "
        f"GPUs, FIFO" + (f"; last of {report['repeats']} repeats" if report["repeats"] > 1 else "")
    )
    table.add_column("figure")
    for arm in arms:
        table.add_column(f"{arm} (measured)", justify="right")
    for arm in arms:
        table.add_column(f"{arm} (sim)", justify="right")
    for key, label in (
        ("avg_jct", "avg JCT (s)"),
        ("p99_jct", "p99 JCT (s)"),
        ("makespan", "makespan (s)"),
        ("avg_wait", "avg wait (s)"),
        ("spread_jobs", "jobs spread for nothing"),
    ):
        cells = [str(arms[a].get(f"{key}_s", arms[a].get(key))) for a in arms]
        cells += [str(sim.get(a, {}).get(key)) for a in arms]
        table.add_row(label, *cells)
    console.print(table)
    for pair, figures in (report.get("pairs") or {}).items():
        for key in ("avg_jct_ratio", "p99_jct_ratio", "makespan_ratio"):
            f = figures[key]
            if not f["n"]:
                continue
            runs = ", ".join(f"{v:.3f}" for v in f["runs"])
            spread = f" (runs {runs}; {f['min']:.3f}-{f['max']:.3f})" if f["n"] > 1 else ""
            against = "" if f["vs_sim"] is None else f", measured {100 * f['vs_sim']:+.1f} %"
            console.print(
                f"{key} {pair}: measured {f['median']:.3f}{' median' if f['n'] > 1 else ''}"
                f"{spread}, simulator {f['sim']:.3f}{against}",
                highlight=False,
            )
    model = report.get("latency_model")
    if model:
        band = model["avg_jct_ratio_band"]
        console.print(
            f"simulator with Slurm's scheduling latency modelled (each job's GPUs held "
            f"{report['sim_latency_s']} s longer, the latency that reproduces the measured "
            f"{report['baseline']} arm's average JCT): avg_jct_ratio "
            f"{report['sim_latency_avg_jct_ratio']:.3f}, p99 "
            f"{report['sim_latency_p99_jct_ratio']:.3f}, makespan "
            f"{report['sim_latency_makespan_ratio']:.3f}; over latencies 0-2 s the avg_jct_ratio "
            f"moves {band['min']:.3f}-{band['max']:.3f} (median {band['median']:.3f})",
            highlight=False,
        )
    late = report.get("sim_at_submit_avg_jct_ratio")
    if late is not None:
        console.print(
            f"simulator with the advisor deciding at submit only (queued jobs placed by Slurm): "
            f"avg_jct_ratio advisor/stock {late:.3f}"
        )
    settings = ", ".join(f"{k}={v}" for k, v in (sim.get("advisor_settings") or {}).items())
    console.print(
        f"advisor: policy {sim.get('advisor_policy')} ({settings}), deciding "
        f"{sim.get('decisions')}; control: policy {report.get('control_policy')}; in the "
        f"simulator {sim.get('jobs_as_stock')} of {report['jobs']} jobs start and end under "
        "the advisor as under packing",
        highlight=False,
    )
    if sim.get("jobs_as_stock") == report["jobs"]:
        console.print(
            "the advisor's policy places like packing on these GPUs: a ratio of 1.0 is the "
            "expected result (differences are the testbed's noise)",
            highlight=False,
        )
