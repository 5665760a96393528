"""Entry point of the `slurm-pal` command: one typer app with a sub-app per area.

The sub-apps are imported only when their command runs: each brings what its work needs
(numpy, pandas, scikit-learn, the simulator), and a probe such as `serve health` or a hook
must not pay for all of them at every start.
"""

from __future__ import annotations

import importlib
import tempfile
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from slurm_pal import __version__
from slurm_pal.adapters.config import ENV_CONFIG, ENV_DB
from slurm_pal.cli.common import AppState, console, one_line_usage_errors, reported_errors

SUBCOMMANDS = {  # command name -> module in slurm_pal.cli that defines its typer `app`
    "advise": "advise",
    "apps": "apps",
    "campaign": "campaign",
    "hook": "hook",
    "profile": "profile",
    "serve": "serve",
    "sim": "sim",
    "site": "site",
    "testbed": "testbed",
    "tune": "tune",
}


class SlurmPalGroup(TyperGroup):
    """The root command: loads a sub-app when it is named, and turns every option-parsing
    error anywhere below it into the one ``error:`` line the project's own errors use."""

    def list_commands(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        return sorted(set(self.commands) | set(SUBCOMMANDS))

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:  # type: ignore[override]
        if cmd_name not in self.commands and cmd_name in SUBCOMMANDS:
            module = importlib.import_module(f"slurm_pal.cli.{SUBCOMMANDS[cmd_name]}")
            sub: typer.Typer = module.app
            # an app whose one command has the app's own name (tune) is that command, not a
            # group: `slurm-pal tune [OPTIONS]`, no COMMAND
            only = sub.registered_commands[0] if len(sub.registered_commands) == 1 else None
            named = only is not None and (only.name or getattr(only.callback, "__name__", ""))
            if named == cmd_name and not sub.registered_groups and sub.registered_callback is None:
                group = typer.main.get_command(sub)
            else:
                group = typer.main.get_group(sub)
            group.name = cmd_name
            self.commands[cmd_name] = group
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> Any:  # type: ignore[override]
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = get_close_matches(name, self.list_commands(ctx))
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            ctx.fail(f"no such command {name!r}{hint}")
        return super().resolve_command(ctx, args)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        with one_line_usage_errors():
            return super().invoke(ctx)


app = typer.Typer(
    cls=SlurmPalGroup,
    rich_markup_mode=None,
    name="slurm-pal",
    help="Variability- and locality-aware GPU placement advisor for Slurm (PM-First / PAL).",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main(
    ctx: typer.Context,
    # Each option and its environment variable are one parameter, so every command (the demo's
    # throw-away store, the store path `site render` writes into the unit) sees the same value.
    db: Path | None = typer.Option(
        None,
        "--db",
        envvar=ENV_DB,
        show_envvar=False,
        help="SQLite store (env SLURM_PAL_DB; default /var/lib/slurm-pal for root, "
        "else ~/.local/share/slurm-pal).",
        show_default=False,
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        envvar=ENV_CONFIG,
        show_envvar=False,
        help="Site configuration TOML (env SLURM_PAL_CONFIG; default: built-in defaults).",
        show_default=False,
    ),
) -> None:
    """Global options shared by every command."""
    ctx.obj = AppState(db=db, config_path=config)


@app.command()
def version() -> None:
    """Print the slurm-pal version."""
    typer.echo(__version__)


@app.command()
def demo(
    ctx: typer.Context,
    nodes: int = typer.Option(4, help="Nodes of the example campaign (the local Slurm: 4)."),
    gpus_per_node: int = typer.Option(4, help="GPUs per node of the example campaign."),
    offline: bool = typer.Option(
        False, "--offline", help="Only the campaign part: no local Slurm, no jobs."
    ),
    png: Path = typer.Option(
        Path("slurm-pal-demo.png"),
        "--png",
        help="Where the PNG comparing the two arms goes (needs the 'plot' extra).",
    ),
    trace_seed: int = typer.Option(
        18, "--trace-seed", help="Seed of the demo's workload (18: a clear predicted gain)."
    ),
) -> None:
    """The one-command demo: ingest the bundled example campaign and show its bins and labels;
    then (root, Slurm installed) run a deep-learning cluster's work with plain sbatch on a
    local Slurm of 8 hosts x 4 fake GPUs, a few far slower, under a packing control and under
    the advisor: where each job went and why, the GPU time each arm lost to slow GPUs, the
    measured gain beside the simulator's, and a PNG. Stops everything it started.

    Uses a throw-away store unless --db (or SLURM_PAL_DB) names one.
    """
    from slurm_pal.example_campaign import generate_example_campaign

    state: AppState = ctx.obj
    with tempfile.TemporaryDirectory(prefix="slurm-pal-demo-") as tmp:
        if state.db is None:
            state.db = Path(tmp) / "demo.db"
        csv_path = Path(tmp) / "example-campaign.csv"
        generate_example_campaign(nodes=nodes, gpus_per_node=gpus_per_node).to_csv(
            csv_path, index=False
        )
        console.rule("slurm-pal demo: bundled example campaign")
        console.print(
            f"{nodes}x{gpus_per_node} synthetic V100s, classes A (compute-bound) .. D "
            f"(memory-bound), 3 runs per GPU and class; store {state.db_path}"
        )
        with reported_errors():
            cfg = state.config
            from slurm_pal.adapters.campaign_csv import read_campaign_csv

            files = [read_campaign_csv(csv_path, gpu_model=cfg.profiling.gpu_model)]
            with state.store() as store:
                result = store.ingest(
                    files,
                    campaign_id="example",
                    class_order=cfg.classes.names,
                    binner=cfg.binning.binner(),
                    description="bundled example campaign",
                )
                console.print(f"ingested {result.rows} runs into campaign 'example'\n")
                from slurm_pal.cli.profile import print_bins

                print_bins(store, result.campaign_id)
                labels = store.labels(result.campaign_id)
        console.print(
            f"\n{len(labels)} PM signatures (future gres.conf Type= labels), e.g. "
            + ", ".join(str(r["label"]) for r in labels[:4])
        )
    if offline:
        console.print("live part skipped (--offline)")
        return
    from slurm_pal.testbed.demo import live_demo, missing_for_live_demo

    missing = missing_for_live_demo()
    if missing:
        console.rule("live part not run")
        console.print("The live demo (local Slurm + advisor + jobs) needs:", highlight=False)
        for item in missing:
            console.print(f"  - {item}", highlight=False, markup=False)
        return
    with reported_errors():
        code = live_demo(console, cfg, trace_seed=trace_seed, png=png)
    if code:
        raise typer.Exit(code)


if __name__ == "__main__":  # pragma: no cover
    app()
