"""`slurm-pal site ...`: the Slurm configuration that exposes PM signatures, and its check."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.table import Table

from slurm_pal.adapters.slurm.state import CliStateReader, SlurmQueryError
from slurm_pal.cli.common import (
    console,
    err_console,
    fail,
    print_json,
    reported_errors,
    state,
    warn,
)
from slurm_pal.core.hostlist import expand
from slurm_pal.site.render import (
    DEFAULT_DEVICE_PATTERN,
    DEFAULT_EPILOG,
    DEFAULT_PROLOG,
    HookSettings,
    RenderError,
    ServiceSettings,
    SitePlan,
    compare_gres,
    plan_from_store,
    render_files,
    write_site,
)

app = typer.Typer(
    rich_markup_mode=None,
    help="Site configuration: render gres.conf Type= labels, check them against Slurm.",
    no_args_is_help=True,
)

CAMPAIGN_OPT = typer.Option(None, "--campaign", help="Campaign id (default: the active one).")
NODES_OPT = typer.Option(
    None, "--nodes", help="Only these nodes (a Slurm hostlist, e.g. 'gpu[01-16]')."
)
RESTART_HINT = (
    "changing Type= in gres.conf needs a restart of slurmctld and of every slurmd "
    "(scontrol reconfigure is not enough)"
)


def _nodes(hostlist: str | None) -> list[str] | None:
    if hostlist is None:
        return None
    try:
        return expand(hostlist)
    except ValueError as exc:
        fail(f"--nodes {hostlist!r}: {exc}")


@app.command()
def render(
    ctx: typer.Context,
    out: Path = typer.Option(..., "--out", help="Folder to write the files into (created)."),
    campaign: str | None = CAMPAIGN_OPT,
    device_pattern: str = typer.Option(
        DEFAULT_DEVICE_PATTERN,
        "--device-pattern",
        help="Device file of GPU {index} (the testbed uses /dev/tty{index}).",
    ),
    nodes: str | None = NODES_OPT,
    prolog: str = typer.Option(DEFAULT_PROLOG, "--prolog", help="Prolog path for slurm.conf."),
    epilog: str = typer.Option(DEFAULT_EPILOG, "--epilog", help="Epilog path for slurm.conf."),
    labels_path: str | None = typer.Option(
        None,
        "--labels-path",
        help="Where the hooks read labels.json on the nodes (default: OUT/labels.json).",
    ),
    python: str | None = typer.Option(
        None, "--python", help="Python the hooks run (default: the one running slurm-pal)."
    ),
) -> None:
    """Write gres.conf, the NodeName Gres= parts, the slurm.conf snippet, labels.json,
    job_submit.lua and the Prolog/Epilog scripts ([advisor] and [hooks] of the config)."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store:
        try:
            plan = plan_from_store(
                store,
                campaign,
                device_pattern=device_pattern,
                nodes=_nodes(nodes),
                config=st.config,
            )
            if python is not None and not python.startswith("/"):
                fail(f"--python must be an absolute path (slurmd has its own PATH), got {python!r}")
            hooks = HookSettings.from_config(
                st.config,
                labels_path=labels_path or str(out.resolve() / "labels.json"),
                python=python,
            )
            service = ServiceSettings.from_config(
                st.config,
                config_path=os.path.abspath(st.config_path) if st.config_path else None,
                db_path=os.path.abspath(st.db.expanduser()) if st.db else None,
                python=python,
            )
            files = render_files(plan, prolog=prolog, epilog=epilog, hooks=hooks, service=service)
        except RenderError as exc:
            fail(str(exc))
    written = write_site(out, files)
    labels = {g.label for g in plan.gpus}
    console.print(
        f"campaign [bold]{plan.campaign}[/]: {len(plan.gpus)} GPUs on {len(plan.node_labels())} "
        f"nodes, {len(labels)} Type= labels; wrote {', '.join(p.name for p in written)} to {out}"
    )
    if plan.skipped:
        table = Table(title=f"{len(plan.skipped)} GPUs skipped", title_justify="left")
        for col in ("GPU", "node", "label", "reason"):
            table.add_column(col)
        for s in plan.skipped:
            table.add_row(s.uuid, s.node or "-", s.label or "-", s.reason)
        err_console.print(table)
    _print_merge(plan, st.config.site.max_labels)
    for problem in service.hidden_paths():
        warn(problem)
    console.print(f"note: {RESTART_HINT}")


LABELS_HINT = 16
"""Above this many labels `site render` suggests [site] max_labels."""


def _print_merge(plan: SitePlan, max_labels: int | None) -> None:
    """What [site] max_labels did and what it costs, in PM-score per class."""
    merge = plan.merge
    if merge is None:
        count = len({g.label for g in plan.gpus})
        if count > LABELS_HINT:
            console.print(
                f"{count} labels (one per PM signature): set [site] max_labels to merge the "
                "closest ones; this command then prints what that costs",
                markup=False,  # "[site]" is text, not a rich tag
            )
        return
    if not merge.merged:
        return
    signatures = len(merge.labels)
    console.print(
        f"[site] max_labels = {max_labels}: {signatures} PM signatures merged into "
        f"{merge.count} labels (<model>-pm<rank>, pm0 = fastest; labels.json keeps each GPU's "
        "signature)",
        markup=False,
    )
    cost = Table(
        title="cost: distance of a GPU's own PM-score from its label's", title_justify="left"
    )
    for col in ("class", "worst", "mean (per GPU)"):
        cost.add_column(col, justify="right")
    for c in merge.cost:
        cost.add_row(c.job_class, f"{c.worst:.4f}", f"{c.mean:.4f}")
    console.print(cost)
    table = Table(title="labels", title_justify="left")
    for col in ("label", "signatures", "PM-score per class"):
        table.add_column(col)
    for label in sorted(merge.members, key=lambda lb: (lb.split("-", 1)[0], len(lb), lb)):
        members = merge.members[label]
        shown = ", ".join(members[:3]) + (f" (+{len(members) - 3})" if len(members) > 3 else "")
        scores = " ".join(f"{c}={v:.3f}" for c, v in merge.scores[label].items())
        table.add_row(label, shown, scores)
    console.print(table)


@app.command()
def check(
    ctx: typer.Context,
    campaign: str | None = CAMPAIGN_OPT,
    nodes: str | None = NODES_OPT,
    slurm_conf: Path | None = typer.Option(
        None, "--slurm-conf", help="slurm.conf of the cluster to ask (default: SLURM_CONF)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Compare the campaign's GPU labels per node with the Gres types the running Slurm reports.

    Exit 0 when every node matches, 1 when any differs.
    """
    st = state(ctx)
    wanted = _nodes(nodes)
    with reported_errors(), st.store(create=False) as store:
        try:
            plan = plan_from_store(store, campaign, nodes=wanted, config=st.config)
        except RenderError as exc:
            fail(str(exc))
    env = dict(os.environ)
    if slurm_conf is not None:
        env["SLURM_CONF"] = str(slurm_conf)
    try:
        live_nodes = CliStateReader(env).nodes(plan.node_labels().keys())
    except SlurmQueryError as exc:
        fail(str(exc))
    live = {n.name: n.gpu_types() for n in live_nodes}
    same, diffs = compare_gres(plan.gres_counts(), live)
    if as_json:
        print_json(
            {
                "campaign": plan.campaign,
                "matching": same,
                "differing": [
                    {"node": d.node, "expected": d.expected, "live": d.live} for d in diffs
                ],
                "skipped_gpus": len(plan.skipped),
            }
        )
    else:
        console.print(
            f"campaign [bold]{plan.campaign}[/]: {len(same)} node(s) match, {len(diffs)} differ"
        )
        for d in diffs:
            if d.live is None:
                console.print(f"  {d.node}: not known to Slurm (expected {_fmt(d.expected)})")
            else:
                console.print(
                    f"  {d.node}: Slurm has {_fmt(d.live)}, campaign says {_fmt(d.expected)}"
                )
        if diffs:
            console.print(
                "fix: 'slurm-pal site render --out DIR', install gres.conf and the Gres= parts, "
                f"then restart; {RESTART_HINT}"
            )
    if diffs:
        raise typer.Exit(1)


def _fmt(counts: dict[str, int]) -> str:
    return ",".join(f"gpu:{t}:{n}" for t, n in sorted(counts.items())) or "no GPUs"


@app.command()
def usage(
    sacct: str = typer.Option(
        ...,
        "--sacct",
        help="sacct output ('-' for stdin) of: sacct -a -X -P "
        "--format=JobID,ElapsedRaw,AllocTRES -S START -E END",
    ),
    labels: Path | None = typer.Option(
        None, "--labels", help="labels.json of `site render` (default: label prefix = model)."
    ),
    by_label: bool = typer.Option(False, "--by-label", help="Also list each label's GPU-hours."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """GPU-hours by GPU model from Slurm accounting, rolled up from the PM labels."""
    import sys

    from slurm_pal.adapters.labels_file import LabelTableError, read_labels
    from slurm_pal.site.usage import UsageError, parse_sacct, rollup

    try:
        text = sys.stdin.read() if sacct == "-" else Path(sacct).read_text()
    except OSError as exc:
        fail(f"--sacct {sacct}: {exc.strerror or exc}")
    models: dict[str, str] = {}
    try:
        if labels is not None:
            models = {e.label: e.declared_model or e.model for e in read_labels(labels).entries}
        rows = rollup(parse_sacct(text, source="stdin" if sacct == "-" else sacct), models)
    except (UsageError, LabelTableError) as exc:
        fail(str(exc))
    if as_json:
        print_json(
            [
                {
                    "model": u.model,
                    "jobs": u.jobs,
                    "gpu_hours": round(u.gpu_hours, 3),
                    "labels": {k: round(v, 3) for k, v in sorted(u.labels.items())},
                }
                for u in rows
            ]
        )
        return
    table = Table(title="GPU usage by model", title_justify="left")
    for col in ("model", "jobs", "GPU-hours", "labels"):
        table.add_column(col, justify="right" if col in ("jobs", "GPU-hours") else "left")
    for u in rows:
        detail = (
            ", ".join(f"{k} {v:.1f}" for k, v in sorted(u.labels.items()))
            if by_label
            else str(len(u.labels))
        )
        table.add_row(u.model, str(u.jobs), f"{u.gpu_hours:.1f}", detail)
    console.print(table)
    if any(u.model == "(untyped)" for u in rows):
        console.print(
            "(untyped): AllocTRES had gres/gpu without a type: list every label in "
            "AccountingStorageTRES (see site render's slurm.conf.snippet)"
        )
