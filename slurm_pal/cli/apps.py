"""`slurm-pal apps ...`: profile applications, fit the job classes, override, resolve jobs.

Applications are what jobs map to: ``apps classify`` turns telemetry files (Nsight Compute
CSV, DCGM text, an NVML job record) into an application's (DRAM, FU) utilization and its
class; ``apps fit`` fits the classifier on every stored application; ``apps set`` pins an
application's class (an admin override that refits keep); ``apps resolve`` shows which
class a job would get and why, by the very function the submit path uses.

Every command reads all its input before it writes, and writes in one transaction, so a bad
file stores nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from slurm_pal.adapters.config import CLASSIFY_SOURCES, SiteConfig
from slurm_pal.adapters.dcgm import (
    DcgmParseError,
    DcgmSample,
    dcgm_features,
    parse_dmon,
    parse_prometheus,
)
from slurm_pal.adapters.ncu import NcuParseError, application_features, read_ncu_csv
from slurm_pal.adapters.store import Application, ClassifierModel
from slurm_pal.cli.common import console, fail, print_json, reported_errors, state, warn
from slurm_pal.core.classifier import JobClassifier, TooFewApplicationsWarning
from slurm_pal.core.features import UtilizationFeatures
from slurm_pal.core.resolve import JobRequest, check_app_name, resolve
from slurm_pal.errors import SlurmPalError

app = typer.Typer(
    rich_markup_mode=None,
    help="Applications and job classes: classify telemetry, fit classes, override, resolve.",
    no_args_is_help=True,
)

JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of a table.")
_SNIFF_BYTES = 65536
_DMON_HEADER_RE = re.compile(r"^\s*#\s*Entity(Id)?\s", re.MULTILINE)


class TelemetryInputError(SlurmPalError, ValueError):
    """A telemetry file that cannot be used; the message starts with ``file[:line]:``."""


@contextmanager
def _input_errors() -> Iterator[None]:
    """Parser errors (they name file and line) become one clear line and exit code 2."""
    try:
        yield
    except (NcuParseError, DcgmParseError, TelemetryInputError) as exc:
        fail(str(exc))


# --------------------------------------------------------------------------------------------
# Telemetry files -> features


def detect_source(path: Path) -> str:
    """ncu, nvml or dcgm, from the file's start: JSON is an NVML job record, a '#Entity'
    header or DCGM_FI_PROF_ names are DCGM, anything else is read as ncu CSV (whose parser
    then says precisely what is wrong with it)."""
    with path.open("rb") as handle:
        head = handle.read(_SNIFF_BYTES).decode("utf-8-sig", errors="replace")
    stripped = head.lstrip()
    if stripped.startswith(("{", "[")):
        return "nvml"
    if _DMON_HEADER_RE.search(head) or "DCGM_FI_PROF_" in head:
        return "dcgm"
    return "ncu"


def _ncu_features(paths: Sequence[Path]) -> UtilizationFeatures:
    reports = [read_ncu_csv(p) for p in paths]
    for report in reports:
        if report.errors:
            line, text = report.errors[0]
            raise NcuParseError(
                report.path,
                line,
                f"ncu reported an error ({text}); the table may be incomplete: profile the "
                "application again",
            )
    return application_features(reports)


def _dcgm_samples(path: Path) -> list[DcgmSample]:
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    if _DMON_HEADER_RE.search(text):
        return parse_dmon(text, str(path))
    return parse_prometheus(text, str(path))


def _dcgm_features(paths: Sequence[Path]) -> UtilizationFeatures:
    samples: list[DcgmSample] = []
    for path in paths:
        file_samples = _dcgm_samples(path)
        dcgm_features(file_samples, source=str(path))  # each file must stand on its own
        samples.extend(file_samples)
    return dcgm_features(samples, source=", ".join(str(p) for p in paths))


#: Keys the NVML sampler's summary carries besides the features (``hooks sample`` output and
#: the Epilog record's ``telemetry``): the interval count again, and what went wrong.
_SAMPLER_EXTRA_KEYS = frozenset({"samples", "errors"})


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _json_items(path: Path, text: str) -> tuple[list[Any], bool]:
    """The JSON values of a file: one object, a list, or JSON lines (a record export)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(lines) < 2 or not _is_json(lines[0][1]):
            raise TelemetryInputError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        items = []
        for number, line in lines:
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as line_exc:
                raise TelemetryInputError(
                    f"{path}:{number}: neither one JSON document nor JSON lines: {line_exc.msg}"
                ) from None
        return items, True
    return (data, True) if isinstance(data, list) else ([data], False)


def _telemetry_of(item: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The features dict inside one item: the item itself (sampler output) or the
    ``telemetry`` of a Prolog/Epilog record; None for a record that carries none."""
    if "record_id" in item or item.get("kind") in ("prolog", "epilog"):
        telemetry = item.get("telemetry")
        if telemetry is None:
            return None
        if not isinstance(telemetry, dict):
            raise TelemetryInputError(f"{where}: 'telemetry' is not an object: {telemetry!r:.60}")
        item = telemetry
    return {k: v for k, v in item.items() if k not in _SAMPLER_EXTRA_KEYS}


def _nvml_records(path: Path) -> list[UtilizationFeatures]:
    """NVML features from anything the project writes: the sampler's summary
    (``python -m slurm_pal.hooks sample``), a Prolog/Epilog record (spooled or exported,
    one object, a list or JSON lines), or a bare ``UtilizationFeatures`` object."""
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    items, many = _json_items(path, text)
    if not items:
        raise TelemetryInputError(f"{path}: an empty list; expected NVML job record(s)")
    records = []
    without: list[str] = []
    for number, item in enumerate(items, start=1):
        where = f"{path}: record {number}" if many else str(path)
        if not isinstance(item, dict):
            raise TelemetryInputError(f"{where}: expected a JSON object, got {item!r:.60}")
        telemetry = _telemetry_of(item, where)
        if telemetry is None:
            without.append(f"{item.get('kind', 'record')} {item.get('record_id', number)}")
            continue
        try:
            record = UtilizationFeatures.from_dict(telemetry)
        except (TypeError, ValueError) as exc:
            raise TelemetryInputError(
                f"{where}: not NVML telemetry (sampler summary, Epilog record or "
                f"UtilizationFeatures JSON): {exc}"
            ) from None
        if record.source != "nvml":
            raise TelemetryInputError(
                f"{where}: source is {record.source!r}, not 'nvml'; pass --source to match"
            )
        records.append(record)
    if not records:
        first = without[0]
        hint = (
            "a Prolog record has no telemetry: classify the job's Epilog record"
            if first.startswith("prolog")
            else "the job's sampler measured nothing (no NVML, or hooks.telemetry off)"
        )
        raise TelemetryInputError(f"{path}: no telemetry in {', '.join(without[:3])}: {hint}")
    return records


def combine_features(records: Sequence[UtilizationFeatures]) -> UtilizationFeatures:
    """Several measurements of one application as one: weighted by their measured time."""
    if len(records) == 1:
        return records[0]
    units = {r.weight_unit for r in records}
    if len(units) > 1:
        raise TelemetryInputError(
            f"records weigh by different units {sorted(units)}; classify them separately"
        )
    total = math.fsum(r.weight_total for r in records)
    weights = [r.weight_total / total if total > 0 else 1 / len(records) for r in records]

    def mean(name: str) -> float:
        return math.fsum(getattr(r, name) * w for r, w in zip(records, weights, strict=True))

    def joined(name: str) -> str:
        return " + ".join(dict.fromkeys(getattr(r, name) for r in records))

    return UtilizationFeatures(
        dram_util=mean("dram_util"),
        fu_util=mean("fu_util"),
        source=records[0].source,
        dram_source=joined("dram_source"),
        fu_source=joined("fu_source"),
        measurements=sum(r.measurements for r in records),
        weight_total=total,
        weight_unit=units.pop(),
        dram_excluded_fraction=min(1.0, mean("dram_excluded_fraction")),
        fu_excluded_fraction=min(1.0, mean("fu_excluded_fraction")),
        busy_fraction=None,  # the records' windows are not added up anywhere
    )


def _nvml_features(paths: Sequence[Path]) -> UtilizationFeatures:
    return combine_features([r for p in paths for r in _nvml_records(p)])


def read_features(paths: Sequence[Path], source: str) -> tuple[str, UtilizationFeatures]:
    """(source used, features) of one application's files; ``source`` may be "auto"."""
    if source == "auto":
        detected = {p: detect_source(p) for p in paths}
        kinds = set(detected.values())
        if len(kinds) > 1:
            listing = ", ".join(f"{p} ({k})" for p, k in detected.items())
            raise TelemetryInputError(
                f"the files are of different formats: {listing}; classify one format at a "
                "time, or pass --source"
            )
        source = kinds.pop()
    readers = {"ncu": _ncu_features, "dcgm": _dcgm_features, "nvml": _nvml_features}
    return source, readers[source](paths)


# --------------------------------------------------------------------------------------------
# The model


def _site_model(model: ClassifierModel, cfg: SiteConfig) -> JobClassifier:
    """The active model, checked against the site's class names (they may have changed)."""
    try:
        classifier = JobClassifier.from_dict(model.model)
    except (KeyError, TypeError, ValueError) as exc:
        fail(f"the active classifier model {model.id} is unreadable ({exc}); run 'apps fit'")
    classes = [str(c) for c in classifier.classes_]
    names = list(cfg.classes.names)
    if classes != names[: len(classes)]:
        fail(
            f"the active classifier model {model.id} (fitted {model.created_at}) has classes "
            f"{', '.join(classes)}, but classes.names in {cfg.source} is {', '.join(names)}; "
            "run 'slurm-pal apps fit' to refit with the site's classes"
        )
    return classifier


def _predict(classifier: JobClassifier, features: UtilizationFeatures) -> str:
    return str(classifier.predict([features])[0])


def _check_class(job_class: str, cfg: SiteConfig) -> str:
    if job_class not in cfg.classes.names:
        fail(
            f"unknown class {job_class!r}; valid classes: {', '.join(cfg.classes.names)} "
            f"(classes.names in {cfg.source})"
        )
    return job_class


def _check_name(name: str) -> str:
    try:
        return check_app_name(name)
    except ValueError as exc:
        fail(str(exc))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _app_dict(a: Application) -> dict[str, Any]:
    f = a.features
    return {
        "app": a.name,
        "class": a.job_class,
        "class_origin": a.class_origin,
        "dram_util": None if f is None else f.dram_util,
        "fu_util": None if f is None else f.fu_util,
        "source": None if f is None else f.source,
        "dram_source": None if f is None else f.dram_source,
        "fu_source": None if f is None else f.fu_source,
        "measurements": None if f is None else f.measurements,
        "model_id": a.model_id,
        "files": list(a.files),
        "updated_at": a.updated_at,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _class_text(a: Application) -> str:
    if a.job_class is None:
        return "-"
    return a.job_class + (" (admin)" if a.class_origin == "admin" else "")


def short_fu_source(fu_source: str) -> str:
    """The metric family of an ``fu_source`` for tables: 'pipe:fma,tensor',
    'sm__throughput (fallback)'; the full text is in the JSON output."""
    head = fu_source.split(" (", 1)[0]
    if head.startswith(("sm__", "smsp__")):
        head = head.split(".", 1)[0]
    return head + (" (fallback)" if "fallback" in fu_source else "")


def _apps_table(apps: Sequence[Application], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("app", no_wrap=True)
    table.add_column("class", no_wrap=True)
    table.add_column("DRAM %", justify="right")
    table.add_column("FU %", justify="right")
    table.add_column("source")
    table.add_column("FU metric family")
    for a in apps:
        table.add_row(
            escape(a.name),
            _class_text(a),
            _pct(a.dram_util),
            _pct(a.fu_util),
            "-" if a.features is None else a.features.source,
            "-" if a.features is None else short_fu_source(a.features.fu_source),
        )
    return table


# --------------------------------------------------------------------------------------------
# Commands


@app.command()
def classify(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(
        ...,
        exists=True,
        dir_okay=False,
        readable=True,
        help="Telemetry of one application: ncu CSV (--csv, details or raw page), DCGM "
        "(dcgmi dmon or dcgm-exporter text) or NVML job-record JSON. Several files are pooled.",
    ),
    app_name: str = typer.Option(..., "--app", help="Application name users give in pal:app=."),
    source: str | None = typer.Option(
        None,
        "--source",
        help="Telemetry format: ncu, nvml, dcgm or auto (by content; the default unless "
        "classification.default_source says otherwise).",
        show_default=False,
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Measure an application from telemetry files, classify it and store it (all or nothing)."""
    st = state(ctx)
    with reported_errors():
        cfg = st.config
        name = _check_name(app_name)
        chosen = source or cfg.classification.default_source
        if chosen not in CLASSIFY_SOURCES:
            fail(f"unknown --source {chosen!r}; valid values: {', '.join(CLASSIFY_SOURCES)}")
        file_info = [{"path": str(p.resolve()), "sha256": _sha256(p)} for p in files]
        seen: dict[str, Path] = {}
        for path, info in zip(files, file_info, strict=True):
            if info["sha256"] in seen:
                fail(f"{path} and {seen[info['sha256']]} are the same file (same content)")
            seen[info["sha256"]] = path
        with _input_errors():
            used, features = read_features(files, chosen)
        with st.store() as store:
            model = store.active_classifier()
            predicted = None
            if model is not None:
                predicted = _predict(_site_model(model, cfg), features)
            stored = store.save_application(
                name,
                features,
                files=file_info,
                predicted_class=predicted,
                model_id=None if model is None else model.id,
            )
    _print_classified(name, stored, predicted, used, features, file_info, as_json)


def _print_classified(
    name: str,
    stored: Application,
    predicted: str | None,
    used: str,
    features: UtilizationFeatures,
    file_info: list[dict[str, str]],
    as_json: bool,
) -> None:
    """The application's figures, what they were taken over, and its class and why."""
    if stored.class_origin == "admin":
        message = "admin override" + (
            f"; the model says {predicted}" if predicted and predicted != stored.job_class else ""
        )
    elif stored.job_class is None:
        message = "no classifier model yet: run 'slurm-pal apps fit' once applications are stored"
    else:
        message = f"classified by model {stored.model_id}"
    if as_json:
        print_json(
            {
                "app": name,
                "dram_util": features.dram_util,
                "fu_util": features.fu_util,
                "fu_source": features.fu_source,
                "class": stored.job_class,
                "class_origin": stored.class_origin,
                "model_class": predicted,
                "source": used,
                "dram_source": features.dram_source,
                "measurements": features.measurements,
                "dram_excluded_fraction": features.dram_excluded_fraction,
                "fu_excluded_fraction": features.fu_excluded_fraction,
                "busy_fraction": features.busy_fraction,
                "files": file_info,
                "model_id": stored.model_id,
                "message": message,
            }
        )
        return
    console.print(
        f"application [bold]{escape(name)}[/]: DRAM {features.dram_util:.1f} %, "
        f"FU {features.fu_util:.1f} % ({short_fu_source(features.fu_source)}) from "
        f"{len(file_info)} {used} file(s), {features.measurements} measurement(s)",
        highlight=False,
    )
    if features.busy_fraction is not None:
        console.print(
            f"taken over the GPU's busy time ({features.busy_fraction:.0%} of the sampled window)",
            highlight=False,
        )
    elif used == "nvml":
        console.print(
            "note: these figures are over the whole sampled window, idle time included (a "
            "sampler without busy-time weighting wrote them): they read low against ncu's",
            highlight=False,
        )
    for what, fraction in (
        ("DRAM", features.dram_excluded_fraction),
        ("FU", features.fu_excluded_fraction),
    ):
        if fraction > 0:
            console.print(
                f"note: {fraction:.0%} of the measured time has no {what} value and was left "
                "out of that figure",
                highlight=False,
            )
    console.print(f"class [bold]{stored.job_class or '-'}[/]: {message}", highlight=False)


@app.command("list")
def list_apps(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Stored applications with their utilization and class ("admin" marks an override)."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store:
        apps = store.applications()
        model = store.active_classifier()
    if as_json:
        print_json([_app_dict(a) for a in apps])
        return
    if not apps:
        console.print("no applications yet: store some with 'slurm-pal apps classify'")
        return
    about = "no classifier model yet (run 'slurm-pal apps fit')"
    if model is not None:
        about = f"classifier model {model.id}, fitted {model.created_at} on {model.n_apps} apps"
    console.print(_apps_table(apps, title=f"{len(apps)} application(s); {about}"))


@app.command("set")
def set_class(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Application name (created if not stored yet)."),
    job_class: str | None = typer.Option(None, "--class", "-c", help="The class to pin."),
    clear: bool = typer.Option(
        False, "--clear", help="Remove the override: the model's class applies again."
    ),
) -> None:
    """Admin override: pin an application's class (refits keep it), or --clear it."""
    st = state(ctx)
    with reported_errors():
        cfg = st.config
        _check_name(name)
        if (job_class is None) == (not clear):
            fail("give exactly one of --class CLASS or --clear")
        with st.store() as store:
            if job_class is not None:
                stored = store.set_application_class(name, _check_class(job_class, cfg))
                console.print(
                    f"application [bold]{escape(name)}[/] is class [bold]{stored.job_class}[/] "
                    "(admin override)"
                )
                return
            current = store.application(name)
            model = store.active_classifier()
            predicted = None
            if model is not None and current is not None and current.features is not None:
                predicted = _predict(_site_model(model, cfg), current.features)
            stored = store.clear_application_override(
                name, predicted_class=predicted, model_id=None if model is None else model.id
            )
    if stored.features is None:
        console.print(
            f"application [bold]{escape(name)}[/] removed (it had no profile, only the override)"
        )
    else:
        console.print(
            f"application [bold]{escape(name)}[/]: override cleared; "
            f"class {stored.job_class or '-'}"
        )


@app.command()
def fit(
    ctx: typer.Context,
    n_classes: int | None = typer.Option(
        None,
        "--n-classes",
        "-k",
        help="Classes to fit (default: classification.n_classes, else one per classes.names).",
        show_default=False,
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Fit the job classes on every profiled application; the model becomes the active one.

    All applications with measurements take part, admin-overridden ones included (their
    measurements still say where the workload sits); overrides keep their class. The classes
    are the first K of classes.names, most compute-bound first.
    """
    st = state(ctx)
    with reported_errors():
        cfg = st.config
        names = cfg.classes.names
        k = cfg.classification.k(names) if n_classes is None else n_classes
        if not 1 <= k <= len(names):
            fail(
                f"--n-classes must be within 1..{len(names)} (classes.names: {', '.join(names)}), "
                f"got {k}"
            )
        with st.store(create=False) as store:
            apps = [a for a in store.applications() if a.features is not None]
            if not apps:
                fail("no profiled applications: store some with 'slurm-pal apps classify'")
            classifier = JobClassifier(
                n_classes=k,
                class_names=list(names[:k]),
                random_state=cfg.classification.seed,
                n_init=cfg.classification.n_init,
                too_few="reduce",
                noise_tolerance=cfg.classification.noise_tolerance,
            )
            features = [a.features for a in apps if a.features is not None]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TooFewApplicationsWarning)
                classifier.fit(features)
            predicted = dict(zip([a.name for a in apps], map(str, classifier.labels_), strict=True))
            if classifier.n_classes_ < k:
                warn(_fewer_classes_note(k, classifier, len(apps)))
            labels = {n: c for n, c in predicted.items() if _origin(apps, n) != "admin"}
            model_id = store.save_classifier(classifier.to_dict(), labels, n_apps=len(apps))
            stored = store.applications()
    _print_fit(model_id, classifier, predicted, k, len(apps), stored, as_json)


def _print_fit(
    model_id: int,
    classifier: JobClassifier,
    predicted: dict[str, str],
    asked: int,
    n_apps: int,
    stored: Sequence[Application],
    as_json: bool,
) -> None:
    """The model's classes (centres and the applications it grouped there), then every
    stored application's class now."""
    summary: list[dict[str, Any]] = [
        {
            "class": str(cls),
            "dram_util": float(center[0]),
            "fu_util": float(center[1]),
            "apps": sorted(n for n, c in predicted.items() if c == cls),
        }
        for cls, center in zip(classifier.classes_, classifier.cluster_centers_, strict=True)
    ]
    if as_json:
        print_json(
            {
                "model_id": model_id,
                "n_apps": n_apps,
                "n_classes_asked": asked,
                "n_behaviours": classifier.n_behaviours_,
                "classes": summary,
                "applications": [_app_dict(a) for a in stored],
            }
        )
        return
    table = Table(
        title=f"classifier model {model_id}: {classifier.n_classes_} classes from "
        f"{n_apps} application(s)",
        title_justify="left",
    )
    for column in ("class", "DRAM %", "FU %", "applications (model's grouping)"):
        table.add_column(column, justify="left" if column[0] in "ca" else "right")
    for row in summary:
        table.add_row(
            row["class"], _pct(row["dram_util"]), _pct(row["fu_util"]), ", ".join(row["apps"])
        )
    console.print(table)
    console.print(_apps_table(stored, title="applications now"))


def _fewer_classes_note(asked: int, classifier: JobClassifier, n_apps: int) -> str:
    """Why the model has fewer classes than the site asked for, and what would change it."""
    fitted = ", ".join(map(str, classifier.classes_))
    return (
        f"{asked} classes asked, but the {n_apps} application(s) show "
        f"{classifier.n_behaviours_} distinct behaviour(s) (measurements within "
        f"{classifier.noise_tolerance:g} percentage points of each other are one, "
        f"classification.noise_tolerance): fitted {classifier.n_classes_} classes ({fitted}); "
        "classify applications that behave differently to get more"
    )


def _origin(apps: Sequence[Application], name: str) -> str | None:
    return next(a.class_origin for a in apps if a.name == name)


@app.command()
def mismatches(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Jobs whose named application's class differs from what their telemetry measured."""
    st = state(ctx)
    with reported_errors(), st.store(create=False) as store:
        rows = store.class_mismatches()
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no mismatches recorded")
        return
    table = Table(title=f"{len(rows)} job(s) named an application of another class")
    for column in ("job", "user", "job name", "claimed app", "claimed", "measured", "at (UTC)"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            escape(str(r["job_id"])),
            escape(str(r["user"])),
            escape(str(r["job_name"])),
            escape(str(r["claimed_app"])),
            r["claimed_class"],
            r["measured_class"],
            r["recorded_at"],
        )
    console.print(table)


@app.command("resolve")
def resolve_job(
    ctx: typer.Context,
    user: str = typer.Option(..., "--user", "-u", help="Submitting user."),
    job_name: str = typer.Option("", "--job-name", "-J", help="Job name."),
    account: str = typer.Option("", "--account", "-A", help="Account."),
    partition: str = typer.Option("", "--partition", "-p", help="Partition(s), comma-separated."),
    comment: str = typer.Option("", "--comment", help="Job comment (pal:app=NAME)."),
    script: Path | None = typer.Option(
        None,
        "--script",
        exists=True,
        dir_okay=False,
        help="Batch script (#PAL app=NAME; its sha256 keys the history).",
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Which class a job would get, and why: the submit path's resolution, for admins."""
    st = state(ctx)
    with reported_errors():
        cfg = st.config
        text, sha = None, None
        if script is not None:
            text = script.read_text(encoding="utf-8", errors="replace")
            sha = _sha256(script)
        with st.store(create=False) as store:
            view = store.store_view(cfg.classification.history_window, cfg.classes.names)
        job = JobRequest(
            user=user,
            job_name=job_name,
            account=account,
            partition=partition,
            comment=comment,
            script=text,
            script_sha256=sha,
        )
        result = resolve(job, view, cfg.resolve_config())
    if as_json:
        print_json(
            {
                "class": result.job_class,
                "reason": result.reason,
                "origin": result.origin,
                "claimed_app": result.claimed_app,
                "claimed_class": result.claimed_class,
                "mismatch": result.mismatch,
            }
        )
        return
    console.print(f"class [bold]{result.job_class}[/]: {escape(result.reason)}", highlight=False)
