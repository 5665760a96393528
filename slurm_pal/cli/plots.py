"""PNG plots of the CLI (``--plot``): matplotlib is an optional extra, imported only here.

Each function draws one figure from data the command already has and returns the path it
wrote; a missing matplotlib or an unwritable folder is one line (``fail``), never a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from slurm_pal.cli.common import fail
from slurm_pal.core.variability import ClassBins
from slurm_pal.sim.metrics import SimResult

MATPLOTLIB_HINT = "--plot needs matplotlib (pip install 'slurm-pal[plot]')"
DPI = 120


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend, or one line saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(MATPLOTLIB_HINT)
    return plt


def plot_directory(directory: Path) -> Path:
    """The ``--plot`` folder, created; checked before a long run, so a typo costs nothing."""
    if directory.exists() and not directory.is_dir():
        fail(f"--plot {directory}: exists and is not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--plot {directory}: cannot create the folder: {exc.strerror or exc}")
    return directory


def _save(plt: Any, figure: Any, path: Path) -> Path:
    try:
        figure.savefig(path, dpi=DPI, bbox_inches="tight")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")
    finally:
        plt.close(figure)
    return path


def _hours_axis(axes: Any) -> None:
    """Log-scale time axis labelled in plain hours (0.1, 1, 10, 100) rather than 10^x."""
    from matplotlib.ticker import FuncFormatter

    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))


def sim_plots(results: Sequence[SimResult], directory: Path) -> list[Path]:
    """Per scheduler: the JCT CDF of every placement (log time axis: job times span minutes to
    days, and a linear axis squeezes most jobs against zero) and GPUs in use over time."""
    plt = pyplot()
    plot_directory(directory)
    written: list[Path] = []
    for scheduler in dict.fromkeys(r.scheduler for r in results):
        group = [r for r in results if r.scheduler == scheduler]
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for result in group:
            jcts = np.sort(np.array([j / 3600 for j in result.jcts() if j > 0]))
            if len(jcts):
                fraction = np.arange(1, len(jcts) + 1) / len(jcts)
                axes.step(jcts, fraction, where="post", label=result.placement)
        _hours_axis(axes)
        axes.set_ylim(0, 1.01)
        axes.set_xlabel("job completion time (h, log scale)")
        axes.set_ylabel("fraction of jobs finished")
        axes.set_title(f"JCT CDF ({scheduler})")
        axes.grid(alpha=0.35, which="major")
        axes.grid(alpha=0.1, which="minor")
        axes.legend(loc="lower right", fontsize="small")
        written.append(_save(plt, figure, directory / f"jct_cdf_{scheduler}.png"))
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for result in group:
            times = [t / 3600 for t, _ in result.timeline]
            busy = [b for _, b in result.timeline]
            axes.step(times, busy, where="post", label=result.placement)
        axes.set_xlabel("time (h)")
        axes.set_ylabel("GPUs in use")
        axes.set_ylim(0, group[0].n_gpus * 1.05)
        axes.set_title(f"GPUs in use ({scheduler}, {group[0].n_gpus} GPUs)")
        axes.grid(alpha=0.3)
        axes.legend(loc="upper right", fontsize="small")
        written.append(_save(plt, figure, directory / f"gpus_in_use_{scheduler}.png"))
    return written


def bins_plot(
    campaign_id: str, per_class: Mapping[str, ClassBins], scores: pd.DataFrame, path: Path
) -> Path:
    """One panel per class: the histogram of measured GPUs' normalized values (median GPU =
    1.0), coloured by the bin each GPU landed in, each bin's PM-score (its centroid) as a
    dashed line, outliers in red."""
    plt = pyplot()
    plot_directory(path.parent)
    classes = [c for c in per_class if not scores[scores["job_class"] == c].empty]
    if not classes:
        fail(f"campaign {campaign_id} has no measured GPUs to plot")
    figure, panels = plt.subplots(
        len(classes), 1, figsize=(10, 2.3 * len(classes) + 0.6), squeeze=False
    )
    colours = plt.get_cmap("tab10").colors
    for axes, job_class in zip(panels[:, 0], classes, strict=True):
        info = per_class[job_class]
        rows = scores[(scores["job_class"] == job_class) & scores["measured"]]
        values = rows["norm_value"].astype(float).to_numpy()
        if not np.isfinite(values).any():
            continue
        # The x range follows the bins' GPUs: a few far outliers would squeeze every bin into
        # one bar. Outliers outside it are counted at the edge instead.
        body = rows[rows["bin"] >= 0]["norm_value"].astype(float).to_numpy()
        body = body[np.isfinite(body)] if len(body) else values[np.isfinite(values)]
        low, high = float(body.min()), float(body.max())
        pad = max((high - low) * 0.08, 0.002)
        low, high = low - pad, high + pad
        edges = np.linspace(low, high, min(60, max(12, len(body) // 3)) + 1)
        groups, labels, tints = [], [], []
        for number, item in enumerate(info.bins):
            members = rows[rows["bin"] == number]["norm_value"].astype(float).to_numpy()
            groups.append(members[(members >= low) & (members <= high)])
            labels.append(f"bin {number}: {item.score:.3f} ({item.gpus} GPUs)")
            tints.append(colours[number % len(colours)])
        outliers = rows[rows["bin"] < 0]["norm_value"].astype(float).to_numpy()
        inside = outliers[(outliers >= low) & (outliers <= high)]
        if len(outliers):
            # Outliers outside the bins' range are named in the legend, not drawn.
            off_axis = []
            below, above = outliers[outliers < low], outliers[outliers > high]
            if len(below):
                off_axis.append(f"{len(below)} left of the axis, min {below.min():.3f}")
            if len(above):
                off_axis.append(f"{len(above)} right of the axis, max {above.max():.3f}")
            groups.append(inside)
            labels.append("\n".join([f"outliers ({len(outliers)})", *off_axis]))
            tints.append("#d62728")
        axes.hist(
            groups,
            bins=edges,
            stacked=True,
            color=tints,
            label=labels,
            edgecolor="white",
            linewidth=0.4,
        )
        if len(inside):
            axes.plot(inside, np.zeros(len(inside)), "|", color="#d62728", markersize=14)
        axes.set_xlim(low, high)
        for item in info.bins:
            axes.axvline(item.score, color="black", linestyle="--", linewidth=1.2)
        axes.axvline(1.0, color="grey", linestyle=":", linewidth=1.0)
        sil = "-" if info.silhouette is None else f"{info.silhouette:.2f}"
        axes.set_title(
            f"class {job_class}: K={info.k}, silhouette {sil}, {info.measured_gpus} GPUs",
            fontsize="medium",
            loc="left",
        )
        axes.set_ylabel("GPUs")
        axes.grid(alpha=0.3, axis="y")
        # Beside the panel, so a long legend never hides the histogram.
        axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    panels[-1, 0].set_xlabel(
        "run time / the median GPU's (dotted: 1.0); dashed: each bin's PM-score"
    )
    figure.suptitle(f"PM-scores of campaign {campaign_id}", x=0.01, ha="left")
    figure.tight_layout()
    return _save(plt, figure, path)


def tune_plot(
    rows: Sequence[Mapping[str, Any]], ratios: Mapping[str, Sequence[float]], title: str, path: Path
) -> Path:
    """Per candidate, its paired runs' average-JCT ratio against packing (one dot per seed),
    the geometric mean and its bootstrap 95 % interval; left of 1.0 = faster than packing."""
    plt = pyplot()
    plot_directory(path.parent)
    figure, axes = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.6))
    rng = np.random.default_rng(0)
    for y, row in enumerate(rows):
        values = np.array(ratios[row["candidate"]], dtype=float)
        jitter = rng.uniform(-0.15, 0.15, len(values))
        tint = "grey" if row.get("noise_reference") else ("#2ca02c" if row["clear_gain"] else "C0")
        axes.scatter(values, y + jitter, s=14, color=tint, alpha=0.6, linewidths=0)
        geomean = 1.0 - float(row["geomean_gain"])
        low, high = row["gain_ci95"]
        axes.errorbar(
            geomean,
            y,
            xerr=[[max(0.0, geomean - (1.0 - high))], [max(0.0, (1.0 - low) - geomean)]],
            fmt="D",
            color="black",
            markersize=5,
            capsize=3,
        )
    axes.axvline(1.0, color="black", linewidth=1.0)
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels([str(r["candidate"]) for r in rows], fontsize="small")
    axes.invert_yaxis()
    finite = [v for vs in ratios.values() for v in vs if math.isfinite(v)]
    if finite:
        spread = max(abs(1.0 - min(finite)), abs(max(finite) - 1.0), 0.02) * 1.1
        axes.set_xlim(1.0 - spread, 1.0 + spread)
    axes.set_xlabel("average JCT / packed-sticky's, per paired run (< 1: faster than packing)")
    axes.set_title(title, fontsize="medium", loc="left")
    axes.grid(alpha=0.3, axis="x")
    return _save(plt, figure, path)
