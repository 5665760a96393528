"""`slurm-pal advise ...`: inspect what the placement core would do with the active campaign."""

from __future__ import annotations

import typer
from rich.table import Table

from slurm_pal.adapters.config import ConfigError
from slurm_pal.adapters.site_topology import topology_from_config
from slurm_pal.cli.common import console, fail, print_json, reported_errors, state
from slurm_pal.core.lxv import LxVMatrix

app = typer.Typer(
    rich_markup_mode=None,
    help="Inspect placement decisions: the L x V matrix.",
    no_args_is_help=True,
)


@app.command()
def lxv(
    ctx: typer.Context,
    job_class: str = typer.Option(..., "--class", "-c", help="Job class (e.g. A)."),
    campaign: str | None = typer.Option(None, "--campaign", help="Default: the active one."),
    across: float | None = typer.Option(
        None, "--locality-penalty", help="What-if: the across-nodes penalty (default: config)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """PAL's L x V matrix for one class, in the order PAL walks it (smallest LV product first)."""
    st = state(ctx)
    with reported_errors():
        # The site's own topology first: its errors name the config file; then the what-if,
        # whose errors name the option that was typed.
        topology = topology_from_config(st.config.locality, source=st.config.source)
        if across is not None:
            try:
                topology = topology_from_config(st.config.locality, across_override=across)
            except ConfigError as exc:
                fail(f"--locality-penalty {across:g}: {exc.__cause__ or exc}")
        with st.store(create=False) as store:
            campaign_id = store.resolve_campaign(campaign)
            per_class = store.class_bins(campaign_id)
    if job_class not in per_class:
        fail(
            f"class {job_class!r} has no bins in campaign {campaign_id!r}; classes: "
            f"{', '.join(per_class) or 'none'}"
        )
    bins = per_class[job_class]
    bin_names = {b.score: f"bin {i}" for i, b in enumerate(bins.bins)}
    for rank, (_uuid, score) in enumerate(bins.outliers):
        bin_names.setdefault(score, f"outlier x{rank}")
    scores = tuple(sorted(bin_names))
    try:
        matrix = LxVMatrix.build(job_class, scores, topology.levels)
    except ValueError as exc:
        fail(str(exc))
    rows = matrix.rows()
    for row in rows:
        row["bin_name"] = bin_names[scores[int(row["bin"])]]  # type: ignore[call-overload]
    if as_json:
        print_json({"campaign": campaign_id, "class": job_class, "traversal": rows})
        return
    table = Table(
        title=f"L x V traversal, class {job_class}, campaign {campaign_id}", title_justify="left"
    )
    for col in ("rank", "level", "L", "V", "bin", "LV"):
        table.add_column(col, justify="right" if col in ("rank", "L", "V", "LV") else "left")
    for row in rows:
        table.add_row(
            str(row["rank"]),
            str(row["level"]),
            f"{row['penalty']:.2f}",
            f"{row['bin_score']:.4f}",
            str(row["bin_name"]),
            f"{row['lv_product']:.4f}",
        )
    console.print(table)
