"""A campaign's directory: the plan, the batch scripts, the benchmarks, the run records.

``campaign plan`` writes everything a campaign needs into one directory, which must be on a
filesystem the compute nodes share (the tasks write their records there; compute nodes never
open the SQLite store)::

    <root>/<campaign id>/
        campaign.json          the plan: classes, repeats, benchmark commands, GPUs
        runner.py              the in-task runner (stdlib only; a copy, so the campaign keeps
                               the code that measured it)
        bench/gemm.py          default benchmarks (copies)
        bench/stream.py
        sbatch/<node>.sbatch   one job array per node, one task per GPU
        results/*.json         one record per run (written by the tasks)
        logs/                  Slurm output of the tasks
        submissions.json       what ``campaign submit`` sent to Slurm (job ids per node)
        collected/<id>.csv     what ``campaign collect`` ingested (the project's CSV format)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from slurm_pal.core.campaigns import PlannedGpu, RecordError, RunRecord
from slurm_pal.errors import SlurmPalError

ENV_CAMPAIGNS = "SLURM_PAL_CAMPAIGNS"
PLAN_FILE = "campaign.json"
SUBMISSIONS_FILE = "submissions.json"
RESULTS_DIR = "results"
BENCH_DIR = "bench"
LOG_DIR = "logs"
SBATCH_DIR = "sbatch"
COLLECTED_DIR = "collected"
DEFAULT_BENCHMARKS = {
    "gemm": "{python} {bench_dir}/gemm.py",
    "stream": "{python} {bench_dir}/stream.py",
}
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class CampaignError(SlurmPalError, ValueError):
    """A campaign directory or plan problem; the message says what to do."""


@dataclass(frozen=True)
class Benchmark:
    """A class's representative benchmark: a shell command printing ``PAL_DURATION_S=``.

    ``{python}`` becomes the task's Python and ``{bench_dir}`` the campaign's bench folder.
    """

    name: str
    command: str


@dataclass(frozen=True)
class CampaignPlan:
    campaign: str
    classes: tuple[str, ...]
    repeats: int
    benchmarks: Mapping[str, Benchmark]
    gpus: tuple[PlannedGpu, ...]
    gpu_model: str = "gpu"
    partition: str | None = None
    time_limit: str = "01:00:00"
    run_timeout_s: float = 1800.0
    python: str = "python3"
    sbatch_args: tuple[str, ...] = ()
    node_gpu_counts: Mapping[str, int] = field(default_factory=dict)
    """GPUs each node has, where the plan measures only some of them (``plan --only``): each
    task still holds the whole node. A node not listed has just its planned GPUs. With
    ``gpu_type``: the node's GPUs of that type, all of which a task holds."""
    gpu_type: str | None = None
    """None (a campaign): each task holds its whole node, ``--exclusive``. A gres Type label
    (a re-measure): each task holds only the node's GPUs of that label, all of them (Slurm
    cannot be asked for one GPU by index, and all of them must include the measured one), and
    the node's other GPUs keep running other jobs."""
    warmup_s: float = 10.0
    """Seconds a benchmark runs before its timed window (``PAL_WARMUP_S`` for the command)."""
    measure_s: float = 20.0
    """Seconds of the timed window (``PAL_MEASURE_S``); see profiling/README.md."""
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.node for g in self.gpus))

    def node_gpus(self, node: str) -> list[int]:
        return sorted(g.gpu_index for g in self.gpus if g.node == node)

    def node_gpu_count(self, node: str) -> int:
        """GPUs a task must hold on ``node``: all of the node's, measured or not."""
        return int(self.node_gpu_counts.get(node) or len(self.node_gpus(node)))

    def to_dict(self) -> dict[str, object]:
        return {
            "schema": 1,
            "campaign": self.campaign,
            "created_at": self.created_at,
            "classes": list(self.classes),
            "repeats": self.repeats,
            "benchmarks": {
                c: {"name": b.name, "command": b.command} for c, b in self.benchmarks.items()
            },
            "gpus": [_gpu_dict(g) for g in self.gpus],
            "gpu_model": self.gpu_model,
            "partition": self.partition,
            "time_limit": self.time_limit,
            "run_timeout_s": self.run_timeout_s,
            "python": self.python,
            "sbatch_args": list(self.sbatch_args),
            "node_gpu_counts": dict(self.node_gpu_counts),
            "warmup_s": self.warmup_s,
            "measure_s": self.measure_s,
            "results_dir": RESULTS_DIR,
            "bench_dir": BENCH_DIR,
            "log_dir": LOG_DIR,
        } | ({"gpu_type": self.gpu_type} if self.gpu_type else {})

    @classmethod
    def from_dict(cls, data: Mapping[str, object], source: str) -> CampaignPlan:
        try:
            return cls(
                campaign=str(data["campaign"]),
                classes=tuple(data["classes"]),  # type: ignore[arg-type]
                repeats=int(data["repeats"]),  # type: ignore[call-overload]
                benchmarks={
                    c: Benchmark(str(b["name"]), str(b["command"]))
                    for c, b in data["benchmarks"].items()  # type: ignore[attr-defined]
                },
                gpus=tuple(
                    PlannedGpu(
                        str(g["node"]),
                        int(g["gpu_index"]),
                        g.get("uuid"),
                        None if g.get("slurm_index") is None else int(g["slurm_index"]),
                    )
                    for g in data["gpus"]  # type: ignore[attr-defined]
                ),
                gpu_model=str(data.get("gpu_model") or "gpu"),
                partition=data.get("partition"),  # type: ignore[arg-type]
                time_limit=str(data.get("time_limit") or "01:00:00"),
                run_timeout_s=float(data.get("run_timeout_s") or 1800.0),  # type: ignore[arg-type]
                python=str(data.get("python") or "python3"),
                sbatch_args=tuple(data.get("sbatch_args") or ()),  # type: ignore[arg-type]
                node_gpu_counts={
                    str(n): int(c)
                    for n, c in (data.get("node_gpu_counts") or {}).items()  # type: ignore[attr-defined]
                },
                created_at=str(data.get("created_at") or ""),
                warmup_s=float(data.get("warmup_s", 10.0)),  # type: ignore[arg-type]
                measure_s=float(data.get("measure_s", 20.0)),  # type: ignore[arg-type]
                gpu_type=str(data["gpu_type"]) if data.get("gpu_type") else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CampaignError(f"{source}: not a valid campaign plan ({exc!r})") from exc


def _gpu_dict(g: PlannedGpu) -> dict[str, object]:
    out: dict[str, object] = {"node": g.node, "gpu_index": g.gpu_index, "uuid": g.uuid}
    if g.slurm_index is not None:  # the runner checks the job holds it
        out["slurm_index"] = g.slurm_index
    return out


def check_campaign_id(campaign: str) -> str:
    if not _ID.match(campaign):
        raise CampaignError(
            f"campaign id {campaign!r} must be 1-64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (it names a directory, Slurm jobs and a store campaign)"
        )
    return campaign


def default_campaign_id(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return now.strftime("c%Y%m%d-%H%M%S")


def campaigns_root(explicit: Path | None, db_path: Path, configured: str | None = None) -> Path:
    """Where campaign directories live: --root, else $SLURM_PAL_CAMPAIGNS, else the site
    config's ``campaign.root``, else next to the db.

    The default suits a single-machine test; on a cluster it must be a shared filesystem.
    """
    if explicit is not None:
        return explicit
    env = os.environ.get(ENV_CAMPAIGNS)
    if env:
        return Path(env)
    if configured:
        return Path(configured)
    return db_path.parent / "campaigns"


def default_benchmarks(classes: Sequence[str], commands: Mapping[str, str]) -> dict[str, Benchmark]:
    """Each class's benchmark: its own command when given, else GEMM for the compute-bound
    first half of the class order and the STREAM triad for the memory-bound rest."""
    unknown = sorted(set(commands) - set(classes))
    if unknown:
        raise CampaignError(
            f"--command for class(es) {', '.join(unknown)} not in this campaign's classes "
            f"({', '.join(classes)})"
        )
    out: dict[str, Benchmark] = {}
    half = (len(classes) + 1) // 2
    for pos, job_class in enumerate(classes):
        if job_class in commands:
            command = commands[job_class]
            words = shlex.split(command) if command.strip() else []
            if not words:
                raise CampaignError(f"--command for class {job_class} is empty")
            files = [w for w in words if "/" in w or w.endswith((".py", ".sh"))]
            out[job_class] = Benchmark(f"custom:{Path((files or words)[0]).name}", command)
        else:
            name = "gemm" if pos < half else "stream"
            out[job_class] = Benchmark(name, DEFAULT_BENCHMARKS[name])
    return out


def parse_commands(items: Sequence[str]) -> dict[str, str]:
    """``CLASS=COMMAND`` options -> {class: command}."""
    out: dict[str, str] = {}
    for item in items:
        job_class, sep, command = item.partition("=")
        if not sep or not job_class.strip() or not command.strip():
            raise CampaignError(
                f"--command {item!r} must look like CLASS=COMMAND, e.g. "
                "A='python3 train.py --steps 50' (the command prints PAL_DURATION_S=<seconds>)"
            )
        if job_class.strip() in out:
            raise CampaignError(f"--command given twice for class {job_class.strip()}")
        out[job_class.strip()] = command.strip()
    return out


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("slurm_pal.campaigns", "profiling"),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shell_quote"] = lambda value: shlex.quote(str(value))
    return env


def render_sbatch(plan: CampaignPlan, directory: Path, node: str, array: str) -> str:
    """The batch script of one node's job array (``array``: the GPU minors to measure)."""
    return (
        _environment()
        .get_template("campaign.sbatch.j2")
        .render(
            campaign=plan.campaign,
            node=node,
            job_name=job_name(plan.campaign, node),
            gpus=plan.node_gpu_count(node),
            gpu_type=plan.gpu_type,
            array=array,
            time_limit=plan.time_limit,
            partition=plan.partition,
            sbatch_args=plan.sbatch_args,
            log_dir=str(directory / LOG_DIR),
            python=plan.python,
            runner=str(directory / "runner.py"),
            plan=str(directory / PLAN_FILE),
        )
    )


def job_name(campaign: str, node: str) -> str:
    return f"pal-{campaign}-{node}"


def create_campaign(root: Path, plan: CampaignPlan) -> Path:
    """Write a new campaign directory; refuses to touch an existing one."""
    check_campaign_id(plan.campaign)
    directory = root / plan.campaign
    if directory.exists():
        raise CampaignError(
            f"campaign directory {directory} already exists: choose another --id, or use "
            f"'slurm-pal campaign submit {plan.campaign}' to (re)run that campaign"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{plan.campaign}.partial"
        if tmp.exists():
            shutil.rmtree(tmp)
        for sub in (RESULTS_DIR, BENCH_DIR, LOG_DIR, SBATCH_DIR, COLLECTED_DIR):
            (tmp / sub).mkdir(parents=True)
        package = resources.files("slurm_pal.campaigns")
        (tmp / "runner.py").write_text(package.joinpath("runner.py").read_text("utf-8"))
        for name in ("gemm.py", "stream.py", "palbench.py"):
            text = package.joinpath("profiling", name).read_text("utf-8")
            (tmp / BENCH_DIR / name).write_text(text)
        (tmp / PLAN_FILE).write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
        for node in plan.nodes:
            array = ",".join(str(i) for i in plan.node_gpus(node))
            (tmp / SBATCH_DIR / f"{node}.sbatch").write_text(
                render_sbatch(plan, directory, node, array)
            )
        tmp.rename(directory)  # the campaign appears whole or not at all
    except OSError as exc:
        raise CampaignError(f"cannot write campaign directory under {root}: {exc}") from exc
    return directory


def load_plan(root: Path, campaign: str) -> tuple[CampaignPlan, Path]:
    check_campaign_id(campaign)
    directory = root / campaign
    path = directory / PLAN_FILE
    if not path.is_file():
        known = sorted(p.name for p in root.glob("*") if (p / PLAN_FILE).is_file())
        raise CampaignError(
            f"no campaign {campaign!r} under {root} (no {PLAN_FILE}); campaigns there: "
            f"{', '.join(known) or 'none'}. Plan one with 'slurm-pal campaign plan', or point "
            f"--root / ${ENV_CAMPAIGNS} at the right folder"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CampaignError(f"cannot read {path}: {exc}") from exc
    return CampaignPlan.from_dict(data, str(path)), directory


def read_records(directory: Path, campaign: str) -> tuple[list[RunRecord], list[str]]:
    """Every run record of the campaign, and one line per file that could not be used."""
    records: list[RunRecord] = []
    problems: list[str] = []
    results = directory / RESULTS_DIR
    for path in sorted(results.glob("*.json")):
        try:
            record = RunRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:  # JSONDecodeError and RecordError are ValueErrors
            kind = "bad record" if isinstance(exc, RecordError) else "unreadable"
            problems.append(f"{path.name}: {kind}: {exc}")
            continue
        if record.campaign != campaign:
            problems.append(f"{path.name}: belongs to campaign {record.campaign!r}, ignored")
            continue
        records.append(record)
    return records, problems


@dataclass(frozen=True)
class Submission:
    node: str
    job_id: str
    gpus: tuple[int, ...]
    submitted_at: str


def read_submissions(directory: Path) -> list[Submission]:
    path = directory / SUBMISSIONS_FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [
            Submission(str(s["node"]), str(s["job_id"]), tuple(s["gpus"]), str(s["submitted_at"]))
            for s in data
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CampaignError(f"cannot read {path}: {exc}; fix or remove it") from exc


def add_submission(directory: Path, submission: Submission) -> None:
    """Append one submission (rewritten through a temporary file and a rename)."""
    items = [*read_submissions(directory), submission]
    path = directory / SUBMISSIONS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            [
                {
                    "node": s.node,
                    "job_id": s.job_id,
                    "gpus": list(s.gpus),
                    "submitted_at": s.submitted_at,
                }
                for s in items
            ],
            indent=2,
        )
        + "\n"
    )
    os.replace(tmp, path)
