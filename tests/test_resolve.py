"""Job -> application -> class: parsing the claims, the resolution order, anti-gaming."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_pal.adapters.config import ClassificationConfig, ConfigError, load_config
from slurm_pal.core import resolve as resolve_module
from slurm_pal.core.resolve import (
    ClassRule,
    HistoryRow,
    HistorySummary,
    JobRecord,
    JobRequest,
    ResolveConfig,
    StoreView,
    app_from_comment,
    app_from_script,
    check_app_name,
    claimed_app,
    contradicted_claims,
    resolve,
    resolve_class,
    summarize_history,
)

NAMES = ("A", "B", "C", "D")
CONFIG = ResolveConfig(class_names=NAMES, default_class="A")
APPS = {"resnet50": "A", "bert": "B", "pagerank": "D", "fresh": None}
SHA = "ab" * 32


def job(**kwargs: object) -> JobRequest:
    base: dict[str, object] = {"user": "alice", "job_name": "train", "script_sha256": SHA}
    base.update(kwargs)
    return JobRequest(**base)  # type: ignore[arg-type]


def history(measured: str | None, runs: int = 5, app: str | None = None) -> HistorySummary:
    return HistorySummary(
        runs=runs,
        measured_runs=runs if measured else 0,
        measured_class=measured,
        measured_class_runs=runs if measured else 0,
        app=app,
    )


# --------------------------------------------------------------------------------------------
# What the user names


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("pal:app=resnet50", "resnet50"),
        ("nightly run, pal:app=bert-large;other", "bert-large"),
        ("pal:app=a pal:app=b", "a"),
        ("xpal:app=resnet50", None),  # not a token of its own
        ("pal:app=", None),
        ("pal:app=bad/name", None),
        ("", None),
        (None, None),
    ],
)
def test_app_from_comment(comment: str | None, expected: str | None) -> None:
    assert app_from_comment(comment) == expected


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("#!/bin/bash\n#SBATCH -N 1\n#PAL app=resnet50\npython train.py\n", "resnet50"),
        ("#!/bin/bash\n\n#SBATCH --gpus=2\n\n  #PAL   app=bert\nsrun x\n", "bert"),
        ("#!/bin/bash\n#PAL mode=x app=bert\n", "bert"),
        ("\ufeff#!/bin/bash\r\n#PAL app=bert\r\npython x.py\r\n", "bert"),  # BOM, CRLF
        # After the first command the block is over: like #SBATCH, later lines do not count.
        ("#!/bin/bash\nmodule load cuda\n#PAL app=resnet50\n", None),
        ("#!/bin/bash\ncat <<EOF\n#PAL app=resnet50\nEOF\n", None),
        ("#!/bin/bash\n#PAL app=../etc\n", None),
        ("#!/bin/bash\n#PALapp=resnet50\n", None),
        (None, None),
    ],
)
def test_app_from_script_reads_only_the_leading_comment_block(
    script: str | None, expected: str | None
) -> None:
    assert app_from_script(script) == expected


def test_the_comment_outranks_the_script() -> None:
    j = job(comment="pal:app=bert", script="#!/bin/sh\n#PAL app=resnet50\n")
    assert claimed_app(j) == ("bert", "comment")
    assert claimed_app(job(script="#!/bin/sh\n#PAL app=resnet50\n")) == ("resnet50", "script")
    assert claimed_app(job()) == (None, "")


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b", "x" * 65, "é"])
def test_invalid_app_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(ValueError, match="letters, digits and '._\\+-'"):
        check_app_name(name)


# --------------------------------------------------------------------------------------------
# Rules


def test_a_rule_matches_only_when_every_condition_does() -> None:
    rule = ClassRule(user="alice", partition="gpu", job_name="train-*", job_class="C")
    assert rule.matches(job(partition="debug,gpu", job_name="train-7"))
    assert not rule.matches(job(partition="debug", job_name="train-7"))
    assert not rule.matches(job(partition="gpu", job_name="eval-7"))
    assert not rule.matches(job(user="bob", partition="gpu", job_name="train-7"))
    assert ClassRule(account="physics", job_class="B").matches(job(account="physics"))
    assert not ClassRule(account="physics", job_class="B").matches(job(account="bio"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"user": "a"}, "exactly one of a class or an application"),
        ({"user": "a", "job_class": "A", "app": "x"}, "exactly one"),
        ({"job_class": "A"}, "at least one of user, account, partition, job_name"),
    ],
)
def test_malformed_rules_are_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClassRule(**kwargs)


def test_config_refuses_unknown_classes_and_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid classes: A, B, C, D"):
        ResolveConfig(class_names=NAMES, rules=(ClassRule(user="x", job_class="Z"),))
    with pytest.raises(ValueError, match="default class"):
        ResolveConfig(class_names=NAMES, default_class="Z")


# --------------------------------------------------------------------------------------------
# The resolution order, one step at a time (the reasons are what admins read)


def test_admin_rule_comes_first() -> None:
    config = dataclasses.replace(
        CONFIG,
        rules=(
            ClassRule(user="bob", job_class="B"),
            ClassRule(user="alice", app="unprofiled"),
            ClassRule(partition="debug", job_class="D"),
        ),
    )
    view = StoreView(apps=APPS, history={job().history_key: history("C")})
    result = resolve(job(partition="debug", comment="pal:app=resnet50"), view, config)
    assert (result.job_class, result.origin) == ("D", "rule")
    assert result.reason.startswith("admin rule 3 (partition=debug)")
    # The rule naming an application without a profile was skipped, and the reason says so.
    assert "admin rule 2 names app unprofiled" in resolve(job(), view, config).reason


def test_a_rule_may_name_an_application() -> None:
    config = dataclasses.replace(CONFIG, rules=(ClassRule(job_name="pr-*", app="pagerank"),))
    result = resolve(job(job_name="pr-1"), StoreView(apps=APPS), config)
    assert result.job_class == "D"
    assert result.reason == "admin rule 1 (job_name=pr-*): app pagerank (class D)"


def test_a_known_named_application_gives_its_class() -> None:
    result = resolve(job(comment="pal:app=bert"), StoreView(apps=APPS), CONFIG)
    assert (result.job_class, result.origin) == ("B", "app")
    assert result.reason == "named app bert (class B, from comment)"


@pytest.mark.parametrize(
    ("name", "note"),
    [("nosuch", "named app nosuch is unknown"), ("fresh", "named app fresh has no class yet")],
)
def test_unknown_or_unclassified_names_fall_to_the_default(name: str, note: str) -> None:
    config = dataclasses.replace(CONFIG, default_class="B")
    result = resolve(job(comment=f"pal:app={name}"), StoreView(apps=APPS), config)
    assert (result.job_class, result.origin) == ("B", "default")
    assert result.reason == f"default class B; {note}"


def test_measured_history_outranks_the_name_and_flags_the_mismatch() -> None:
    view = StoreView(apps=APPS, history={job().history_key: history("C", runs=5)})
    result = resolve(job(comment="pal:app=resnet50"), view, CONFIG)
    assert (result.job_class, result.origin, result.mismatch) == ("C", "history", True)
    assert (result.claimed_app, result.claimed_class) == ("resnet50", "A")
    assert result.reason == (
        "history: 5 of 5 earlier measured run(s) measured class C (claimed resnet50 -> A ignored)"
    )
    agreeing = resolve(
        job(comment="pal:app=bert"),
        StoreView(apps=APPS, history={job().history_key: history("B", runs=2)}),
        CONFIG,
    )
    assert (agreeing.job_class, agreeing.mismatch) == ("B", False)
    assert "confirmed by 2 of 2" in agreeing.reason


def test_a_user_whose_claims_were_contradicted_is_not_believed_under_any_job_name() -> None:
    view = StoreView(apps=APPS, contradicted={("alice", "resnet50"): 2})
    config = dataclasses.replace(CONFIG, default_class="C")
    for name in ("train", "renamed-to-dodge-history"):
        result = resolve(job(job_name=name, comment="pal:app=resnet50"), view, config)
        assert (result.job_class, result.origin) == ("C", "default")
        assert (result.claimed_app, result.claimed_class) == ("resnet50", "A")
        assert result.reason == (
            "default class C; named app resnet50 not believed: 2 earlier job(s) of alice "
            "naming it measured a less compute-bound class"
        )
    # Other users, and alice's other applications, are believed.
    assert resolve_class(job(user="bob", comment="pal:app=resnet50"), view, config)[0] == "A"
    assert resolve_class(job(comment="pal:app=bert"), view, config)[0] == "B"
    # Earlier runs that named it do not smuggle the claim back in either.
    hist = StoreView(
        apps=APPS,
        contradicted=view.contradicted,
        history={job().history_key: history(None, app="resnet50")},
    )
    assert resolve(job(), hist, config).origin == "default"


def test_only_claims_that_would_win_better_gpus_count_as_contradicted() -> None:
    rows = [
        ("alice", "resnet50", "A", "C"),  # claimed A, measured C: would have won better GPUs
        ("alice", "resnet50", "A", "D"),
        ("alice", "pagerank", "D", "A"),  # undersold: no advantage, no distrust
        ("bob", "resnet50", "A", "Z"),  # a class the site no longer has
    ]
    assert contradicted_claims(rows, NAMES) == {("alice", "resnet50"): 2}
    assert contradicted_claims(rows, ()) == {}


def test_history_needs_the_same_user_job_name_and_script() -> None:
    view = StoreView(apps=APPS, history={job().history_key: history("D")})
    assert resolve_class(job(), view, CONFIG)[0] == "D"
    for other in (job(user="bob"), job(job_name="eval"), job(script_sha256="cd" * 32)):
        assert resolve_class(other, view, CONFIG) == ("A", "default class A")


def test_history_below_the_minimum_runs_does_not_outrank_a_name() -> None:
    config = dataclasses.replace(CONFIG, history_min_runs=3)
    view = StoreView(apps=APPS, history={job().history_key: history("D", runs=2)})
    assert resolve_class(job(comment="pal:app=resnet50"), view, config)[0] == "A"
    assert resolve_class(job(), view, config)[0] == "A"  # default, not 2 runs' worth of D
    assert resolve_class(job(), view, dataclasses.replace(config, history_min_runs=2))[0] == "D"


def test_history_without_measurements_uses_the_application_earlier_runs_named() -> None:
    view = StoreView(apps=APPS, history={job().history_key: history(None, app="pagerank")})
    result = resolve(job(), view, CONFIG)
    assert (result.job_class, result.origin) == ("D", "history-app")
    assert result.reason == "history: earlier runs named app pagerank (class D)"
    # A name given now is more current than one given earlier.
    assert resolve_class(job(comment="pal:app=bert"), view, CONFIG)[0] == "B"


def test_jobs_without_a_script_share_one_history_key() -> None:
    assert job(script_sha256=None).history_key == ("alice", "train", "")
    assert job(script_sha256="").history_key == job(script_sha256=None).history_key


# --------------------------------------------------------------------------------------------
# Properties over arbitrary jobs, stores and rules

names_st = st.sampled_from(NAMES)
app_names_st = st.sampled_from(["resnet50", "bert", "pagerank", "fresh", "nosuch"])
users_st = st.sampled_from(["alice", "bob"])
job_names_st = st.sampled_from(["train", "eval", "train-2"])
parts_st = st.sampled_from(["gpu", "debug", "gpu,debug", ""])


@st.composite
def jobs(draw: st.DrawFn) -> JobRequest:
    claim = draw(st.none() | app_names_st)
    in_script = draw(st.booleans())
    return JobRequest(
        user=draw(users_st),
        job_name=draw(job_names_st),
        account=draw(st.sampled_from(["physics", "bio"])),
        partition=draw(parts_st),
        comment=f"pal:app={claim}" if claim and not in_script else "",
        script=f"#!/bin/sh\n#PAL app={claim}\nrun\n" if claim and in_script else None,
        script_sha256=draw(st.sampled_from([SHA, None])),
    )


@st.composite
def views(draw: st.DrawFn) -> StoreView:
    keys = st.tuples(users_st, job_names_st, st.sampled_from([SHA, ""]))
    summaries = st.builds(
        lambda runs, measured, app: history(measured, runs=runs, app=app),
        st.integers(1, 6),
        st.none() | names_st,
        st.none() | app_names_st,
    )
    contradicted = st.dictionaries(st.tuples(users_st, app_names_st), st.integers(1, 3))
    return StoreView(
        apps=APPS,
        history=draw(st.dictionaries(keys, summaries, max_size=4)),
        contradicted=draw(contradicted),
    )


rules_st = st.lists(
    st.builds(
        ClassRule,
        user=st.none() | users_st,
        partition=st.just("debug"),
        job_class=names_st,
        app=st.none(),
    )
    | st.builds(ClassRule, job_name=st.just("train*"), app=app_names_st),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(j=jobs(), view=views(), rules=rules_st, min_runs=st.integers(1, 4))
def test_properties_of_the_resolution_order(
    j: JobRequest, view: StoreView, rules: list[ClassRule], min_runs: int
) -> None:
    config = ResolveConfig(class_names=NAMES, rules=tuple(rules), history_min_runs=min_runs)
    result = resolve(j, view, config)
    assert result.job_class in NAMES and result.reason
    assert resolve_class(j, view, config) == (result.job_class, result.reason)

    # 1. The first usable matching rule decides, whatever the user names or the history says.
    usable = [
        r for r in rules if r.matches(j) and (r.job_class or view.apps.get(r.app or "") in NAMES)
    ]
    if usable:
        first = usable[0]
        assert result.origin == "rule"
        assert result.job_class == (first.job_class or view.apps[first.app or ""])
        return

    # 2. Anti-gaming: with enough measured history, the claimed name changes nothing.
    unnamed = dataclasses.replace(j, comment="", script=None)
    summary = view.history.get(j.history_key)
    if summary is not None and summary.measured_class and summary.measured_runs >= min_runs:
        assert result.job_class == summary.measured_class
        assert resolve(unnamed, view, config).job_class == result.job_class
        assert result.mismatch == (
            result.claimed_class is not None and result.claimed_class != result.job_class
        )
        return
    assert not result.mismatch

    # 3. Otherwise a known, classified, believed name gives its class; else history's app or
    #    the default. A name the user's measured jobs contradicted never decides.
    name, _ = claimed_app(j)
    believed = (j.user, name) not in view.contradicted
    if name is not None and view.apps.get(name) in NAMES and believed:
        assert (result.origin, result.job_class) == ("app", view.apps[name])
    elif (
        summary is not None
        and view.apps.get(summary.app or "") in NAMES
        and (j.user, summary.app) not in view.contradicted
    ):
        assert result.origin == "history-app"
    else:
        assert (result.origin, result.job_class) == ("default", config.default_class)


@settings(max_examples=200, deadline=None)
@given(j=jobs(), view=views(), rule_class=names_st)
def test_a_matching_class_rule_put_first_always_wins(
    j: JobRequest, view: StoreView, rule_class: str
) -> None:
    config = ResolveConfig(class_names=NAMES, rules=(ClassRule(user=j.user, job_class=rule_class),))
    assert resolve_class(j, view, config) == (rule_class, f"admin rule 1 (user={j.user})")


# --------------------------------------------------------------------------------------------
# History summaries and job records


def row(cls: str | None, at: str, app: str | None = None, key=("u", "j", SHA)) -> HistoryRow:
    return HistoryRow(key=key, app=app, measured_class=cls, recorded_at=at)


def test_history_takes_the_most_measured_class_ties_to_the_most_recent() -> None:
    rows = [row("C", "t1"), row("C", "t2"), row("B", "t3"), row(None, "t4", app="bert")]
    summary = summarize_history(reversed(rows))[("u", "j", SHA)]
    assert summary == HistorySummary(
        runs=4, measured_runs=3, measured_class="C", measured_class_runs=2, app="bert"
    )
    tie = summarize_history([row("C", "t1"), row("B", "t2")])[("u", "j", SHA)]
    assert (tie.measured_class, tie.measured_class_runs) == ("B", 1)
    other = summarize_history([row("D", "t1", key=("v", "j", ""))])
    assert set(other) == {("v", "j", "")}


def test_job_record_mismatch_needs_a_claim_and_a_measurement() -> None:
    base = JobRecord(job_id="1", user="u", job_name="j", script_sha256=SHA)
    assert not base.mismatch
    assert dataclasses.replace(
        base, claimed_app="resnet50", claimed_class="A", measured_class="C"
    ).mismatch
    assert not dataclasses.replace(
        base, claimed_app="resnet50", claimed_class="A", measured_class="A"
    ).mismatch
    assert not dataclasses.replace(base, claimed_app="resnet50", claimed_class="A").mismatch


def test_the_core_module_does_no_io() -> None:
    """The submit path must not touch disks or sockets: no I/O-capable imports at all."""
    tree = ast.parse(Path(resolve_module.__file__).read_text())
    imported = {
        alias.name.split(".")[0] if isinstance(node, ast.Import) else (node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    forbidden = {"os", "io", "pathlib", "sqlite3", "socket", "subprocess", "time"}
    assert not imported & forbidden
    calls = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert not calls & {"open", "print", "input"}
    assert not any(m.startswith(("slurm_pal.adapters", "slurm_pal.cli")) for m in imported)


# --------------------------------------------------------------------------------------------
# The site config's [classification] section feeds the resolution


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def test_rules_are_read_from_the_site_config_in_order(tmp_path: Path) -> None:
    cfg = load_config(
        write_config(
            tmp_path,
            "[classification]\nhistory_min_runs = 2\n"
            '[[classification.rules]]\npartition = "debug"\nclass = "D"\n'
            '[[classification.rules]]\nuser = "alice"\njob_name = "bert-*"\napp = "bert"\n',
        )
    )
    resolver = cfg.resolve_config()
    assert resolver.rules == (
        ClassRule(partition="debug", job_class="D"),
        ClassRule(user="alice", job_name="bert-*", app="bert"),
    )
    assert (resolver.class_names, resolver.default_class, resolver.history_min_runs) == (
        NAMES,
        "A",
        2,
    )
    assert cfg.classification.k(cfg.classes.names) == 4


def test_the_documented_example_documents_the_classification_section() -> None:
    text = (Path(__file__).resolve().parents[1] / "site-config" / "slurm-pal.toml").read_text()
    assert "[classification]" in text and "[[classification.rules]]" in text
    for f in dataclasses.fields(ClassificationConfig):
        assert f"{f.name} =" in text, f"classification.{f.name} is not documented"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[classification]\nn_classes = 5\n", r"'classification.n_classes' must be within 1..4"),
        (
            '[classification]\ndefault_source = "csv"\n',
            r"'classification.default_source' is 'csv'; valid values: auto, ncu, nvml, dcgm",
        ),
        ("[classification]\nhistory_min_runs = 0\n", r"'classification.history_min_runs' must"),
        ("[classification]\nhistory_window = 1\nhistory_min_runs = 2\n", "history_window"),
        ('[[classification.rules]]\nuser = "a"\nclass = "Z"\n', r"rule 1 .*valid values: A, B"),
        (
            '[[classification.rules]]\nuser = "a"\nclass = "B"\n'
            '[[classification.rules]]\npartiton = "x"\nclass = "A"\n',
            r"rule 2 of \[\[classification.rules\]\]: unknown key\(s\) partiton; valid keys: "
            r"account, app, class, job_name, partition, user",
        ),
        ('[[classification.rules]]\nclass = "B"\n', r"rule 1 .*needs at least one condition"),
        ('[[classification.rules]]\nuser = "a"\n', r"exactly one of 'class' or 'app'"),
        ('[[classification.rules]]\nuser = 3\nclass = "A"\n', r"'user' must be a non-empty"),
        ('[[classification.rules]]\nuser = "a"\napp = "a b"\n', r"'app': invalid application"),
        ("[classification]\nrules = 3\n", r"'classification.rules' must be tables"),
        ("[classification]\nsource = 'ncu'\n", r"unknown key 'classification.source'"),
    ],
)
def test_classification_config_errors_name_file_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))
