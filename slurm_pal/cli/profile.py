"""`slurm-pal profile ...`: campaign measurements in, PM-scores, bins and labels out."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.store import Store
from slurm_pal.campaigns.workspace import CampaignError, check_campaign_id
from slurm_pal.cli.common import (
    console,
    fail,
    fmt_score,
    print_json,
    reported_errors,
    state,
    step,
    steps,
    warn,
)
from slurm_pal.core.variability import ClassBins

app = typer.Typer(
    rich_markup_mode=None,
    help="Profiling campaigns: ingest measurements, inspect PM-scores and bins.",
    no_args_is_help=True,
)

CAMPAIGN_OPT = typer.Option(None, "--campaign", help="Campaign id (default: the active one).")
JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of a table.")


@app.command()
def ingest(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(
        ..., help="Campaign CSV files (slurm-pal or Longhorn format)."
    ),
    job_class: str | None = typer.Option(
        None, "--class", "-c", help="Job class these files measure (else a job_class column)."
    ),
    campaign: str | None = typer.Option(
        None, "--campaign", help="Add to this campaign (created if new; default: a new one)."
    ),
    gpu_model: str | None = typer.Option(
        None, "--gpu-model", help="GPU model for rows that do not name one (e.g. v100)."
    ),
    pal_artifact: bool | None = typer.Option(
        None,
        "--pal-artifact/--no-pal-artifact",
        help="Bin like PAL's public code (K=2 + one per outlier) for paper reproductions.",
    ),
    description: str = typer.Option(
        "", "--description", help="Free text kept with a new campaign."
    ),
) -> None:
    """Load per-GPU benchmark results into a campaign and (re)compute its bins."""
    st = state(ctx)
    if campaign is not None:
        try:
            check_campaign_id(campaign)
        except CampaignError as exc:
            fail(f"--campaign: {exc}")
    with reported_errors():
        cfg = st.config
        if job_class is not None and job_class not in cfg.classes.names:
            fail(
                f"unknown class {job_class!r}; valid classes: {', '.join(cfg.classes.names)} "
                f"(set classes.names in the site config, {cfg.source})"
            )
        model = gpu_model or cfg.profiling.gpu_model
        with steps() as progress:
            files = []
            for p in paths:
                progress(f"reading {p}")
                files.append(read_campaign_csv(p, job_class=job_class, gpu_model=model))
            for f in files:
                unknown = sorted(set(f.rows["job_class"]) - set(cfg.classes.names))
                if unknown:
                    fail(
                        f"{f.path}: unknown class(es) {', '.join(unknown)}; valid classes: "
                        f"{', '.join(cfg.classes.names)}"
                    )
            with st.store() as store:
                result = store.ingest(
                    files,
                    campaign_id=campaign,
                    class_order=cfg.classes.names,
                    binner=cfg.binning.binner(pal_artifact=pal_artifact),
                    description=description,
                    on_step=progress,
                )
    verb = "created" if result.created else "updated"
    console.print(
        f"{verb} campaign [bold]{escape(result.campaign_id)}[/]: {result.files} file(s), "
        f"{result.rows} run(s), class(es) {', '.join(result.classes)}"
        + (" (now active)" if result.activated else "")
    )


@app.command()
def bins(
    ctx: typer.Context,
    campaign: str | None = CAMPAIGN_OPT,
    as_json: bool = JSON_OPT,
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Write bins-CAMPAIGN.png into this directory: per class, the histogram of GPUs' "
        "PM-scores with the bins marked (needs slurm-pal[plot]).",
        show_default=False,
    ),
) -> None:
    """Per class: chosen K, silhouette, bins (PM-score and GPU count), outliers."""
    st = state(ctx)
    if plot is not None:
        from slurm_pal.cli.plots import plot_directory, pyplot

        pyplot()  # a missing matplotlib is said before anything else
        plot_directory(plot)
    with reported_errors(), st.store(create=False) as store:
        campaign_id = _campaign_to_show(store, campaign)
        per_class = store.class_bins(campaign_id) if campaign_id else {}
        scores = store.gpu_scores(campaign_id) if plot is not None and campaign_id else None
    written = None
    if plot is not None and campaign_id is not None and scores is not None:
        from slurm_pal.cli.plots import bins_plot

        target = plot / f"bins-{campaign_id}.png"
        with step(f"drawing {target}"):
            written = bins_plot(campaign_id, per_class, scores, target)
    if as_json:
        print_json({c: b.to_dict() for c, b in per_class.items()})
        return
    if campaign_id is None:
        return
    console.print(f"campaign [bold]{escape(campaign_id)}[/]")
    for b in per_class.values():
        _print_class_bins(b)
    if written is not None:
        console.print(f"wrote {written}", markup=False, highlight=False)


NO_CAMPAIGN_YET = (
    "no campaign yet: ingest one with 'slurm-pal profile ingest PATH --class CLASS', or try the "
    "bundled example: 'slurm-pal profile example -o example.csv' then "
    "'slurm-pal profile ingest example.csv'"
)


def _campaign_to_show(store: Store, campaign: str | None) -> str | None:
    """The campaign a read command shows: the one named (which must exist), else the active
    one; None, with a note, when the store holds no campaign yet (a new or missing store
    reads as an empty view, not as an error)."""
    if campaign is None and store.active_campaign_id() is None:
        warn(NO_CAMPAIGN_YET)
        return None
    return store.resolve_campaign(campaign)


def _class_summary(b: ClassBins) -> str:
    sil = fmt_score(b.silhouette)
    outliers = f", {len(b.outliers)} outlier(s)" if b.outliers else ""
    return (
        f"class {b.job_class}: K={b.k}, silhouette {sil}, {b.measured_gpus} GPUs measured"
        + (f", {b.unmeasured_gpus} unmeasured (median bin)" if b.unmeasured_gpus else "")
        + outliers
        + (" [pal-artifact]" if b.mode == "pal-artifact" else "")
    )


def _bins_table(b: ClassBins) -> Table:
    """Bins and outliers of one class. GPUs is always a count; an outlier's GPU id has a
    column of its own (shown only when the class has outliers)."""
    table = Table(title_justify="left")
    table.add_column("bin", justify="right")
    table.add_column("PM-score", justify="right")
    table.add_column("GPUs", justify="right")
    if b.outliers:
        table.add_column("outlier GPU")
    for i, item in enumerate(b.bins):
        table.add_row(str(i), f"{item.score:.4f}", str(item.gpus), *([""] if b.outliers else []))
    for uuid, score in b.outliers:
        table.add_row("outlier", f"{score:.4f}", "1", escape(uuid))
    return table


def _print_class_bins(b: ClassBins) -> None:
    # The summary is a line of its own: as a table title rich wraps it to the table's width.
    console.print(_class_summary(b), markup=False, highlight=False)
    console.print(_bins_table(b))


@app.command()
def show(
    ctx: typer.Context,
    gpu: str = typer.Argument(..., help="GPU UUID (or a location id such as c002-4-1)."),
    campaign: str | None = CAMPAIGN_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """One GPU: raw medians, normalized values, PM-scores and bins per class, and its label."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store:
        campaign_id = store.resolve_campaign(campaign)
        uuid = store.canonical_uuid(campaign_id, gpu)
        rows = store.gpu_scores(campaign_id, uuid)
        label = store.gpu_labels(campaign_id).get(uuid)
        suspect = [r for r in store.suspicions(campaign_id) if r["gpu"] == uuid]
    if rows.empty:
        fail(f"GPU {gpu!r} is not in campaign {campaign_id!r}")
    first = rows.iloc[0]
    info = {
        "uuid": uuid,
        "campaign": campaign_id,
        "node": first["node"],
        "gpu_index": None
        if first["gpu_index"] is None or str(first["gpu_index"]) == "<NA>"
        else int(first["gpu_index"]),
        "gpu_model": first["gpu_model"],
        "label": label,
        "classes": {
            r["job_class"]: {
                "measured": bool(r["measured"]),
                "runs": int(r["n_runs"]),
                "raw_median": _opt(r["raw_median"]),
                "normalized": _opt(r["norm_value"]),
                "pm_score": float(r["pm_score"]),
                "bin": "outlier" if r["bin"] < 0 else int(r["bin"]),
            }
            for _, r in rows.iterrows()
        },
        "suspect": [{k: v for k, v in r.items() if k not in ("campaign", "gpu")} for r in suspect],
    }
    if as_json:
        print_json(info)
        return
    console.print(
        f"GPU [bold]{escape(uuid)}[/] ({escape(str(info['gpu_model']))}) on "
        f"{escape(str(info['node'] or '?'))} "
        f"index {info['gpu_index'] if info['gpu_index'] is not None else '?'}, "
        f"label {escape(str(label))}"
    )
    table = Table()
    for col in ("class", "runs", "raw median", "normalized", "PM-score", "bin", "measured"):
        table.add_column(col, justify="right")
    for cls, c in info["classes"].items():
        table.add_row(
            cls,
            str(c["runs"]),
            fmt_score(c["raw_median"], 4),
            fmt_score(c["normalized"], 4),
            f"{c['pm_score']:.4f}",
            str(c["bin"]),
            "yes" if c["measured"] else "no (fallback)",
        )
    console.print(table)
    for r in suspect:  # what the advisor service found since the campaign (store)
        cls, cause = escape(str(r["job_class"])), escape(str(r["cause"]))
        since, jobs = _utc(r["since_s"]), _jobs(r["evidence"])
        console.print(f"suspect for class {cls} since {since}: {cause} (advisor; jobs {jobs})")


@app.command()
def gpus(
    ctx: typer.Context,
    campaign: str | None = CAMPAIGN_OPT,
    node: list[str] = typer.Option(
        [], "--node", "-n", help="Only these nodes (repeatable).", show_default=False
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """A campaign's GPUs: node, index, model, label, and whether each class measured it."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store:
        campaign_id = _campaign_to_show(store, campaign)
        if campaign_id is None:
            if as_json:
                print_json({"campaign": None, "gpus": []})
            return
        frame = store.gpu_scores(campaign_id)
        labels_of = store.gpu_labels(campaign_id)
        suspect: dict[str, list[str]] = {}
        for r in store.suspicions(campaign_id):
            suspect.setdefault(str(r["gpu"]), []).append(str(r["job_class"]))
    if node:
        unknown = sorted(set(node) - set(frame["node"].dropna()))
        if unknown:
            fail(f"node(s) {', '.join(unknown)} have no GPUs in campaign {campaign_id!r}")
        frame = frame[frame["node"].isin(node)]
    rows: list[dict[str, Any]] = []
    for uuid, group in frame.groupby("uuid", sort=False):
        first = group.iloc[0]
        index = first["gpu_index"]
        rows.append(
            {
                "uuid": str(uuid),
                "node": first["node"],
                "gpu_index": None if index is None or str(index) == "<NA>" else int(index),
                "gpu_model": first["gpu_model"],
                "label": labels_of.get(str(uuid)),
                "measured": sorted(str(c) for c in group[group["measured"]]["job_class"]),
                "suspect": sorted(suspect.get(str(uuid), [])),
            }
        )
    rows.sort(key=lambda r: (str(r["node"] or ""), r["gpu_index"] or 0, r["uuid"]))
    if as_json:
        print_json({"campaign": campaign_id, "gpus": rows})
        return
    table = Table(title=f"campaign {escape(campaign_id)}: {len(rows)} GPUs", title_justify="left")
    for column in ("node", "index", "uuid", "model", "label", "measured classes", "suspect for"):
        table.add_column(column, justify="right" if column == "index" else "left")
    for r in rows:
        table.add_row(
            escape(str(r["node"] or "?")),
            "?" if r["gpu_index"] is None else str(r["gpu_index"]),
            escape(r["uuid"]),  # type: ignore[arg-type]
            escape(str(r["gpu_model"])),
            escape(str(r["label"] or "-")),
            ",".join(r["measured"]) or "-",  # type: ignore[arg-type]
            ",".join(r["suspect"]) or "-",  # type: ignore[arg-type]
        )
    console.print(table)


def _utc(epoch: object) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(epoch)))  # type: ignore[arg-type]


def _jobs(evidence: object) -> str:
    ids = [str(e.get("job_id")) for e in evidence if isinstance(e, dict)]  # type: ignore[attr-defined]
    return ",".join(ids) or "-"


def _opt(value: object) -> float | None:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if f != f else f


@app.command()
def labels(
    ctx: typer.Context, campaign: str | None = CAMPAIGN_OPT, as_json: bool = JSON_OPT
) -> None:
    """The PM signature labels (future gres.conf Type= values): bins and scores per class."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store:
        campaign_id = _campaign_to_show(store, campaign)
        rows: list[dict[str, Any]] = store.labels(campaign_id) if campaign_id else []
    if campaign_id is None:
        if as_json:
            print_json({"campaign": None, "labels": []})
        return
    if as_json:
        print_json({"campaign": campaign_id, "labels": rows})
        return
    table = Table(
        title=f"campaign {escape(campaign_id)}: {len(rows)} PM signatures", title_justify="left"
    )
    table.add_column("label")
    table.add_column("model")
    table.add_column("GPUs", justify="right")
    table.add_column("PM-scores per class")
    for r in rows:
        scores = "  ".join(f"{c}={s:.3f}" for c, s in r["scores"].items())
        table.add_row(r["label"], escape(str(r["gpu_model"])), str(r["gpus"]), scores)
    console.print(table)


@app.command()
def campaigns(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """List campaigns; the active one is what the advisor places by."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store:
        items = store.campaigns()
    if as_json:
        print_json([c.__dict__ for c in items])
        return
    table = Table()
    for col in ("id", "active", "created (UTC)", "classes", "files", "runs", "binning"):
        table.add_column(col)
    for c in items:
        mode = "pal-artifact" if c.binning.get("pal_artifact") else "silhouette"
        table.add_row(
            escape(c.id),
            "*" if c.active else "",
            c.created_at,
            ",".join(c.classes),
            str(c.sources),
            str(c.measurements),
            mode,
        )
    console.print(table)


@app.command()
def activate(ctx: typer.Context, campaign: str = typer.Argument(..., help="Campaign id.")) -> None:
    """Make a campaign the active one."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store:
        store.activate(campaign)
    console.print(f"campaign [bold]{escape(campaign)}[/] is now active")


@app.command()
def rebin(
    ctx: typer.Context,
    campaign: str | None = CAMPAIGN_OPT,
    pal_artifact: bool | None = typer.Option(
        None, "--pal-artifact/--no-pal-artifact", help="Bin like PAL's public code, or not."
    ),
) -> None:
    """Recompute a campaign's bins with the site's binning settings (raw rows are kept)."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store, steps() as progress:
        campaign_id = store.resolve_campaign(campaign)
        store.rebin(
            campaign_id,
            class_order=st.config.classes.names,
            binner=st.config.binning.binner(pal_artifact=pal_artifact),
            on_step=progress,
        )
    console.print(f"campaign [bold]{escape(campaign_id)}[/] re-binned")


@app.command()
def example(
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the campaign CSV."),
    nodes: int = typer.Option(16, help="Number of nodes."),
    gpus_per_node: int = typer.Option(4, help="GPUs per node."),
    node_prefix: str = typer.Option("node", help="Node names are PREFIX01, PREFIX02, ..."),
    seed: int = typer.Option(2026, help="Random seed (same seed, same campaign)."),
) -> None:
    """Write the bundled synthetic example campaign (slurm-pal CSV format)."""
    from slurm_pal.example_campaign import generate_example_campaign

    try:
        frame = generate_example_campaign(
            nodes=nodes, gpus_per_node=gpus_per_node, node_prefix=node_prefix, seed=seed
        )
    except ValueError as exc:
        fail(str(exc))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out, index=False)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    console.print(
        f"wrote {len(frame)} runs ({nodes}x{gpus_per_node} GPUs, classes A-D) to {escape(str(out))}"
    )


def print_bins(store: Store, campaign_id: str) -> None:
    """Shared by the demo: the bins tables of one campaign."""
    for b in store.class_bins(campaign_id).values():
        _print_class_bins(b)
