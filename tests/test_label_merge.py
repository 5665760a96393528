"""Bounding the gres Type= labels: merging the closest PM signatures, and what it costs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_pal.adapters.config import ConfigError, load_config
from slurm_pal.core.binning import Signature, merge_signatures
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.site.render import RenderError, plan_site, signatures_of

REPO = Path(__file__).resolve().parents[1]


def sig(label: str, gpus: int, **scores: float) -> Signature:
    return Signature(label, label.split("-", 1)[0], scores, gpus)


SIGS = [
    sig("v100-a0b0", 10, A=0.98, B=0.99),
    sig("v100-a1b0", 6, A=1.02, B=0.99),
    sig("v100-a1b1", 4, A=1.03, B=1.01),
    sig("v100-a2b1", 3, A=1.10, B=1.01),
    sig("v100-ax0bx0", 1, A=2.3, B=1.4),
    sig("a100-a0b0", 8, A=0.99, B=1.0),
    sig("a100-a1b0", 8, A=1.04, B=1.0),
]


def test_no_cap_keeps_every_signature_and_costs_nothing() -> None:
    merge = merge_signatures(SIGS, None)
    assert not merge.merged and merge.count == len(SIGS)
    assert all(merge.labels[s.label] == s.label for s in SIGS)
    assert all(c.worst == 0 and c.mean == 0 for c in merge.cost)
    # A cap that does not bind changes nothing either.
    assert merge_signatures(SIGS, 7).labels == merge.labels


def test_cap_merges_the_closest_signatures_of_one_model_and_keeps_models_readable() -> None:
    merge = merge_signatures(SIGS, 4)
    assert merge.count == 4 and merge.merged
    # Never across models: every rendered label starts with its GPUs' model.
    for s in SIGS:
        assert merge.labels[s.label].split("-", 1)[0] == s.model
    # Both models merged, so both are renamed <model>-pm<rank>, fastest first.
    assert set(merge.members) == {"v100-pm0", "v100-pm1", "v100-pm2", "a100-pm0"}
    # The throttled GPU merges last: it is alone in the slowest v100 label.
    slowest = merge.labels["v100-ax0bx0"]
    assert merge.members[slowest] == ("v100-ax0bx0",) and slowest == "v100-pm2"
    assert merge.scores[slowest]["A"] == pytest.approx(2.3)
    # A label's score is its GPUs' weighted mean; the cost is the distance to it.
    # Closest first: a1b0+a1b1 (range 0.02), the two a100s (0.05, fewer GPUs than the next),
    # then a0b0 joins them (0.05); a2b1 would widen A's range to 0.12.
    assert merge.members["v100-pm0"] == ("v100-a0b0", "v100-a1b0", "v100-a1b1")
    assert merge.members["v100-pm1"] == ("v100-a2b1",)
    assert merge.members["a100-pm0"] == ("a100-a0b0", "a100-a1b0")
    assert merge.scores["v100-pm0"]["A"] == pytest.approx((10 * 0.98 + 6 * 1.02 + 4 * 1.03) / 20)
    cost = {c.job_class: c for c in merge.cost}
    a_err = [abs(s.scores["A"] - merge.scores[merge.labels[s.label]]["A"]) for s in SIGS]
    assert cost["A"].worst == pytest.approx(max(a_err))
    weights = [s.gpus for s in SIGS]
    assert cost["A"].mean == pytest.approx(np.average(a_err, weights=weights))
    assert 0 < cost["A"].mean <= cost["A"].worst < 0.2


def test_outliers_above_avoid_above_keep_their_own_label() -> None:
    # Without the guard the throttled GPU would merge once the cap is tight enough.
    loose = merge_signatures(SIGS, 2)
    assert loose.labels["v100-ax0bx0"] == loose.labels["v100-a0b0"]
    guarded = merge_signatures(SIGS, 3, keep_apart_above=1.5)
    assert guarded.members[guarded.labels["v100-ax0bx0"]] == ("v100-ax0bx0",)
    with pytest.raises(ValueError, match=r"max_labels = 2 cannot be met: 3 labels .* 1\.5"):
        merge_signatures(SIGS, 2, keep_apart_above=1.5)
    with pytest.raises(ValueError, match="max_labels = 1 cannot be met: 2 labels"):
        merge_signatures(SIGS, 1)
    with pytest.raises(ValueError, match="integer >= 1"):
        merge_signatures(SIGS, 0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["v100", "a100"]), st.integers(1, 9), st.floats(0.9, 2.5)),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 12),
)
def test_merge_properties(points: list[tuple[str, int, float]], cap: int) -> None:
    sigs = [sig(f"{m}-s{i}", n, A=a, D=1.0) for i, (m, n, a) in enumerate(points)]
    models = {s.model for s in sigs}
    if cap < len(models):
        with pytest.raises(ValueError, match="cannot be met"):
            merge_signatures(sigs, cap)
        return
    merge = merge_signatures(sigs, cap)
    assert merge.count == min(cap, len(sigs))
    assert set(merge.labels) == {s.label for s in sigs}
    assert sum(len(m) for m in merge.members.values()) == len(sigs)
    for s in sigs:
        rendered = merge.labels[s.label]
        assert rendered.split("-", 1)[0] == s.model and s.label in merge.members[rendered]
        lo = min(t.scores["A"] for t in sigs if merge.labels[t.label] == rendered)
        hi = max(t.scores["A"] for t in sigs if merge.labels[t.label] == rendered)
        assert lo - 1e-9 <= merge.scores[rendered]["A"] <= hi + 1e-9
    worst = {c.job_class: c.worst for c in merge.cost}
    assert worst["D"] == pytest.approx(0.0)
    # Complete linkage never does worse than putting each model in one label.
    spans = [
        max(s.scores["A"] for s in sigs if s.model == m)
        - min(s.scores["A"] for s in sigs if s.model == m)
        for m in models
    ]
    assert worst["A"] <= max(spans) + 1e-9


def _example_plan(max_labels: int | None, keep: float | None = 1.5):
    from slurm_pal.core.variability import build_profile

    frame = generate_example_campaign(nodes=16, gpus_per_node=4, node_prefix="n", seed=7)
    profile = build_profile(frame.rename(columns={"duration_s": "duration"}), "ABCD")
    gpus = profile.gpus
    return profile, plan_site(
        "ex",
        gpus,
        profile.gpu_labels,
        max_labels=max_labels,
        keep_apart_above=keep,
    )


def test_plan_site_renders_merged_labels_and_keeps_the_signature() -> None:
    profile, full = _example_plan(None)
    signatures = signatures_of(profile.gpus, profile.gpu_labels)
    assert len(signatures) == len(profile.labels) == len({g.label for g in full.gpus}) > 4
    _, capped = _example_plan(4)
    assert len({g.label for g in capped.gpus}) <= 4
    labels = json.loads(json.dumps(capped.to_dict()))
    entries = [g for gpus in labels["nodes"].values() for g in gpus]
    assert all(e["model"] == "v100" and e["label"].startswith("v100-pm") for e in entries)
    assert {e["signature"] for e in entries} == set(profile.gpu_labels.values())
    for e in entries:  # the signature is each GPU's own, from the campaign
        assert e["signature"] == profile.gpu_labels[e["uuid"]]
    # The counts per node that Slurm will report follow the merged labels.
    assert sum(sum(c.values()) for c in capped.gres_counts().values()) == len(entries)
    with pytest.raises(RenderError, match=r"\[site\] max_labels: max_labels = 1 cannot be met"):
        _example_plan(1)


def test_site_max_labels_is_read_validated_and_documented(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[site]\nmax_labels = 8\n")
    assert load_config(path).site.max_labels == 8
    assert load_config(None).site.max_labels is None
    path.write_text("[site]\nmax_labels = 0\n")
    with pytest.raises(ConfigError, match=r"'site.max_labels' must be >= 1"):
        load_config(path)
    text = (REPO / "site-config" / "slurm-pal.toml").read_text()
    assert "[site]" in text and "# max_labels =" in text


def test_cli_render_with_max_labels_prints_the_cost(run_cli, tmp_path: Path) -> None:
    csv = tmp_path / "example.csv"
    generate_example_campaign(nodes=16, gpus_per_node=4, node_prefix="n", seed=7).to_csv(
        csv, index=False
    )
    run_cli("profile", "ingest", csv, "--campaign", "ex")
    full = run_cli("site", "render", "--out", tmp_path / "full")
    signatures = len(json.loads(run_cli("profile", "labels", "--json").output)["labels"])
    assert f"{signatures} Type= labels" in " ".join(full.output.split())
    config = tmp_path / "site.toml"
    config.write_text("[site]\nmax_labels = 4\n")
    out = tmp_path / "capped"
    capped = run_cli("--config", config, "site", "render", "--out", out)
    text = " ".join(capped.output.split())
    assert "4 Type= labels" in text
    assert f"max_labels = 4: {signatures} PM signatures merged into 4 labels" in text
    assert "worst" in text and "mean (per GPU)" in text
    gres = (out / "gres.conf").read_text()
    types = {ln.split("Type=")[1].split()[0] for ln in gres.splitlines() if ln.startswith("Node")}
    assert len(types) == 4 and all(t.startswith("v100-pm") for t in types)
    snippet = (out / "slurm.conf.snippet").read_text()
    assert (
        "#AccountingStorageTRES=gres/gpu," + ",".join(f"gres/gpu:{t}" for t in sorted(types))
        in snippet
    )
    config.write_text("[site]\nmax_labels = 1\n")  # the throttled GPUs need labels of their own
    bad = run_cli("--config", config, "site", "render", "--out", out, ok=False)
    assert bad.exit_code == 2 and "cannot be met" in bad.output
    assert "Traceback" not in bad.output


SACCT = """JobID|User|ElapsedRaw|AllocTRES
101|ann|3600|billing=4,cpu=4,gres/gpu:v100-pm0=2,gres/gpu=2,mem=16G,node=1
101.batch|ann|3600|cpu=4,gres/gpu:v100-pm0=2,gres/gpu=2,mem=16G,node=1
102|bob|1800|cpu=8,gres/gpu:v100-pm0=1,gres/gpu:v100-pm2=1,gres/gpu=2,node=1
103|cat|7200|cpu=2,gres/gpu:a100-a0b1=4,gres/gpu=4,node=1
104|dan|600|cpu=1,mem=1G,node=1
105|eve|3600|cpu=1,gres/gpu=1,node=1
"""


def test_usage_rolls_labels_up_to_the_gpu_model(run_cli, tmp_path: Path) -> None:
    from slurm_pal.site.usage import parse_elapsed, parse_sacct, rollup

    assert parse_elapsed("1-02:03:04") == 93784 and parse_elapsed("05:06") == 306
    assert parse_elapsed("7") == 7
    jobs = parse_sacct(SACCT)
    assert [j.job_id for j in jobs] == ["101", "102", "103", "105"]  # steps and CPU jobs out
    rows = {u.model: u for u in rollup(jobs, {})}
    assert rows["v100"].gpu_hours == pytest.approx(2 * 1 + 2 * 0.5)
    assert rows["v100"].jobs == 2 and set(rows["v100"].labels) == {"v100-pm0", "v100-pm2"}
    assert rows["a100"].gpu_hours == pytest.approx(8.0)
    assert rows["(untyped)"].gpu_hours == pytest.approx(1.0)
    path = tmp_path / "sacct.txt"
    path.write_text(SACCT)
    out = json.loads(run_cli("site", "usage", "--sacct", path, "--json").output)
    assert [(r["model"], r["gpu_hours"]) for r in out] == [
        ("a100", 8.0),
        ("v100", 3.0),
        ("(untyped)", 1.0),
    ]
    # labels.json says which model a label is (here a label without the model prefix).
    labels = tmp_path / "labels.json"
    gpu = {"index": 0, "slurm_index": 0, "uuid": "GPU-1", "label": "a100-a0b1", "model": "a100sxm4"}
    labels.write_text(json.dumps({"nodes": {"n1": [gpu]}}))
    text = run_cli("site", "usage", "--sacct", path, "--labels", labels, "--by-label").output
    assert "a100sxm4" in text and "a100-a0b1 8.0" in " ".join(text.split())
    bad_path = tmp_path / "bad.txt"
    bad_path.write_text("JobID|State\n1|COMPLETED\n")
    bad = run_cli("site", "usage", "--sacct", bad_path, ok=False)
    assert bad.exit_code == 2 and "need the columns AllocTRES" in bad.output
    assert "Traceback" not in bad.output


def test_a_model_request_still_means_the_model_with_merged_labels() -> None:
    from slurm_pal.engine.decide import LabelTable, labels_as_models

    _, capped = _example_plan(4)
    table = LabelTable.from_labels_json(capped.to_dict())
    # --gres=gpu:v100:2 names the model (not a label), which the advisor places as such...
    assert table.is_model("v100") and table.models == frozenset({"v100"})
    assert all(table.is_label(lbl) for lbl in {g.label for g in capped.gpus})
    # ...and a user who names a merged label is translated back to the model.
    assert labels_as_models("gres:gpu:v100-pm0:2", table) == "gres:gpu:v100:2"
