"""`slurm-pal hook prolog|epilog|flush`: the Prolog/Epilog hooks for admins (PROTOCOL.md).

The rendered Prolog/Epilog scripts call ``python -m slurm_pal.hooks`` directly (this CLI imports
too much for a hook that must finish in well under a second); these commands run the same code
with the socket, spool dir and timeouts of the site config.
"""

from __future__ import annotations

from pathlib import Path

import typer

from slurm_pal.cli.common import console, print_json, state

app = typer.Typer(
    rich_markup_mode=None,
    help="Prolog/Epilog job records: run a hook by hand, resend spooled records.",
    no_args_is_help=True,
)

SOCKET_OPT = typer.Option(None, "--socket", help="Advisor socket (default: [advisor] socket).")
SPOOL_OPT = typer.Option(None, "--spool-dir", help="Spool dir (default: [hooks] spool_dir).")
LABELS_OPT = typer.Option(None, "--labels", help="labels.json from `site render` (for UUIDs).")


def _settings(
    ctx: typer.Context, socket: str | None, spool: Path | None
) -> tuple[str, Path, float]:
    cfg = state(ctx).config
    return (
        socket or cfg.advisor.socket,
        spool or Path(cfg.hooks.spool_dir),
        cfg.hooks.deliver_timeout_ms / 1000,
    )


def _run(
    ctx: typer.Context, kind: str, socket: str | None, spool: Path | None, labels: Path | None
):
    from slurm_pal.hooks.cli import run_hook

    sock, spool_dir, timeout_s = _settings(ctx, socket, spool)
    cfg = state(ctx).config
    record = run_hook(
        kind,
        socket_path=sock,
        spool_dir=spool_dir,
        timeout_s=timeout_s,
        tcp=cfg.hooks.advisor,
        munge_socket=cfg.hooks.munge_socket,
        labels=labels,
        telemetry=cfg.hooks.telemetry,
        sample_s=cfg.hooks.sample_s,
    )
    if record is None:
        console.print(f"{kind}: not in a Slurm job environment (SLURM_JOB_ID); nothing recorded")
    else:
        print_json(record)


@app.command()
def prolog(
    ctx: typer.Context,
    socket: str | None = SOCKET_OPT,
    spool_dir: Path | None = SPOOL_OPT,
    labels: Path | None = LABELS_OPT,
) -> None:
    """Record the job's GPUs on this node (SLURM_JOB_ID, SLURM_JOB_GPUS from the environment)."""
    _run(ctx, "prolog", socket, spool_dir, labels)


@app.command()
def epilog(
    ctx: typer.Context,
    socket: str | None = SOCKET_OPT,
    spool_dir: Path | None = SPOOL_OPT,
    labels: Path | None = LABELS_OPT,
) -> None:
    """Record the job's end on this node (exit code, telemetry summary)."""
    _run(ctx, "epilog", socket, spool_dir, labels)


@app.command()
def flush(
    ctx: typer.Context,
    socket: str | None = SOCKET_OPT,
    spool_dir: Path | None = SPOOL_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Resend the records waiting in the spool dir. Exit 1 when some are still left."""
    from slurm_pal.hooks.spool import flush as flush_spool

    sock, spool, timeout_s = _settings(ctx, socket, spool_dir)
    hooks = state(ctx).config.hooks
    # [hooks] advisor set: a compute node's records go to the controller over TCP (munge)
    result = flush_spool(spool, sock, timeout_s, tcp=hooks.advisor, munge_socket=hooks.munge_socket)
    if as_json:
        print_json(
            {
                "delivered": result.delivered,
                "left": result.left,
                "unreadable": result.unreadable,
            }
        )
    else:
        console.print(
            f"{len(result.delivered)} record(s) delivered, {len(result.left)} left in {spool}"
            + (f", {len(result.unreadable)} unreadable" if result.unreadable else "")
        )
    if result.left:
        raise typer.Exit(1)
